"""Dense indexer scores [n, L] (-inf outside each context), from the family's
one scoring routine so they equal the fused filter's scores bit for bit."""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from ...registry import register
from . import common as C
from .common import BLOCK

SMEM_LIMIT = 48 * 1024        # default dynamic shared memory without opt-in


@cuda.jit
def dense_block_kernel(q2, w, keys, lo, hi, out, scaled):
    t = cuda.blockIdx.x
    s = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if t < out.shape[0] and s < out.shape[1]:
        if lo[t] <= s < hi[t]:
            out[t, s] = C.indexer_score_ks(q2[t], w[t], keys, s, w.shape[1], scaled)
        else:
            out[t, s] = C.NEG_INF


@cuda.jit
def dense_smem_kernel(q2, w, keys, lo, hi, out, scaled):
    """q[t] and w[t] staged once per block in dynamic shared memory (read by every
    thread: broadcast), each thread scoring one key with the same routine."""
    t = cuda.blockIdx.x
    H = w.shape[1]
    HD = q2.shape[1]
    sh = cuda.shared.array(0, float32)
    if t >= out.shape[0]:
        return
    for i in range(cuda.threadIdx.x, HD, cuda.blockDim.x):
        sh[i] = q2[t, i]
    for i in range(cuda.threadIdx.x, H, cuda.blockDim.x):
        sh[HD + i] = w[t, i]
    cuda.syncthreads()
    lo_t = lo[t]
    hi_t = hi[t]
    qs = sh[:HD]
    ws = sh[HD:HD + H]
    s = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    stride = cuda.gridDim.y * cuda.blockDim.x
    while s < out.shape[1]:
        if lo_t <= s < hi_t:
            out[t, s] = C.indexer_score_ks(qs, ws, keys, s, H, scaled)
        else:
            out[t, s] = C.NEG_INF
        s += stride


def _flat(q):
    n, H, D = q.shape
    return q.reshape(n, H * D)


def _keys(keys, kscale, s):
    """(keys array, scaled flag): fp8 keys (decoded values) are packed with their scales."""
    return (keys, 0) if kscale is None else (C.pack_scaled_keys(keys, kscale, s), 1)


@register("dense", "numba.dense.block")
def dense_block(q, w, keys, lo, hi, kscale=None):
    """One thread per (query, key), q read from global memory. kscale: fp8 keys' scales."""
    s = C.stream()
    n, L = int(q.shape[0]), int(keys.shape[0])
    out = C.empty((n, L), np.float32, s)
    if n and L:
        kk, scaled = _keys(keys, kscale, s)
        dense_block_kernel[(n, C.blocks(L, BLOCK)), BLOCK, s](_flat(q), w, kk, lo, hi, out, scaled)
    return out


@register("dense", "numba.dense.smem", gpu_only=True)
def dense_smem(q, w, keys, lo, hi, kscale=None):
    """q[t], w[t] in dynamic shared memory; grid-stride over keys."""
    s = C.stream()
    n, H, D = (int(x) for x in q.shape)
    L = int(keys.shape[0])
    out = C.empty((n, L), np.float32, s)
    if n and L and 4 * (H * D + H) > SMEM_LIMIT:
        return dense_block(q, w, keys, lo, hi, kscale)  # q row does not fit: same scores, global reads
    if n and L:
        kk, scaled = _keys(keys, kscale, s)
        grid_y = min(C.blocks(L, BLOCK), 64)
        dense_smem_kernel[(n, grid_y), BLOCK, s, 4 * (H * D + H)](_flat(q), w, kk, lo, hi, out, scaled)
    return out
