"""Indexer scores at a set of positions per query, -inf where there is none: one kernel for the
dense table (every key of the context) and for selection replay (the k selected keys), built
per position rule, on the family's one tiled scorer (tile.score_tile), so both agree with the
fused filter bit for bit."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, int32

from . import common as C
from . import tile as TL


@cuda.jit(device=True)
def dense_position(a, b, keys, t, j):
    """Column j of a dense row is key j, scored inside the context [a[t], b[t]) = [lo, hi)."""
    if a[t] <= j < b[t]:
        return j
    return -1


@cuda.jit(device=True)
def replay_position(a, b, keys, t, j):
    """Column j of a replay row is the selected key a[t, j] (a = idx), scored when it is a key."""
    s = a[t, j]
    if 0 <= s < keys.shape[0]:
        return s
    return -1


POSITIONS = {"dense": dense_position, "replay": replay_position}


@lru_cache(maxsize=None)
def score_rows_kernel(position: str, hg: int, cfg: TL.Tile):
    """out[t, j] = I(t, s) for s = position(t, j), -inf where there is no key; grid (query,
    column tiles), each block loops over its tiles."""
    where = POSITIONS[position]
    score, scratch, tile_has_key = TL.score_tile(hg, cfg), TL.scratch(cfg), TL.has_key(cfg)
    TK, NT = cfg.tk, cfg.block

    @cuda.jit(**cfg.jit)                # launch bounds: the shape's registers per thread
    def kernel(q2, w, keys, a, b, out, scaled):
        key_s, q_s, acc_s, pos_s = scratch()
        flag = cuda.shared.array(1, int32)
        t = cuda.blockIdx.x
        if t >= out.shape[0]:
            return
        width = out.shape[1]
        for c0 in range(cuda.blockIdx.y * TK, width, cuda.gridDim.y * TK):
            for j in range(cuda.threadIdx.x, TK, NT):
                pos_s[j] = where(a, b, keys, t, c0 + j) if c0 + j < width else -1
            if tile_has_key(pos_s, flag):
                score(q2, w, keys, scaled, t, pos_s, key_s, q_s, acc_s)
            for j in range(cuda.threadIdx.x, TK, NT):
                if c0 + j < width:
                    out[t, c0 + j] = acc_s[j] if pos_s[j] >= 0 else C.NEG_INF
            cuda.syncthreads()          # pos_s / acc_s are rewritten by the next tile
    return kernel


MAX_GRID_Y = 65535


def score_rows(position, q, w, keys, a, b, width, kscale=None):
    """Launch on [n, width] output. ``kscale``: the fp8 keys' scales (keys are then the decoded
    values), packed beside the keys as their last column (common.pack_scaled_keys)."""
    s = C.stream()
    n, H, D = (int(x) for x in q.shape)
    out = C.empty((n, int(width)), np.float32, s)
    if not (n and width):
        return out
    kk, scaled = (keys, 0) if kscale is None else (C.pack_scaled_keys(keys, kscale, s), 1)
    cfg = TL.current()
    grid_y = min(C.blocks(width, cfg.tk), MAX_GRID_Y)
    score_rows_kernel(position, cfg.heads_per_warp(H), cfg)[(n, grid_y), cfg.block, s](
        q.reshape(n, H * D), w, kk, a, b, out, np.int64(scaled))
    return out
