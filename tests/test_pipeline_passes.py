"""How the driver splits queries into passes of bounded scratch memory (workbench/pipeline.py)."""
import numpy as np
import pytest

import reference as R
import workbench
from reference import generate as G
from workbench import pipeline as P


def test_default_chunk_bounds_scratch_and_balances_passes():
    cap, m, k = 8960, 4096, 2048               # dsv32-128k: default capacity, M = 4096
    chunk = P.query_chunk_for(4096, cap, m, k=k)
    per_query = 8 * cap + 8 * m + 8 * k + 16
    assert chunk * per_query <= P.SCRATCH_BYTES
    passes = -(-4096 // chunk)
    assert passes * chunk - 4096 < 8 * passes          # passes are even (up to the rounding to 8)
    assert P.query_chunk_for(4096, 1000, 100, k=64) % 8 == 0
    assert P.query_chunk_for(100, cap, m) == 100       # fits in one pass
    assert P.query_chunk_for(0, cap, m) == 1
    assert P.query_chunk_for(10**6, 10**9, 0) == 1     # a huge capacity still makes progress


def test_pass_budget_grows_with_the_table_but_stays_under_a_32nd():
    """Small problems keep SCRATCH_BYTES per pass; large ones get table / (40 lanes) so they run
    a few passes, not hundreds (32768 x 256K: 127 passes with the fixed budget)."""
    assert P.pass_scratch_bytes(4096, 131072) == P.SCRATCH_BYTES
    for n, L, cap in ((32768, 262144, 9984), (8192, 1 << 20, 11520)):
        table = 4 * n * L
        for lanes in (1, 2):
            sb = P.pass_scratch_bytes(n, L, lanes)
            assert P.SCRATCH_BYTES <= sb <= P.SCRATCH_CAP and lanes * sb <= table / 32
        m = int(R.num_samples(L))
        fixed = -(-n // P.query_chunk_for(n, cap, m, k=2048))
        grown = -(-n // P.query_chunk_for(n, cap, m, k=2048, scratch_bytes=P.pass_scratch_bytes(n, L)))
        assert grown <= 10 < fixed
    assert P.pass_scratch_bytes(10**6, 10**7) == P.SCRATCH_CAP


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_bad_query_chunk_names_the_argument(bad):
    with pytest.raises(ValueError, match="query_chunk"):
        P.query_chunk_for(10, 100, 10, bad)


def test_default_passes_change_no_bit(monkeypatch):
    """Shrink the scratch budget so the default splits 37 queries into passes: same answer."""
    rng = np.random.default_rng(5)
    n, L, k = 37, 3000, 40
    lo, hi = G.layout("varlen", n, L, k, rng)
    scores = G.score_table("ties_at_kth", n, L, k, rng, lo, hi)
    monkeypatch.setattr(P, "SCRATCH_BYTES", 8 * 1024)
    cap = R.default_capacity(k, lo, hi, 3.0)
    assert P.query_chunk_for(n, cap, int(R.num_samples(L)), k=k) < n
    res = workbench.backend("reference").hytopk(scores, lo, hi, k)
    ref = R.hytopk(scores, lo, hi, k)
    np.testing.assert_array_equal(res.idx, ref.idx)
    np.testing.assert_array_equal(res.val.view(np.uint32), ref.val.view(np.uint32))
    np.testing.assert_array_equal(res.count, ref.count)
    np.testing.assert_array_equal(res.failed, ref.failed)
    assert res.fell_back == ref.fell_back


def test_more_failures_than_max_failed_fall_back_for_every_query():
    """CONTRACT.md §3.7 over all queries, whatever the passes: every query of a ReLU plateau
    (T = 0 floods the buffer) fails; with max_failed = 1 the whole batch takes the exact path."""
    rng = np.random.default_rng(9)
    n, L, k = 6, 5000, 4
    lo, hi = np.zeros(n, np.int32), np.full(n, L, np.int32)
    scores = np.zeros((n, L), np.float32)
    scores[:, rng.integers(0, L, 2)] = 1.0                 # fewer than k positive scores
    ref = R.hytopk(scores, lo, hi, k, max_failed=1, capacity=16)
    assert ref.fell_back and ref.failed.all()
    for chunk in (None, 1, 2, 4, 6):
        res = workbench.backend("reference").hytopk(scores, lo, hi, k, max_failed=1, capacity=16, query_chunk=chunk)
        assert res.fell_back
        np.testing.assert_array_equal(res.idx, ref.idx)
        np.testing.assert_array_equal(res.failed, ref.failed)
