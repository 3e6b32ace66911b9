"""Known-bad variants: mutants of the stages that every stage check must reject.

As GPU MODE's reference kernels keep known-bad solutions beside the good ones, these keep
the checks honest: each is one small slip a kernel engineer makes (an off-by-one at
capacity, at k, at lo/hi; a flipped tie order; a dropped NaN rule; a missing -0.0 fold; a
candidate written past capacity; a slot read past the count). They are plain `Variant`s
that are never registered, so they never reach `compare`'s rows, the winners or a backend;
tests/test_known_bad.py runs them through the same gates as the real variants (the edge
probes of the fast tests, `compare`'s stage check, `watch`).

Most are NumPy variants of the reference family (cheap: they run everywhere); one is a
Numba kernel built by the check stage's own factory with a wrong predicate, run in the CUDA
simulator.
"""
from __future__ import annotations

import numpy as np

import reference as R
from workbench.registry import Variant

SIGN = np.uint32(0x80000000)


def _mutant(stage, what, fn, family="reference", sources=("table", "indexer")):
    return Variant(stage, f"{family}.{stage}.known_bad_{what}", family, fn, sources, False, fn.__doc__ or "")


# ---------------------------------------------------------------- check
def _check_with(rule, doc):
    def check(count, lo, hi, k, capacity):
        c = np.asarray(hi, np.int64) - np.asarray(lo, np.int64)
        failed = rule(c, np.asarray(count, np.int64), k, capacity)
        return failed, np.nonzero(failed)[0].astype(np.int32)
    check.__doc__ = doc
    return check


check_capacity_ge = _check_with(lambda c, n, k, cap: (c > k) & ((n >= cap) | (n < k)),
                                "overflow at count >= capacity (a full buffer is not an overflow)")
check_k_le = _check_with(lambda c, n, k, cap: (c > k) & ((n > cap) | (n <= k)),
                         "underflow at count <= k (exactly k candidates hold the top-k)")
check_context_short = _check_with(lambda c, n, k, cap: (c - 1 > k) & ((n > cap) | (n < k)),
                                  "context length hi - lo - 1: a context of k + 1 keys is never checked")


# ---------------------------------------------------------------- threshold
def threshold_rank_plus_one(source, lo, hi, M, r):
    """T = the (r + 1)-th best sample instead of the r-th."""
    M = np.asarray(M)
    return R.stage_threshold(source, np.asarray(lo), np.asarray(hi), M, np.minimum(np.asarray(r) + 1, M))


# ---------------------------------------------------------------- filter
def filter_hi_inclusive(source, lo, hi, T, capacity):
    """Scans [lo, hi] instead of [lo, hi): the key at hi is a candidate."""
    return R.stage_filter(source, lo, np.minimum(np.asarray(hi) + 1, source.shape[1]), T, capacity)


def filter_float_compare(source, lo, hi, T, capacity):
    """Compares scores as floats (v >= T) instead of order keys: NaN never passes."""
    n = len(lo)
    ci, cv, count = np.full((n, capacity), -1, np.int32), np.full((n, capacity), -np.inf, np.float32), \
        np.zeros(n, np.int32)
    for t in range(n):
        a, b = int(lo[t]), int(hi[t])
        vals = source.row(t, a, b)
        with np.errstate(invalid="ignore"):
            hit = np.nonzero(vals >= T[t])[0]
        count[t] = hit.size
        take = hit[:capacity]
        ci[t, :take.size], cv[t, :take.size] = take + a, vals[take]
    return ci, cv, count


def filter_past_capacity(source, lo, hi, T, capacity):
    """Stores capacity + 1 candidates per row in a row-major buffer: the extra one lands in the
    next row's first slot (what a GPU write past capacity does to the row after)."""
    n = len(lo)
    ci, cv, count = R.stage_filter(source, lo, hi, T, capacity + 1)
    flat_i = np.full(n * capacity, -1, np.int32)
    flat_v = np.full(n * capacity, -np.inf, np.float32)
    for t in reversed(range(n)):             # the overflowing row writes last, as a late block would
        m = min(int(count[t]), capacity + 1, n * capacity - t * capacity)
        flat_i[t * capacity:t * capacity + m], flat_v[t * capacity:t * capacity + m] = ci[t, :m], cv[t, :m]
    return flat_i.reshape(n, capacity), flat_v.reshape(n, capacity), count


# ---------------------------------------------------------------- select
def _keys_no_nan_rule(v):
    b = v.view(np.uint32)
    key = np.where(b & SIGN, ~b, b ^ SIGN).astype(np.uint32)
    key[b == SIGN] = SIGN
    return key


def _keys_no_zero_fold(v):
    b = v.view(np.uint32)
    key = np.where(b & SIGN, ~b, b ^ SIGN).astype(np.uint32)
    key[np.isnan(v)] = 0
    return key


def _select_with(keys_of, tie, doc):
    def select(cand_idx, cand_val, count, k):
        n, cap = cand_idx.shape
        idx, val = R.empty_selection(n, k)
        for t in range(n):
            m = min(int(count[t]), cap)
            pos, v = cand_idx[t, :m].astype(np.int64), np.ascontiguousarray(cand_val[t, :m], np.float32)
            order = np.lexsort((tie * pos, ~keys_of(v)))[:k]
            idx[t, :order.size], val[t, :order.size] = pos[order], v[order]
        return idx, val
    select.__doc__ = doc
    return select


select_flipped_ties = _select_with(R.order_keys, -1, "equal keys: the higher position wins")
select_no_nan_rule = _select_with(_keys_no_nan_rule, 1, "NaN keeps its bits' key: +NaN ranks above +inf")
select_no_zero_fold = _select_with(_keys_no_zero_fold, 1, "-0.0 keeps its own key, just below +0.0")


def select_reads_past_count(cand_idx, cand_val, count, k):
    """Reads min(count + 1, capacity) slots: one slot past the stored candidates."""
    return R.stage_select(cand_idx, cand_val, np.asarray(count) + 1, k)


def select_drops_last(cand_idx, cand_val, count, k):
    """Reads min(count, capacity) - 1 slots: the last stored candidate is lost."""
    return R.stage_select(cand_idx, cand_val, np.maximum(np.asarray(count) - 1, 0), k)


def select_k_minus_one(cand_idx, cand_val, count, k):
    """Keeps k - 1 entries and pads the k-th slot."""
    idx, val = R.empty_selection(len(count), k)
    idx[:, :k - 1], val[:, :k - 1] = R.stage_select(cand_idx, cand_val, count, k - 1)
    return idx, val


# ---------------------------------------------------------------- recover, dense, replay
def recover_lo_plus_one(source, lo, hi, rows, k):
    """Rescores [lo + 1, hi): the key at lo is never a candidate."""
    return R.stage_recover(source, np.minimum(np.asarray(lo) + 1, hi), hi, rows, k)


def dense_hi_inclusive(q, w, keys, lo, hi):
    """Scores [lo, hi]: the key at hi gets a score instead of -inf."""
    return R.indexer_scores(q, w, keys, lo, np.minimum(np.asarray(hi) + 1, keys.shape[0]))


def replay_scores_padding(q, w, keys, idx):
    """Scores the padding (idx = -1) as key 0 instead of -inf."""
    return R.replay_scores(q, w, keys, np.maximum(idx, 0))


MUTANTS = [
    _mutant("check", "capacity_ge", check_capacity_ge),
    _mutant("check", "k_le", check_k_le),
    _mutant("check", "context_short", check_context_short),
    _mutant("threshold", "rank_plus_one", threshold_rank_plus_one),
    _mutant("filter", "hi_inclusive", filter_hi_inclusive),
    _mutant("filter", "float_compare", filter_float_compare),
    _mutant("filter", "past_capacity", filter_past_capacity),
    _mutant("select", "flipped_ties", select_flipped_ties),
    _mutant("select", "no_nan_rule", select_no_nan_rule),
    _mutant("select", "no_zero_fold", select_no_zero_fold),
    _mutant("select", "reads_past_count", select_reads_past_count),
    _mutant("select", "drops_last", select_drops_last),
    _mutant("select", "k_minus_one", select_k_minus_one),
    _mutant("recover", "lo_plus_one", recover_lo_plus_one),
    _mutant("dense", "hi_inclusive", dense_hi_inclusive),
    _mutant("replay", "scores_padding", replay_scores_padding),
]


def numba_mutants() -> list[Variant]:
    """The Numba check kernel with `n_c >= capacity`, built by check.check_kernel (simulator or GPU)."""
    from numba import cuda

    from workbench.families.numba import check

    @cuda.jit(device=True)
    def failed_capacity_ge(count, lo, hi, t, k, capacity):
        c = np.int64(hi[t]) - np.int64(lo[t])
        n_c = np.int64(count[t])
        return c > k and (n_c >= capacity or n_c < k)

    def check_block_capacity_ge(count, lo, hi, k, capacity):
        """numba.check.block with overflow at count >= capacity"""
        return check.run_check(check.check_kernel("block", failed_capacity_ge), count, lo, hi, k, capacity)
    return [_mutant("check", "capacity_ge", check_block_capacity_ge, family="numba")]
