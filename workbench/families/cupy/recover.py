"""Stage 7 on the GPU: exact top-k of the failed queries over their whole
context. Table source: select straight from the table rows. Indexer source:
materialise at most ROWS_PER_PASS rows x c floats at a time with the shared
scoring routine, then the same exact select. Never an n x L buffer."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from . import _scope
from ._launch import (CHUNK, bind, check_k_fits, chunks, exact_topk_smem_bytes, i32, kernel, launch,
                      launch_stream)

ROWS_PER_PASS = 64


def _select_rows(base, stride, by_query, rows, lo, hi, k, idx, val):
    launch(kernel("recover.cu", "hytopk_select_rows"), (rows.shape[0],),
           (base, np.int64(stride), np.int32(by_query), rows, np.int32(rows.shape[0]), lo, hi, np.int32(k),
            idx, val), exact_topk_smem_bytes(k))


@register("recover", "cupy.recover.materialise", gpu_only=True)
def recover(source, lo, hi, rows, k):
    """Rescore only the failed rows (bounded chunks), then the exact radix select."""
    k = check_k_fits(k)
    with launch_stream():
        src = bind(source)
        lo, hi, rows = i32(lo, "lo"), i32(hi, "hi"), i32(rows, "rows")
        nr = rows.shape[0]
        idx = cp.empty((nr, k), cp.int32)
        val = cp.empty((nr, k), cp.float32)
        if nr == 0:
            return idx, val
        if src.kind == "table":
            _select_rows(src.args[0], src.L, 1, rows, lo, hi, k, idx, val)
            return idx, val
        fn = kernel("recover.cu", f"hytopk_score_rows<{src.cxx}>", src.shapes)
        longest = _scope.longest_context()        # in a pipeline call: from its host ranges, no sync
        lengths = (hi - lo)[rows] if longest is None else None
        step = _scope.recovery_rows(ROWS_PER_PASS)
        for s in range(0, nr, step):
            part = rows[s:s + step]
            stride = max(1, longest if longest is not None else int(lengths[s:s + step].max()))
            buf = cp.empty((part.shape[0], stride), cp.float32)
            launch(fn, (part.shape[0], chunks(stride, CHUNK)),
                   (*src.args, part, np.int32(part.shape[0]), lo, hi, np.int32(CHUNK), buf, np.int64(stride)),
                   4 * src.smem_floats)
            _select_rows(buf, stride, 0, part, lo, hi, k, idx[s:s + step], val[s:s + step])
            del buf
        return idx, val
