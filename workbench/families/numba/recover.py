"""Stage 7: exact top-k of the listed (failed) queries over their whole context.

The listed rows are materialised (scores and positions of each context,
len(rows) x max c entries: memory bounded by the rows passed, which the driver
caps at max_failed or a fallback chunk), then the select engine of select.py
runs over them. Indexer scores come from the family's tiled scorer (tile.score_tile).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from . import tile as TL
from .common import BLOCK
from .select import select_rows


@lru_cache(maxsize=None)
def materialise_kernel(kind):
    score_at = C.SCORE_FNS[kind]

    @cuda.jit
    def kernel(a, b, c, lo, hi, rows, vals, pos, count):
        j = cuda.blockIdx.x
        if j >= rows.shape[0]:
            return
        t = rows[j]
        lo_t = np.int64(lo[t])
        c_t = np.int64(hi[t]) - lo_t
        width = vals.shape[1]
        if cuda.blockIdx.y == 0 and cuda.threadIdx.x == 0:
            count[j] = min(c_t, width)
        i = np.int64(cuda.blockIdx.y) * cuda.blockDim.x + cuda.threadIdx.x
        stride = np.int64(cuda.gridDim.y) * cuda.blockDim.x
        while i < c_t and i < width:
            vals[j, i] = score_at(a, b, c, t, lo_t + i)
            pos[j, i] = lo_t + i
            i += stride
    return kernel


@lru_cache(maxsize=None)
def materialise_tiled_kernel(hg: int, cfg: TL.Tile):
    """Indexer rows: block (listed row, tiles of its context) through the tiled scorer."""
    score, scratch = TL.score_tile(hg, cfg), TL.scratch(cfg)
    TK, NT = cfg.tk, cfg.block

    @cuda.jit(**cfg.jit)                # launch bounds: the shape's registers per thread
    def kernel(q2, w, keys, scaled, lo, hi, rows, vals, pos, count):
        key_s, q_s, acc_s, pos_s = scratch()
        j = cuda.blockIdx.x
        if j >= rows.shape[0]:
            return
        t = rows[j]
        lo_t = np.int64(lo[t])
        lim = min(np.int64(hi[t]) - lo_t, vals.shape[1])
        if cuda.blockIdx.y == 0 and cuda.threadIdx.x == 0:
            count[j] = lim
        for i0 in range(np.int64(cuda.blockIdx.y) * TK, lim, np.int64(cuda.gridDim.y) * TK):
            for e in range(cuda.threadIdx.x, TK, NT):
                pos_s[e] = lo_t + i0 + e if i0 + e < lim else -1
            score(q2, w, keys, scaled, t, pos_s, key_s, q_s, acc_s)
            for e in range(cuda.threadIdx.x, TK, NT):
                if i0 + e < lim:
                    vals[j, i0 + e] = acc_s[e]
                    pos[j, i0 + e] = lo_t + i0 + e
    return kernel


def run_recover(flavour, source, lo, hi, rows, k):
    s = C.stream()
    a, b, c, kind = C.source_args(source)
    nr = int(rows.shape[0])
    k = int(k)
    if nr == 0:
        return C.empty((0, k), np.int32, s), C.empty((0, k), np.float32, s)
    rows_h = C.host(rows, s)
    lo_h, hi_h = C.host(lo, s), C.host(hi, s)
    width = max(1, int((hi_h[rows_h].astype(np.int64) - lo_h[rows_h]).max()))
    vals = C.empty((nr, width), np.float32, s)
    pos = C.empty((nr, width), np.int32, s)
    count = C.empty((nr,), np.int32, s)
    if kind == "table":
        grid_y = min(C.blocks(width, BLOCK), 1024)
        materialise_kernel(kind)[(nr, grid_y), BLOCK, s](a, b, c, lo, hi, rows, vals, pos, count)
    else:
        cfg = TL.current()
        grid_y = min(C.blocks(width, cfg.tk), 1024)
        materialise_tiled_kernel(cfg.heads_per_warp(b.shape[1]), cfg)[(nr, grid_y), cfg.block, s](
            a, b, c, np.int64(kind == "indexer_fp8"), lo, hi, rows, vals, pos, count)
    return select_rows(flavour, vals, pos, count, k, s)


@register("recover", "numba.recover.block")
def recover_block(source, lo, hi, rows, k):
    """Materialise the listed rows, then the block radix select/sort."""
    return run_recover("block", source, lo, hi, rows, k)


@register("recover", "numba.recover.warp", gpu_only=True)
def recover_warp(source, lo, hi, rows, k):
    """Materialise the listed rows, then the warp-aggregated radix select/sort."""
    return run_recover("warp", source, lo, hi, rows, k)
