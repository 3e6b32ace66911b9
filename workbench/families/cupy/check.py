"""Stage 6 on the GPU: overflow/underflow check and compaction of failed rows."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import BLOCK, chunks, i32, kernel, launch, launch_stream


def check_on_device(count, lo, hi, k, capacity):
    """The check kernel, nothing waited for: (failed uint8 [n], rows int32 [n] whose first
    *nfailed entries are the failed queries in arbitrary order, nfailed int32 [1])."""
    count, lo, hi = i32(count, "count"), i32(lo, "lo"), i32(hi, "hi")
    n = count.shape[0]
    failed = cp.zeros(n, cp.uint8)
    rows = cp.empty(max(n, 1), cp.int32)
    nfailed = cp.zeros(1, cp.int32)
    launch(kernel("check.cu", "hytopk_check"), (min(chunks(n, BLOCK), 1024),),
           (np.int32(n), count, lo, hi, np.int32(k), np.int32(capacity), failed, rows, nfailed))
    return failed, rows, nfailed


@register("check", "cupy.check.atomic", gpu_only=True)
def check(count, lo, hi, k, capacity):
    """failed[t] per query; rows compacted with warp-aggregated atomics, then sorted (ascending)."""
    with launch_stream():
        failed, rows, nfailed = check_on_device(count, lo, hi, k, capacity)
        nf = int(nfailed.get()[0])                  # the host learns how many failed (one sync)
        return failed.astype(cp.bool_), cp.sort(rows[:nf])
