"""The score cores side by side on a preset's shape, without the oracle (the tests check
correctness; `hytopk compare` checks every row and gives the committed figures). Per core:
score-only floor, fused filter (the core's own threshold), dense table; bf16 and fp8; the
effective rate 2 H D sum(c) / time over the bf16 GEMM rate measured in the same run.

    python scripts/bench_core.py --preset dsv32-128k --preset glm5-128k --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference as R                                              # noqa: E402
from reference.fp8 import exact_fp8_source                         # noqa: E402
from workbench.bf16 import float32_to_bf16_bits                    # noqa: E402
from workbench.families.cupy import mma_sync as MS, wgmma as WG, wgmma_ws as WS   # noqa: E402
from workbench.harness.presets import get as get_preset, make_inputs  # noqa: E402


def timed(fn, budget_s=3.0, min_reps=3, max_reps=30):
    """Median and min in ms over repeats (first call = warm-up / compile)."""
    fn()
    cp.cuda.Device().synchronize()
    times, t_end = [], time.perf_counter() + budget_s
    a, b = cp.cuda.Event(), cp.cuda.Event()
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() < t_end):
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(times)), float(np.min(times)), len(times)


def gemm_tflops():
    import torch
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    med, _, _ = timed(lambda: torch.mm(x, y), budget_s=2.0)
    return 2 * 8192 ** 3 / (med * 1e-3) / 1e12


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", action="append", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--cores", default="mma_sync,wgmma,wgmma_ws,wgmma_ws2")
    ap.add_argument("--no-dense", action="store_true")
    args = ap.parse_args(argv)
    cores = args.cores.split(",")
    gemm = gemm_tflops()
    print(f"GPU {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}  bf16 GEMM {gemm:.0f} TFLOP/s", flush=True)
    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "gemm_tflops": gemm, "presets": {}}
    for name in args.preset or ["dsv32-128k"]:
        p = get_preset(name)
        q, w, keys, lo, hi = make_inputs(p)
        c = (hi.astype(np.int64) - lo).clip(0)
        flop = 2.0 * p.H * p.D * float(c.sum())
        qb, wb, kb = (cp.asarray(float32_to_bf16_bits(x)) for x in (q, w, keys))
        src = R.IndexerSource(qb, wb, kb)
        lo_d, hi_d = cp.asarray(lo.astype(np.int32)), cp.asarray(hi.astype(np.int32))
        M, r = (cp.asarray(x) for x in R.sample_plan(lo, hi, p.k, p.oversample))
        cap = R.default_capacity(p.k, lo, hi, p.oversample)
        T = WS.threshold_ws(src, lo_d, hi_d, M, r)
        f8 = exact_fp8_source(cp.asarray(q), cp.asarray(w), cp.asarray(keys), cp)
        del q, keys
        rows = {}

        def row(label, fn):
            try:
                med, mn, reps = timed(fn)
            except Exception as e:                              # a broken core is a row, not a crash
                rows[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"  {name:18s} {label:28s} ERROR {rows[label]['error']}", flush=True)
                return
            rate = flop / (med * 1e-3) / 1e12
            rows[label] = {"ms": med, "min_ms": mn, "reps": reps, "tflops": rate, "vs_gemm": rate / gemm}
            print(f"  {name:18s} {label:28s} {med:9.3f} ms  {rate:6.0f} TFLOP/s  {rate / gemm:.3f} of GEMM", flush=True)
            cp.get_default_memory_pool().free_all_blocks()

        calls = {
            "mma_sync": dict(score=lambda: MS.score_only_mma_sync(qb, wb, kb, lo_d, hi_d),
                          filt=lambda: MS.filter_mma_sync(src, lo_d, hi_d, T, cap),
                          dense=lambda: MS.dense_mma_sync(qb, wb, kb, lo_d, hi_d)),
            "wgmma": dict(score=lambda: WG.score_only_wgmma(src, lo_d, hi_d),
                          filt=lambda: WG.filter_wgmma(src, lo_d, hi_d, T, cap),
                          dense=lambda: WG.dense_wgmma_source(src, lo_d, hi_d),
                          score8=lambda: WG.score_only_wgmma(f8, lo_d, hi_d),
                          filt8=lambda: WG.filter_wgmma(f8, lo_d, hi_d, T, cap)),
            "wgmma_ws": dict(score=lambda: WS.score_only_ws(src, lo_d, hi_d),
                             filt=lambda: WS.filter_ws(src, lo_d, hi_d, T, cap),
                             dense=lambda: WS.dense_source(src, lo_d, hi_d),
                             score8=lambda: WS.score_only_ws(f8, lo_d, hi_d),
                             filt8=lambda: WS.filter_ws(f8, lo_d, hi_d, T, cap)),
            "wgmma_ws2": dict(score=lambda: WS.score_only_ws(src, lo_d, hi_d, consumers=2),
                              filt=lambda: WS.filter_source(src, lo_d, hi_d, T, cap, consumers=2)),
        }
        dense_ok = not args.no_dense and p.n * p.L * 4 <= 24 << 30
        for core in cores:
            for kind, label in (("score", "score_only"), ("filt", "filter"), ("dense", "dense"),
                                ("score8", "score_only fp8"), ("filt8", "filter fp8")):
                if kind in calls[core] and (kind != "dense" or dense_ok):
                    row(f"{core} {label}", calls[core][kind])
        out["presets"][name] = {"n": p.n, "L": p.L, "H": p.H, "D": p.D, "k": p.k, "sum_c": int(c.sum()),
                                "capacity": cap, "rows": rows}
        calls = None
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
