"""The hytopk torch.library ops on CPU: opcheck, equality with the reference,
gradients against the reference's float64 gradients, argument errors."""
import numpy as np
import pytest
from hypothesis import given, settings

torch = pytest.importorskip("torch")

import reference as R                                   # noqa: E402
from reference import generate as G                     # noqa: E402
import workbench.torch as wt                            # noqa: E402
from workbench.torch import scoring                     # noqa: E402
from tests.strategies import indexer_cases              # noqa: E402


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def small_case(seed=0, n=5, L=300, H=3, D=8, k=16, layout="causal_tail", exact=True):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=exact)
    lo, hi = G.layout(layout, n, L, k, rng)
    return q, w, keys, lo, hi, k


def test_opcheck_every_op():
    q, w, keys, lo, hi, k = small_case()
    qt, wt_, kt = (T(x).requires_grad_() for x in (q, w, keys))
    idx = T(R.hytopk_indexer(q, w, keys, lo, hi, k).idx)
    g = torch.randn(idx.shape, dtype=torch.float32)
    cases = [
        (torch.ops.hytopk.select.default, (qt.detach(), wt_.detach(), kt.detach(), T(lo), T(hi), k, None, 3.0, 64)),
        (torch.ops.hytopk.select.default, (qt.detach(), wt_.detach(), kt.detach(), T(lo), T(hi), k, 64, 1.0, 0)),
        (torch.ops.hytopk.replay_scores.default, (qt, wt_, kt, idx, None)),
        (torch.ops.hytopk.replay_scores.default, (qt, wt_, kt, idx, True)),
        (torch.ops.hytopk.replay_scores_backward.default, (g, qt.detach(), wt_.detach(), kt.detach(), idx, False)),
        (torch.ops.hytopk.replay_scores_backward.default, (g, qt.detach(), wt_.detach(), kt.detach(), idx, True)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@settings(max_examples=15)
@given(indexer_cases(max_n=5, max_L=600))
def test_select_and_replay_equal_reference(case):
    args = [T(x) for x in (case.q, case.w, case.keys, case.lo, case.hi)]
    ref = R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k, capacity=case.capacity,
                           oversample=case.oversample, max_failed=case.max_failed)
    idx, val = wt.select(*args, case.k, capacity=case.capacity, oversample=case.oversample,
                         max_failed=case.max_failed)
    assert same_bits(idx.numpy(), ref.idx) and same_bits(val.numpy(), ref.val)
    rep = wt.replay_scores(args[0], args[1], args[2], idx)
    assert same_bits(rep.numpy(), R.replay_scores(case.q, case.w, case.keys, ref.idx))


@settings(max_examples=15)
@given(indexer_cases(max_n=5, max_L=600))
def test_pure_torch_path_equals_reference(case):
    """The CUDA fallback / graph-capture path, run here on CPU tensors."""
    args = [T(x) for x in (case.q, case.w, case.keys, case.lo, case.hi)]
    idx, val = R.topk(R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi), case.lo, case.hi, case.k)
    tidx, tval = scoring.exact_select(*args, case.k)
    assert same_bits(tidx.numpy(), idx) and same_bits(tval.numpy(), val)
    rep = scoring.replay(args[0], args[1], args[2], T(idx))
    assert same_bits(rep.numpy(), R.replay_scores(case.q, case.w, case.keys, idx))


def _target(idx, rng):
    p = rng.random(idx.shape) * (idx >= 0)
    s = p.sum(1, keepdims=True)
    return np.where(s > 0, p / np.where(s > 0, s, 1), 0.0)


@settings(max_examples=15)
@given(indexer_cases(max_n=5, max_L=400, max_H=3, max_D=8))
def test_loss_and_gradients_match_reference_float64(case):
    rng = np.random.default_rng(0)
    idx = R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k).idx
    target = _target(idx, rng)
    for reduction in ("sum", "mean"):
        for det in (False, True):
            q, w, keys = (T(x).requires_grad_() for x in (case.q, case.w, case.keys))
            loss = wt.indexer_kl_loss(q, w, keys, T(idx), T(target), reduction=reduction, deterministic=det)
            loss.backward()
            ref = R.indexer_kl_loss(case.q, case.w, case.keys, idx, target, reduction=reduction)
            assert loss.item() == pytest.approx(ref[0], rel=1e-4, abs=1e-4)
            for got, want in zip((q.grad, w.grad, keys.grad), ref[1:]):
                scale = max(1.0, float(np.abs(want).max(initial=0)))
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5 * scale)


def test_gradients_on_general_floats_and_padding():
    """Non-exact inputs, short contexts (padding slots), float64 reference gradients."""
    q, w, keys, lo, hi, k = small_case(seed=3, n=6, L=200, k=24, layout="edge", exact=False)
    idx = R.hytopk_indexer(q, w, keys, lo, hi, k).idx
    assert (idx < 0).any()
    target = _target(idx, np.random.default_rng(1))
    qt, wt_, kt = (T(x).requires_grad_() for x in (q, w, keys))
    wt.indexer_kl_loss(qt, wt_, kt, T(idx), T(target)).backward()
    _, dq, dw, dk = R.indexer_kl_loss(q, w, keys, idx, target)
    for got, want in zip((qt.grad, wt_.grad, kt.grad), (dq, dw, dk)):
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-4, atol=2e-5)


def test_bfloat16_inputs():
    q, w, keys, lo, hi, k = small_case(seed=4)          # small integers: exact in bf16
    args = [T(x).to(torch.bfloat16) for x in (q, w, keys)]
    idx, val = wt.select(*args, T(lo), T(hi), k)
    ref = R.hytopk_indexer(q, w, keys, lo, hi, k)
    assert same_bits(idx.numpy(), ref.idx) and same_bits(val.numpy(), ref.val)
    args = [a.requires_grad_() for a in args]
    s = wt.replay_scores(*args, idx)
    assert s.dtype == torch.float32
    s.masked_fill(idx < 0, 0).sum().backward()
    assert all(a.grad.dtype == torch.bfloat16 for a in args)


@pytest.mark.parametrize("bad, match", [
    (dict(k=0), "'k'"),
    (dict(lo=np.array([-1, 0, 0, 0, 0], np.int32)), "'lo'"),
    (dict(lo=np.array([299, 0, 0, 0, 0], np.int32)), "'lo'/'hi'"),
    (dict(hi=np.array([999, 1, 1, 1, 1], np.int32)), "'hi'"),
    (dict(w=np.zeros((5, 2), np.float32)), "'w'"),
    (dict(capacity=3), "'capacity'"),
    (dict(oversample=-1.0), "'oversample'"),
])
def test_select_errors_name_the_argument(bad, match):
    q, w, keys, lo, hi, k = small_case()
    a = dict(q=q, w=w, keys=keys, lo=lo, hi=hi, k=k, capacity=None, oversample=3.0)
    a.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        wt.select(T(a["q"]), T(a["w"]), T(a["keys"]), T(a["lo"]), T(a["hi"]), a["k"],
                  capacity=a["capacity"], oversample=a["oversample"])


def test_replay_rejects_out_of_range_idx():
    q, w, keys, lo, hi, k = small_case()
    idx = torch.full((5, k), keys.shape[0], dtype=torch.int32)
    with pytest.raises(ValueError, match="'idx'"):
        wt.replay_scores(T(q), T(w), T(keys), idx)
    with pytest.raises(TypeError, match="'idx'"):
        wt.replay_scores(T(q), T(w), T(keys), idx.long())


def test_selected_kl_rejects_bad_reduction_and_shape():
    idx = torch.zeros((2, 3), dtype=torch.int32)
    with pytest.raises(ValueError, match="'reduction'"):
        wt.selected_kl(torch.zeros(2, 3), idx, torch.zeros(2, 3), reduction="max")
    with pytest.raises(ValueError, match="'target'"):
        wt.selected_kl(torch.zeros(2, 3), idx, torch.zeros(2, 4))
