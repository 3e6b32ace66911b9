"""Stage 5: fused score-and-filter into the capacity-bounded candidate buffer.

Grid (query, span of its context); each round a thread takes ITEMS positions
and keeps those with key >= key(T), then reserves slots for them: one atomic
add per block and round (`block` flavour: shared-memory counter) or per warp
and round (`warp` flavour: shuffle scan). `count` is the true count (it keeps
counting past capacity); a slot at or beyond capacity is never written.
Table rows are read per position; indexer rows are scored a tile at a time by
the family's tiled scorer (tile.score_tile), a round being one tile.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from . import tile as TL
from .common import BLOCK

ITEMS = 4                      # positions per thread per round
MAX_GRID_Y = 65535


@cuda.jit(device=True)
def block_span(lo, hi, t, span, n):
    """[start, stop) of query t's context that this block covers (start >= stop: none, also for
    a block past the n queries)."""
    if t >= n:
        return np.int64(0), np.int64(0)
    start = np.int64(lo[t]) + np.int64(cuda.blockIdx.y) * span
    return start, min(np.int64(hi[t]), start + span)


@lru_cache(maxsize=None)
def appender(flavour: str):
    """Append this thread's hits (hit[i] != 0: position pos[i], score val[i]) to query t's buffer:
    the flavour reserves the slots, a slot at or past capacity is counted and never written."""
    reserve = C.FLAVOURS[flavour].reserve

    @cuda.jit(device=True)
    def append(count, t, mine, hit, pos, val, local, cand_idx, cand_val):
        j = reserve(count, t, mine, local)     # count keeps counting past capacity
        for it in range(hit.shape[0]):
            if hit[it] != 0:
                if j < cand_idx.shape[1]:
                    cand_idx[t, j] = pos[it]
                    cand_val[t, j] = val[it]
                j += 1
    return append


@lru_cache(maxsize=None)
def filter_kernel(kind: str, flavour: str):
    """The fused read-and-filter kernel for the table source and a flavour."""
    score_at = C.SCORE_FNS[kind]
    append = appender(flavour)

    @cuda.jit
    def kernel(a, b, c, lo, hi, T, span, cand_idx, cand_val, count):
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        local = cuda.shared.array(2, np.int32)
        hit = cuda.local.array(ITEMS, np.int32)
        pos = cuda.local.array(ITEMS, np.int64)
        val = cuda.local.array(ITEMS, np.float32)
        start, stop = block_span(lo, hi, t, span, count.shape[0])
        if start >= stop:
            return
        tkey = C.order_key(T[t])
        for base in range(start, stop, nt * ITEMS):
            mine = 0
            for it in range(ITEMS):
                s = base + it * nt + tid
                hit[it] = 0
                if s < stop:
                    v = score_at(a, b, c, t, s)
                    if C.order_key(v) >= tkey:
                        hit[it] = 1
                        pos[it] = s
                        val[it] = v
                        mine += 1
            append(count, t, mine, hit, pos, val, local, cand_idx, cand_val)
    return kernel


@lru_cache(maxsize=None)
def filter_tiled_kernel(flavour: str, hg: int, cfg: TL.Tile):
    """The fused score-and-filter kernel for indexer sources: a round scores one tile of TK keys."""
    append = appender(flavour)
    score, scratch = TL.score_tile(hg, cfg), TL.scratch(cfg)
    TK, ITEMS_T, NT = cfg.tk, cfg.items, cfg.block

    @cuda.jit(**cfg.jit)                # launch bounds: the shape's registers per thread
    def kernel(q2, w, keys, scaled, lo, hi, T, span, cand_idx, cand_val, count):
        key_s, q_s, acc_s, pos_s = scratch()
        local = cuda.shared.array(2, np.int32)
        hit = cuda.local.array(ITEMS_T, np.int32)
        pos = cuda.local.array(ITEMS_T, np.int64)
        val = cuda.local.array(ITEMS_T, np.float32)
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        start, stop = block_span(lo, hi, t, span, count.shape[0])
        if start >= stop:
            return
        tkey = C.order_key(T[t])
        for base in range(start, stop, TK):
            for j in range(tid, TK, NT):
                pos_s[j] = base + j if base + j < stop else -1
            score(q2, w, keys, scaled, t, pos_s, key_s, q_s, acc_s)
            mine = 0
            for it in range(ITEMS_T):
                j = it * NT + tid
                hit[it] = 0
                if j < TK and pos_s[j] >= 0 and C.order_key(acc_s[j]) >= tkey:
                    hit[it] = 1
                    pos[it] = pos_s[j]
                    val[it] = acc_s[j]
                    mine += 1
            append(count, t, mine, hit, pos, val, local, cand_idx, cand_val)
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
    cfg = TL.current()
    span = BLOCK * ITEMS if kind == "table" else cfg.tk
    while C.blocks(c_max, span) > MAX_GRID_Y:
        span *= 2
    grid = (n, C.blocks(c_max, span))
    if kind == "table":
        filter_kernel(kind, flavour)[grid, BLOCK, s](a, b, c, lo, hi, T, np.int64(span), cand_idx, cand_val, count)
    else:
        filter_tiled_kernel(flavour, cfg.heads_per_warp(b.shape[1]), cfg)[grid, cfg.block, s](
            a, b, c, np.int64(kind == "indexer_fp8"), lo, hi, T, np.int64(span), cand_idx, cand_val, count)
    return cand_idx, cand_val, count


@register("filter", "numba.filter.block")
def filter_block(source, lo, hi, T, capacity):
    """Score and compare; one global atomic per block and round (shared-memory counter)."""
    return run_filter("block", source, lo, hi, T, capacity)


@register("filter", "numba.filter.warp", gpu_only=True)
def filter_warp(source, lo, hi, T, capacity):
    """Score and compare; warp-aggregated atomics (shuffle scan of each lane's hits)."""
    return run_filter("warp", source, lo, hi, T, capacity)
