"""The capture-safe run of a planned selection on the CPU, with dry launches (NumPy standing in
for CuPy: tests/fake_cupy/cupy): what a CUDA graph of it would hold, and the host's Python cost.

    python tests/fake_cupy/run_pipeline.py N L K [--dtype bf16|fp8] [--layout full|causal] [--reps R]

Prints one JSON line: launches (RawKernel launches of one call), by_kernel, array_ops (CuPy
array operations: fills, casts, copies: graph nodes too), passes, host_us (median Python time of
one call, launches not run, NumPy's data moves in the stand-ins left out). Run in a subprocess (tests/test_launch_count.py): the stand-in
cupy must never reach the process of the other tests."""
import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))             # the stand-in cupy first
import cupy as fake                       # noqa: E402
import workbench                          # noqa: E402
from workbench.families.cupy import _launch  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int)
    ap.add_argument("L", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--layout", default="causal", choices=("full", "causal"))
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--max-failed", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--eager", action="store_true", help="the eager run instead (its check syncs: no counts)")
    a = ap.parse_args(argv)
    n, L, H, D = a.n, a.L, a.H, a.D
    if a.layout == "full":
        lo, hi = np.zeros(n, np.int32), np.full(n, L, np.int32)
    else:                                  # the last n queries of a causal context of L keys
        hi = np.arange(L - n + 1, L + 1, dtype=np.int32)
        lo = np.zeros(n, np.int32)
    if a.dtype == "bf16":
        q, w, keys, ks = np.zeros((n, H, D), np.uint16), np.zeros((n, H), np.float32), np.zeros((L, D), np.uint16), None
    else:
        q, w, keys = np.zeros((n, H, D), np.uint8), np.zeros((n, H), np.float32), np.zeros((L, D), np.uint8)
        ks = np.ones(L, np.float32)
    q, w, keys = (fake.asarray(x) for x in (q, w, keys))
    ks = fake.asarray(ks) if ks is not None else None
    b = workbench.backend("cupy")
    plan = b.plan(lo, hi, a.k, L=L, max_failed=a.max_failed)
    times = []
    for rep in range(a.reps + 1):
        fake.COUNTS.clear()
        fake.DATA_S[0] = 0.0
        with _launch.record_launches(dry=True) as rec:
            t = time.perf_counter()
            plan(q, w, keys, kscale=ks, capture_safe=True)
            times.append((time.perf_counter() - t - fake.DATA_S[0]) * 1e6)   # NumPy's data moves left out
    by = collections.Counter(name.split(":", 1)[1].split("<", 1)[0] for name in rec.names())
    print(json.dumps({"launches": len(rec.launches), "by_kernel": dict(by), "array_ops": dict(fake.COUNTS),
                      "passes": len(plan.passes), "threshold_spans": len(plan.threshold_spans),
                      "host_us": float(np.median(times[1:])), "host_us_min": float(np.min(times[1:])), "host_us_per_launch":
                      float(np.median(times[1:])) / max(1, len(rec.launches))}))


if __name__ == "__main__":
    main()
