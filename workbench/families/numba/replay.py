"""Selection replay: rescore only the k selected entries of each query, with
the family's one scoring routine (bit-equal to the fused filter's scores)."""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from ...registry import register
from . import common as C
from .common import BLOCK

SMEM_LIMIT = 48 * 1024        # default dynamic shared memory without opt-in


@cuda.jit
def replay_block_kernel(q2, w, keys, idx, out, scaled):
    t = cuda.blockIdx.x
    j = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if t < out.shape[0] and j < out.shape[1]:
        s = idx[t, j]
        if 0 <= s < keys.shape[0]:
            out[t, j] = C.indexer_score_ks(q2[t], w[t], keys, s, w.shape[1], scaled)
        else:
            out[t, j] = C.NEG_INF


@cuda.jit
def replay_smem_kernel(q2, w, keys, idx, out, scaled):
    """One block per query: q[t], w[t] staged in dynamic shared memory."""
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
    qs = sh[:HD]
    ws = sh[HD:HD + H]
    for j in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        s = idx[t, j]
        if 0 <= s < keys.shape[0]:
            out[t, j] = C.indexer_score_ks(qs, ws, keys, s, H, scaled)
        else:
            out[t, j] = C.NEG_INF


def _flat(q):
    n, H, D = q.shape
    return q.reshape(n, H * D)


def _keys(keys, kscale, s):
    """(keys array, scaled flag): fp8 keys (decoded values) are packed with their scales."""
    return (keys, 0) if kscale is None else (C.pack_scaled_keys(keys, kscale, s), 1)


@register("replay", "numba.replay.block")
def replay_block(q, w, keys, idx, kscale=None):
    """One thread per selected entry, q read from global memory. kscale: fp8 keys' scales."""
    s = C.stream()
    n, k = int(idx.shape[0]), int(idx.shape[1])
    out = C.empty((n, k), np.float32, s)
    if n and k:
        kk, scaled = _keys(keys, kscale, s)
        replay_block_kernel[(n, C.blocks(k, BLOCK)), BLOCK, s](_flat(q), w, kk, idx, out, scaled)
    return out


@register("replay", "numba.replay.smem", gpu_only=True)
def replay_smem(q, w, keys, idx, kscale=None):
    """One block per query with q[t], w[t] in dynamic shared memory."""
    s = C.stream()
    n, H, D = (int(x) for x in q.shape)
    k = int(idx.shape[1])
    out = C.empty((n, k), np.float32, s)
    if n and k and 4 * (H * D + H) > SMEM_LIMIT:
        return replay_block(q, w, keys, idx, kscale)    # q row does not fit: same scores, global reads
    if n and k:
        kk, scaled = _keys(keys, kscale, s)
        replay_smem_kernel[n, BLOCK, s, 4 * (H * D + H)](_flat(q), w, kk, idx, out, scaled)
    return out
