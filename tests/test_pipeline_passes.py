"""How the driver splits queries into passes of bounded scratch memory (workbench/pipeline.py)."""
import numpy as np
import pytest

import reference as R
import workbench
from reference import generate as G
from workbench import pipeline as P


def test_default_chunk_bounds_scratch_and_balances_passes():
    cap, m = 8960, 4096                        # dsv32-128k: default capacity, M = 4096
    chunk = P.query_chunk_for(4096, cap, m)
    per_query = 8 * cap + 8 * m + 16
    assert chunk % 8 == 0 and chunk * per_query <= P.SCRATCH_BYTES
    passes = -(-4096 // chunk)
    assert passes * chunk - 4096 < 8 * passes          # passes are even (up to the rounding to 8)
    assert P.query_chunk_for(100, cap, m) == 100       # fits in one pass
    assert P.query_chunk_for(0, cap, m) == 1
    assert P.query_chunk_for(10**6, 10**9, 0) == 1     # a huge capacity still makes progress


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
    assert P.query_chunk_for(n, cap, int(R.sample_plan(lo, hi, k, 3.0)[0].max())) < n
    res = workbench.backend("reference").hytopk(scores, lo, hi, k)
    ref = R.hytopk(scores, lo, hi, k)
    np.testing.assert_array_equal(res.idx, ref.idx)
    np.testing.assert_array_equal(res.val.view(np.uint32), ref.val.view(np.uint32))
    np.testing.assert_array_equal(res.count, ref.count)
