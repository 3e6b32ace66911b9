"""The Numba family's tiled scorer beside the CuPy SIMT scorer on a preset's shape (float32
inputs, the work the `numba.*[indexer]` and `cupy.*.simt[indexer]` rows of `hytopk compare` do):
dense table and fused filter, as the effective rate 2 H D sum(c) / time. A subset of the
preset's queries (--queries, spread over all of them) keeps the run under ~30 s; both
scorers check their dense tables against each other (exact-arithmetic inputs: bit-equal).

    python scripts/bench_numba_scorer.py --preset dsv32-128k --json out.json
    python scripts/bench_numba_scorer.py --sweep --json sweep.json      # every tile shape of tile.SWEEP

--sweep times the Numba dense table once per tile shape (workbench/families/numba/tile.py: keys per
lane, staged dims, heads per warp, head sum, threads per block, staging batch, launch bounds), checks
each bit-equal to the CuPy SIMT table, prints them fastest first, then the filters at the fastest
shape, and the HYTOPK_NUMBA_TILE value that makes it the default.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference as R                                                   # noqa: E402
from workbench.families.cupy import dense as cdense, filter as cfilter, threshold as cthreshold  # noqa: E402
from workbench.families.numba import dense as ndense, filter as nfilter, tile  # noqa: E402
from workbench.harness.presets import get as get_preset, make_inputs  # noqa: E402
from bench_core import timed                                           # noqa: E402  (median ms of repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="dsv32-128k")
    ap.add_argument("--queries", type=int, default=256, help="queries of the preset to run (spread over all)")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--sweep", action="store_true", help="time every tile shape of tile.SWEEP (dense), then "
                    "the filters at the fastest")
    ap.add_argument("--shapes", default=None, help="with --sweep: shapes to time instead, ';'-separated, "
                    "e.g. 'kpt=8,hsum=smem;kpt=4,hg=16'")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    p = get_preset(args.preset)
    q, w, keys, lo, hi = make_inputs(p)
    pick = np.linspace(0, p.n - 1, min(args.queries, p.n)).astype(np.int64)
    q, w, lo, hi = q[pick], w[pick], lo[pick], hi[pick]
    c = (hi.astype(np.int64) - lo).clip(0)
    flop = 2.0 * p.H * p.D * float(c.sum())
    qd, wd, kd = (cp.asarray(np.ascontiguousarray(x, np.float32)) for x in (q, w, keys))
    lo_d, hi_d = cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))
    M, r = (cp.asarray(x) for x in R.sample_plan(lo, hi, p.k, p.oversample))
    cap = R.default_capacity(p.k, lo, hi, p.oversample)
    src_c = R.IndexerSource(qd, wd, kd)
    nq, nw, nk, nlo, nhi = (cuda.as_cuda_array(x) for x in (qd, wd, kd, lo_d, hi_d))
    src_n = R.IndexerSource(nq, nw, nk)
    T = cthreshold.threshold(src_c, lo_d, hi_d, M, r)
    nT = cuda.as_cuda_array(T)
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    want = cdense.dense(qd, wd, kd, lo_d, hi_d).view(cp.uint32)
    sweep, at_best = None, contextlib.ExitStack()
    if args.sweep:
        shapes = [tile.parse(x) for x in args.shapes.split(";")] if args.shapes else list(tile.SWEEP)
        sweep = run_sweep(shapes, lambda: ndense.dense_tiled(nq, nw, nk, nlo, nhi), want, flop, p.H)
        ok = [r for r in sweep if "tflops" in r]
        if ok:
            best = max(ok, key=lambda r: r["tflops"])
            print(f"  fastest: {best['tile']}  ({best['tflops']:.2f} TFLOP/s); make it the default with\n"
                  f"    HYTOPK_NUMBA_TILE='{best['tile']}'", flush=True)
            at_best.enter_context(tile.use(tile.parse(best["tile"])))    # the rows below: the fastest shape
    cfg = tile.current()
    print(f"GPU {gpu}  {p.name}: {len(pick)} of {p.n} queries, L={p.L} H={p.H} D={p.D}, "
          f"numba tile {cfg.label} (TK={cfg.tk}, HG={cfg.heads_per_warp(p.H)})", flush=True)

    same = bool(cp.array_equal(cp.asarray(ndense.dense_tiled(nq, nw, nk, nlo, nhi)).view(cp.uint32), want))
    print(f"  dense tables bit-equal: {same}", flush=True)
    rows = {}
    calls = {
        "numba.dense.tiled": lambda: ndense.dense_tiled(nq, nw, nk, nlo, nhi),
        "cupy.dense.simt": lambda: cdense.dense(qd, wd, kd, lo_d, hi_d),
        "numba.filter.warp": lambda: nfilter.filter_warp(src_n, nlo, nhi, nT, cap),
        "numba.filter.block": lambda: nfilter.filter_block(src_n, nlo, nhi, nT, cap),
        "cupy.filter.simt": lambda: cfilter.filter_simt(src_c, lo_d, hi_d, T, cap),
    }
    for label, fn in calls.items():
        try:
            med, mn, reps = timed(fn, budget_s=2.0, max_reps=20)
        except Exception as e:                                  # a broken row is a row, not a crash
            rows[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"  {label:22s} ERROR {rows[label]['error']}", flush=True)
            continue
        rate = flop / (med * 1e-3) / 1e12
        rows[label] = {"ms": med, "min_ms": mn, "reps": reps, "tflops": rate}
        print(f"  {label:22s} {med:9.3f} ms  {rate:6.2f} TFLOP/s", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    for stage in ("dense", "filter"):
        simt = rows.get(f"cupy.{stage}.simt", {}).get("tflops")
        for label, row in rows.items():
            if label.startswith(f"numba.{stage}.") and simt and "tflops" in row:
                row["vs_cupy_simt"] = row["tflops"] / simt
                print(f"  {label:22s} {row['vs_cupy_simt']:.2f} x cupy.{stage}.simt", flush=True)
    simt = rows.get("cupy.dense.simt", {}).get("tflops")
    for r in sweep or []:
        if simt and "tflops" in r:
            r["vs_cupy_simt"] = r["tflops"] / simt
    out = {"gpu": gpu, "date": time.strftime("%Y-%m-%d %H:%M"), "preset": p.name, "queries": len(pick),
           "L": p.L, "H": p.H, "D": p.D, "sum_c": int(c.sum()), "capacity": cap, "dense_bit_equal": same,
           "tile": dict(cfg.__dict__, TK=cfg.tk, HG=cfg.heads_per_warp(p.H), label=cfg.label),
           "rows": rows, "sweep": sweep, "wall_s": time.perf_counter() - t_start}
    print(f"  wall {out['wall_s']:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    bad = [r["tile"] for r in sweep or [] if "error" in r or r.get("bit_equal") is False]
    if bad:
        print(f"  shapes that failed or differ: {bad}", flush=True)
    return 0 if same and not bad else 1


def run_sweep(shapes, dense, want, flop, H) -> list:
    """Each shape: its dense table checked bit-equal to the CuPy SIMT table, then timed; a shape
    that fails to compile or differs is a row with its error, not a crash."""
    out = []
    print(f"  sweep: {len(shapes)} tile shapes (dense table; compile + check + time each)", flush=True)
    for cfg in shapes:
        row = {"tile": cfg.label, "TK": cfg.tk, "HG": cfg.heads_per_warp(H), "smem_bytes": cfg.smem_bytes()}
        t0 = time.perf_counter()
        try:
            with tile.use(cfg):
                got = cp.asarray(dense()).view(cp.uint32)
                row["compile_s"] = time.perf_counter() - t0
                row["bit_equal"] = bool(cp.array_equal(got, want))
                del got
                if row["bit_equal"]:
                    med, mn, reps = timed(dense, budget_s=1.5, max_reps=15)
                    row.update(ms=med, min_ms=mn, reps=reps, tflops=flop / (med * 1e-3) / 1e12)
        except Exception as e:                                  # a shape that does not build is a row
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        cp.get_default_memory_pool().free_all_blocks()
        out.append(row)
        print(f"    {cfg.label:60s} " + (f"{row['ms']:9.3f} ms {row['tflops']:6.2f} TFLOP/s" if "tflops" in row
              else row.get("error", "NOT bit-equal")), flush=True)
    print("  sweep, fastest first:", flush=True)
    for r in sorted((r for r in out if "tflops" in r), key=lambda r: -r["tflops"]):
        print(f"    {r['tflops']:6.2f} TFLOP/s  {r['tile']}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
