"""Stage 7 on the GPU: exact top-k of the failed queries over their whole
context. Table source: select straight from the table rows. Indexer source:
materialise at most ROWS_PER_PASS rows x c floats at a time with the shared
scoring routine, then the same exact select. Never an n x L buffer."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import CHUNK, bind, check_k_fits, chunks, i32, kernel, launch, launch_stream
from ._shared import recover_rows, select_rows


class SimtRows:
    """The SIMT rows kernel (recover.cu) in the shape recover_rows takes."""

    def __init__(self, src):
        self.src = src
        self.fn = kernel("recover.cu", f"hytopk_score_rows<{src.cxx}>", src.shapes)

    def score_rows(self, part, lo, hi, buf, stride):
        launch(self.fn, (part.shape[0], chunks(stride, CHUNK)),
               (*self.src.args, part, np.int32(part.shape[0]), lo, hi, np.int32(CHUNK), buf, np.int64(stride)),
               4 * self.src.smem_floats)


@register("recover", "cupy.recover.materialise", gpu_only=True)
def recover(source, lo, hi, rows, k):
    """Rescore only the failed rows (bounded chunks), then the exact radix select."""
    k = check_k_fits(k)
    with launch_stream():
        src = bind(source)
        if src.kind != "table":
            return recover_rows(SimtRows(src), lo, hi, rows, k)
        lo, hi, rows = i32(lo, "lo"), i32(hi, "hi"), i32(rows, "rows")
        idx = cp.empty((rows.shape[0], k), cp.int32)
        val = cp.empty((rows.shape[0], k), cp.float32)
        if rows.shape[0]:
            select_rows(src.args[0], src.L, 1, rows, lo, hi, k, idx, val)
        return idx, val
