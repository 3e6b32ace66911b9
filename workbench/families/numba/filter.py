"""Stage 5: fused score-and-filter into the capacity-bounded candidate buffer.

Grid (query, span of ITEMS * BLOCK keys of its context); each round a thread
scores one position and keeps it if key >= key(T). Slots come from one atomic
add per block and round (`block` flavour: shared-memory counter) or per warp
(`warp` flavour: ballot + popc). `count` is the true count (it keeps counting
past capacity); a slot at or beyond capacity is never written.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from .common import BLOCK

ITEMS = 4                      # rounds per block: a block covers ITEMS * BLOCK keys
MAX_GRID_Y = 65535


@lru_cache(maxsize=None)
def filter_kernel(kind: str, flavour: str):
    """The fused score-and-filter kernel for a score source and a flavour."""
    score_at = C.SCORE_FNS[kind]
    append = C.FLAVOURS[flavour].append

    @cuda.jit
    def kernel(a, b, c, lo, hi, T, span, cand_idx, cand_val, count):
        t = cuda.blockIdx.x
        local = cuda.shared.array(2, np.int32)
        if t >= count.shape[0]:
            return
        lo_t = np.int64(lo[t])
        hi_t = np.int64(hi[t])
        start = lo_t + np.int64(cuda.blockIdx.y) * span
        if start >= hi_t:
            return
        stop = min(hi_t, start + span)
        tkey = C.order_key(T[t])
        cap = cand_idx.shape[1]
        for base in range(start, stop, cuda.blockDim.x):
            s = base + cuda.threadIdx.x
            v = np.float32(0.0)
            keep = False
            if s < stop:
                v = score_at(a, b, c, t, s)
                keep = C.order_key(v) >= tkey
            j = append(count, t, keep, local)       # count keeps counting past capacity
            if keep and j < cap:
                cand_idx[t, j] = s
                cand_val[t, j] = v
    return kernel


def run_filter(flavour, source, lo, hi, T, capacity):
    s = C.stream()
    a, b, c, kind = C.source_args(source)
    n = int(lo.shape[0])
    capacity = int(capacity)
    cand_idx = C.empty((n, capacity), np.int32, s)
    cand_val = C.empty((n, capacity), np.float32, s)
    count = C.full((n,), np.int32, 0, s)
    if n == 0:
        return cand_idx, cand_val, count
    lo_h, hi_h = C.host(lo, s), C.host(hi, s)
    c_max = int((hi_h.astype(np.int64) - lo_h).max())
    if c_max <= 0:
        return cand_idx, cand_val, count
    span = BLOCK * ITEMS
    while C.blocks(c_max, span) > MAX_GRID_Y:
        span *= 2
    filter_kernel(kind, flavour)[(n, C.blocks(c_max, span)), BLOCK, s](
        a, b, c, lo, hi, T, np.int64(span), cand_idx, cand_val, count)
    return cand_idx, cand_val, count


@register("filter", "numba.filter.block")
def filter_block(source, lo, hi, T, capacity):
    """Score and compare; one global atomic per block and round (shared-memory counter)."""
    return run_filter("block", source, lo, hi, T, capacity)


@register("filter", "numba.filter.warp", gpu_only=True)
def filter_warp(source, lo, hi, T, capacity):
    """Score and compare; warp-aggregated atomics (ballot + popc + shfl)."""
    return run_filter("warp", source, lo, hi, T, capacity)
