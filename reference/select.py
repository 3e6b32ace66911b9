"""Stages 7-8: exact selection over candidates, recovery of failed queries, chunked fallback."""
from __future__ import annotations

import numpy as np

from .order import empty_selection, order_keys
from .radix import exact_topk_of_entries
from .sources import Source


def stage_select(cand_idx, cand_val, count, k: int):
    """Exact top-k of each query's stored candidates (the first min(count, capacity) slots).

    Rows whose query failed the check produce a selection of whatever was
    stored; the pipeline overwrites them with the recovery result.
    """
    n, capacity = cand_idx.shape
    idx, val = empty_selection(n, k)
    for t in range(n):
        m = min(int(count[t]), capacity)
        pos, v = cand_idx[t, :m], cand_val[t, :m]
        i, x = exact_topk_of_entries(pos, v, order_keys(v), k)
        idx[t, :i.size], val[t, :i.size] = i, x
    return idx, val


def stage_recover(source: Source, lo, hi, rows, k: int):
    """Exact top-k of the listed queries over their whole context, by rescoring them.

    Memory: one materialised row per listed query (callers bound len(rows)).
    Returns (idx [len(rows), k], val [len(rows), k]).
    """
    idx, val = empty_selection(len(rows), k)
    for j, t in enumerate(rows):
        a, b = int(lo[t]), int(hi[t])
        scores = source.row(t, a, b)
        i, x = exact_topk_of_entries(np.arange(a, b, dtype=np.int64), scores,
                                     order_keys(scores), k)
        idx[j, :i.size], val[j, :i.size] = i, x
    return idx, val


def fallback_all(source: Source, lo, hi, k: int, chunk: int):
    """Exact path for every query, ``chunk`` queries at a time (never one giant table)."""
    n = len(lo)
    idx, val = empty_selection(n, k)
    chunk = max(1, chunk)
    for s in range(0, n, chunk):
        rows = np.arange(s, min(n, s + chunk), dtype=np.int32)
        idx[rows], val[rows] = stage_recover(source, lo, hi, rows, k)
    return idx, val
