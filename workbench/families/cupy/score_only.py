"""The benchmark floor: the shared scoring routine over every context, no
selection, nothing written but a checksum."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import CHUNK, bind_indexer, chunks, i32, kernel, launch, launch_stream

CORES = ("simt", "mma_sync", "wgmma", "wgmma_ws", "wgmma_ws2")


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
        raise ValueError(f"argument 'variant' must be one of {CORES}, got {variant!r}")
    with launch_stream():
        src = bind_indexer(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        checksum = cp.zeros(1, cp.uint64)
        fn = kernel("score_only.cu", f"hytopk_score_only<{src.cxx}>", src.shapes)
        launch(fn, (src.n, chunks(src.L, CHUNK)),
               (*src.args, np.int32(src.n), lo, hi, np.int32(CHUNK), checksum), 4 * src.smem_floats)
        return checksum


# The floor as a stage (registry.FLOORS["score_only"]): one variant per core, on a score source.
# The wgmma cores take fp8 e4m3 inputs too (their floor beside the fused fp8 filter).
def _floor(core: str, sources=("indexer",)):
    def fn(source, lo, hi):
        out = score_only(source.q, source.w, source.keys, lo, hi, variant=core) if core in ("simt", "mma_sync") \
            else _wgmma_floor(core, source, lo, hi)
        return out.view(cp.int64)         # the same bits; torch takes int64 through DLPack everywhere
    fn.__name__ = f"score_only_{core}"
    fn.__doc__ = f"the score-only floor of the {core} core: its scoring over every context, a checksum out"
    register("score_only", f"cupy.score_only.{core}", sources=sources, gpu_only=True)(fn)
    return fn


def _wgmma_floor(core, source, lo, hi):
    if core == "wgmma":
        from .wgmma import score_only_wgmma
        return score_only_wgmma(source, lo, hi)
    from .wgmma_ws import score_only_ws
    return score_only_ws(source, lo, hi, consumers=4 if core == "wgmma_ws" else 2)


for _core in CORES:
    _floor(_core, ("indexer", "indexer_fp8") if _core in ("wgmma", "wgmma_ws") else ("indexer",))
