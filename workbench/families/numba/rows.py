"""Indexer scores at a set of positions per query, -inf where there is none: one kernel for the
dense table (every key of the context) and for selection replay (the k selected keys), built
per position rule and per staging, with the family's one scoring routine (common.indexer_score),
so both agree with the fused filter bit for bit."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32

from . import common as C
from .common import BLOCK

SMEM_LIMIT = 48 * 1024        # default dynamic shared memory without opt-in


@cuda.jit(device=True)
def dense_position(a, b, keys, t, j):
    """Column j of a dense row is key j, scored inside the context [a[t], b[t]) = [lo, hi)."""
    return j, a[t] <= j < b[t]


@cuda.jit(device=True)
def replay_position(a, b, keys, t, j):
    """Column j of a replay row is the selected key a[t, j] (a = idx), scored when it is a key."""
    s = a[t, j]
    return s, 0 <= s < keys.shape[0]


POSITIONS = {"dense": dense_position, "replay": replay_position}


@lru_cache(maxsize=None)
def score_rows_kernel(position: str, staged: bool):
    """out[t, j] = I(t, s) for (s, ok) = position(t, j), -inf where not ok; grid (query,
    column blocks), grid-stride over columns. staged: q[t] and w[t] are read once per block
    into dynamic shared memory (a broadcast to every thread) instead of from global memory."""
    where = POSITIONS[position]

    @cuda.jit
    def kernel(q2, w, keys, a, b, out, scaled):
        t = cuda.blockIdx.x
        if t >= out.shape[0]:
            return
        H = w.shape[1]
        HD = q2.shape[1]
        if staged:
            sh = cuda.shared.array(0, float32)
            for i in range(cuda.threadIdx.x, HD, cuda.blockDim.x):
                sh[i] = q2[t, i]
            for i in range(cuda.threadIdx.x, H, cuda.blockDim.x):
                sh[HD + i] = w[t, i]
            cuda.syncthreads()
            qs = sh[:HD]
            ws = sh[HD:HD + H]
        else:
            qs = q2[t]
            ws = w[t]
        j = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        stride = cuda.gridDim.y * cuda.blockDim.x
        while j < out.shape[1]:
            s, ok = where(a, b, keys, t, j)
            if ok:
                out[t, j] = C.indexer_score_ks(qs, ws, keys, s, H, scaled)
            else:
                out[t, j] = C.NEG_INF
            j += stride
    return kernel


def score_rows(position, staged, q, w, keys, a, b, width, max_blocks_y=None, kscale=None):
    """Launch on [n, width] output; ``max_blocks_y`` caps the column blocks of a staged launch
    (each block stages q[t] once). A q row too large for shared memory is read from global
    memory instead: the same scores. ``kscale``: the fp8 keys' scales (keys are then the decoded
    values), packed beside the keys as their last column (common.pack_scaled_keys)."""
    s = C.stream()
    n, H, D = (int(x) for x in q.shape)
    out = C.empty((n, int(width)), np.float32, s)
    if not (n and width):
        return out
    smem = 4 * (H * D + H)
    staged = bool(staged) and smem <= SMEM_LIMIT
    grid_y = C.blocks(width, BLOCK)
    if staged and max_blocks_y:
        grid_y = min(grid_y, max_blocks_y)
    kk, scaled = (keys, 0) if kscale is None else (C.pack_scaled_keys(keys, kscale, s), 1)
    score_rows_kernel(position, staged)[(n, grid_y), BLOCK, s, smem if staged else 0](
        q.reshape(n, H * D), w, kk, a, b, out, np.int64(scaled))
    return out
