"""Stage 6: which queries failed (overflow or underflow), compacted into `rows`.

One thread per query; failed rows are appended block-aggregated (`block`
flavour) or warp-aggregated (`warp`). `rows` is in any order; its length comes
back to the host (the driver needs it to choose recovery or fallback), so this
stage synchronises once.
"""
from __future__ import annotations

from functools import lru_cache

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


@lru_cache(maxsize=None)
def check_kernel(flavour: str, failed_fn=None):
    """The check kernel of a flavour; ``failed_fn`` (default: query_failed) decides one query."""
    reserve = C.FLAVOURS[flavour].reserve
    fails = failed_fn if failed_fn is not None else query_failed

    @cuda.jit
    def kernel(count, lo, hi, k, capacity, failed, rows, nrows):
        t = cuda.grid(1)
        local = cuda.shared.array(2, np.int32)
        bad = False
        if t < count.shape[0]:
            bad = fails(count, lo, hi, t, k, capacity)
            failed[t] = 1 if bad else 0
        j = reserve(nrows, 0, 1 if bad else 0, local)
        if bad and j < rows.shape[0]:
            rows[j] = t
    return kernel


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
    return run_check(check_kernel("block"), count, lo, hi, k, capacity)


@register("check", "numba.check.warp", gpu_only=True)
def check_warp(count, lo, hi, k, capacity):
    """One thread per query; warp-aggregated append (shuffle scan, one atomic per warp)."""
    return run_check(check_kernel("warp"), count, lo, hi, k, capacity)
