"""Stage 6: which queries failed (overflow or underflow), compacted into `rows`.

`rows` is in any order; its length comes back to the host (the driver needs
it to choose recovery or fallback), so this stage synchronises once.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from .common import BLOCK


@cuda.jit(device=True)
def query_failed(count, lo, hi, t, k, capacity):
    c = np.int64(hi[t]) - np.int64(lo[t])
    n_c = np.int64(count[t])
    return c > k and (n_c > capacity or n_c < k)


@cuda.jit
def check_block_kernel(count, lo, hi, k, capacity, failed, rows, nrows):
    t = cuda.grid(1)
    local = cuda.shared.array(2, np.int32)
    if cuda.threadIdx.x == 0:
        local[0] = 0
    cuda.syncthreads()
    bad = False
    slot = 0
    if t < count.shape[0]:
        bad = query_failed(count, lo, hi, t, k, capacity)
        failed[t] = 1 if bad else 0
        if bad:
            slot = cuda.atomic.add(local, 0, 1)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and local[0] > 0:
        local[1] = cuda.atomic.add(nrows, 0, local[0])
    cuda.syncthreads()
    if bad:
        j = local[1] + slot
        if j < rows.shape[0]:
            rows[j] = t


@cuda.jit
def check_warp_kernel(count, lo, hi, k, capacity, failed, rows, nrows):
    t = cuda.grid(1)
    bad = False
    if t < count.shape[0]:
        bad = query_failed(count, lo, hi, t, k, capacity)
        failed[t] = 1 if bad else 0
    ballot = cuda.ballot_sync(C.FULL_MASK, bad)
    first = 0
    if cuda.laneid == 0 and ballot != 0:
        first = cuda.atomic.add(nrows, 0, cuda.popc(ballot))
    first = cuda.shfl_sync(C.FULL_MASK, first, 0)
    if bad:
        j = first + cuda.popc(ballot & ((1 << cuda.laneid) - 1))
        if j < rows.shape[0]:
            rows[j] = t


def run_check(kernel, count, lo, hi, k, capacity):
    s = C.stream()
    n = int(count.shape[0])
    failed = C.empty((n,), np.uint8, s)
    rows = C.empty((max(n, 1),), np.int32, s)
    nrows = C.full((1,), np.int32, 0, s)
    if n:
        kernel[C.blocks(n, BLOCK), BLOCK, s](count, lo, hi, np.int64(k), np.int64(capacity),
                                             failed, rows, nrows)
    nf = int(C.host(nrows, s)[0])
    return failed, rows[:nf]


@register("check", "numba.check.block")
def check_block(count, lo, hi, k, capacity):
    """One thread per query; block-aggregated append of failed rows."""
    return run_check(check_block_kernel, count, lo, hi, k, capacity)


@register("check", "numba.check.warp", gpu_only=True)
def check_warp(count, lo, hi, k, capacity):
    """One thread per query; warp-aggregated append (ballot + popc)."""
    return run_check(check_warp_kernel, count, lo, hi, k, capacity)
