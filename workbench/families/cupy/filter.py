"""Stage 5 on the GPU: fused score-and-filter into the capacity-bounded buffer.
Two variants: the SIMT scoring routine shared with dense/recover/replay, and
the bf16 tensor-core (mma.sync) path for the indexer source."""
from __future__ import annotations

import cupy as cp
import numpy as np

from reference import validate as V

from ...registry import register
from ._launch import CHUNK, MMA_CHUNK, bind, bind_indexer, chunks, i32, kernel, launch, launch_stream
import reference as R


def _buffers(n, capacity):
    return (cp.full((n, capacity), -1, cp.int32), cp.full((n, capacity), -np.inf, cp.float32),
            cp.zeros(n, cp.int32))


def _capacity(capacity):
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"argument 'capacity' must be a positive int, got {capacity!r}")
    return int(capacity)


@register("filter", "cupy.filter.simt", gpu_only=True)
def filter_simt(source, lo, hi, T, capacity):
    """SIMT (FFMA) scoring, warp-aggregated atomic appends."""
    capacity = _capacity(capacity)
    with launch_stream():
        src = bind(source)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = _buffers(src.n, capacity)
        fn = kernel("filter.cu", f"hytopk_filter<{src.cxx}>", src.shapes)
        launch(fn, (src.n, chunks(src.L, CHUNK)),
               (*src.args, np.int32(src.n), lo, hi, T, np.int32(capacity), np.int32(CHUNK),
                cand_idx, cand_val, count), 4 * src.smem_floats)
        return cand_idx, cand_val, count


@register("filter", "cupy.filter.mma_bf16", sources=("indexer",), gpu_only=True)
def filter_mma_bf16(source, lo, hi, T, capacity):
    """bf16 tensor cores (mma.sync m16n8k16, f32 accumulate); float32 inputs are rounded to bf16 first."""
    if not isinstance(source, R.IndexerSource):
        raise TypeError("argument 'source': cupy.filter.mma_bf16 takes the indexer source only")
    capacity = _capacity(capacity)
    with launch_stream():
        src = bind_indexer(source.q, source.w, source.keys, dtype="bfloat16", mma=True)
        if src.keys.data.ptr % 4:
            raise ValueError("argument 'keys' must be 4-byte aligned for the tensor-core path")
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = _buffers(src.n, capacity)
        fn = kernel("filter_mma.cu", f"hytopk_filter_mma<{src.H}, {src.D}>", src.shapes)
        smem = src.H * (src.D + 8) * 2 + src.H * 4
        launch(fn, (src.n, chunks(src.L, MMA_CHUNK)),
               (src.q, src.w, src.keys, np.int64(src.L), np.int32(src.n), lo, hi, T, np.int32(capacity),
                cand_idx, cand_val, count), smem)
        return cand_idx, cand_val, count
