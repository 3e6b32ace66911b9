"""Stage 5 on the GPU: fused score-and-filter into the capacity-bounded buffer,
with the SIMT scoring routine shared with dense/recover/replay (the tensor-core
filters live with their cores: tiled.py, wgmma.py, wgmma_ws.py)."""
from __future__ import annotations

import cupy as cp
import numpy as np


from ...registry import register
from ._launch import CHUNK, bind, chunks, i32, kernel, launch, launch_stream


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
