"""The benchmark floor: the shared scoring routine over every context, no
selection, nothing written but a checksum."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ._launch import CHUNK, bind_indexer, chunks, i32, kernel, launch, launch_stream


def score_only(q, w, keys, lo, hi, variant="simt"):
    """-> uint64[1] device array: the wrapping sum of the order keys of every
    score in every context (deterministic; not synchronised, for timing).
    variant: "simt" (the SIMT routine), "mma_sync" (the mma.sync core, bf16), "wgmma"
    (the wgmma core, bf16, sm_90a), "wgmma_ws" / "wgmma_ws2" (the warp-specialised wgmma core
    with 4 / 2 consumer warpgroups, sm_90a)."""
    if variant == "mma_sync":
        from .mma_sync import score_only_mma_sync
        return score_only_mma_sync(q, w, keys, lo, hi)
    if variant == "wgmma":
        import reference as R
        from .wgmma import score_only_wgmma
        return score_only_wgmma(R.IndexerSource(q, w, keys), lo, hi)
    if variant in ("wgmma_ws", "wgmma_ws2"):
        import reference as R
        from .wgmma_ws import score_only_ws
        return score_only_ws(R.IndexerSource(q, w, keys), lo, hi, consumers=4 if variant == "wgmma_ws" else 2)
    if variant != "simt":
        raise ValueError(f"argument 'variant' must be 'simt', 'mma_sync', 'wgmma', 'wgmma_ws' or 'wgmma_ws2', got {variant!r}")
    with launch_stream():
        src = bind_indexer(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        checksum = cp.zeros(1, cp.uint64)
        fn = kernel("score_only.cu", f"hytopk_score_only<{src.cxx}>", src.shapes)
        launch(fn, (src.n, chunks(src.L, CHUNK)),
               (*src.args, np.int32(src.n), lo, hi, np.int32(CHUNK), checksum), 4 * src.smem_floats)
        return checksum
