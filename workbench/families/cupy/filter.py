"""Stage 5 on the GPU: fused score-and-filter into the capacity-bounded buffer,
with the SIMT scoring routine shared with dense/recover/replay (the tensor-core
filters live with their cores: mma_sync.py, wgmma.py, wgmma_ws.py)."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import CHUNK, bind, chunks, i32, kernel, launch, launch_stream
from ._shared import candidate_buffers, check_capacity


@register("filter", "cupy.filter.simt", gpu_only=True)
def filter_simt(source, lo, hi, T, capacity):
    """SIMT (FFMA) scoring, warp-aggregated atomic appends."""
    capacity = check_capacity(capacity)
    with launch_stream():
        src = bind(source)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = candidate_buffers(src.n, capacity)
        fn = kernel("filter.cu", f"hytopk_filter<{src.cxx}>", src.shapes)
        launch(fn, (src.n, chunks(src.L, CHUNK)),
               (*src.args, np.int32(src.n), lo, hi, T, np.int32(capacity), np.int32(CHUNK),
                cand_idx, cand_val, count), 4 * src.smem_floats)
        return cand_idx, cand_val, count
