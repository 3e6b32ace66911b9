"""Selection replay: rescore only the k selected entries of each query, with the family's one
tiled scorer (bit-equal to the fused filter's scores; rows.score_rows, shared with the dense
table)."""
from __future__ import annotations

from ...registry import register
from .rows import score_rows


@register("replay", "numba.replay.tiled")
def replay_tiled(q, w, keys, idx, kscale=None):
    """The selected keys gathered into shared-memory tiles, HG x KPT dots per thread. kscale: fp8 scales."""
    return score_rows("replay", q, w, keys, idx, idx, int(idx.shape[1]), kscale=kscale)
