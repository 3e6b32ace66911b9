"""The wgmma MLA forwards (kernels_cuda/attend_wgmma2.cu: cupy.attend.wgmma2, its 2-CTA cluster
kernel wgmma2c, and both with the swizzled key tile, wgmma2s and wgmma2sc; attend_wgmma3.cu:
cupy.attend.wgmma3, other rounding, so close to wgmma2, never bitwise; the query-pair kernels
wgmma2sp and wgmma3p) on a Hopper GPU (skipped elsewhere with the reason); every test runs on each kernel
(`FWD`: the c versions forced onto the cluster kernel at every head count, the odd head-block counts
padded with an empty block).

Bit for bit on the exact hot/cold inputs of tests/test_attention_gpu.py; against the float64
reference with its tolerance on random bf16 inputs (padding, duplicates, shared and disjoint
neighbours, queries with no valid key, k not a multiple of the 64-key tile, 16 / 64 / 128 / 192 heads,
large logits, k = 2048); close to cupy.attend.one; bf16 out = the rounded float32 out; kv rows with a
stride; GQA refused with a clear error.
"""
from __future__ import annotations

import numpy as np
import pytest

from reference import attention as RA
from workbench.bf16 import float32_to_bf16_bits
from tests.test_attention import make_idx
from tests.test_attention_gpu import bf16, bits, layout, seed

from tests._cupy_gpu import GPU_MARKS, cp  # noqa: E402  (skips the module without CuPy)

pytestmark = GPU_MARKS

KINDS = ["random", "dups", "shared", "disjoint", "empty", "pad_only"]


VERSIONS = ["wgmma2", "wgmma2c", "wgmma2s", "wgmma2sc", "wgmma3"]
V2_VERSIONS = VERSIONS[:4]                 # one arithmetic order: bitwise wgmma2 (wgmma3 rounds differently)


def _forward(version):
    from workbench.families.cupy import attend_wgmma2, attend_wgmma3
    from workbench import loader
    if loader.current_arch() != "90":
        pytest.skip("cupy.attend.wgmma2 needs a Hopper GPU (sm_90a)")
    if version == "wgmma3":
        return attend_wgmma3.attend_forward_wgmma3
    cluster, swz = version.endswith("c"), version.startswith("wgmma2s")
    return lambda *a, **kw: attend_wgmma2.attend_forward_wgmma2(*a, cluster=cluster, swz=swz, **kw)


@pytest.fixture(scope="module", params=VERSIONS)
def FWD(request):
    """The forward of one kernel version: (q, k, v, idx, scale, out_dtype=...) -> (out, lse)."""
    return _forward(request.param)


@pytest.fixture(scope="module")
def CA():
    from workbench.families.cupy import attend
    return attend


def check_hot_cold(FWD, Hq, kind, n, tag="wgmma"):
    """Hot keys (logit 0) / cold keys (exp2 underflows to exactly 0): out = the exact mean of the hot
    keys' small-integer values (a key listed twice counts twice), as the float32 quotient
    (tests/test_attention_gpu.py's case); a query with no key: lse -inf."""
    Dqk, Dv = 576, 512
    rng = np.random.default_rng(seed(tag, Hq, kind))
    L, kk = 300, 100
    kvv = np.zeros((L, Dqk))
    kvv[:, 0] = np.where(rng.random(L) < 0.4, -128.0, 0.0)
    kvv[:, 1:Dv] = rng.integers(-4, 5, (L, Dv - 1))
    k, v, kh, vh = layout(True, L, 1, Dqk, Dv, rng, values=kvv)
    q = np.zeros((n, Hq, Dqk))
    q[:, :, 0] = np.where(rng.random((n, Hq)) < 0.8, 2.0, 0.0)
    qd, qh = bf16(q)
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = FWD(qd, k, v, cp.asarray(idx), 1.0, out_dtype="float32")
    out = cp.asnumpy(out)
    want = np.zeros((n, Hq, Dv), np.float32)
    for t in range(n):
        sl = idx[t][idx[t] >= 0]
        if len(sl) == 0:
            continue
        for h in range(Hq):
            logit = kh[sl, 0] @ qh[t, h]
            use = sl[logit == logit.max()]
            want[t, h] = vh[use, 0].sum(0).astype(np.float32) / np.float32(len(use))
    np.testing.assert_array_equal(bits(out), bits(want))
    lse = cp.asnumpy(lse)
    assert np.all(np.isneginf(lse[(idx < 0).all(1)]))


@pytest.mark.parametrize("Hq", [128, 64, 8])
@pytest.mark.parametrize("kind", ["random", "dups", "shared", "empty"])
def test_exact_hot_cold_logits_bit_for_bit(FWD, Hq, kind):
    check_hot_cold(FWD, Hq, kind, 6)


@pytest.mark.parametrize("Hq", [128, 64, 16, 192])
@pytest.mark.parametrize("kk", [64, 100, 300])
@pytest.mark.parametrize("kind", KINDS)
def test_random_inputs_match_reference(FWD, Hq, kk, kind):
    check_random(FWD, Hq, kk, kind, 700)


def check_random(FWD, Hq, kk, kind, L, tag="wgmma"):
    """The reference's tolerance on random bf16 inputs (7 queries: an odd count); a query with no
    key: out 0, lse -inf."""
    rng = np.random.default_rng(seed(tag, Hq, kk, kind, 1))
    n = 7
    k, v, kh, vh = layout(True, L, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, kind)
    out, lse = FWD(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    ro, rl = RA.attend(qh, kh, vh, idx)
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-3)
    empty = (idx < 0).all(1)
    assert np.all(cp.asnumpy(out)[empty] == 0) and np.all(np.isneginf(cp.asnumpy(lse)[empty]))


@pytest.mark.parametrize("kind", ["random", "dups", "shared"])
def test_close_to_the_one_kernel(FWD, CA, kind):
    rng = np.random.default_rng(seed("wgmma-one", kind))
    n, L, kk = 9, 3000, 1000
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, 128, 576)))
    idx = cp.asarray(make_idx(rng, n, L, kk, kind))
    o1, l1 = CA.attend_forward(qd, k, v, idx, None, qpt=1, out_dtype="float32")
    ow, lw = FWD(qd, k, v, idx, None, out_dtype="float32")
    np.testing.assert_allclose(cp.asnumpy(ow), cp.asnumpy(o1), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(cp.asnumpy(lw), cp.asnumpy(l1), rtol=1e-5, atol=1e-4)


def test_large_logits_and_k_2048(FWD):
    rng = np.random.default_rng(5)
    n, L, kk, Hq = 4, 5000, 2048, 128
    k, v, kh, vh = layout(True, L, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)) * 8.0)     # logits ~ +-200: one-hot-ish softmax
    idx = make_idx(rng, n, L, kk, "shared")
    out, lse = FWD(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    ro, rl = RA.attend(qh, kh, vh, idx)
    assert np.all(np.isfinite(cp.asnumpy(out)))
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-2)


def test_runs_are_bit_identical(FWD):
    """The forward is reproducible bit for bit (no atomics; fixed reduction orders): 10 runs at k 2048
    over many blocks give the same bytes (out and lse)."""
    rng = np.random.default_rng(14)
    k, v, _, _ = layout(True, 20000, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((257, 128, 576)))
    idx = cp.asarray(make_idx(rng, 257, 20000, 2048, "shared"))
    first = [cp.asnumpy(x).view(np.uint8) for x in FWD(qd, k, v, idx, None, out_dtype="float32")]
    for _ in range(9):
        for a, b in zip(first, FWD(qd, k, v, idx, None, out_dtype="float32")):
            np.testing.assert_array_equal(a, cp.asnumpy(b).view(np.uint8))


def test_bf16_output_is_the_rounded_float32_one(FWD):
    rng = np.random.default_rng(6)
    k, v, _, _ = layout(True, 300, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((5, 64, 576)))
    idx = cp.asarray(make_idx(rng, 5, 300, 130, "random"))
    o32, l32 = FWD(qd, k, v, idx, None, out_dtype="float32")
    o16, l16 = FWD(qd, k, v, idx, None, out_dtype="bfloat16")
    assert o16.dtype == cp.uint16
    np.testing.assert_array_equal(cp.asnumpy(o16), float32_to_bf16_bits(cp.asnumpy(o32)))
    np.testing.assert_array_equal(bits(l16), bits(l32))


def test_strided_kv_rows(FWD):
    """kv rows inside a wider buffer (row stride 640 elements): the same result as a compact copy."""
    rng = np.random.default_rng(8)
    L = 400
    wide = rng.standard_normal((L, 640))
    wd, _ = bf16(wide)
    kvs = wd[:, :576]
    kc = cp.ascontiguousarray(kvs)
    qd, _ = bf16(rng.standard_normal((3, 128, 576)))
    idx = cp.asarray(make_idx(rng, 3, L, 200, "random"))
    a = FWD(qd, kvs[:, None, :], kvs[:, None, :512], idx, None, out_dtype="float32")
    b = FWD(qd, kc[:, None, :], kc[:, None, :512], idx, None, out_dtype="float32")
    for x, y in zip(a, b):
        np.testing.assert_array_equal(bits(x), bits(y))


def test_gqa_is_refused_with_a_clear_error(FWD):
    rng = np.random.default_rng(11)
    k, v, _, _ = layout(False, 100, 2, 128, 128, rng)
    qd, _ = bf16(rng.standard_normal((2, 8, 128)))
    idx = cp.asarray(make_idx(rng, 2, 100, 16, "random"))
    with pytest.raises(ValueError, match="cupy.attend.one"):
        FWD(qd, k, v, idx, None)


@pytest.mark.parametrize("name", ["cupy.attend." + v for v in VERSIONS])
def test_registered_variant(name):
    from workbench import registry
    _forward("wgmma2")                                       # (skips off Hopper)
    assert name in [v.name for v in registry.variants("attend", "cupy")]
    rng = np.random.default_rng(9)
    k, v, kh, vh = layout(True, 500, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((5, 128, 576)))
    idx = make_idx(rng, 5, 500, 200, "shared")
    out, lse = registry.get(name)(qd, k, v, cp.asarray(idx), None)
    ro, rl = registry.get("reference.attend")(qh, kh, vh, idx, None)
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("Hq, kk", [(128, 2048), (128, 300), (64, 1000), (192, 130), (16, 64)])
@pytest.mark.parametrize("version", V2_VERSIONS[1:])
def test_variants_are_wgmma2_bit_for_bit(version, Hq, kk):
    """The same arithmetic in the same order: out and lse equal wgmma2's bits (swizzled tile or not,
    cluster or not, several tiles, padding, a partial last tile, more queries than SMs' worth of
    blocks). (wgmma2 equalled the removed version 1 bit for bit: run 6 of results/h200-2026-12-01.)"""
    v1, v2 = _forward("wgmma2"), _forward(version)
    rng = np.random.default_rng(seed("wgmma-v2", version, Hq, kk))
    n, L = 300 if Hq == 128 and kk == 300 else 5, 5000
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = cp.asarray(make_idx(rng, n, L, kk, "random"))
    for dt in ("float32", "bfloat16"):
        a, b = v1(qd, k, v, idx, None, out_dtype=dt), v2(qd, k, v, idx, None, out_dtype=dt)
        for x, y in zip(a, b):                           # raw bytes: bf16 bits, float32 bits, -inf lse
            np.testing.assert_array_equal(cp.asnumpy(x).view(np.uint8), cp.asnumpy(y).view(np.uint8))


@pytest.mark.parametrize("v3", [True, False])
def test_torch_op_takes_wgmma3_for_mla_at_many_heads(v3, monkeypatch):
    """torch.ops.hytopk.sparse_attention at 128 MLA heads (d_qk 576 / d_v 512) on Hopper: the
    forward is cupy.attend.wgmma3's bit for bit (HYTOPK_ATTEND_WGMMA3=0, TA.WGMMA3_FORWARD False:
    wgmma2s's); out, lse and the gradients (the wgmma backward, attend_backward version 4, on that
    forward's out / lse) stay within the reference's tolerance."""
    torch = pytest.importorskip("torch")
    import workbench.torch  # noqa: F401
    from workbench.families.cupy import attend_wgmma2, attend_wgmma3
    from workbench.torch import attention as TA
    _forward("wgmma2s")                                      # skips off Hopper
    if not TA.WGMMA_FORWARD:
        pytest.skip("HYTOPK_ATTEND_WGMMA=0")
    monkeypatch.setattr(TA, "WGMMA3_FORWARD", v3)
    g = torch.Generator().manual_seed(3)
    n, L, kk, Hq = 6, 300, 200, 128
    q = torch.randn(n, Hq, 576, generator=g).bfloat16()
    kv = torch.randn(L, 576, generator=g).bfloat16()
    idx = torch.from_numpy(make_idx(np.random.default_rng(4), n, L, kk, "dups"))
    res = {}
    for dev in ("cpu", "cuda"):
        leaves = [x.detach().to(dev).requires_grad_() for x in (q, kv)]
        out, lse = torch.ops.hytopk.sparse_attention(leaves[0], leaves[1], None, idx.to(dev), 512, None, True)
        if dev == "cuda":
            args = (leaves[0].detach(), leaves[1].detach()[:, None, :], leaves[1].detach()[:, None, :512], idx.cuda(), None)
            want, want_lse = (attend_wgmma3.attend_forward_wgmma3(*args) if v3
                              else attend_wgmma2.attend_forward_wgmma2(*args, swz=True))
            assert torch.equal(out.view(torch.int16).cpu(), torch.from_dlpack(want).view(torch.int16).cpu())
            assert torch.equal(lse.cpu(), torch.from_dlpack(want_lse).cpu())
        out.backward(torch.ones_like(out))
        res[dev] = [out.float().cpu(), lse.cpu()] + [x.grad.float().cpu() for x in leaves]
    for a, b in zip(res["cuda"], res["cpu"]):
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin)
        scale = max(1e-3, float(b[fin].abs().max())) if fin.any() else 1.0
        assert float((a[fin] - b[fin]).abs().max()) <= 3e-2 * scale


# ------------------------------------------------ wgmma2sp, wgmma3p: a query pair per block
PAIR_VERSIONS = ["wgmma2sp", "wgmma3p"]


def _pair(version="wgmma2sp"):
    from workbench.families.cupy import attend_wgmma2, attend_wgmma3
    _forward("wgmma2s")                                      # skips off Hopper
    if version == "wgmma3p":
        return lambda *a, **kw: attend_wgmma3.attend_forward_wgmma3(*a, qpt=2, **kw)
    return lambda *a, **kw: attend_wgmma2.attend_forward_wgmma2(*a, swz=True, qpt=2, **kw)


@pytest.fixture(scope="module", params=PAIR_VERSIONS)
def PAIR(request):
    """The forward of one query-pair kernel: (q, k, v, idx, scale, out_dtype=...) -> (out, lse)."""
    return _pair(request.param)


@pytest.mark.parametrize("Hq", [8, 16, 32, 5])
@pytest.mark.parametrize("kind", ["random", "dups", "shared", "disjoint", "empty"])
def test_pair_exact_hot_cold_logits_bit_for_bit(PAIR, Hq, kind):
    """Over each pair's union (keys only the other query selected masked); odd n: a lone last query."""
    check_hot_cold(PAIR, Hq, kind, 7, tag="wgmma-pair")


@pytest.mark.parametrize("Hq", [8, 16, 32])
@pytest.mark.parametrize("kk", [64, 100, 300, 2048])
@pytest.mark.parametrize("kind", KINDS)
def test_pair_random_inputs_match_reference(PAIR, Hq, kk, kind):
    check_random(PAIR, Hq, kk, kind, 5000, tag="wgmma-pair")


def test_pair_runs_are_bit_identical(PAIR):
    """10 runs of a query-pair forward at k 2048 (many union tiles, odd n) give the same bits."""
    rng = np.random.default_rng(13)
    n, L, kk, Hq = 257, 20000, 2048, 16
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = cp.asarray(make_idx(rng, n, L, kk, "shared"))
    o0, l0 = PAIR(qd, k, v, idx, None, out_dtype="float32")
    for _ in range(9):
        o, l = PAIR(qd, k, v, idx, None, out_dtype="float32")
        assert cp.array_equal(o.view(cp.uint32), o0.view(cp.uint32)) and cp.array_equal(l.view(cp.uint32), l0.view(cp.uint32))


def test_pair_close_to_the_mma_sync_pair_and_bf16_out(CA, PAIR):
    """Within tolerance of cupy.attend.pair (the same union, other MMA order) over many pairs at
    k 2048; the bf16 out is the rounded float32 out; more than 32 heads refused."""
    FWD = PAIR
    rng = np.random.default_rng(12)
    n, L, kk, Hq = 301, 20000, 2048, 16
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = cp.asarray(make_idx(rng, n, L, kk, "shared"))
    o1, l1 = CA.attend_forward(qd, k, v, idx, None, qpt=2, out_dtype="float32")
    ow, lw = FWD(qd, k, v, idx, None, out_dtype="float32")
    np.testing.assert_allclose(cp.asnumpy(ow), cp.asnumpy(o1), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(cp.asnumpy(lw), cp.asnumpy(l1), rtol=1e-5, atol=1e-4)
    o16, l16 = FWD(qd, k, v, idx, None, out_dtype="bfloat16")
    np.testing.assert_array_equal(cp.asnumpy(o16), float32_to_bf16_bits(cp.asnumpy(ow)))
    np.testing.assert_array_equal(bits(l16), bits(lw))
    q48, _ = bf16(rng.standard_normal((4, 48, 576)))
    with pytest.raises(ValueError, match="at most 32"):
        FWD(q48, k, v, idx[:4], None)


@pytest.mark.parametrize("v3", [True, False])
def test_torch_op_takes_wgmma2sp_for_mla_at_few_heads(v3, monkeypatch):
    """torch.ops.hytopk.sparse_attention at 16 MLA heads on Hopper: the forward is wgmma2sp's, bit for
    bit, whatever HYTOPK_ATTEND_WGMMA3 says (TA.WGMMA3_FORWARD: version 3 only above 32 heads)."""
    torch = pytest.importorskip("torch")
    import workbench.torch  # noqa: F401
    from workbench.torch import attention as TA
    FWD = _pair("wgmma2sp")
    if not TA.WGMMA_FORWARD:
        pytest.skip("HYTOPK_ATTEND_WGMMA=0")
    monkeypatch.setattr(TA, "WGMMA3_FORWARD", v3)
    g = torch.Generator().manual_seed(5)
    n, L, kk, Hq = 9, 400, 150, 16
    q = torch.randn(n, Hq, 576, generator=g).bfloat16().cuda()
    kv = torch.randn(L, 576, generator=g).bfloat16().cuda()
    idx = torch.from_numpy(make_idx(np.random.default_rng(6), n, L, kk, "shared")).cuda()
    out, lse = torch.ops.hytopk.sparse_attention(q, kv, None, idx, 512, None, True)
    want, want_lse = FWD(q, kv[:, None, :], kv[:, None, :512], idx, None)
    assert torch.equal(out.view(torch.int16).cpu(), torch.from_dlpack(want).view(torch.int16).cpu())
    assert torch.equal(lse.cpu(), torch.from_dlpack(want_lse).cpu())


@pytest.mark.parametrize("name", ["cupy.attend.wgmma2sp", "cupy.attend.wgmma3p"])
def test_pair_registered_variant(name):
    from workbench import registry
    _pair()
    assert name in [v.name for v in registry.variants("attend", "cupy")]
    rng = np.random.default_rng(9)
    k, v, kh, vh = layout(True, 500, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((5, 16, 576)))
    idx = make_idx(rng, 5, 500, 200, "shared")
    out, lse = registry.get(name)(qd, k, v, cp.asarray(idx), None)
    ro, rl = registry.get("reference.attend")(qh, kh, vh, idx, None)
    np.testing.assert_allclose(cp.asnumpy(out), ro, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(cp.asnumpy(lse), rl, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("Hq, kk", [(128, 2048), (128, 300), (64, 1000), (192, 130), (16, 64), (128, 1)])
def test_version_3_close_to_version_2(Hq, kk):
    """Version 3 (other rounding: chained max, S k-steps reordered) within tolerance of wgmma2 over
    many tiles, odd and even tile counts, padding, and more queries than SMs' worth of blocks."""
    v2, v3 = _forward("wgmma2"), _forward("wgmma3")
    rng = np.random.default_rng(seed("wgmma-v3", Hq, kk))
    n, L = 300 if Hq == 128 and kk == 300 else 5, 5000
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = cp.asarray(make_idx(rng, n, L, kk, "random"))
    (o2, l2), (o3, l3) = v2(qd, k, v, idx, None, out_dtype="float32"), v3(qd, k, v, idx, None, out_dtype="float32")
    np.testing.assert_allclose(cp.asnumpy(o3), cp.asnumpy(o2), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(cp.asnumpy(l3), cp.asnumpy(l2), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qpt,Hq", [(1, 16), (1, 128), (2, 16)])
def test_version_3_prefetch_changes_no_bit(qpt, Hq):
    """Version 3's L2 prefetch (0, 1, 2 pairs of key tiles ahead; the default picks by heads) gives
    the same bits at k 2048 (list ends inside the prefetch distance, padding); a bad distance is
    refused naming the argument."""
    from workbench.families.cupy import attend_wgmma3
    _forward("wgmma3")                                       # (skips off Hopper)
    rng = np.random.default_rng(seed("wgmma-v3-prefetch", qpt, Hq))
    n, L, kk = 37, 20000, 2048
    k, v, _, _ = layout(True, L, 1, 576, 512, rng)
    qd, _ = bf16(rng.standard_normal((n, Hq, 576)))
    idx = make_idx(rng, n, L, kk, "shared")
    idx[0, 2000], idx[3, 5] = -1, -1
    idx = cp.asarray(idx)
    o0, l0 = attend_wgmma3.attend_forward_wgmma3(qd, k, v, idx, None, out_dtype="float32", qpt=qpt, prefetch=0)
    for pf in (1, 2, None):
        o, lv = attend_wgmma3.attend_forward_wgmma3(qd, k, v, idx, None, out_dtype="float32", qpt=qpt, prefetch=pf)
        assert cp.array_equal(o.view(cp.uint32), o0.view(cp.uint32)) and cp.array_equal(lv.view(cp.uint32), l0.view(cp.uint32))
    with pytest.raises(ValueError, match="'prefetch'"):
        attend_wgmma3.attend_forward_wgmma3(qd, k, v, idx, None, qpt=qpt, prefetch=-1)


@pytest.mark.parametrize("qpt,Hq", [(1, 128), (1, 16), (2, 16), (2, 8)])
@pytest.mark.parametrize("kk", [100, 2048])
def test_version_3_interleaved_slot_order(qpt, Hq, kk):
    """Version 3 with interleave (tile t of T takes slots t, t + T, ...): exact hot/cold bits and the
    reference's tolerance on random inputs with padding, duplicates and shared neighbours."""
    from workbench.families.cupy import attend_wgmma3
    _forward("wgmma3")                                       # (skips off Hopper)
    FWD = lambda *a, **kw: attend_wgmma3.attend_forward_wgmma3(*a, qpt=qpt, interleave=True, **kw)
    check_hot_cold(FWD, Hq, "dups", 7, tag=f"wgmma-il-{qpt}")
    for kind in ("shared", "empty", "dups"):
        check_random(FWD, Hq, kk, kind, 5000, tag=f"wgmma-il-{qpt}")


@pytest.mark.parametrize("qpt", [1, 2])
@pytest.mark.parametrize("out_bf16", [True, False])
def test_version_3_fits_the_launch(out_bf16, qpt):
    """The driver's view of version 3 (the first one, 320 threads at 200 registers, got
    max_threads_per_block 256 and never launched): 168 registers at launch, 384 threads allowed."""
    from workbench import instantiations as INST
    from workbench.families.cupy import attend_wgmma3
    _forward("wgmma3")                                       # (skips off Hopper)
    fn = attend_wgmma3._fn(INST.attend_wgmma3_name(out_bf16, qpt))
    assert fn.num_regs == 168
    assert fn.max_threads_per_block >= INST.ATTEND_WGMMA3_THREADS == 384
