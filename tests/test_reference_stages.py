"""Stage invariants of the reference pipeline (docs/CONTRACT.md §3)."""
import math

import numpy as np
import pytest
from hypothesis import given

import reference as R
from reference import generate as G
from tests.strategies import selection_cases


def test_sample_plan_matches_article():
    c = np.array([1 << 20, 1 << 17, 4095, 4096, 10_000, 2049])
    M, r = R.sample_plan(np.zeros_like(c), c, 2048, 3.0)
    assert M.tolist() == [8192, 4096, 4095, 4096, 4096, 2049]
    assert r[0] == 48 and r[1] == 192
    assert r[2] == min(4095, math.ceil((3.0 * 2048) * 4095 / 4095))
    M0, r0 = R.sample_plan(np.array([0, 5]), np.array([2048, 5]), 2048, 3.0)
    assert M0.tolist() == [0, 0] and r0.tolist() == [0, 0]            # c <= k: no sampling


def test_sample_positions_are_64_bit_exact():
    c, M = 3_000_000_000, 8192                    # j * c overflows 32 bits
    p = R.sample_positions(7, c, M)
    assert p[0] == 7 and p[-1] == 7 + ((M - 1) * c) // M and p.dtype == np.int64


@given(selection_cases(max_n=4, max_L=3000))
def test_stage_invariants(case):
    s, lo, hi, k = case.scores, case.lo.astype(np.int64), case.hi.astype(np.int64), case.k
    cap = case.capacity or R.default_capacity(k, lo, hi, case.oversample)
    M, r = R.sample_plan(lo, hi, k, case.oversample)
    src = R.TableSource(s)
    T = R.stage_threshold(src, lo, hi, M, r)
    _, _, count = R.stage_filter(src, lo, hi, T, cap)
    failed, rows = R.stage_check(count, lo, hi, k, cap)
    c = hi - lo
    keys = R.order_keys(s)
    for t in range(len(lo)):
        ctx = keys[t, lo[t]:hi[t]]
        if c[t] <= k:
            assert M[t] == 0 and math.isnan(T[t]) and count[t] == c[t] and not failed[t]
            continue
        pos = R.sample_positions(lo[t], c[t], M[t])
        tkey = R.order_keys(T[t:t + 1])[0]
        assert tkey == np.sort(keys[t, pos])[::-1][r[t] - 1]             # r-th best sample
        assert count[t] == int((ctx >= tkey).sum()) >= r[t]               # true count, >= r
        under, over = count[t] < k, count[t] > cap
        assert failed[t] == (under or over)
        if under:
            assert r[t] < k                                               # underflow needs r < k
    assert rows.tolist() == np.nonzero(failed)[0].tolist()
    res = R.hytopk(s, lo, hi, k, capacity=case.capacity, oversample=case.oversample,
                   max_failed=case.max_failed)
    assert res.fell_back == (failed.sum() > case.max_failed)
    assert (res.failed == failed).all() and (res.count == count).all()


def _run(scores, k, cap, oversample=3.0):
    n, L = scores.shape
    return R.hytopk(scores, np.zeros(n, np.int32), np.full(n, L, np.int32), k,
                    capacity=cap, oversample=oversample)


def test_overflow_is_reachable_and_recovered():
    rng = np.random.default_rng(0)
    s = G.score_table("relu_plateau", 2, 5000, 64, rng)
    res = _run(s, 64, 256)
    assert res.failed.all() and (res.count > 256).all()
    assert (res.idx == R.topk(s, np.zeros(2, int), np.full(2, 5000), 64)[0]).all()


def test_underflow_is_reachable_and_recovered():
    rng = np.random.default_rng(0)
    lo, hi = np.zeros(2, np.int32), np.full(2, 6000, np.int32)
    s = G.score_table("alias_on_samples", 2, 6000, 64, rng, lo, hi)
    res = R.hytopk(s, lo, hi, 64, oversample=0.25)
    assert (res.rank < 64).all() and res.failed.all() and (res.count < 64).all()
    assert (res.idx == R.topk(s, lo, hi, 64)[0]).all()


def test_fallback_when_more_than_max_failed():
    s = np.zeros((5, 3000), np.float32)
    res = _run(s, 16, 64)
    assert res.failed.sum() == 5 and not res.fell_back           # default max_failed = 64
    res = R.hytopk(s, np.zeros(5, int), np.full(5, 3000), 16, capacity=64, max_failed=4)
    assert res.fell_back and (res.idx == np.arange(16)).all()
    res = R.hytopk(s, np.zeros(5, int), np.full(5, 3000), 16, capacity=64, max_failed=5)
    assert not res.fell_back and (res.idx == np.arange(16)).all()


def test_filter_never_stores_past_capacity_and_counts_past_it():
    s = np.ones((1, 1000), np.float32)
    ci, cv, count = R.stage_filter(R.TableSource(s), np.array([0]), np.array([1000]),
                                   np.array([np.nan], np.float32), 10)
    assert ci.shape == (1, 10) and count[0] == 1000 and (ci[0] == np.arange(10)).all()


def test_default_capacity_scales_with_rank_spread():
    k = 2048
    cap_1m = R.default_capacity(k, np.array([0]), np.array([1 << 20]))
    cap_128k = R.default_capacity(k, np.array([0]), np.array([1 << 17]))
    assert cap_1m > cap_128k >= 3 * k
    assert cap_1m % 256 == 0 and cap_128k % 256 == 0
    assert R.default_capacity(k, np.array([0]), np.array([100])) == k


@pytest.mark.parametrize("oversample, want_r", [(1e18, 4096), (1e300, 4096), (5e-324, 1)])
def test_extreme_oversample_keeps_r_in_1_to_M(oversample, want_r):
    """r = min(M, ceil(...)) is taken in float64 (no int64 overflow), and never 0."""
    s = np.random.default_rng(0).standard_normal((1, 5000)).astype(np.float32)
    res = R.hytopk(s, [0], [5000], 64 if want_r > 1 else 1, oversample=oversample)
    assert res.rank[0] == want_r and res.num_samples[0] == 4096
    idx, val = R.topk(s, [0], [5000], 64 if want_r > 1 else 1)
    assert res.idx.tobytes() == idx.tobytes() and res.val.tobytes() == val.tobytes()
