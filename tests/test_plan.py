"""Selection plans on the CPU (issue 14): a plan equals the one-shot pipeline, is reused, refuses
inputs of another layout with errors naming the argument; the torch op's plan cache makes one
plan per layout and a new one when lo/hi change. (GPU runs: tests/test_plan_gpu.py.)"""
from __future__ import annotations

import numpy as np
import pytest

import reference as R
import workbench
from reference import generate as G


def _case(n=12, L=700, H=2, D=8, k=16, layout="varlen", seed=0):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout(layout, n, L, k, rng)
    return q, w, keys, lo, hi, k


@pytest.mark.parametrize("thresholds_first", [True, False])
@pytest.mark.parametrize("query_chunk", [None, 5])
@pytest.mark.parametrize("capacity, max_failed", [(None, 64), (20, 64), (20, 1)])
def test_plan_equals_the_pipeline_and_is_reused(query_chunk, capacity, max_failed, thresholds_first):
    q, w, keys, lo, hi, k = _case()
    want = R.hytopk_indexer(q, w, keys, lo, hi, k, capacity=capacity, max_failed=max_failed)
    b = workbench.backend("reference")
    plan = b.plan(lo, hi, k, capacity=capacity, max_failed=max_failed, query_chunk=query_chunk,
                  thresholds_first=thresholds_first)
    assert len(plan.passes) == (1 if query_chunk is None else 3)
    for _ in range(2):
        got = plan(q, w, keys).host()
        assert np.array_equal(got.idx, want.idx) and got.val.tobytes() == want.val.tobytes()
        assert np.array_equal(got.count, want.count) and np.array_equal(got.failed, want.failed)
        assert got.fell_back == want.fell_back and got.capacity == want.capacity
    assert plan.table(R.indexer_scores(q, w, keys, lo, hi)).host().idx.tobytes() == want.idx.tobytes()


def test_thresholds_first_in_spans_of_the_budget(monkeypatch):
    """Thresholds before the passes, in spans when the sampled scores outgrow the budget: same bits."""
    from workbench import pipeline as P
    q, w, keys, lo, hi, k = _case()
    want = R.hytopk_indexer(q, w, keys, lo, hi, k)
    m = int(R.num_samples(int((hi - lo).max())))
    monkeypatch.setattr(P, "SCRATCH_BYTES", 4 * (8 * m + 16))       # 4 queries' samples per span
    plan = workbench.backend("reference").plan(lo, hi, k)
    assert plan.thresholds_first and len(plan.threshold_spans) == 3
    got = plan(q, w, keys).host()
    assert got.idx.tobytes() == want.idx.tobytes() and got.val.tobytes() == want.val.tobytes()
    assert got.threshold.tobytes() == want.threshold.tobytes() and np.array_equal(got.count, want.count)


def test_backend_calls_reuse_one_plan_per_layout():
    q, w, keys, lo, hi, k = _case()
    b = workbench.backend("reference")
    b.hytopk_indexer(q, w, keys, lo, hi, k)
    b.hytopk_indexer(q, w, keys, lo.copy(), hi.copy(), k)        # same values: the same plan
    assert len(b._plans) == 1
    hi2 = hi.copy()
    hi2[0] -= 1
    b.hytopk_indexer(q, w, keys, lo, hi2, k)
    assert len(b._plans) == 2
    for i in range(2 * b.PLANS_KEPT):                             # bounded
        b.hytopk_indexer(q, w, keys, lo, hi, k, capacity=k + i)
    assert len(b._plans) == b.PLANS_KEPT


def test_plan_errors_name_the_argument():
    q, w, keys, lo, hi, k = _case()
    b = workbench.backend("reference")
    with pytest.raises(ValueError, match="argument 'k'"):
        b.plan(lo, hi, 0)
    with pytest.raises(ValueError, match="argument 'hi'"):
        b.plan(lo, hi, k, L=int(hi.max()) - 1)
    with pytest.raises(ValueError, match="argument 'max_failed'"):
        b.plan(lo, hi, k, max_failed=-1)
    plan = b.plan(lo, hi, k)
    with pytest.raises(ValueError, match="argument 'q' has 11 query rows.*n = 12"):
        plan(q[:-1], w[:-1], keys)
    with pytest.raises(ValueError, match="argument 'keys' has L = .*reach hi"):
        plan(q, w, keys[: int(hi.max()) - 1])
    with pytest.raises(ValueError, match="argument 'w'"):
        plan(q, w[:, :1], keys)
    with pytest.raises(TypeError, match="argument 'q'"):
        plan(q.astype(np.int32), w, keys)
    with pytest.raises(ValueError, match="argument 'scores' has 11 query rows"):
        plan.table(np.zeros((11, keys.shape[0]), np.float32))


def test_capture_safe_needs_a_capable_family():
    q, w, keys, lo, hi, k = _case()
    plan = workbench.backend("reference").plan(lo, hi, k)
    with pytest.raises(RuntimeError, match="cannot run a selection without host syncs"):
        plan(q, w, keys, capture_safe=True)


def test_torch_op_plan_cache_per_layout():
    torch = pytest.importorskip("torch")
    from workbench.torch import plans
    q, w, keys, lo, hi, k = _case()
    b = workbench.backend("reference")
    plans.clear()
    lo_t, hi_t = torch.from_numpy(lo), torch.from_numpy(hi)
    p1 = plans.get(b, lo_t, hi_t, keys.shape[0], k, None, 3.0, 64, capturing=False)
    assert plans.get(b, lo_t, hi_t, keys.shape[0], k, None, 3.0, 64, capturing=False) is p1
    assert plans.get(b, lo_t, hi_t, keys.shape[0], k, k + 1, 3.0, 64, capturing=False) is not p1
    hi_t.sub_(0)                                   # in place: the version counter moves
    p3 = plans.get(b, lo_t, hi_t, keys.shape[0], k, None, 3.0, 64, capturing=False)
    assert p3 is not p1
    assert len(plans._PLANS) == 3
    with pytest.raises(RuntimeError, match="call the op once"):
        plans.get(b, lo_t[:-1], hi_t[:-1], keys.shape[0], k, None, 3.0, 64, capturing=True)
    with pytest.raises(ValueError, match="argument 'hi'"):
        bad = hi_t.clone()
        bad[0] = keys.shape[0] + 1
        plans.get(b, lo_t, bad, keys.shape[0], k, None, 3.0, 64, capturing=False)
    for i in range(plans.KEEP + 2):
        plans.get(b, lo_t, hi_t, keys.shape[0], k, k + 2 + i, 3.0, 64, capturing=False)
    assert len(plans._PLANS) == plans.KEEP
    plans.clear()
