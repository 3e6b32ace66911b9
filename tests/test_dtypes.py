"""Indexer input dtypes (reference.dtypes, issue 17), CPU: q/keys float32, bf16 or fp8 e4m3 (+ a
float32 scale per key row), w float32 or bf16 — every combination through the reference, the
reference backend, the torch ops (CPU and the pure-torch path), the fp8 quantiser and its
straight-through replay, the DSA layer; mixed dtypes that make no sense are refused by name."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import reference as R
import workbench
from reference import dtypes as DT
from reference import generate as G
from reference.fp8 import quantize_indexer

from strategies import indexer_cases

COMBOS = [(kind, wd) for kind in DT.KINDS for wd in ("float32", "bf16")]


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _inputs(seed=0, n=5, L=300, H=3, D=8, k=12, layout="random"):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout(layout, n, L, k, rng)
    return q, w, keys, lo, hi, k


# ------------------------------------------------------------------ the reference: exact on exact inputs
@pytest.mark.parametrize("kind, wd", COMBOS)
def test_reference_scores_every_combination_bit_for_bit(kind, wd):
    q, w, keys, lo, hi, k = _inputs()
    qq, ww, kk, ks = DT.encode_exact(q, w, keys, kind, wd, np.random.default_rng(1))
    want = R.indexer_scores(q, w, keys, lo, hi)
    np.testing.assert_array_equal(bits(R.indexer_scores(qq, ww, kk, lo, hi, kscale=ks)), bits(want))
    idx, val = R.topk(want, lo, hi, k)
    np.testing.assert_array_equal(bits(R.replay_scores(qq, ww, kk, idx, kscale=ks)),
                                  bits(R.replay_scores(q, w, keys, idx)))
    target = np.where(idx >= 0, 1.0, 0.0) / np.maximum(1, (idx >= 0).sum(1, keepdims=True))
    got = R.indexer_kl_loss(qq, ww, kk, idx, target, kscale=ks)
    ref = R.indexer_kl_loss(q, w, keys, idx, target)
    assert got[0] == pytest.approx(ref[0], rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-12, atol=1e-12)            # dw: same scores
    if ks is None:
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[3], ref[3], rtol=1e-12, atol=1e-12)
    else:                     # w.r.t. the decoded e4m3 values: keys / kscale -> dkeys * kscale
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[3], ref[3] * ks[:, None], rtol=1e-12, atol=1e-12)


@settings(max_examples=15)
@given(case=indexer_cases(max_n=4, max_L=600, max_H=3, max_D=8, max_k=24))
def test_reference_hytopk_every_combination_equals_float32(case):
    res32 = R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k, capacity=case.capacity,
                             oversample=case.oversample, max_failed=case.max_failed)
    rng = np.random.default_rng(case.k)
    for kind, wd in COMBOS[1:]:
        qq, ww, kk, ks = DT.encode_exact(case.q, case.w, case.keys, kind, wd, rng)
        res = R.hytopk_indexer(qq, ww, kk, case.lo, case.hi, case.k, kscale=ks, capacity=case.capacity,
                               oversample=case.oversample, max_failed=case.max_failed)
        np.testing.assert_array_equal(res.idx, res32.idx)
        np.testing.assert_array_equal(bits(res.val), bits(res32.val))
        np.testing.assert_array_equal(res.count, res32.count)


def test_fp8_score_is_kscale_times_the_head_sum_in_float64():
    """Non-exact fp8 inputs: the reference equals kscale * sum_h w * relu(q8 . k8) in float64, rounded once."""
    rng = np.random.default_rng(3)
    q, keys = rng.standard_normal((3, 4, 16)).astype(np.float32), rng.standard_normal((50, 16)).astype(np.float32)
    w = rng.random((3, 4)).astype(np.float32)
    src = quantize_indexer(q, w, keys)
    q8, k8 = (DT.decode_float64(x, "fp8") for x in (src.q, src.keys))
    dots = np.einsum("thd,sd->tsh", q8, k8)
    want = (src.kscale.astype(np.float64)[None] * (np.maximum(dots, 0) @ src.w.astype(np.float64)[:, :, None])[..., 0]
            .reshape(3, 50)).astype(np.float32)
    lo, hi = np.zeros(3, np.int32), np.full(3, 50, np.int32)
    np.testing.assert_array_equal(bits(R.indexer_scores(src.q, src.w, src.keys, lo, hi, kscale=src.kscale)), bits(want))


# ------------------------------------------------------------------ the rule: errors name the argument
Q, W, K = np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32), np.zeros((10, 4), np.float32)
Q16, K16 = np.zeros((2, 3, 4), np.uint16), np.zeros((10, 4), np.uint16)
Q8, K8, KS = np.zeros((2, 3, 4), np.uint8), np.zeros((10, 4), np.uint8), np.ones(10, np.float32)
LO, HI = np.zeros(2, np.int32), np.full(2, 10, np.int32)
BAD = {
    "fp8_q_bf16_keys": ((Q8, W, K16, KS), "keys"),
    "bf16_q_fp8_keys": ((Q16, W, K8, KS), "keys"),
    "f32_q_bf16_keys": ((Q, W, K16, None), "keys"),
    "scale_without_fp8": ((Q16, W, K16, KS), "kscale"),
    "scale_with_float32": ((Q, W, K, KS), "kscale"),
    "fp8_without_scale": ((Q8, W, K8, None), "kscale"),
    "fp8_weights": ((Q8, W.astype(np.uint8), K8, KS), "w"),
    "float64_weights": ((Q, W.astype(np.float64), K, None), "w"),
    "float16_q": ((Q.astype(np.float16), W, K.astype(np.float16), None), "q"),
    "int8_keys": ((Q, W, K.astype(np.int8), None), "keys"),
    "scale_float64": ((Q8, W, K8, KS.astype(np.float64)), "kscale"),
    "scale_shape": ((Q8, W, K8, KS[:5]), "kscale"),
    "scale_2d": ((Q8, W, K8, KS[:, None]), "kscale"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("fn", ["indexer_scores", "hytopk_indexer", "replay_scores", "indexer_kl_loss"])
def test_mixed_dtypes_are_refused_by_name(case, fn):
    (q, w, keys, ks), arg = BAD[case]
    idx = np.zeros((2, 3), np.int32)
    call = {
        "indexer_scores": lambda: R.indexer_scores(q, w, keys, LO, HI, kscale=ks),
        "hytopk_indexer": lambda: R.hytopk_indexer(q, w, keys, LO, HI, 3, kscale=ks),
        "replay_scores": lambda: R.replay_scores(q, w, keys, idx, kscale=ks),
        "indexer_kl_loss": lambda: R.indexer_kl_loss(q, w, keys, idx, np.zeros((2, 3)), kscale=ks),
    }[fn]
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    assert f"argument '{arg}'" in str(e.value), str(e.value)


@pytest.mark.parametrize("case", sorted(BAD))
def test_backend_refuses_like_the_reference(case):
    (q, w, keys, ks), _ = BAD[case]
    b = workbench.backend("reference")
    with pytest.raises(Exception) as want:
        R.hytopk_indexer(q, w, keys, LO, HI, 3, kscale=ks)
    with pytest.raises(type(want.value)) as got:
        b.hytopk_indexer(q, w, keys, LO, HI, 3, kscale=ks)
    assert str(got.value) == str(want.value)


def test_error_messages_say_what_is_wrong():
    with pytest.raises(TypeError, match="q and keys must share one input kind"):
        R.indexer_scores(Q8, W, K16, LO, HI, kscale=KS)
    with pytest.raises(TypeError, match="only for fp8 e4m3 keys"):
        R.indexer_scores(Q16, W, K16, LO, HI, kscale=KS)
    with pytest.raises(TypeError, match="required with fp8 e4m3 keys"):
        R.indexer_scores(Q8, W, K8, LO, HI)


# ------------------------------------------------------------------ the reference backend (the Backend's conversions)
@pytest.mark.parametrize("kind, wd", COMBOS)
def test_reference_backend_every_combination(kind, wd):
    q, w, keys, lo, hi, k = _inputs(seed=4)
    qq, ww, kk, ks = DT.encode_exact(q, w, keys, kind, wd, np.random.default_rng(2))
    b = workbench.backend("reference")
    want = R.hytopk_indexer(q, w, keys, lo, hi, k, max_failed=1)
    res = b.hytopk_indexer(qq, ww, kk, lo, hi, k, kscale=ks, max_failed=1, query_chunk=2)
    np.testing.assert_array_equal(res.idx, want.idx)
    np.testing.assert_array_equal(bits(res.val), bits(want.val))
    np.testing.assert_array_equal(bits(b.indexer_scores(qq, ww, kk, lo, hi, kscale=ks)),
                                  bits(R.indexer_scores(q, w, keys, lo, hi)))
    np.testing.assert_array_equal(bits(b.replay_scores(qq, ww, kk, want.idx, kscale=ks)),
                                  bits(R.replay_scores(q, w, keys, want.idx)))


def test_stage_set_picks_the_kind_defaults():
    from workbench.pipeline import stage_set
    b = workbench.backend("reference")
    assert b.stages_for_kind("fp8").filter.name == "reference.filter"
    assert stage_set("reference", kind="bf16").threshold.name == b.stages.threshold.name
    assert "Backend('reference'" in repr(b)


# ------------------------------------------------------------------ what each family is handed (CuPy's contract, on CPU)
class _Recorder:
    """A family stub that records what the Backend hands it."""
    name = "stub"

    def __init__(self, bf16_bits, fp8_bits):
        self.takes_bf16_bits, self.takes_fp8_bits, self.seen = bf16_bits, fp8_bits, []

    def to_device(self, x):
        self.seen.append(x)
        return x


@pytest.mark.parametrize("fp8_bits", [True, False])
def test_backend_passes_float32_w_and_fp8_bits_through(fp8_bits):
    torch = pytest.importorskip("torch")
    from workbench.torch import dispatch
    b = workbench.backend("reference")
    b.family = _Recorder(bf16_bits=True, fp8_bits=fp8_bits)
    q8 = torch.zeros((2, 3, 4), dtype=torch.float8_e4m3fn)
    k8 = torch.ones((10, 4)).to(torch.float8_e4m3fn)
    w, ks = torch.rand(2, 3), torch.ones(10)
    qq, ww, kk, ss = dispatch.kernel_inputs(q8, w.requires_grad_(), k8, ks)
    assert (qq.dtype, ww.dtype, kk.dtype, ss.dtype) == (q8.dtype, torch.float32, k8.dtype, torch.float32)
    assert not ww.requires_grad
    dts = DT.check_indexer_dtypes(qq, ww, kk, ss)
    out = b._indexer_args(qq, ww, kk, ss, dts)
    assert out[1] is ww and out[3] is ss                        # float32 w and kscale: unchanged
    if fp8_bits:                                                # the e4m3 bits, viewed (no copy)
        assert out[0].dtype == torch.uint8 and out[0].data_ptr() == q8.data_ptr()
        assert out[2].dtype == torch.uint8 and out[2].data_ptr() == k8.data_ptr()
    else:                                                       # decoded float32 values
        assert out[0].dtype == torch.float32 and torch.equal(out[2], k8.float())
    # bf16 q/keys with float32 w: unchanged for a family with bf16 kernels; bf16 w beside float32 q: widened
    qb, kb = torch.zeros((2, 3, 4), dtype=torch.bfloat16), torch.zeros((10, 4), dtype=torch.bfloat16)
    out = b._indexer_args(qb, w.detach(), kb, None, DT.check_indexer_dtypes(qb, w, kb))
    assert out[0] is qb and out[2] is kb and out[1].dtype == torch.float32 and out[3] is None
    out = b._indexer_args(qb.float(), w.detach().bfloat16(), kb.float(), None,
                          DT.check_indexer_dtypes(qb.float(), w.bfloat16(), kb.float()))
    assert out[1].dtype == torch.float32
