"""Indexer source, replay and the KL loss of the reference (docs/CONTRACT.md §4)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import reference as R
from reference import generate as G
from tests.strategies import indexer_cases


def same_bits(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@given(indexer_cases())
def test_hytopk_indexer_equals_topk_of_indexer_scores(case):
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    res = R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k,
                           capacity=case.capacity, oversample=case.oversample,
                           max_failed=case.max_failed)
    idx, val = R.topk(table, case.lo, case.hi, case.k)
    assert same_bits(res.idx, idx) and same_bits(res.val, val)


@given(indexer_cases(max_L=500))
def test_indexer_scores_exact_and_masked(case):
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    dots = np.einsum("thd,sd->tsh", case.q.astype(np.int64), case.keys.astype(np.int64))
    exact = (np.maximum(dots, 0) * case.w.astype(np.int64)[:, None, :]).sum(-1)
    for t in range(len(case.lo)):
        inside = np.zeros(table.shape[1], bool)
        inside[case.lo[t]:case.hi[t]] = True
        assert (table[t, inside] == exact[t, inside]).all()
        assert np.isneginf(table[t, ~inside]).all()


@given(indexer_cases(max_L=500))
def test_replay_equals_gathered_scores(case):
    res = R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k)
    rep = R.replay_scores(case.q, case.w, case.keys, res.idx)
    assert same_bits(rep, res.val)          # the selection's values are the rescored ones
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    gathered = np.where(res.idx >= 0, np.take_along_axis(table, np.maximum(res.idx, 0), 1), -np.inf)
    assert same_bits(rep, gathered.astype(np.float32))


def _loss_problem(seed, n=3, L=40, H=3, D=5, k=6):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=False)
    q, w, keys = q.astype(np.float64), w.astype(np.float64), keys.astype(np.float64)
    lo, hi = np.zeros(n, np.int32), np.array([L, 4, L], np.int32)[:n]
    idx = R.topk(R.indexer_scores(q.astype(np.float32), w.astype(np.float32),
                                  keys.astype(np.float32), lo, hi), lo, hi, k)[0]
    p = rng.random((n, k)) * (idx >= 0)
    p /= np.maximum(p.sum(1, keepdims=True), 1e-300)
    return q, w, keys, idx, p


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@given(seed=st.integers(0, 2**32 - 1))
def test_loss_gradients_match_finite_differences(seed, reduction):
    q, w, keys, idx, p = _loss_problem(seed)
    loss, dq, dw, dk = R.indexer_kl_loss(q, w, keys, idx, p, reduction=reduction)
    eps = 1e-6
    for arr, grad in ((q, dq), (w, dw), (keys, dk)):
        flat, g = arr.reshape(-1), grad.reshape(-1)
        for i in np.random.default_rng(seed).choice(flat.size, size=min(8, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = R.indexer_kl_loss(q, w, keys, idx, p, reduction=reduction)[0]
            flat[i] = old - eps
            down = R.indexer_kl_loss(q, w, keys, idx, p, reduction=reduction)[0]
            flat[i] = old
            assert abs((up - down) / (2 * eps) - g[i]) <= 1e-5 * (1 + abs(g[i]))


def test_loss_is_kl_and_zero_at_the_model_distribution():
    q, w, keys, idx, _ = _loss_problem(3)
    I = R.replay_scores(q.astype(np.float32), w.astype(np.float32), keys.astype(np.float32), idx).astype(np.float64)
    sm = np.where(idx >= 0, np.exp(I - I.max(1, keepdims=True)), 0)
    sm /= sm.sum(1, keepdims=True)
    loss, dq, dw, dk = R.indexer_kl_loss(q, w, keys, idx, sm)
    assert abs(loss) < 1e-5 and np.abs(dq).max() < 1e-5
