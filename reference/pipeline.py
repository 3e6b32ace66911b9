"""HyTopK end to end, stage by stage exactly as the kernels run it (docs/CONTRACT.md §3)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import dtypes as DT
from . import validate as V
from .candidates import stage_check, stage_filter
from .capacity import resolve_capacity
from .indexer import indexer_source
from .order import table_float32
from .sampling import sample_plan, stage_threshold
from .select import fallback_all, stage_recover, stage_select
from .sources import Source, TableSource


@dataclass
class HyTopKResult:
    idx: np.ndarray          # [n, k] int32, rank order, -1 padding
    val: np.ndarray          # [n, k] float32, -inf padding
    threshold: np.ndarray    # [n] float32 (NaN where c <= k: every key passes)
    count: np.ndarray        # [n] int32 true candidate count
    failed: np.ndarray       # [n] bool: overflow or underflow
    fell_back: bool          # more than max_failed failed: exact path for all
    num_samples: np.ndarray  # [n] int32 M (0 where c <= k)
    rank: np.ndarray         # [n] int32 r (0 where c <= k)
    capacity: int = 0


def run_stages(source: Source, lo, hi, k, capacity, oversample, max_failed) -> HyTopKResult:
    """The pipeline on already-validated arguments (host int64 lo/hi)."""
    capacity = resolve_capacity(capacity, k, lo, hi, oversample)     # before anything is allocated
    M, r = sample_plan(lo, hi, k, oversample)
    T = stage_threshold(source, lo, hi, M, r)
    cand_idx, cand_val, count = stage_filter(source, lo, hi, T, capacity)
    failed, rows = stage_check(count, lo, hi, k, capacity)
    fell_back = rows.size > max_failed
    if fell_back:
        idx, val = fallback_all(source, lo, hi, k, chunk=max(1, max_failed))
    else:
        idx, val = stage_select(cand_idx, cand_val, count, k)
        if rows.size:
            idx[rows], val[rows] = stage_recover(source, lo, hi, rows, k)
    return HyTopKResult(idx, val, T, count, failed, bool(fell_back), M, r, int(capacity))


def hytopk(scores, lo, hi, k, *, capacity=None, oversample=3.0, max_failed=64) -> HyTopKResult:
    """HyTopK on a given [n, L] float32 (or bf16: widened exactly) score table (table source)."""
    shape = V.check_scores(scores)
    lo_h, hi_h = V.check_selection_args(shape, lo, hi, k, capacity, oversample, max_failed)
    return run_stages(TableSource(table_float32(scores)), lo_h, hi_h, k, capacity,
                      oversample, max_failed)


def hytopk_indexer(q, w, keys, lo, hi, k, *, kscale=None, capacity=None, oversample=3.0,
                   max_failed=64) -> HyTopKResult:
    """HyTopK with scores computed on the fly from the lightning indexer
    (q/keys float32, bf16 or fp8 e4m3 + kscale; w float32 or bf16: reference.dtypes)."""
    n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
    lo_h, hi_h = V.check_selection_args((n, L), lo, hi, k, capacity, oversample, max_failed)
    src = indexer_source(q, w, keys, kscale, dts)
    return run_stages(src, lo_h, hi_h, k, capacity, oversample, max_failed)
