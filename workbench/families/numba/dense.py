"""Dense indexer scores [n, L] (-inf outside each context), from the family's one tiled scorer
so they equal the fused filter's scores bit for bit (rows.score_rows, shared with replay)."""
from __future__ import annotations

from ...registry import register
from .rows import score_rows


@register("dense", "numba.dense.tiled")
def dense_tiled(q, w, keys, lo, hi, kscale=None):
    """Tiles of keys and q rows in shared memory, HG x KPT dots per thread. kscale: fp8 keys' scales."""
    return score_rows("dense", q, w, keys, lo, hi, int(keys.shape[0]), kscale=kscale)
