"""Stage 6 on the GPU: overflow/underflow check and compaction of failed rows."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import BLOCK, chunks, i32, kernel, launch, launch_stream


@register("check", "cupy.check.atomic", gpu_only=True)
def check(count, lo, hi, k, capacity):
    """failed[t] per query; rows compacted with warp-aggregated atomics, then sorted (ascending)."""
    with launch_stream():
        count, lo, hi = i32(count, "count"), i32(lo, "lo"), i32(hi, "hi")
        n = count.shape[0]
        failed = cp.zeros(n, cp.uint8)
        rows = cp.empty(n, cp.int32)
        nfailed = cp.zeros(1, cp.int32)
        fn = kernel("check.cu", "hytopk_check")
        launch(fn, (min(chunks(n, BLOCK), 1024),),
               (np.int32(n), count, lo, hi, np.int32(k), np.int32(capacity), failed, rows, nfailed))
        nf = int(nfailed.get()[0])
        return failed.astype(cp.bool_), cp.sort(rows[:nf])
