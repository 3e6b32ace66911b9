"""Issue 21 probe: where a row of the op's fused kernel spends its time, and when.

    python scripts/probe_fused_phases.py --json /tmp/phases.json            (H200: ~4 min)
    python scripts/probe_fused_phases.py --json /tmp/p.json --builds default,trace,x2

The kernel is hytopk_table_fused(_cfg) at the op's plan (table.table_topk's: samples in runs,
oversample 1.5, min_rank 48, coarse 8), float32 randn rows, full contexts, k = 2048. For each entry
of BUILDS (table_v2.cu options, a launch, FUSED_AHEAD; "trace" / "stagger" are probe builds, see
table_v2.cu HYTOPK_FUSED_TRACE / HYTOPK_FUSED_STAGGER_NS) it times, like bench_table_topk.py (stream
timing, median of --repeats, torch.topk in the same run): the fused kernel at n rows for each n of
--rows (n = whole and partial waves show what the last wave costs), and the op replayed from a CUDA
graph, both checked against the default build's indices. Trace builds also run the kernel once more
and read each row's %globaltimer stamps (start, samples in, threshold known, stream done, select
staged, row written) and SM back: the phases' lengths, how many rows stream at a time (and a
timeline of it), how much the fixed work (threshold, select) of one SM's rows overlaps, and the last
wave. A diagnostic, not a benchmark: the trace builds' own times carry their stamps.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# name: (table_v2.cu options, (threads, blocks per SM) of the launch or None: the op's[, FUSED_AHEAD])
BUILDS = {"default": ((), None),
          "trace": (("-DHYTOPK_FUSED_TRACE=1",), None),
          "x2": ((), (512, 2)),                   # the launch of every row before table_v2.FUSED_SHORT = (512, 3)
          "x2_trace": (("-DHYTOPK_FUSED_TRACE=1",), (512, 2)),
          "head_first": (("-DHYTOPK_FUSED_HEAD_AFTER_SAMPLES=0",), None),
          "x2_head_first": (("-DHYTOPK_FUSED_HEAD_AFTER_SAMPLES=0",), (512, 2)),
          "first_head2": (("-DHYTOPK_FUSED_FIRST_HEAD=2",), None),
          "first_head3": (("-DHYTOPK_FUSED_FIRST_HEAD=3",), None),
          "ahead2": ((), None, 2),
          "stagger10": (("-DHYTOPK_FUSED_STAGGER_NS=10000",), None),
          "trace_stagger10": (("-DHYTOPK_FUSED_TRACE=1", "-DHYTOPK_FUSED_STAGGER_NS=10000"), None)}
PLAN = dict(design="v2", sampling="runs", oversample=1.5, min_rank=48, coarse=8)   # table.TOPK_*


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def summary(xs):
    return {"median": statistics.median(xs), "p10": pct(xs, 0.1), "p90": pct(xs, 0.9), "max": max(xs)}


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def analyse(tr, n):
    """Per-row stamps (ns) -> phase lengths (us), streaming concurrency, the SMs' fixed-work overlap."""
    rows = [dict(t=t, s0=int(r[0]), sg=int(r[1]), s1=int(r[2]), s2=int(r[3]), ss=int(r[4]), s3=int(r[5]), sm=int(r[6]),
                 cnt=int(r[7])) for t, r in enumerate(tr[:n])]
    base = min(r["s0"] for r in rows)
    for r in rows:
        for key in ("s0", "sg", "s1", "s2", "ss", "s3"):
            r[key] = (r[key] - base) / 1e3          # us from the first start
    span = max(r["s3"] for r in rows)
    out = {"rows": n, "span_us": span,
           "threshold_us": summary([r["s1"] - r["s0"] for r in rows]),
           "stream_us": summary([r["s2"] - r["s1"] for r in rows]),
           "select_us": summary([r["s3"] - r["s2"] for r in rows]),
           "gather_us": summary([r["sg"] - r["s0"] for r in rows]),
           "sample_select_us": summary([r["s1"] - r["sg"] for r in rows]),
           "select_stage_us": summary([r["ss"] - r["s2"] for r in rows if r["ss"] >= r["s2"]] or [0.0]),
           "select_rank_write_us": summary([r["s3"] - r["ss"] for r in rows if r["ss"] >= r["s2"]] or [0.0]),
           "row_us": summary([r["s3"] - r["s0"] for r in rows]),
           "count": summary([r["cnt"] for r in rows]),
           "sms": len({r["sm"] for r in rows})}
    # rows streaming / in fixed work, averaged over 1-us bins, and its timeline in 10-us bins
    nb = int(span) + 1
    streaming, fixed = [0.0] * nb, [0.0] * nb

    def add(arr, x0, x1):
        i = int(x0)
        while i < nb and i < x1:
            arr[i] += overlap(x0, x1, i, i + 1)
            i += 1
    for r in rows:
        add(fixed, r["s0"], r["s1"])
        add(streaming, r["s1"], r["s2"])
        add(fixed, r["s2"], r["s3"])
    out["mean_rows_streaming"] = sum(streaming) / nb
    out["mean_rows_fixed"] = sum(fixed) / nb
    out["timeline_10us"] = [[round(sum(streaming[i:i + 10]) / len(streaming[i:i + 10]), 1),
                             round(sum(fixed[i:i + 10]) / len(fixed[i:i + 10]), 1)] for i in range(0, nb, 10)]
    # on each SM: the part of a row's fixed work during which another row of the same SM also did fixed work
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r["sm"], []).append(r)
    both = total = 0.0
    for rs in by_sm.values():
        for r in rs:
            for a0, a1 in ((r["s0"], r["s1"]), (r["s2"], r["s3"])):
                total += a1 - a0
                for o in rs:
                    if o is not r:
                        both += overlap(a0, a1, o["s0"], o["s1"]) + overlap(a0, a1, o["s2"], o["s3"])
    out["fixed_overlapping_same_sm"] = both / total if total else 0.0
    starts = sorted(r["s0"] for r in rows)
    out["last_start_us"] = starts[-1]
    out["tail_us"] = span - starts[-1]              # from the last row's start to the kernel's end
    out["rows_per_sm"] = summary([len(v) for v in by_sm.values()])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--L", type=int, default=131072)
    ap.add_argument("--rows", default="4096", help="n values timed with the default build (3960,4096,4224: the tail)")
    ap.add_argument("--n", type=int, default=4096, help="rows of every other timing and of the traces")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--builds", default="default,trace,x2,head_first,first_head2")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()

    import cupy as cp
    import torch
    import bench_table_topk as B
    from workbench import instantiations as INST
    from workbench import loader
    from workbench.families.cupy import _launch
    from workbench.families.cupy import table as tab
    from workbench.families.cupy import table_v2 as tab_v2
    importlib.import_module("workbench.torch")      # registers torch.ops.hytopk
    op_mod = importlib.import_module("workbench.torch.table_topk")
    saved_beside = op_mod.RANGE_CHECK_BESIDE

    torch.cuda.init()
    rows_n = [int(x) for x in args.rows.split(",")]
    nmax = max(rows_n + [args.n])
    g = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn((nmax, args.L), device="cuda", dtype=torch.float32, generator=g)
    k = args.k
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cupy": cp.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "L": args.L, "k": k, "plan": PLAN, "timing": B.TIMING, "builds": {}}
    saved = INST.FILE_OPTIONS.get("table_v2.cu")
    saved_cfg = (tab_v2.FUSED_THREADS, tab_v2.FUSED_MIN_BLOCKS)
    saved_ahead = tab_v2.FUSED_AHEAD

    def views(n):
        s = scores[:n]
        return (s, torch.zeros(n, dtype=torch.int32, device="cuda"),
                torch.full((n,), args.L, dtype=torch.int32, device="cuda"))

    s4, lo4, hi4 = views(args.n)
    torch_topk = B.timed(lambda: torch.topk(s4, k, dim=1, sorted=True), args.repeats, torch)
    out["torch.topk"] = torch_topk
    ref_idx = torch.ops.hytopk.topk(s4, lo4, hi4, k)[0].clone()
    print(f"torch.topk {args.n}x{args.L}: {torch_topk['median_ms']:.3f} ms", flush=True)

    def one_build(name):
        opts_b, cfg = BUILDS[name][:2]
        tab_v2.FUSED_AHEAD = BUILDS[name][2] if len(BUILDS[name]) > 2 else saved_ahead
        INST.FILE_OPTIONS.pop("table_v2.cu", None)
        if tuple(saved or ()) + opts_b:
            INST.FILE_OPTIONS["table_v2.cu"] = tuple(saved or ()) + opts_b
        tab_v2.FUSED_THREADS, tab_v2.FUSED_MIN_BLOCKS = cfg if cfg else saved_cfg
        rec = {"options": list(opts_b), "launch": list(cfg) if cfg else "op", "ahead": tab_v2.FUSED_AHEAD}
        for n in (rows_n if name == "default" else [args.n]):
            s, lo, hi = views(n)
            count = cp.empty(n, cp.int32)
            fn = lambda: tab.fused_hytopk(s, lo, hi, k, count=count, host_check=False, **PLAN)  # noqa: E731
            t = B.timed(fn, args.repeats, torch)
            i = fn()[0]
            cap = tab_v2.fused_cap(k, 1, args.L, PLAN["oversample"], PLAN["min_rank"])
            c = cp.asnumpy(count)
            t["cap"], t["rows_flagged"] = cap, int(((c < k) | (c > cap)).sum())
            if n == args.n:
                t["idx_equal_default"] = bool(torch.equal(torch.from_dlpack(i), ref_idx))
            rec[f"fused_n{n}"] = t
            print(f"  {name:16s} fused n={n}: {t['median_ms']:.4f} ms ({t['median_ms'] / n * 1e3:.3f} us a row), "
                  f"cap {cap}, flagged {t['rows_flagged']}, idx equal {t.get('idx_equal_default')}", flush=True)
        # the op replayed from a CUDA graph; the default build also with its range check first on the
        # caller's stream (table_topk.RANGE_CHECK_BESIDE flipped)
        for beside in ([saved_beside, not saved_beside] if name == "default" else [saved_beside]):
            op_mod.RANGE_CHECK_BESIDE = beside
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                gi, _ = torch.ops.hytopk.topk(s4, lo4, hi4, k)
            t = B.timed(graph.replay, args.repeats, torch)
            graph.replay()
            torch.cuda.synchronize()
            t["idx_equal_default"] = bool(torch.equal(gi, ref_idx))
            t["speedup_vs_torch_topk"] = torch_topk["median_ms"] / t["median_ms"]
            t["range_check_beside"] = beside
            key = "op_graph" if beside == saved_beside else f"op_graph[range check beside {beside}]"
            rec[key] = t
            print(f"  {name:16s} {key}: {t['median_ms']:.4f} ms, {t['speedup_vs_torch_topk']:.2f}x torch.topk, "
                  f"idx equal {t['idx_equal_default']}", flush=True)
            del graph
        op_mod.RANGE_CHECK_BESIDE = saved_beside
        if "TRACE=1" in " ".join(opts_b):
            count = cp.empty(args.n, cp.int32)
            tab.fused_hytopk(s4, lo4, hi4, k, count=count, host_check=False, **PLAN)
            cp.cuda.runtime.deviceSynchronize()
            names = _launch._names("table_v2.cu", tuple(map(tuple, INST.SHAPES)))[0]
            mod = loader.module("table_v2.cu", names, options=INST.FILE_OPTIONS.get("table_v2.cu", ())).get()
            tr = cp.ndarray((16384, 8), cp.uint64, mod.get_global("hytopk_fused_trace")).get()
            a = rec["trace"] = analyse(tr, args.n)
            print(f"  {name:16s} trace: span {a['span_us']:.1f} us; threshold {a['threshold_us']['median']:.2f} "
                  f"(gather {a['gather_us']['median']:.2f}), stream {a['stream_us']['median']:.2f}, select "
                  f"{a['select_us']['median']:.2f} (staged {a['select_stage_us']['median']:.2f}) us (medians); "
                  f"rows streaming {a['mean_rows_streaming']:.1f}, fixed {a['mean_rows_fixed']:.1f}; "
                  f"fixed work overlapping on an SM {a['fixed_overlapping_same_sm']:.2f}; "
                  f"tail {a['tail_us']:.1f} us", flush=True)
        return rec

    try:
        for name in args.builds.split(","):
            try:
                out["builds"][name] = one_build(name)
            except Exception as e:          # a build that fails here: say so, go on with the others
                out["builds"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"  {name:16s} error: {out['builds'][name]['error']}", flush=True)
    finally:
        tab_v2.FUSED_THREADS, tab_v2.FUSED_MIN_BLOCKS = saved_cfg
        tab_v2.FUSED_AHEAD = saved_ahead
        op_mod.RANGE_CHECK_BESIDE = saved_beside
        INST.FILE_OPTIONS.pop("table_v2.cu", None)
        if saved:
            INST.FILE_OPTIONS["table_v2.cu"] = saved
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
