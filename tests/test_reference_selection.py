"""The reference selection: brute force vs an independent definition, and
hytopk == topk bit for bit on every adversarial family, layout and option."""
import functools
import math
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

import reference as R
from reference import generate as G
from tests.strategies import SPECIALS, selection_cases, stable_seed


def same_bits(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def slow_topk_row(row, lo, hi, k):
    """An independent definition: Python's sort with a comparator written from
    docs/CONTRACT.md §2 in float terms (NaN lowest, -0.0 == +0.0, ties by position)."""
    def cmp(a, b):
        (sa, xa), (sb, xb) = a, b
        na, nb = math.isnan(xa), math.isnan(xb)
        if na != nb:
            return 1 if na else -1
        if not na and xa != xb:            # -0.0 == +0.0 here, as the contract wants
            return -1 if xa > xb else 1
        return -1 if sa < sb else (1 if sa > sb else 0)
    entries = [(s, float(row[s])) for s in range(lo, hi)]
    entries.sort(key=functools.cmp_to_key(cmp))
    return [s for s, _ in entries[:k]]


@given(selection_cases(max_n=3, max_L=300, max_k=40))
def test_topk_matches_independent_sort(case):
    idx, val = R.topk(case.scores, case.lo, case.hi, case.k)
    for t in range(len(case.lo)):
        want = slow_topk_row(case.scores[t], int(case.lo[t]), int(case.hi[t]), case.k)
        assert idx[t, :len(want)].tolist() == want
        assert (idx[t, len(want):] == -1).all() and np.isneginf(val[t, len(want):]).all()
        assert same_bits(val[t, :len(want)], case.scores[t, want])


@given(selection_cases())
def test_hytopk_equals_topk_bit_for_bit(case):
    res = R.hytopk(case.scores, case.lo, case.hi, case.k, capacity=case.capacity,
                   oversample=case.oversample, max_failed=case.max_failed)
    idx, val = R.topk(case.scores, case.lo, case.hi, case.k)
    assert same_bits(res.idx, idx)
    assert same_bits(res.val, val)


@pytest.mark.parametrize("family", G.SCORE_FAMILIES)
@pytest.mark.parametrize("lay", G.LAYOUTS)
def test_every_family_and_layout_beyond_sampling_stride(family, lay):
    """L > 4096 so that M < c and the sample stride matters (aliasing families)."""
    rng = np.random.default_rng(stable_seed(family, lay))
    n, L, k = 4, 6000, 48
    lo, hi = G.layout(lay, n, L, k, rng)
    s = G.score_table(family, n, L, k, rng, lo, hi)
    res = R.hytopk(s, lo, hi, k, capacity=3 * k + 64, max_failed=2)
    idx, val = R.topk(s, lo, hi, k)
    assert same_bits(res.idx, idx) and same_bits(res.val, val)


def test_order_keys_order_and_specials():
    x = np.array([np.nan, -np.inf, -np.finfo(np.float32).max, -1.0, -1e-45, -0.0, 0.0,
                  1e-45, 1.0, np.finfo(np.float32).max, np.inf], np.float32)
    keys = R.order_keys(x)
    assert keys[0] == 0
    assert keys[5] == keys[6]                           # -0.0 ranks as +0.0
    assert (np.diff(keys.astype(np.int64))[np.arange(len(x) - 1) != 5] > 0).all()
    neg_nan = np.array([struct.unpack("<f", struct.pack("<I", 0xFFC01234))[0]], np.float32)
    assert R.order_keys(neg_nan)[0] == 0


@given(st.lists(st.sampled_from(list(SPECIALS)), min_size=2, max_size=40))
def test_order_keys_agree_with_float_order(vals):
    x = np.array(vals, np.float32)
    kx = R.order_keys(x)
    for i in range(len(x)):
        for j in range(len(x)):
            a, b = float(x[i]), float(x[j])
            if math.isnan(a) or math.isnan(b):
                assert (kx[i] == 0) == math.isnan(a)
                continue
            assert (kx[i] > kx[j]) == (a > b) and (kx[i] == kx[j]) == (a == b)


@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.integers(1, 60))
def test_radix_select_is_storage_order_independent(seed, m, k):
    rng = np.random.default_rng(seed)
    vals = rng.integers(-3, 3, size=m).astype(np.float32)
    pos = rng.choice(10_000, size=m, replace=False)
    keys = R.order_keys(vals)
    i1, v1 = R.exact_topk_of_entries(pos, vals, keys, k)
    perm = rng.permutation(m)
    i2, v2 = R.exact_topk_of_entries(pos[perm], vals[perm], keys[perm], k)
    assert same_bits(i1, i2) and same_bits(v1, v2)
    order = R.rank_order(keys, pos)[:k]
    assert i1.tolist() == pos[order].tolist()


@given(st.integers(0, 2**32 - 1), st.integers(1, 500))
def test_kth_key_and_need(seed, m):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 6, size=m).astype(np.uint32) << np.uint32(rng.integers(0, 28))
    k = int(rng.integers(1, m + 1))
    k_star, need = R.select_kth_key(keys, k)
    assert k_star == np.sort(keys)[::-1][k - 1]
    assert need == k - int((keys > k_star).sum()) and 1 <= need <= int((keys == k_star).sum())
