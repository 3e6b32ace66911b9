"""Outputs of `compare` and `calibrate`: a rich table, a results JSON, a PNG plot."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

BASE_COLS = (("torch", "×torch"), ("dense+topk", "×dense+topk"), ("score-only", "×floor"), ("flop-bound", "×bound"))
# the floor column: the score-only run of the default bf16 core present (wgmma_ws on Hopper, else mma_sync;
# on a CPU the reference family's floor)
FLOORS = ("score-only-wgmma_ws", "score-only-mma_sync", "score-only", "score-only-reference")


def _fmt(x, spec="{:.3g}"):
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else spec.format(x)


def _mem(b):
    if b is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024


def _iqr(spread) -> str:
    """'q25–q75 ×n' of a row's timing (the middle half of its repeats and how many there were)."""
    if not spread:
        return "–"
    if spread["repeats"] < 2:
        return f"– ×{spread['repeats']}"
    return f"{spread['q25_ms']:.4g}–{spread['q75_ms']:.4g} ×{spread['repeats']}"


def compare_table(res):
    from rich.markup import escape
    from rich.table import Table
    ceil = res.ceilings
    t = Table(title=f"hytopk compare — preset {res.preset['name']} on {res.device} "
                    f"(ceilings: GEMM {ceil['gemm_tflops']:.3g} TFLOP/s, copy {ceil['copy_gbps']:.4g} GB/s; "
                    f"ratio < 1 = faster than the baseline)")
    for col in ("stage", "variant", "correct", "time ms", "IQR ms ×n", *(c for _, c in BASE_COLS),
                "TFLOP/s (% ceil)", "GB/s (% ceil)", "extra mem"):
        t.add_column(col, justify="right" if col not in ("stage", "variant") else "left", no_wrap=col == "variant")
    present = {r.stage for r in res.rows if r.kind == "baseline"} | {"flop-bound"}
    floor = next((f for f in FLOORS if f in present), "score-only")
    for r in res.rows:
        ok = {True: "[green]yes[/]", False: "[bold red]NO[/]", None: "n/a"}[r.correct]
        tfl = f"{r.tflops:.3g} ({100 * r.tflops / ceil['gemm_tflops']:.0f}%)" if r.tflops else "–"
        gbs = f"{r.gbps:.4g} ({100 * r.gbps / ceil['copy_gbps']:.0f}%)" if r.gbps else "–"
        keys = [floor if b == "score-only" else b for b, _ in BASE_COLS]     # the floor: mma_sync when it ran
        ratios = [_fmt(r.ratios.get(k)) if k in present else "–" for k in keys]
        t.add_row(r.stage if r.kind != "baseline" else "baseline", escape(r.label), ok, _fmt(r.time_ms, "{:.4g}"),
                  _iqr(getattr(r, "spread", None)), *ratios, tfl, gbs, _mem(r.peak_extra_bytes))
        if r.correct is False and r.detail:
            t.add_row("", f"[red]  ↳ {escape(r.detail)}[/]", *[""] * (len(t.columns) - 2))
    return t


def check_writable(path: str | Path, what: str) -> Path:
    """Check, before any work, that a file can be written at ``path`` (relative paths: the
    current directory); returns it as an absolute Path. ``what`` names the source in the
    message ("argument '--json'", "HYTOPK_WINNERS"). A directory, a parent that is missing or
    not a directory, or a place this process cannot write is a ValueError saying which. Missing
    parent directories are not created: a typo in a path should not grow a directory tree."""
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise ValueError(f"{what}: {p} is a directory; give a file path")
    parent = p.parent
    if not parent.exists():
        raise ValueError(f"{what}: directory {parent} does not exist; create it first")
    if not parent.is_dir():
        raise ValueError(f"{what}: {parent} is not a directory")
    try:
        if p.exists():
            with open(p, "ab"):              # append mode: the file is not truncated
                pass
        else:                                # a probe file next to it, removed at once
            fd, probe = tempfile.mkstemp(dir=parent, prefix=".hytopk-write-check-")
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise ValueError(f"{what}: cannot write {p}: {e.strerror or e}") from None
    return p


def write_json(obj: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def compare_plot(res, path: str | Path) -> Path:
    """Horizontal bars of each timed row (log scale); wrong rows in red, baselines as lines."""
    plt = _pyplot()
    rows = [r for r in res.rows if r.time_ms]
    fig, ax = plt.subplots(figsize=(10, 0.32 * max(4, len(rows)) + 1.2))
    labels = [f"{r.stage}: {r.label}" if r.kind != "baseline" else f"baseline: {r.name}" for r in rows]
    colours = ["tab:red" if r.correct is False else "tab:gray" if r.kind == "baseline"
               else "tab:green" if r.kind == "pipeline" else "tab:blue" for r in rows]
    spreads = [getattr(r, "spread", None) or {} for r in rows]      # whiskers: the middle half of the repeats
    err = [[max(0.0, r.time_ms - s.get("q25_ms", r.time_ms)) for r, s in zip(rows, spreads)],
           [max(0.0, s.get("q75_ms", r.time_ms) - r.time_ms) for r, s in zip(rows, spreads)]]
    ax.barh(range(len(rows)), [r.time_ms for r in rows], color=colours, xerr=err, error_kw=dict(lw=0.8))
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median time (ms, log scale; whiskers: interquartile range)")
    bound = res.ceilings.get("flop_bound_ms")
    if bound:
        ax.axvline(bound, color="k", ls="--", lw=1, label=f"tensor-core FLOP bound {bound:.3g} ms")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"hytopk compare: {res.preset['name']} on {res.environment.get('gpu', {}).get('name') or res.device}",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def calibrate_plot(cal: dict, path: str | Path) -> Path:
    """Failure rate vs oversample (per family), overflow vs capacity, failure vs sample-count bounds."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    by_fam = {}
    for r in cal["oversample"]:
        by_fam.setdefault(r["family"], []).append(r)
    for fam, rs in by_fam.items():
        axes[0].plot([r["oversample"] for r in rs], [r["fail_rate"] for r in rs], marker="o", label=fam)
    axes[0].set_xlabel("oversample (default capacity)")
    axes[0].set_ylabel("failed-query rate (overflow + underflow)")
    by_fam = {}
    for r in cal["capacity"]:
        by_fam.setdefault(r["family"], []).append(r)
    for fam, rs in by_fam.items():
        axes[1].plot([r["capacity_over_k"] for r in rs], [r["overflow_rate"] for r in rs], marker="o", label=fam)
    axes[1].set_xlabel(f"capacity / k (oversample {cal['params']['oversample_default']})")
    axes[1].set_ylabel("overflow rate")
    by_fam = {}
    for r in cal["bounds"]:
        by_fam.setdefault(r["family"], []).append(r)
    for fam, rs in by_fam.items():
        axes[2].plot([f"{r['min_samples']}-{r['max_samples']}" for r in rs], [r["fail_rate"] for r in rs],
                     marker="o", label=fam)
    axes[2].set_xlabel("sample-count bounds (min-max)")
    axes[2].set_ylabel("failed-query rate")
    for ax in axes:
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6, ncol=2)
    p = cal["params"]
    fig.suptitle(f"hytopk calibrate ({p['scale']}: n={p['n']} L={p['L']} k={p['k']}, {p['draws']} draws)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
