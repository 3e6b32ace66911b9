"""Dense indexer scores [n, L] (-inf outside each context), from the family's
one scoring routine so they equal the fused filter's scores bit for bit
(rows.score_rows, shared with replay)."""
from __future__ import annotations

from ...registry import register
from .rows import score_rows


@register("dense", "numba.dense.block")
def dense_block(q, w, keys, lo, hi, kscale=None):
    """One thread per (query, key), q read from global memory. kscale: fp8 keys' scales."""
    return score_rows("dense", False, q, w, keys, lo, hi, int(keys.shape[0]), kscale=kscale)


@register("dense", "numba.dense.smem", gpu_only=True)
def dense_smem(q, w, keys, lo, hi, kscale=None):
    """q[t], w[t] in dynamic shared memory; grid-stride over keys (at most 64 blocks per query)."""
    return score_rows("dense", True, q, w, keys, lo, hi, int(keys.shape[0]), max_blocks_y=64, kscale=kscale)
