"""Host time of torch.ops.hytopk.topk per eager call, and where it goes (cProfile), on a GPU.

The device time of the op at 4096 x 131072 float32 is ~0.9 ms; an eager call whose host work is
longer than that leaves the GPU idle between calls (bench_table_topk.py's torch.ops.hytopk.topk
row against its [graph] row).

    python scripts/profile_op_host.py [--n 4096] [--L 131072] [--k 2048] [--calls 200] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--L", type=int, default=131072)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    import torch
    import workbench.torch as wt
    s = torch.randn((args.n, args.L), device="cuda")
    lo = torch.zeros(args.n, dtype=torch.int32, device="cuda")
    hi = torch.full((args.n,), args.L, dtype=torch.int32, device="cuda")
    for _ in range(3):
        wt.topk(s, lo, hi, args.k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        wt.topk(s, lo, hi, args.k)
    host = (time.perf_counter() - t0) / args.calls
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / args.calls
    print(f"host time per call {host * 1e6:.1f} us, wall per call (device-bound when equal to the device "
          f"time) {wall * 1e6:.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        wt.topk(s, lo, hi, args.k)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
