"""Dense indexer scores [n, L] (the baseline), with the shared scoring routine."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import CHUNK, bind_indexer, chunks, i32, kernel, launch, launch_stream


@register("dense", "cupy.dense.simt", gpu_only=True)
def dense(q, w, keys, lo, hi):
    """Whole table, -inf outside each context."""
    with launch_stream():
        src = bind_indexer(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        out = cp.empty((src.n, src.L), cp.float32)
        fn = kernel("dense.cu", f"hytopk_dense<{src.cxx}>", src.shapes)
        launch(fn, (src.n, chunks(src.L, CHUNK)),
               (*src.args, np.int32(src.n), lo, hi, np.int32(CHUNK), out), 4 * src.smem_floats)
        return out
