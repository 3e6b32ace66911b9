"""Sparse attention kernels (kernels_cuda/attend.cu) on a real GPU (skipped elsewhere with the reason).

Bit for bit on exact inputs: uniform logits (q = 0) and hot/cold logits (cold ones underflow
exp2 to exactly 0) with small-integer values, so out is the float32 quotient of exact sums;
against the float64 reference with a tolerance on random bf16 inputs (large logits too); `one`
and `pair` on padding, duplicates, shared and disjoint neighbours, queries with no key, k not a
multiple of the key tile, 8 / 16 / 64 / 128 heads, MLA (576 / 512) and GQA layouts; the backward
against the reference, deterministic dK/dV 20/20 identical bits (and independent of the query
chunking), the atomic mode within tolerance; the torch op and the DSA layer on CUDA.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from reference import attention as RA
from workbench.bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from tests.test_attention import make_idx
from tests.strategies import stable_seed as seed

from tests._cupy_gpu import GPU_MARKS, cp  # noqa: E402  (skips the module without CuPy)

pytestmark = GPU_MARKS


@pytest.fixture(scope="module")
def CA():
    from workbench.families.cupy import attend
    return attend


def bf16(x):
    """(bf16 bits on the device, the float64 values they hold)."""
    b = float32_to_bf16_bits(np.ascontiguousarray(x, np.float32))
    return cp.asarray(b), bf16_bits_to_float32(b).astype(np.float64)


def bits(x):
    return np.ascontiguousarray(cp.asnumpy(x), np.float32).view(np.uint32)


def layout(mla, L, Hkv, Dqk, Dv, rng, scale_k=1.0, values=None):
    """Device (k, v) and their float64 values: MLA's shared kv rows or GQA's separate k, v."""
    if mla:
        kv = rng.standard_normal((L, Dqk)) * scale_k if values is None else values
        kd, kh = bf16(kv)
        return kd[:, None, :], kd[:, None, :Dv], kh[:, None, :], kh[:, None, :Dv]
    k = rng.standard_normal((L, Hkv, Dqk)) * scale_k if values is None else values[0]
    v = rng.standard_normal((L, Hkv, Dv)) if values is None else values[1]
    (kd, kh), (vd, vh) = bf16(k), bf16(v)
    return kd, vd, kh, vh


SHAPES = [  # (mla, Hq, Hkv, Dqk, Dv)
    (True, 128, 1, 576, 512), (True, 64, 1, 576, 512), (True, 16, 1, 576, 512), (True, 8, 1, 576, 512),
    (False, 32, 4, 128, 128), (False, 16, 2, 64, 64), (False, 4, 2, 24, 8),     # 24/8: padded dims
]
IDS = ["mla128", "mla64", "mla16", "mla8", "gqa8x4", "gqa8x2_d64", "gqa_pad"]
QPT = [1, 2]
FWD_KW = {"base": {}, "acc2": dict(acc=2), "wide": dict(wide=True)}   # hytopk_attend_fwd, _acc2, 64-key tiles


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("qpt", QPT)
@pytest.mark.parametrize("fk", list(FWD_KW))
@pytest.mark.parametrize("kind", ["random", "dups", "shared", "disjoint", "empty"])
def test_exact_hot_cold_logits_bit_for_bit(CA, shape, qpt, fk, kind):
    """Keys are hot (logit 0) or cold (logit -256 * scale / ln 2 < -149: exp2 gives exactly 0) per
    (query, head); out = the exact mean of the hot keys' small-integer values (all keys when none is hot)."""
    mla, Hq, Hkv, Dqk, Dv = shape
    rng = np.random.default_rng(seed(shape, qpt, kind))
    n, L, kk = 6, 300, 100                                  # kk = 100: not a multiple of the key tile
    G = Hq // Hkv
    kval = np.zeros((L, Hkv, Dqk))
    kval[:, :, 0] = np.where(rng.random((L, Hkv)) < 0.4, -128.0, 0.0)
    vval = rng.integers(-4, 5, (L, Hkv, Dv)).astype(np.float64)
    if mla:
        kvv = np.zeros((L, Dqk))
        kvv[:, 0] = kval[:, 0, 0]
        kvv[:, 1:Dv] = rng.integers(-4, 5, (L, Dv - 1))    # v = kv[:, :Dv] holds the hot/cold column too
        k, v, kh, vh = layout(True, L, 1, Dqk, Dv, rng, values=kvv)
    else:
        k, v, kh, vh = layout(False, L, Hkv, Dqk, Dv, rng, values=(kval, vval))
    q = np.zeros((n, Hq, Dqk))
    q[:, :, 0] = np.where(rng.random((n, Hq)) < 0.8, 2.0, 0.0)   # q = 0: every key ties (uniform)
    qd, qh = bf16(q)
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), 1.0, qpt=qpt, out_dtype="float32", **FWD_KW[fk])
    out = cp.asnumpy(out)
    want = np.zeros((n, Hq, Dv), np.float32)
    for t in range(n):
        sl = idx[t][idx[t] >= 0]
        for h in range(Hq):
            g = h // G
            if len(sl) == 0:
                continue
            logit = kh[sl, g] @ qh[t, h]
            use = sl[logit == logit.max()]                  # hot keys (or every key on a tie)
            s = vh[use, g].sum(0).astype(np.float32)        # exact: small integers
            want[t, h] = s / np.float32(len(use))
    np.testing.assert_array_equal(bits(out), bits(want))
    lse = cp.asnumpy(lse)
    assert np.all(np.isneginf(lse[(idx < 0).all(1)]))


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("qpt", QPT)
@pytest.mark.parametrize("fk", list(FWD_KW))
@pytest.mark.parametrize("kind", ["random", "dups", "shared", "disjoint", "empty", "pad_only"])
def test_random_inputs_match_reference(CA, shape, qpt, fk, kind):
    mla, Hq, Hkv, Dqk, Dv = shape
    rng = np.random.default_rng(seed(shape, qpt, kind, 1))
    n, L, kk = 7, 700, 300                                   # odd n: the last pair has one query
    k, v, kh, vh = layout(mla, L, Hkv, Dqk, Dv, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, Dqk)))
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, qpt=qpt, out_dtype="float32", **FWD_KW[fk])
    ro, rl = RA.attend(qh, kh, vh, idx)
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("qpt", QPT)
@pytest.mark.parametrize("fk", list(FWD_KW))
def test_large_logits_and_k_2048(CA, qpt, fk):
    rng = np.random.default_rng(5)
    n, L, kk, Hq = 4, 5000, 2048, 16
    k, v, kh, vh = layout(True, L, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)) * 8.0)     # logits ~ +-200: one-hot-ish softmax
    idx = make_idx(rng, n, L, kk, "shared")
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, qpt=qpt, out_dtype="float32", **FWD_KW[fk])
    ro, rl = RA.attend(qh, kh, vh, idx)
    assert np.all(np.isfinite(cp.asnumpy(out)))
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-2)


def test_bf16_output_is_the_rounded_float32_one(CA):
    rng = np.random.default_rng(6)
    k, v, _, _ = layout(True, 300, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((5, 16, 576)))
    idx = cp.asarray(make_idx(rng, 5, 300, 64, "random"))
    o32, l32 = CA.attend_forward(qd, k, v, idx, None, out_dtype="float32")
    o16, l16 = CA.attend_forward(qd, k, v, idx, None, out_dtype="bfloat16")
    assert o16.dtype == cp.uint16
    np.testing.assert_array_equal(cp.asnumpy(o16), float32_to_bf16_bits(cp.asnumpy(o32)))
    np.testing.assert_array_equal(bits(l16), bits(l32))


# ------------------------------------------------------------------ backward
BWD_SHAPES = [(True, 64, 1, 576, 512), (True, 8, 1, 576, 512), (True, 128, 1, 576, 512), (False, 32, 4, 128, 128),
              (False, 4, 2, 24, 8)]
BWD_IDS = ["mla64", "mla8", "mla128", "gqa8x4", "gqa_pad"]


def _rel_close(got, want, tol=3e-2):
    scale = max(1e-3, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= tol * scale, f"max error {err:.3g} > {tol} x {scale:.3g}"


BWD_MODES = {"det": dict(deterministic=True), "atomic": dict(deterministic=False),
             "det_v2": dict(deterministic=True, version=2)}


@pytest.mark.parametrize("shape", BWD_SHAPES + [(True, 136, 1, 576, 512), (False, 192, 2, 64, 64)],
                         ids=BWD_IDS + ["mla136_3hb", "gqa96x2_partial_hb"])
@pytest.mark.parametrize("mode", list(BWD_MODES))
@pytest.mark.parametrize("kind", ["shared", "dups", "empty", "disjoint", "pad_only"])
def test_backward_matches_reference(CA, shape, mode, kind):
    """mla136: 3 head blocks (a pair and a lone one in version 2); gqa96x2: 2 head blocks (64 + 32 heads)."""
    mla, Hq, Hkv, Dqk, Dv = shape
    deterministic = mode != "atomic"
    rng = np.random.default_rng(seed(shape, deterministic, kind))
    n, L, kk = 7, 400, 150                                   # odd n
    k, v, kh, vh = layout(mla, L, Hkv, Dqk, Dv, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, Dqk)))
    dod, doh = bf16(rng.standard_normal((n, Hq, Dv)))
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    dq, dk, dv = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, **BWD_MODES[mode])
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    if mla:
        assert dv is None
        _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))
    else:
        _rel_close(cp.asnumpy(dk), rk)
        _rel_close(cp.asnumpy(dv), rv)
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(cp.asnumpy(dk)[untouched] == 0)
    assert np.all(cp.asnumpy(dq)[(idx < 0).all(1)] == 0)


@pytest.mark.parametrize("shape", [(True, 16, 1, 576, 512), (False, 32, 4, 128, 128), (True, 128, 1, 576, 512),
                                   (False, 256, 2, 64, 64)], ids=["mla16", "gqa8x4", "mla128", "gqa128x2"])
@pytest.mark.parametrize("version", [1, 2])
def test_deterministic_backward_is_bitwise_reproducible(CA, shape, version):
    """20 runs, identical bits; a small scratch (many query chunks) gives the same bits too
    (mla128 / gqa128x2: two head blocks, which version 2 adds into one part row by atomics)."""
    mla, Hq, Hkv, Dqk, Dv = shape
    rng = np.random.default_rng(7)
    n, L, kk = 64, 512, 256                                  # adjacent queries share most keys: many collisions
    k, v, _, _ = layout(mla, L, Hkv, Dqk, Dv, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, Dqk)))
    dod, _ = bf16(rng.standard_normal((n, Hq, Dv)))
    idx = cp.asarray(make_idx(rng, n, L, kk, "shared"))
    out, lse = CA.attend_forward(qd, k, v, idx, None)
    runs = [CA.attend_backward(dod, qd, k, v, idx, out, lse, None, deterministic=True, version=version)
            for _ in range(20)]
    first = [bits(x) for x in runs[0] if x is not None]
    for r in runs[1:]:
        for a, b in zip(first, [bits(x) for x in r if x is not None]):
            np.testing.assert_array_equal(a, b)
    for sb in (1, 7 << 20):                                  # one query per chunk; uneven chunks
        chunked = CA.attend_backward(dod, qd, k, v, idx, out, lse, None, deterministic=True, scratch_bytes=sb,
                                     version=version)
        for a, b in zip(first, [bits(x) for x in chunked if x is not None]):
            np.testing.assert_array_equal(a, b)


KEY_SHAPES = [(False, 4, 4, 128, 128), (False, 8, 2, 64, 64), (False, 2, 1, 192, 128), (False, 3, 3, 128, 128)]
KEY_IDS = ["mha4_d128", "gqa4x2_d64", "gqa2x1_d192_128", "mha3_d128"]


@pytest.mark.parametrize("shape", KEY_SHAPES, ids=KEY_IDS)
@pytest.mark.parametrize("kind", ["shared", "dups", "empty", "disjoint", "pad_only"])
def test_key_major_backward_matches_reference(CA, shape, kind):
    """Version 3 (dq query-major, dK/dV key-major) against the float64 reference; keys no query
    selected get exact zeros, queries with no key a zero dq."""
    mla, Hq, Hkv, Dqk, Dv = shape
    rng = np.random.default_rng(seed("keys", shape, kind))
    n, L, kk = 9, 300, 130
    k, v, kh, vh = layout(mla, L, Hkv, Dqk, Dv, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, Dqk)))
    dod, doh = bf16(rng.standard_normal((n, Hq, Dv)))
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    dq, dk, dv = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, version=3)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk), rk)
    _rel_close(cp.asnumpy(dv), rv)
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(cp.asnumpy(dk)[untouched] == 0) and np.all(cp.asnumpy(dv)[untouched] == 0)
    assert np.all(cp.asnumpy(dq)[(idx < 0).all(1)] == 0)


@pytest.mark.parametrize("shape", KEY_SHAPES[:2], ids=KEY_IDS[:2])
def test_key_major_backward_is_bitwise_reproducible_and_the_default(CA, shape):
    """20 runs of version 3 give identical bits, with hot keys that many queries selected (long
    entry lists: every lane group and both halves of the final sum busy); version None takes it for
    these shapes, whatever `deterministic` says, and gives the same bits."""
    mla, Hq, Hkv, Dqk, Dv = shape
    rng = np.random.default_rng(seed("keys-repro", shape))
    n, L, kk = 96, 400, 200
    k, v, _, _ = layout(mla, L, Hkv, Dqk, Dv, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, Dqk)))
    dod, _ = bf16(rng.standard_normal((n, Hq, Dv)))
    idx = make_idx(rng, n, L, kk, "shared")
    idx[:, :5] = np.arange(5)                                   # keys 0..4: every query selected them
    idx = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, idx, None)
    first = [bits(x) for x in CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=3)]
    for _ in range(19):
        for a, b in zip(first, [bits(x) for x in CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=3)]):
            np.testing.assert_array_equal(a, b)
    for det in (True, False):
        for a, b in zip(first, [bits(x) for x in CA.attend_backward(dod, qd, k, v, idx, out, lse, None,
                                                                     deterministic=det)]):
            np.testing.assert_array_equal(a, b)


def test_key_major_backward_refuses_other_layouts(CA):
    """MLA's shared rows, many heads per kv head or dims off multiples of 64: a clear error."""
    rng = np.random.default_rng(12)
    for mla, Hq, Hkv, Dqk, Dv in ((True, 8, 1, 576, 512), (False, 16, 2, 64, 64), (False, 2, 2, 24, 8)):
        k, v, _, _ = layout(mla, 50, Hkv, Dqk, Dv, rng)
        qd, _ = bf16(rng.standard_normal((3, Hq, Dqk)))
        dod, _ = bf16(rng.standard_normal((3, Hq, Dv)))
        idx = cp.asarray(make_idx(rng, 3, 50, 20, "dups"))
        out, lse = CA.attend_forward(qd, k, v, idx, None)
        with pytest.raises(ValueError, match="'version'"):
            CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=3)


# ------------------------------------------------------------------ arguments, torch
def test_bad_arguments(CA):
    rng = np.random.default_rng(8)
    k, v, _, _ = layout(True, 10, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((2, 8, 576)))
    with pytest.raises(ValueError, match="'idx'"):
        CA.attend_forward(qd, k, v, cp.asarray([[0, 10], [0, 1]], cp.int32))
    with pytest.raises(ValueError, match="'idx'"):
        CA.attend_forward(qd, k, v, cp.asarray([[0, -2], [0, 1]], cp.int32))
    with pytest.raises(TypeError, match="'idx'"):
        CA.attend_forward(qd, k, v, cp.asarray([[0, 1], [0, 1]], cp.int64))
    with pytest.raises(ValueError, match="'k'"):
        CA.attend_forward(qd, k[:, :, :512], v, cp.asarray([[0, 1], [0, 1]], cp.int32))
    with pytest.raises(ValueError, match="'out_dtype'"):
        CA.attend_forward(qd, k, v, cp.asarray([[0, 1], [0, 1]], cp.int32), out_dtype="float16")


@pytest.mark.parametrize("mla", [True, False])
def test_torch_op_on_cuda_matches_cpu(mla):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    import workbench.torch  # noqa: F401
    g = torch.Generator().manual_seed(0)
    n, L, kk, Hq = 9, 200, 64, 16
    Dqk, Dv = (576, 512) if mla else (128, 128)
    q = torch.randn(n, Hq, Dqk, generator=g).bfloat16()
    kv = torch.randn(L, Dqk, generator=g).bfloat16() if mla else torch.randn(L, 2, Dqk, generator=g).bfloat16()
    v = None if mla else torch.randn(L, 2, Dv, generator=g).bfloat16()
    idx = torch.from_numpy(make_idx(np.random.default_rng(1), n, L, kk, "shared"))
    d_v = Dv if mla else -1
    res = {}
    for dev in ("cpu", "cuda"):
        leaves = [x.detach().to(dev).requires_grad_() for x in (q, kv) + ((v,) if v is not None else ())]
        out, lse = torch.ops.hytopk.sparse_attention(leaves[0], leaves[1], leaves[2] if v is not None else None,
                                                     idx.to(dev), d_v, None, True)
        dout = torch.ones_like(out)
        out.backward(dout)
        res[dev] = [out.float().cpu(), lse.cpu()] + [x.grad.float().cpu() for x in leaves]
    for a, b in zip(res["cuda"], res["cpu"]):
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin)
        scale = max(1e-3, float(b[fin].abs().max())) if fin.any() else 1.0
        assert float((a[fin] - b[fin]).abs().max()) <= 3e-2 * scale


def test_dsa_layer_trains_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from workbench.torch.dsa import DSAttention
    torch.manual_seed(0)
    m = DSAttention(64, heads=4, head_dim=32, index_heads=4, index_dim=32, k=32, checkpoint="replay").cuda().bfloat16()
    x = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    o = m(x)
    (o.out.float().square().mean() + o.indexer_loss).backward()
    assert torch.isfinite(o.out.float()).all() and x.grad is not None and torch.isfinite(x.grad.float()).all()
    assert math.isfinite(float(o.indexer_loss))


def _registered(stage):
    from workbench import registry
    return [v.name for v in registry.variants(stage, "cupy")]


@pytest.mark.parametrize("name", ["cupy.attend.one", "cupy.attend.pair", "cupy.attend.one_acc2",
                                  "cupy.attend.pair_acc2", "cupy.attend.pair_nk64"])
def test_registered_forward_variants(name):
    from workbench import registry
    assert name in _registered("attend")
    rng = np.random.default_rng(9)
    k, v, kh, vh = layout(True, 500, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((5, 16, 576)))
    idx = make_idx(rng, 5, 500, 200, "shared")
    out, lse = registry.get(name)(qd, k, v, cp.asarray(idx), None)
    ro, rl = registry.get("reference.attend")(qh, kh, vh, idx, None)
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["cupy.attend_backward.deterministic", "cupy.attend_backward.deterministic_v2",
                                  "cupy.attend_backward.atomic", "cupy.attend_backward.key_major"])
def test_registered_backward_variants(name):
    from workbench import registry
    assert name in _registered("attend_backward")
    rng = np.random.default_rng(10)
    k, v, kh, vh = layout(False, 300, 2, 128, 128, rng)
    qd, qh = bf16(rng.standard_normal((4, 8, 128)))
    dod, doh = bf16(rng.standard_normal((4, 8, 128)))
    idx = make_idx(rng, 4, 300, 100, "dups")
    got = registry.get(name)(dod, qd, k, v, cp.asarray(idx), None)
    want = registry.get("reference.attend_backward")(doh, qh, kh, vh, idx, None)
    for a, b in zip(got, want):
        _rel_close(cp.asnumpy(a), b)


@pytest.mark.parametrize("kernel", ["bits", "reg", "smem"])
@pytest.mark.parametrize("kind", ["random", "dups", "shared", "disjoint", "empty", "pad_only"])
@pytest.mark.parametrize("n,kk", [(7, 100), (6, 2048), (1, 1), (4, 129), (5, 300), (3, 700), (9, 1500), (2, 2049)])
def test_pair_union_kernel_equals_reference(CA, kernel, kind, n, kk):
    """Every union kernel (2 kk = 2 .. 4098: 1 .. 16 entries per thread of the register sort, and
    the shared-memory fallback past 4096; the bitmap kernel where union_bits_fit, its blocks with a
    duplicate sorting) gives the reference's arrays exactly."""
    rng = np.random.default_rng(seed(kind, n, kk))
    L = 5000
    idx = make_idx(rng, n, L, kk, kind)
    got = CA.pair_union(cp.asarray(idx), L, kernel=kernel)
    for a, b in zip(got, RA.pair_union(idx)):
        np.testing.assert_array_equal(cp.asnumpy(a), b)


def test_pair_union_bits_at_the_bench_size_with_repeats(CA):
    """The bitmap kernel at L = 65536, kk = 2048 (2048-word bitmaps): keys on word edges (0, 31, 32,
    L - 1), pairs sharing most keys, repeats counted from the block's list (a key three times in
    one query and once in the other), a block with more repeats than the list holds (it sorts):
    the reference's arrays exactly, and the default ('auto') takes it."""
    rng = np.random.default_rng(13)
    n, L, kk = 9, 65536, 2048
    assert CA.union_bits_fit(L, kk)
    idx = np.stack([rng.choice(L, kk, replace=False) for _ in range(n)]).astype(np.int32)
    idx[1::2, : kk // 2] = idx[0:-1:2, : kk // 2]
    idx[0, :4] = [0, 31, 32, L - 1]
    idx[3, 7] = idx[3, 9]                                       # pair 1: a duplicate
    idx[2, 10:12] = idx[2, 12]                                  # ... a key three times in query 2
    idx[3, 100] = idx[2, 12]                                    # ... and once in query 3
    idx[4, 5] = -1
    idx[6, :600] = 77                                           # pair 3: 599 repeats (> the list's 512)
    for kernel in ("bits", "auto"):
        got = CA.pair_union(cp.asarray(idx), L, kernel=kernel)
        for a, b in zip(got, RA.pair_union(idx)):
            np.testing.assert_array_equal(cp.asnumpy(a), b)


@pytest.mark.parametrize("kernel", ["reg", "smem"])
@pytest.mark.parametrize("kk", [64, 1024, 2048])
def test_pair_union_long_runs_and_large_positions(CA, kernel, kk):
    """Runs of one position longer than a thread's (or a warp's) share of the sorted entries, and
    positions up to 2^30 - 1 (the packing's limit); out-of-range / -1 slots are dropped."""
    rng = np.random.default_rng(seed("runs", kernel, kk))
    L = 1 << 30
    idx = rng.choice(np.array([0, 7, L - 1, -1, 123456789], np.int64), (5, kk)).astype(np.int32)
    idx[1, : kk // 2] = L - 1                                   # one position fills half a row
    got = CA.pair_union(cp.asarray(idx), L, kernel=kernel)
    for a, b in zip(got, RA.pair_union(idx)):
        np.testing.assert_array_equal(cp.asnumpy(a), b)


def test_backward_v2_one_head_block_equals_v1(CA):
    """At one head block per kv head version 2 runs the same kernel and the same per-key order as
    version 1 (only the reduction kernel differs): identical bits."""
    rng = np.random.default_rng(11)
    n, L, kk = 9, 300, 200
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, 16, 576)))
    dod, _ = bf16(rng.standard_normal((n, 16, 512)))
    idx = cp.asarray(make_idx(rng, n, L, kk, "dups"))
    out, lse = CA.attend_forward(qd, k, v, idx, None)
    a = CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=1)
    b = CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=2)
    for x, y in zip(a, b):
        if x is not None:
            np.testing.assert_array_equal(bits(x), bits(y))
