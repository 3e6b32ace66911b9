"""Stage 8 on the GPU: exact top-k over each query's candidates (one block per
query; shared-memory 8-bit histograms, position select for ties, radix sort; the
radix_smem variant reads the candidates' keys once into shared memory and sorts
the kept entries mostly in registers)."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from ._shared import check_candidates
from ._launch import (RADIX, smem_optin, bitonic_topk_smem_bytes, check_k_fits, exact_topk_smem_bytes, kernel, launch,
                      launch_stream, next_pow2)


@register("select", "cupy.select.radix", gpu_only=True)
def select(cand_idx, cand_val, count, k):
    """Bitwise deterministic: the result depends only on the stored entries, not their order."""
    return _select("hytopk_select", exact_topk_smem_bytes, cand_idx, cand_val, count, k)


@register("select", "cupy.select.radix_bitonic", gpu_only=True,
          notes="radix select with warp-aggregated histograms and a warp-parallel digit search, "
                "then a bitonic sort of the k kept (key, ~position) words")
def select_bitonic(cand_idx, cand_val, count, k):
    return _select("hytopk_select_bitonic", bitonic_topk_smem_bytes, cand_idx, cand_val, count, k)


SMEM_THREADS = 256              # select.cu SEL_THREADS
SMEM_MAX_E = 16                 # slots per thread of the register bitonic sort: k <= 4096


def smem_select_bytes(k: int, capacity: int) -> int:
    """select.cu hytopk_select_smem_e*: histogram, scalars, the capacity's keys (even count), then
    P = 256 E sort words (u64) and bits (u32)."""
    P = max(next_pow2(k), SMEM_THREADS)
    return 4 * (RADIX + 4 + capacity + (capacity & 1)) + 12 * P


@register("select", "cupy.select.radix_smem", gpu_only=True,
          notes="the candidates' order keys read once into shared memory (8 loads in flight per thread), the "
                "radix passes there, positions and bits read only for the ties and the kept entries; bitonic "
                "sort of the k kept words with strides below 32 E in registers and shuffles (6 shared-memory "
                "steps for k = 2048); capacity or k too large for shared memory: cupy.select.radix_bitonic")
def select_smem(cand_idx, cand_val, count, k):
    k = check_k_fits(k, bitonic_topk_smem_bytes)
    capacity = cand_idx.shape[1] if getattr(cand_idx, "ndim", 0) == 2 else 0
    P = max(next_pow2(k), SMEM_THREADS)
    limit = smem_optin()
    if P > SMEM_THREADS * SMEM_MAX_E or smem_select_bytes(k, capacity) > limit:
        return select_bitonic(cand_idx, cand_val, count, k)
    name = f"hytopk_select_smem_e{P // SMEM_THREADS}"
    return _select(name, lambda k: smem_select_bytes(k, capacity), cand_idx, cand_val, count, k, SMEM_THREADS)


FAST_THREADS = 512              # select.cu FAST_SELECT_THREADS
FAST_CAP_MAX = 8192             # candidates held in shared memory (two blocks per SM at k = 2048)


def fast_select_bytes(k: int, cap: int) -> int:
    """hytopk_select_fast.cuh select_smem_words, in bytes."""
    return 4 * (RADIX + 4 + 3 * max(next_pow2(k), 512) + 2 * cap)


@register("select", "cupy.select.fast", gpu_only=True,
          notes="candidates read once into shared memory, then no sort: one histogram over the key range "
                "(up to 2048 bins), a scatter into the bins up to rank k, each kept entry's rank by comparisons "
                "inside its bin; ranking past 128 comparisons per rank (plateaus, wide ties): key select + "
                "register bitonic sort; more than 8192 candidates or k too large for shared memory: "
                "cupy.select.radix_bitonic")
def select_fast(cand_idx, cand_val, count, k):
    k = check_k_fits(k, bitonic_topk_smem_bytes)
    capacity = cand_idx.shape[1] if getattr(cand_idx, "ndim", 0) == 2 else 0
    cap = min(capacity, FAST_CAP_MAX)
    limit = smem_optin()
    if fast_select_bytes(k, cap) > limit:
        return select_bitonic(cand_idx, cand_val, count, k)
    with launch_stream():
        cand_idx, cand_val, count, n, capacity = check_candidates(cand_idx, cand_val, count)
        idx = cp.empty((n, k), cp.int32)
        val = cp.empty((n, k), cp.float32)
        launch(kernel("select.cu", "hytopk_select_fast"), (n,),
               (np.int32(n), cand_idx, cand_val, count, np.int32(capacity), np.int32(k), np.int32(cap), idx, val),
               fast_select_bytes(k, cap), threads=FAST_THREADS)
        return idx, val


def _select(name, smem_bytes, cand_idx, cand_val, count, k, threads=None):
    k = check_k_fits(k, smem_bytes)
    with launch_stream():
        cand_idx, cand_val, count, n, capacity = check_candidates(cand_idx, cand_val, count)
        idx = cp.empty((n, k), cp.int32)
        val = cp.empty((n, k), cp.float32)
        launch(kernel("select.cu", name), (n,),
               (np.int32(n), cand_idx, cand_val, count, np.int32(capacity), np.int32(k), idx, val),
               smem_bytes(k), **({"threads": threads} if threads else {}))
        return idx, val
