"""Selection replay: rescore only the k selected entries of each query, with
the family's one scoring routine (bit-equal to the fused filter's scores;
rows.score_rows, shared with the dense table)."""
from __future__ import annotations

from ...registry import register
from .rows import score_rows


@register("replay", "numba.replay.block")
def replay_block(q, w, keys, idx, kscale=None):
    """One thread per selected entry, q read from global memory. kscale: fp8 keys' scales."""
    return score_rows("replay", False, q, w, keys, idx, idx, int(idx.shape[1]), kscale=kscale)


@register("replay", "numba.replay.smem", gpu_only=True)
def replay_smem(q, w, keys, idx, kscale=None):
    """One block per query with q[t], w[t] in dynamic shared memory."""
    return score_rows("replay", True, q, w, keys, idx, idx, int(idx.shape[1]), max_blocks_y=1, kscale=kscale)
