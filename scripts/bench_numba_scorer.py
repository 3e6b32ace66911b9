"""The Numba family's tiled scorer beside the CuPy SIMT scorer on a preset's shape (float32
inputs, the work the `numba.*[indexer]` and `cupy.*.simt[indexer]` rows of `hytopk compare` do):
dense table and fused filter, as the effective rate 2 H D sum(c) / time. A subset of the
preset's queries (--queries, spread over all of them) keeps the run under ~30 s; both
scorers check their dense tables against each other (exact-arithmetic inputs: bit-equal).

    python scripts/bench_numba_scorer.py --preset dsv32-128k --json out.json
"""
from __future__ import annotations

import argparse
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
    print(f"GPU {gpu}  {p.name}: {len(pick)} of {p.n} queries, L={p.L} H={p.H} D={p.D}, "
          f"numba tile TK={tile.TK} KPT={tile.KPT} HG={tile.heads_per_warp(p.H)} DT={tile.DT}", flush=True)

    same = bool(cp.array_equal(cp.asarray(ndense.dense_tiled(nq, nw, nk, nlo, nhi)).view(cp.uint32),
                               cdense.dense(qd, wd, kd, lo_d, hi_d).view(cp.uint32)))
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
    out = {"gpu": gpu, "date": time.strftime("%Y-%m-%d %H:%M"), "preset": p.name, "queries": len(pick),
           "L": p.L, "H": p.H, "D": p.D, "sum_c": int(c.sum()), "capacity": cap, "dense_bit_equal": same,
           "tile": {"TK": tile.TK, "KPT": tile.KPT, "DT": tile.DT, "HG": tile.heads_per_warp(p.H)},
           "rows": rows, "wall_s": time.perf_counter() - t_start}
    print(f"  wall {out['wall_s']:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
