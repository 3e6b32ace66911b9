"""Stages 5-6: fused score-and-filter into a capacity-bounded buffer, then the check."""
from __future__ import annotations

import numpy as np

from .order import order_keys
from .sources import Source

FILTER_CHUNK = 1 << 16      # keys scored at a time: the reference never holds a full row


def stage_filter(source: Source, lo, hi, threshold, capacity: int):
    """Keep every position s of the context with key(I[t,s]) >= key(T[t]).

    Returns (cand_idx [n, capacity] int32, cand_val [n, capacity] float32,
    count [n] int32). ``count`` is the true number of candidates, which may
    exceed ``capacity``; only the first ``capacity`` (here: lowest positions;
    kernels may store any of them) are kept. Unused slots hold -1 / -inf.
    """
    n = len(lo)
    cand_idx = np.full((n, capacity), -1, np.int32)
    cand_val = np.full((n, capacity), -np.inf, np.float32)
    count = np.zeros(n, np.int32)
    tkeys = order_keys(np.asarray(threshold, np.float32))
    for t in range(n):
        a, b = int(lo[t]), int(hi[t])
        stored = 0
        for s0 in range(a, b, FILTER_CHUNK):
            s1 = min(b, s0 + FILTER_CHUNK)
            vals = source.row(t, s0, s1)
            hit = np.nonzero(order_keys(vals) >= tkeys[t])[0]
            count[t] += hit.size
            take = hit[: max(0, capacity - stored)]
            cand_idx[t, stored:stored + take.size] = take + s0
            cand_val[t, stored:stored + take.size] = vals[take]
            stored += take.size
    return cand_idx, cand_val, count


def stage_check(count, lo, hi, k: int, capacity: int):
    """Which queries failed, and their row numbers (ascending).

    A sampled query (c > k) fails on overflow (count > capacity) or underflow
    (count < k: the threshold landed above the true k-th score).
    """
    count = np.asarray(count, np.int64)
    c = np.asarray(hi, np.int64) - np.asarray(lo, np.int64)
    failed = (c > k) & ((count > capacity) | (count < k))
    return failed, np.nonzero(failed)[0].astype(np.int32)
