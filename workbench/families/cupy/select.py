"""Stage 8 on the GPU: exact top-k over each query's candidates (one block per
query; shared-memory 8-bit histograms, position select for ties, radix sort)."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._launch import bitonic_topk_smem_bytes, check_k_fits, exact_topk_smem_bytes, i32, kernel, launch, launch_stream


@register("select", "cupy.select.radix", gpu_only=True)
def select(cand_idx, cand_val, count, k):
    """Bitwise deterministic: the result depends only on the stored entries, not their order."""
    return _select("hytopk_select", exact_topk_smem_bytes, cand_idx, cand_val, count, k)


@register("select", "cupy.select.radix_bitonic", gpu_only=True,
          notes="radix select with warp-aggregated histograms and a warp-parallel digit search, "
                "then a bitonic sort of the k kept (key, ~position) words")
def select_bitonic(cand_idx, cand_val, count, k):
    return _select("hytopk_select_bitonic", bitonic_topk_smem_bytes, cand_idx, cand_val, count, k)


def _select(name, smem_bytes, cand_idx, cand_val, count, k):
    k = check_k_fits(k, smem_bytes)
    with launch_stream():
        cand_idx = i32(cand_idx, "cand_idx")
        cand_val = cp.ascontiguousarray(cp.asarray(cand_val, cp.float32))
        count = i32(count, "count")
        n, capacity = cand_idx.shape
        if cand_val.shape != (n, capacity) or count.shape != (n,):
            raise ValueError(f"arguments 'cand_val'/'count' must have shapes {(n, capacity)}/{(n,)}, "
                             f"got {cand_val.shape}/{count.shape}")
        idx = cp.empty((n, k), cp.int32)
        val = cp.empty((n, k), cp.float32)
        launch(kernel("select.cu", name), (n,),
               (np.int32(n), cand_idx, cand_val, count, np.int32(capacity), np.int32(k), idx, val),
               smem_bytes(k))
        return idx, val
