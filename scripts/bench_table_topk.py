"""Issue 21 benchmark: exact top-k over a given score table, full contexts, on one GPU.

    python scripts/bench_table_topk.py --json results/table_topk_h200.json
    python scripts/bench_table_topk.py --json /tmp/t.json --sizes 4096x131072 --repeats 5   (quick)

Rows per (table, dtype, k): torch.ops.hytopk.topk (what a PyTorch user calls: table_topk's defaults), also
replayed from a CUDA graph ([graph]); torch.topk(scores, k, dim=1, sorted=True) (values sorted, but its
ties are not the contract's lower-position-first order: it is the baseline a user has, not an
equal answer); table_topk (the exact radix top-k of every row, what backend("cupy").topk
launches), also with plain shared atomics in its histograms; fused_hytopk (one kernel: sampled
threshold, one collecting read, exact select, in-block fallback); table HyTopK (TableHyTopK:
threshold -> streaming filter -> select -> check -> device-side radix recovery, planned once, no
host work between launches); the streaming filter alone; backend("cupy").plan(lo, hi, k).table
(the pipeline driver's plan, capture-safe: device-side recovery); backend("cupy").topk end to end
(host checks included); flashinfer.top_k(sorted=True) where FlashInfer is installed. Effective GB/s = table
bytes / time. Times: CUDA events on the current stream after a warm-up, median of repeats.
Memory: the 8192 x 1048576 float32 table is 34.4 GB (bf16: 17.2 GB), created on the GPU; the
other buffers are < 2 GB; torch.topk's own workspace comes on top.
The second design (kernels_cuda/table_v2.cu) sits beside each first-design row, suffixed _v2:
fused_hytopk_v2 (one streaming kernel per row, flagged rows through the radix kernel),
table_hytopk_v2 (TableHyTopK(kernels="v2")), and the staged path's stages alone for both designs:
threshold_only, filter_only (the streaming filter; GB/s here is the filter's read rate) and
select_only; table_hytopk_v2[overlap N] is table_hytopk_v2 with its stages in N row chunks on
three streams (table_v2.STAGED_CHUNKS = N: each chunk's threshold and select beside another chunk's
filter); fused_hytopk_v2[no prefetch] and filter_only_v2[no prefetch] time the v2 reads without
their L2 prefetch (table_v2.FUSED_AHEAD / FILTER_AHEAD = 0); fused_hytopk_v2[one read] times the
one-read fused kernel (table_v2.FUSED_ONE_READ = 1: hytopk_table_fused1 at (1024, 1)), its idx
checked against the radix path, its flagged rows and counts against fused_hytopk_v2's;
fused_hytopk_v2[cluster] times the cluster kernel (table_v2.FUSED_CLUSTER = 1: hytopk_table_cluster,
rows that fit a cluster's shared memory: 128K keys, not 1M), checked the same way (with --fused-sweep
also under each CLUSTER_SWEEP cluster size, select sharing and grid); fused_hytopk_v2[cluster, no select] is
a diagnostic, not an answer: the same kernel with its selects skipped (table_v2.CLUSTER_SKIP_SELECT),
i.e. what the copies, thresholds, filters and cluster barriers cost without the one-block select. --quick leaves out the slow end-to-end rows (table_topk with match atomics,
backend.plan.table, backend.topk).
Each row also records whether its values equal torch.topk's (bit for bit: the multiset of
the k best values does not depend on tie order) and whether every HyTopK path's idx equals the
radix table_topk's (idx_equals_radix), and how many rows each fused kernel sent to its fallback.
--fused-sweep: also times fused_hytopk_v2 under each launch configuration of FUSED_SWEEP (threads
per block, blocks per SM, candidate cap, L2 prefetch distance, fast select on/off: table_v2.py's
module constants), each checked for idx equal to the radix path (row["fused_sweep"]), and
select_only_v2 with the old select (table_v2.SELECT_FAST = 0, "select_only_v2[sort]"), and the sweep
again with the samples in runs (row["fused_sweep_runs"]).
Rows with [runs] take the same M samples in 64-byte runs (table_v2.py sampling "runs": the exact
top-k, not the contract's statistics): fused_hytopk_v2[runs], table_hytopk_v2[runs] (also in 4 / 8
overlapped chunks) and its stages alone; [runs, os 2] with oversample 2 (fewer candidates per row).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


TIMING = "stream"          # --timing


def timed(fn, repeats, torch):
    """Event pairs around each call, median. TIMING "stream" (triton's do_bench way): the calls go back
    to back with no host sync between them (one untimed call first), so the host's launch work overlaps
    the last call's device work and each pair times the device; "sync": a host sync after each call
    (the GPU is idle when a pair starts, so the pair also holds the call's host work before its first
    launch: ~0.1-0.2 ms for the Python table paths; the method of the runs before 2026-12-01-s4 run 3)."""
    fn()                                     # warm-up (compiles on first use)
    torch.cuda.synchronize()
    times = []
    if TIMING == "stream":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        fn()                                 # untimed: the device is busy while the first pair is queued
        for a, b in pairs:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in pairs]
    else:
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "repeats": repeats}


# --fused-sweep: (FUSED_THREADS, FUSED_MIN_BLOCKS, FUSED_CAP (0: the blocks' share), FUSED_AHEAD, SELECT_FAST)
# (run 3 of results/h200-2026-12-01: the (256, 3/4) blocks flag most rows, (1024, 1) won both sizes)
FUSED_SWEEP = (
    (512, 2, 0, 2, 1), (512, 2, 8192, 2, 1), (1024, 1, 0, 2, 1), (1024, 1, 0, 1, 1), (1024, 1, 8192, 2, 1),
    (1024, 1, 12288, 2, 1), (1024, 1, 16384, 2, 1), (1024, 1, 0, 2, 0),
)
SWEEP_KEYS = ("FUSED_THREADS", "FUSED_MIN_BLOCKS", "FUSED_CAP", "FUSED_AHEAD", "SELECT_FAST")
# the same with the samples in runs, the oversample, min_rank and coarse (table.TOPK_*: 1.5, 48, 8), and a
# build of table_v2.cu (BUILDS: "general" = no immediate-offset appends, the general sink at (512, 2)
# too; "nohint" = the fused select and threshold without the best sample's key)
FUSED_SWEEP_RUNS = (
    (512, 3, 0, 1, 1, 1.5, 48, 8), (512, 2, 0, 1, 1, 1.5, 48, 8), (512, 2, 0, 2, 1, 1.5, 48, 8),
    (512, 2, 0, 1, 1, 1.5, 48, 8, "general"), (256, 3, 0, 1, 1, 1.5, 48, 8), (512, 2, 0, 1, 1, 1.5, 48, 8, "nohint"),
)
BUILDS = {"general": ("-DHYTOPK_FUSED_FIXED=0",),
          "nohint": ("-DHYTOPK_SELECT_HINT=0",)}


def fused_sweep(tab, tab_v2, scores, lo, hi, k, i_radix, repeats, torch, cp, sampling="contract"):
    """fused_hytopk_v2 under each FUSED_SWEEP (sampling "runs": FUSED_SWEEP_RUNS) configuration: time,
    rows flagged, idx == radix."""
    out = []
    from workbench import instantiations as INST
    saved = {key: getattr(tab_v2, key) for key in SWEEP_KEYS}
    saved_opts = INST.FILE_OPTIONS.get("table_v2.cu")
    count = cp.empty(scores.shape[0], cp.int32)
    runs = tab_v2.check_sampling(sampling)

    def build(name):            # table_v2.cu's options for a BUILDS entry (None: the default build)
        INST.FILE_OPTIONS.pop("table_v2.cu", None)
        opts = tuple(saved_opts or ()) + BUILDS.get(name, ())
        if opts:
            INST.FILE_OPTIONS["table_v2.cu"] = opts
    try:
        for cfg in (FUSED_SWEEP_RUNS if runs else FUSED_SWEEP):
            for key, v in zip(SWEEP_KEYS, cfg):
                setattr(tab_v2, key, v)
            rec = dict(zip(SWEEP_KEYS, cfg))
            os_ = cfg[5] if len(cfg) > 5 else 3.0
            mr = cfg[6] if len(cfg) > 6 else 0
            co = cfg[7] if len(cfg) > 7 else 0
            rec["oversample"], rec["min_rank"], rec["coarse"] = os_, mr, co
            rec["build"] = cfg[8] if len(cfg) > 8 else "default"
            build(rec["build"])
            try:
                fn = lambda: tab.fused_hytopk(scores, lo, hi, k, count=count, host_check=False, design="v2",  # noqa: E731
                                              sampling=sampling, oversample=os_, min_rank=mr, coarse=co)
                rec.update(timed(fn, repeats, torch))
                i = fn()[0]
                rec["idx_equals_radix"] = bool(torch.equal(torch.from_dlpack(i_radix), torch.from_dlpack(i)))
                rec["cap"] = tab_v2.fused_cap(k, runs)
                c = cp.asnumpy(count)
                rec["rows_flagged"] = int(((c < k) | (c > rec["cap"])).sum())
                rec["GBps"] = scores.numel() * scores.element_size() / (rec["median_ms"] * 1e-3) / 1e9
            except Exception as e:          # a configuration that does not launch here: say so, go on
                rec["error"] = f"{type(e).__name__}: {e}"[:200]
            out.append(rec)
            print(f"    fused_v2 ({sampling}, os {os_:g}, {rec['build']}) "
                  + " ".join(f"{key}={v}" for key, v in zip(SWEEP_KEYS, cfg))
                  + (f": {rec['median_ms']:8.3f} ms {rec['GBps']:6.0f} GB/s idx==radix {rec['idx_equals_radix']} "
                     f"flagged {rec['rows_flagged']}" if "error" not in rec else f": {rec['error']}"), flush=True)
    finally:
        for key, v in saved.items():
            setattr(tab_v2, key, v)
        build(None)
    return out


# row chunks of table_hytopk_v2[overlap N] (table_v2.STAGED_CHUNKS: threshold / filter / select on three streams)
OVERLAP_CHUNKS = (4, 8, 16, 32)


# the cluster sweep (with --fused-sweep): (CLUSTER_SIZE, CLUSTER_SHARE, CLUSTER_GRID (0: SMs // C)) of the
# cluster kernel (a grid past the clusters that fit at once leaves a tail: 15 / 14 in case 16 do not fit)
# (1 .. 8 clusters: how the time scales with the clusters resident at once)
CLUSTER_SWEEP = ((8, 1, 0), (8, 1, 15), (8, 1, 14), (8, 1, 8), (8, 1, 4), (8, 1, 2), (8, 1, 1), (8, 0, 0), (4, 1, 0),
                 (4, 1, 32), (4, 0, 0))


def cluster_sweep(tab, tab_v2, scores, lo, hi, k, cxx, repeats, torch, cp):
    """fused_hytopk_v2[cluster] under each CLUSTER_SWEEP configuration: time, idx == the fused kernel's."""
    out = []
    saved = dict(tab_v2.CLUSTER_SIZE), tab_v2.CLUSTER_GRID, tab_v2.CLUSTER_SHARE
    count = cp.empty(scores.shape[0], cp.int32)
    tab_v2.FUSED_CLUSTER = 0                 # the reference: the fused kernel's indices
    ref = tab.fused_hytopk(scores, lo, hi, k, count=count, host_check=False, design="v2")[0].copy()
    tab_v2.FUSED_CLUSTER = 1
    try:
        for C, share, grid in CLUSTER_SWEEP:
            tab_v2.CLUSTER_SIZE = dict(saved[0], **{cxx: C})
            tab_v2.CLUSTER_GRID, tab_v2.CLUSTER_SHARE = grid, share
            rec = {"C": C, "share": share, "grid": grid}
            try:
                if tab_v2.cluster_geometry(scores.shape[1], cxx, k) is None:
                    raise ValueError("rows do not fit this cluster size")
                fn = lambda: tab.fused_hytopk(scores, lo, hi, k, count=count, host_check=False, design="v2")  # noqa: E731
                rec.update(timed(fn, repeats, torch))
                rec["idx_equals_fused"] = bool((fn()[0] == ref).all())
                rec["GBps"] = scores.numel() * scores.element_size() / (rec["median_ms"] * 1e-3) / 1e9
            except Exception as e:          # a configuration that does not launch here: say so, go on
                rec["error"] = f"{type(e).__name__}: {e}"[:200]
            out.append(rec)
            print(f"    cluster C={C} share={share} grid={grid}" + (f": {rec['median_ms']:8.3f} ms {rec['GBps']:6.0f} GB/s "
                                                       f"idx==fused {rec['idx_equals_fused']}"
                                                       if "error" not in rec else f": {rec['error']}"), flush=True)
    finally:
        tab_v2.CLUSTER_SIZE, tab_v2.CLUSTER_GRID, tab_v2.CLUSTER_SHARE = saved
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--sizes", default="4096x131072,8192x1048576")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ks", default="2048,512")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="leave out table_topk (match atomics), backend.plan.table and backend.topk")
    ap.add_argument("--timing", choices=("stream", "sync"), default="stream",
                    help="stream: calls back to back, no host sync between them (default); sync: a host sync "
                         "after each call (the host's launch work inside each timed pair)")
    ap.add_argument("--fused-sweep", action="store_true",
                    help="also time fused_hytopk_v2 under each FUSED_SWEEP launch configuration")
    args = ap.parse_args(argv)
    global TIMING
    TIMING = args.timing

    import cupy as cp
    import torch
    import workbench
    import workbench.torch as wt
    from workbench.families.cupy import table as tab
    from workbench.families.cupy import table_v2 as tab_v2

    try:
        import flashinfer
    except Exception:                   # not installed here (the row is left out)
        flashinfer = None
    torch.cuda.init()
    dev = torch.cuda.get_device_name()
    out = {"gpu": dev, "torch": torch.__version__, "cupy": cp.__version__,
           "flashinfer": getattr(flashinfer, "__version__", None),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "note": "full contexts; torch.topk sorted=True; GB/s = table bytes / median time",
           "timing": args.timing, "rows": []}
    backend = workbench.backend("cupy")
    t_start = time.time()
    for size in args.sizes.split(","):
        n, L = (int(x) for x in size.lower().split("x"))
        for dtype in args.dtypes.split(","):
            tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
            g = torch.Generator(device="cuda").manual_seed(0)
            scores = torch.randn((n, L), device="cuda", dtype=tdt, generator=g)
            nbytes = scores.numel() * scores.element_size()
            lo = torch.zeros(n, dtype=torch.int32, device="cuda")
            hi = torch.full((n,), L, dtype=torch.int32, device="cuda")
            lo_h, hi_h = lo.cpu().numpy(), hi.cpu().numpy()
            for k in (int(x) for x in args.ks.split(",")):
                row = {"n": n, "L": L, "dtype": dtype, "k": k, "table_GB": nbytes / 1e9}
                res = {}
                res["torch.topk"] = timed(lambda: torch.topk(scores, k, dim=1, sorted=True), args.repeats, torch)
                tv = torch.topk(scores, k, dim=1, sorted=True).values.float()
                if flashinfer is not None:         # where it is installed: its radix top-k, sorted like ours
                    try:
                        res["flashinfer.top_k"] = timed(lambda: flashinfer.top_k(scores, k, sorted=True),
                                                        args.repeats, torch)
                    except Exception as e:      # an unsupported shape or build: say so, keep going
                        row["flashinfer_error"] = f"{type(e).__name__}: {e}"[:200]
                # what a PyTorch user calls (table_topk's defaults: fused_v2, DEFAULT_SAMPLING), eager and
                # replayed from a CUDA graph (no host work at all)
                res["torch.ops.hytopk.topk"] = timed(lambda: wt.topk(scores, lo, hi, k), args.repeats, torch)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    gi, _ = wt.topk(scores, lo, hi, k)
                res["torch.ops.hytopk.topk[graph]"] = timed(graph.replay, args.repeats, torch)
                if not args.quick:
                    res["table_topk"] = timed(lambda: tab.table_topk(scores, lo, hi, k, host_check=False,
                                                                     method="radix", hist_atomics="match"),
                                              args.repeats, torch)
                res["table_topk[plain atomics]"] = timed(
                    lambda: tab.table_topk(scores, lo, hi, k, host_check=False, method="radix",
                                           hist_atomics="plain"), args.repeats, torch)
                count = cp.empty(n, cp.int32)
                count2 = cp.empty(n, cp.int32)
                for name, design, cnt_buf in (("fused_hytopk", "v1", count), ("fused_hytopk_v2", "v2", count2)):
                    res[name] = timed(lambda: tab.fused_hytopk(scores, lo, hi, k, count=cnt_buf, host_check=False,
                                                               design=design), args.repeats, torch)
                ahead = tab_v2.FUSED_AHEAD, tab_v2.FILTER_AHEAD
                tab_v2.FUSED_AHEAD = tab_v2.FILTER_AHEAD = 0      # the v2 reads without the L2 prefetch
                res["fused_hytopk_v2[no prefetch]"] = timed(
                    lambda: tab.fused_hytopk(scores, lo, hi, k, count=count2, host_check=False, design="v2"),
                    args.repeats, torch)
                tab_v2.FUSED_AHEAD, tab_v2.FILTER_AHEAD = ahead
                one_saved = tab_v2.FUSED_ONE_READ, tab_v2.FUSED_THREADS, tab_v2.FUSED_MIN_BLOCKS
                tab_v2.FUSED_ONE_READ, tab_v2.FUSED_THREADS, tab_v2.FUSED_MIN_BLOCKS = 1, 1024, 1
                count3 = cp.empty(n, cp.int32)           # the one-read kernel (hytopk_table_fused1)
                res["fused_hytopk_v2[one read]"] = timed(
                    lambda: tab.fused_hytopk(scores, lo, hi, k, count=count3, host_check=False, design="v2"),
                    args.repeats, torch)
                i_one = tab.fused_hytopk(scores, lo, hi, k, count=count3, host_check=False, design="v2")[0]
                tab_v2.FUSED_ONE_READ, tab_v2.FUSED_THREADS, tab_v2.FUSED_MIN_BLOCKS = one_saved
                cxx = {"float32": "hytopk::TableSource", "bfloat16": "hytopk::TableBf16Source"}[dtype]
                geo = tab_v2.cluster_geometry(L, cxx, k)     # None: rows too long for a cluster (1M keys)
                count4 = cp.empty(n, cp.int32)                # the cluster kernel (hytopk_table_cluster)
                i_cl = None
                if geo is not None:
                    tab_v2.FUSED_CLUSTER = 1
                    try:
                        res["fused_hytopk_v2[cluster]"] = timed(
                            lambda: tab.fused_hytopk(scores, lo, hi, k, count=count4, host_check=False, design="v2"),
                            args.repeats, torch)
                        i_cl = tab.fused_hytopk(scores, lo, hi, k, count=count4, host_check=False, design="v2")[0]
                        tab_v2.CLUSTER_SKIP_SELECT = 1          # diagnostic: the same kernel without its selects
                        try:
                            res["fused_hytopk_v2[cluster, no select]"] = timed(
                                lambda: tab.fused_hytopk(scores, lo, hi, k, count=cp.empty(n, cp.int32),
                                                         host_check=False, design="v2"), args.repeats, torch)
                        finally:
                            tab_v2.CLUSTER_SKIP_SELECT = 0
                        if args.fused_sweep:
                            row["cluster_sweep"] = cluster_sweep(tab, tab_v2, scores, lo, hi, k, cxx, args.repeats,
                                                                 torch, cp)
                    finally:
                        tab_v2.FUSED_CLUSTER = 0
                # the samples in 64-byte runs (table_v2.py sampling "runs"): fused and staged, oversample 3
                # (the contract's r) and 2 (fewer candidates)
                i_runs, runs_counts = {}, {}
                for os_ in (3.0, 2.0):
                    tag = "runs" if os_ == 3.0 else f"runs, os {os_:g}"
                    cnt = cp.empty(n, cp.int32)
                    runs_counts[tag] = (cnt, os_)
                    name = f"fused_hytopk_v2[{tag}]"
                    res[name] = timed(lambda: tab.fused_hytopk(scores, lo, hi, k, count=cnt, host_check=False,
                                                               design="v2", sampling="runs", oversample=os_),
                                      args.repeats, torch)
                    i_runs[name] = tab.fused_hytopk(scores, lo, hi, k, count=cnt, host_check=False, design="v2",
                                                    sampling="runs", oversample=os_)[0].copy()
                plans = {d: tab.TableHyTopK(n, L, lo_h, hi_h, k, kernels=d) for d in ("v1", "v2")}
                plans["v2[runs]"] = tab.TableHyTopK(n, L, lo_h, hi_h, k, sampling="runs")
                plans["v2[runs, os 2]"] = tab.TableHyTopK(n, L, lo_h, hi_h, k, sampling="runs", oversample=2.0)
                for tag in ("runs", "runs, os 2"):
                    plan = plans[f"v2[{tag}]"]
                    res[f"table_hytopk_v2[{tag}]"] = timed(lambda: plan(scores), args.repeats, torch)
                    i_runs[f"staged_v2[{tag}]"] = plan(scores)[0].copy()
                    for chunks in (4, 8):               # overlapped: a cheap threshold, the select beside the filter
                        tab_v2.STAGED_CHUNKS = chunks
                        name = f"table_hytopk_v2[{tag}, overlap {chunks}]"
                        try:
                            res[name] = timed(lambda: plan(scores), args.repeats, torch)
                            i_runs[name] = plan(scores)[0].copy()
                        finally:
                            tab_v2.STAGED_CHUNKS = 0
                    res[f"threshold_only_v2[{tag}]"] = timed(lambda: plan.threshold_only(scores), args.repeats, torch)
                    plan(scores)
                    res[f"filter_only_v2[{tag}]"] = timed(lambda: plan.filter_only(scores), args.repeats, torch)
                    res[f"select_only_v2[{tag}]"] = timed(lambda: plan.select_only(), args.repeats, torch)
                for d, sfx in (("v1", ""), ("v2", "_v2")):
                    plan = plans[d]
                    res["table_hytopk" + sfx] = timed(lambda: plan(scores), args.repeats, torch)
                i_overlap = {}                                   # the staged v2 path overlapped (STAGED_CHUNKS)
                for chunks in OVERLAP_CHUNKS:
                    tab_v2.STAGED_CHUNKS = chunks
                    name = f"table_hytopk_v2[overlap {chunks}]"
                    try:
                        res[name] = timed(lambda: plans["v2"](scores), args.repeats, torch)
                        i_overlap[name] = plans["v2"](scores)[0].copy()
                    except Exception as e:                       # an experiment that fails here: say so, go on
                        row.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:300]
                        print(f"    {name}: {row['errors'][name]}", flush=True)
                    finally:
                        tab_v2.STAGED_CHUNKS = 0
                for d, sfx in (("v1", ""), ("v2", "_v2")):      # the staged path's stages alone
                    plan = plans[d]
                    res["threshold_only" + sfx] = timed(lambda: plan.threshold_only(scores), args.repeats, torch)
                    res["filter_only" + sfx] = timed(lambda: plan.filter_only(scores), args.repeats, torch)
                    res["select_only" + sfx] = timed(lambda: plan.select_only(), args.repeats, torch)
                tab_v2.SELECT_FAST = 0                           # the select before block_select_fast
                res["select_only_v2[sort]"] = timed(lambda: plans["v2"].select_only(), args.repeats, torch)
                tab_v2.SELECT_FAST = 1
                ahead = tab_v2.FILTER_AHEAD
                tab_v2.FILTER_AHEAD = 0
                res["filter_only_v2[no prefetch]"] = timed(lambda: plans["v2"].filter_only(scores), args.repeats, torch)
                tab_v2.FILTER_AHEAD = ahead
                if not args.quick:
                    bplan = backend.plan(lo_h, hi_h, k)     # the pipeline driver's plan (issue 14), no host sync
                    res["backend.plan.table"] = timed(lambda: bplan.table(scores, capture_safe=True), args.repeats,
                                                      torch)
                    res["backend.topk"] = timed(lambda: backend.topk(scores, lo, hi, k), max(2, args.repeats // 2),
                                                torch)
                torch.cuda.synchronize()
                i1, v1 = tab.table_topk(scores, lo, hi, k, host_check=False, method="radix", hist_atomics="plain")
                row["values_equal_torch_topk"] = bool(torch.equal(torch.from_dlpack(v1).view(torch.int32),
                                                                  tv.view(torch.int32)))
                same_idx = {}
                same_idx["fused"] = tab.fused_hytopk(scores, lo, hi, k, count=count, host_check=False)[0]
                same_idx["fused_v2"] = tab.fused_hytopk(scores, lo, hi, k, count=count2, host_check=False,
                                                        design="v2")[0]
                same_idx["fused_v2[one read]"] = i_one
                if i_cl is not None:
                    same_idx["fused_v2[cluster]"] = i_cl
                same_idx["staged"] = plans["v1"](scores)[0].copy()
                same_idx["staged_v2"] = plans["v2"](scores)[0].copy()
                same_idx.update(i_overlap)
                same_idx.update(i_runs)
                graph.replay()
                same_idx["torch.ops.hytopk.topk[graph]"] = gi
                if not args.quick:
                    same_idx["match"] = tab.table_topk(scores, lo, hi, k, host_check=False, method="radix",
                                                       hist_atomics="match")[0]
                row["idx_equals_radix"] = {name: bool(torch.equal(torch.from_dlpack(i1), torch.from_dlpack(i)))
                                           for name, i in same_idx.items()}
                if args.fused_sweep:
                    row["fused_sweep"] = fused_sweep(tab, tab_v2, scores, lo, hi, k, i1, args.repeats, torch, cp)
                    row["fused_sweep_runs"] = fused_sweep(tab, tab_v2, scores, lo, hi, k, i1, args.repeats, torch, cp,
                                                          sampling="runs")
                c1, c2 = cp.asnumpy(count), cp.asnumpy(count2)
                row["fused_rows_past_cap_or_below_k"] = int(((c1 < k) | (c1 > tab.check_topk_k(k)[1])).sum())
                row["fused_v2_rows_flagged"] = int(((c2 < k) | (c2 > tab_v2.fused_cap(k))).sum())
                row["fused_counts_equal"] = bool((c1 == c2).all())
                c3 = cp.asnumpy(count3)
                row["fused_v2_one_read_rows_flagged"] = int(((c3 < k) | (c3 > tab_v2.fused_cap(k))).sum())
                row["fused_v2_one_read_counts_equal"] = bool((c3 == c2).all())
                if i_cl is not None:
                    c4 = cp.asnumpy(count4)
                    row["cluster_geometry"] = dict(zip(("C", "threads", "buf_words", "cap"), geo))
                    row["fused_v2_cluster_rows_flagged"] = int(((c4 < k) | (c4 > geo[3])).sum())
                    row["fused_v2_cluster_counts_equal"] = bool((c4 == c2).all())
                for tag, (cnt, os_) in runs_counts.items():
                    c5 = cp.asnumpy(cnt)
                    cap5 = tab_v2.fused_cap(k, 1, L, os_)          # the launch fused_v2 chose for these rows
                    row[f"fused_v2_rows_flagged[{tag}]"] = int(((c5 < k) | (c5 > cap5)).sum())
                    row[f"fused_v2_mean_count[{tag}]"] = float(c5.mean())
                row["fused_v2_mean_count"] = float(c2.mean())
                for d in ("v1", "v2", "v2[runs]", "v2[runs, os 2]"):
                    st = plans[d].stats()
                    row["hytopk_failed_rows" + ("" if d == "v1" else "_" + d)] = int(st["failed"].sum())
                row["capacity"] = plans["v1"].capacity
                base = res["torch.topk"]["median_ms"]
                for name, r in res.items():
                    r["GBps"] = nbytes / (r["median_ms"] * 1e-3) / 1e9
                    r["speedup_vs_torch_topk"] = base / r["median_ms"]
                row["results"] = res
                out["rows"].append(row)
                print(f"{n}x{L} {dtype} k={k}: values==torch.topk {row['values_equal_torch_topk']}, "
                      f"idx==radix {row['idx_equals_radix']}, fused flagged v1/v2 "
                      f"{row['fused_rows_past_cap_or_below_k']}/{row['fused_v2_rows_flagged']}", flush=True)
                for name, r in res.items():
                    print(f"    {name:28s} {r['median_ms']:8.3f} ms {r['GBps']:7.0f} GB/s "
                          f"{r['speedup_vs_torch_topk']:6.2f}x torch.topk", flush=True)
                plans = plan = bplan = i1 = v1 = tv = count = count2 = same_idx = None   # free before the next k
                i_runs = graph = gi = None

            scores = None
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()
    out["wall_s"] = time.time() - t_start
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
