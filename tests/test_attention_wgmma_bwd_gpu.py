"""The wgmma MLA backward (kernels_cuda/attend_wgmma_bwd.cu: attend_backward(version=4),
cupy.attend_backward.wgmma / wgmma_atomic) on a Hopper GPU (skipped elsewhere with the reason).

Against the float64 reference at the mma.sync backward's tolerance (padding, duplicates, shared and
disjoint neighbours, queries with no valid key, k not a multiple of the 32-key tile, 8 / 64 / 128 /
136 heads: one, two and three head blocks, the last partial), at k = 2048; the deterministic mode
20 / 20 identical and the same bits under any query chunking; close to version 1; untouched keys
exactly 0; other layouts refused with a clear error. Both dK/dV write paths: direct (the consumers
write; every test before the `staged` fixture) and staged (the producer warpgroup writes, the
default): against the reference, the deterministic mode's bits equal to the direct kernel's. The
same kernel's CPU emulation: tests/test_attention_wgmma_emulation.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from reference import attention as RA
from tests.test_attention import make_idx
from tests.test_attention_gpu import _rel_close, bf16, bits, layout, seed

from tests._cupy_gpu import GPU_MARKS, cp  # noqa: E402  (skips the module without CuPy)

pytestmark = GPU_MARKS


@pytest.fixture(scope="module")
def CA():
    from workbench import loader
    from workbench.families.cupy import attend
    if loader.current_arch() != "90":
        pytest.skip("attend_backward version 4 needs a Hopper GPU (sm_90a)")
    return attend


@pytest.fixture(autouse=True)
def direct(monkeypatch):
    """The tests below the `staged` fixture check the direct writes (the consumers write dK/dV), the
    ones that ask for `staged` the staged writes (the default)."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "direct")


def case(rng, n, Hq, L, kk, kind):
    k, v, kh, vh = layout(True, L, 1, 576, 512, rng)
    qd, qh = bf16(rng.standard_normal((n, Hq, 576)))
    dod, doh = bf16(rng.standard_normal((n, Hq, 512)))
    idx = make_idx(rng, n, L, kk, kind)
    return k, v, kh, vh, qd, qh, dod, doh, idx


@pytest.mark.parametrize("Hq", [8, 64, 128, 136])
@pytest.mark.parametrize("atomic", [False, True], ids=["det", "atomic"])
@pytest.mark.parametrize("kind", ["random", "shared", "dups", "empty", "disjoint", "pad_only"])
def test_backward_matches_reference(CA, Hq, atomic, kind):
    rng = np.random.default_rng(seed("wgmma-bwd", Hq, atomic, kind))
    n, L, kk = 7, 400, 150                                   # odd n, kk not a multiple of 32
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    dq, dk, dv = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=not atomic,
                                    version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    assert dv is None
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(cp.asnumpy(dk)[untouched] == 0)
    assert np.all(cp.asnumpy(dq)[(idx < 0).all(1)] == 0)


@pytest.mark.parametrize("Hq", [64, 136])
def test_vector_atomics_match_reference_and_the_default(CA, Hq, monkeypatch):
    """VEC_WRITES = True (the bench's 16-byte atomics row): against the reference, and close to the
    default scalar atomics (the same adds in another order)."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    from workbench import instantiations as INST
    atomic = True
    rng = np.random.default_rng(seed("wgmma-bwd-writes", Hq))
    n, L, kk = 5, 300, 100
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, "dups")
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    run = lambda: CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=not atomic, version=4)
    default = run()
    assert not INST.ATTEND_WGMMA_BWD_VEC[atomic]
    monkeypatch.setattr(AWB, "VEC_WRITES", True)
    dq, dk, _ = run()
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))
    np.testing.assert_array_equal(bits(dq), bits(default[0]))    # dq does not depend on the dkv writes
    np.testing.assert_allclose(cp.asnumpy(dk), cp.asnumpy(default[1]), rtol=1e-4, atol=1e-4 * float(abs(cp.asnumpy(dk)).max()))


@pytest.mark.parametrize("atomic", [False, True], ids=["det", "atomic"])
@pytest.mark.parametrize("kind", ["shared", "full"])
def test_k_2048_many_heads(CA, kind, atomic):
    """k 2048 at 128 heads; 'full': every slot valid but one (the kernel's unpredicated writes)."""
    rng = np.random.default_rng(seed("wgmma-bwd-2048", kind))
    n, L, kk = 6, 8192, 2048
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, 128, L, kk, "shared")
    if kind == "full":
        idx = np.stack([rng.choice(L, kk, replace=False) for _ in range(n)]).astype(np.int32)
        idx[-1, 40] = -1
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    dq, dk, _ = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=not atomic, version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))


@pytest.mark.parametrize("Hq", [16, 128])
def test_deterministic_is_bitwise_reproducible_and_close_to_version_1(CA, Hq):
    """20 runs, identical bits; one query per chunk and uneven chunks give the same bits; within
    the reference's tolerance of the mma.sync backward (version 1: other rounding)."""
    rng = np.random.default_rng(7)
    n, L, kk = 64, 512, 256                                  # adjacent queries share most keys: many collisions
    k, v, _, _, qd, _, dod, _, idx = case(rng, n, Hq, L, kk, "shared")
    idx = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, idx, None)
    first = [bits(x) for x in CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=4)[:2]]
    for _ in range(19):
        for a, b in zip(first, [bits(x) for x in CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=4)[:2]]):
            np.testing.assert_array_equal(a, b)
    for sb in (1, 7 << 20):
        got = CA.attend_backward(dod, qd, k, v, idx, out, lse, None, scratch_bytes=sb, version=4)[:2]
        for a, b in zip(first, [bits(x) for x in got]):
            np.testing.assert_array_equal(a, b)
    v1 = CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=1)[:2]
    v4 = CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=4)[:2]
    for a, b in zip(v4, v1):
        _rel_close(cp.asnumpy(a), cp.asnumpy(b).astype(np.float64))


def test_other_layouts_are_refused(CA):
    rng = np.random.default_rng(3)
    k, v, _, _ = layout(False, 50, 2, 64, 64, rng)
    qd, _ = bf16(rng.standard_normal((3, 8, 64)))
    dod, _ = bf16(rng.standard_normal((3, 8, 64)))
    idx = cp.asarray(make_idx(rng, 3, 50, 20, "random"))
    out, lse = CA.attend_forward(qd, k, v, idx, None)
    with pytest.raises(ValueError, match="'k', 'v'.*version 4"):
        CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=4)


@pytest.mark.parametrize("name", ["cupy.attend_backward.wgmma", "cupy.attend_backward.wgmma_atomic"])
def test_registered_variant(CA, name):
    from workbench import registry
    assert name in [x.name for x in registry.variants("attend_backward", "cupy")]
    rng = np.random.default_rng(11)
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, 5, 128, 500, 200, "shared")
    dq, dk, dv = registry.get(name)(dod, qd, k, v, cp.asarray(idx), None)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))


@pytest.mark.parametrize("Hq", [128, 16])
def test_torch_op_backward_is_version_4(CA, Hq, monkeypatch):
    """The op's MLA backward is version 4's bit for bit (deterministic), with a query pair per forward
    block (16 heads: wgmma2sp) or version 3 (128 heads); HYTOPK_ATTEND_BWD_WGMMA=0 (TA.WGMMA_BACKWARD
    False) takes the mma.sync one, close to version 4's."""
    torch = pytest.importorskip("torch")
    import workbench.torch  # noqa: F401
    from workbench.torch import attention as TA
    g = torch.Generator().manual_seed(8)
    n, L, kk = 6, 400, 150
    q = torch.randn(n, Hq, 576, generator=g).bfloat16().cuda()
    kv = torch.randn(L, 576, generator=g).bfloat16().cuda()
    dout = torch.randn(n, Hq, 512, generator=g).bfloat16().cuda()
    idx = torch.from_numpy(make_idx(np.random.default_rng(6), n, L, kk, "shared")).cuda()

    def grads():
        qq, kvv = q.clone().requires_grad_(), kv.clone().requires_grad_()
        out, lse = torch.ops.hytopk.sparse_attention(qq, kvv, None, idx, 512, None, True)
        out.backward(dout)
        return qq.grad, kvv.grad, out.detach(), lse.detach()
    assert TA.WGMMA_BACKWARD                                 # the default
    dq, dkv, out, lse = grads()
    want = CA.attend_backward(dout, q, kv[:, None, :], kv[:, None, :512], idx, out, lse, None, version=4)
    assert torch.equal(dq, torch.from_dlpack(want[0]).to(torch.bfloat16))
    assert torch.equal(dkv, torch.from_dlpack(want[1])[:, 0].to(torch.bfloat16))
    monkeypatch.setattr(TA, "WGMMA_BACKWARD", False)
    mma_sync = grads()
    for a, b in zip((dq, dkv), mma_sync[:2]):
        _rel_close(a.float().cpu().numpy(), b.float().cpu().numpy().astype(np.float64))


@pytest.fixture
def staged(monkeypatch):
    """WRITES = "staged": the consumers hand dK/dV to the producer warpgroup, which writes them."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "staged")
    return AWB


@pytest.mark.parametrize("Hq", [8, 128, 136])
@pytest.mark.parametrize("atomic", [False, True], ids=["det", "atomic"])
@pytest.mark.parametrize("kind", ["random", "dups", "empty", "pad_only"])
def test_staged_matches_reference(CA, staged, Hq, atomic, kind):
    rng = np.random.default_rng(seed("wgmma-bwd-staged", Hq, atomic, kind))
    n, L, kk = 7, 400, 150
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    dq, dk, _ = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=not atomic, version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(cp.asnumpy(dk)[untouched] == 0)


@pytest.mark.parametrize("Hq", [16, 128])
def test_staged_deterministic_equals_direct_bit_for_bit(CA, Hq, monkeypatch):
    """The same accumulators through another write path: the deterministic mode's part rows, hence
    dq and the reduced dk, are the direct kernel's bits (k 2048, every slot valid but one, and a
    'shared' selection with collisions); 20 staged runs identical."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    rng = np.random.default_rng(seed("wgmma-bwd-staged-bits", Hq))
    for n, L, kk, kind in ((4, 8192, 2048, "full"), (64, 512, 256, "shared")):
        k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, "shared")
        if kind == "full":
            idx = np.stack([rng.choice(L, kk, replace=False) for _ in range(n)]).astype(np.int32)
            idx[-1, 40] = -1
        idx = cp.asarray(idx)
        out, lse = CA.attend_forward(qd, k, v, idx, None)
        run = lambda: [bits(x) for x in CA.attend_backward(dod, qd, k, v, idx, out, lse, None, version=4)[:2]]
        direct = run()
        monkeypatch.setattr(AWB, "WRITES", "staged")
        for _ in range(20 if kind == "shared" else 1):
            for a, b in zip(direct, run()):
                np.testing.assert_array_equal(a, b)
        monkeypatch.setattr(AWB, "WRITES", "direct")


def test_staged_atomics_close_to_direct_at_k_2048(CA, staged):
    """128 heads, k 2048, every slot valid: the staged atomics (16-byte, from shared memory) against
    the reference and close to the direct kernel's (the same adds in another order)."""
    rng = np.random.default_rng(seed("wgmma-bwd-staged-2048"))
    n, L, kk = 6, 8192, 2048
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, 128, L, kk, "shared")
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    got = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=False, version=4)
    staged.WRITES = "direct"
    direct = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=False, version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(got[0]), rq)
    _rel_close(cp.asnumpy(got[1])[:, 0], RA.mla_dkv(rk, rv))
    np.testing.assert_array_equal(bits(got[0]), bits(direct[0]))
    dk = cp.asnumpy(got[1])
    np.testing.assert_allclose(dk, cp.asnumpy(direct[1]), rtol=1e-4, atol=1e-4 * float(abs(dk).max()))


@pytest.fixture(params=[False, True], ids=["dkv_direct", "dkv_bulk"])
def split(monkeypatch, request):
    """WRITES = "split": the first pass writes P / dS (bf16), the second computes dK/dV of all of a
    query's heads at once and writes them from its accumulators or through the TMA's bulk operations
    (DKV_BULK; tests/test_attention_wgmma_emulation.py emulates both on the CPU)."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "split")
    monkeypatch.setattr(AWB, "DKV_BULK", request.param)
    return AWB


@pytest.mark.parametrize("Hq", [8, 64, 80, 128, 136])
@pytest.mark.parametrize("atomic", [False, True], ids=["det", "atomic"])
@pytest.mark.parametrize("kind", ["random", "shared", "dups", "empty", "disjoint", "pad_only"])
def test_split_matches_reference(CA, split, Hq, atomic, kind):
    """kk 150: five 32-key tiles (the last 64-key block's second half zeroed by the first pass),
    partial head blocks (8, 80: padding heads' P / dS are zeros), 136 heads (three head blocks: the
    staged path instead); dq bit for bit the direct kernel's; untouched keys exactly 0."""
    rng = np.random.default_rng(seed("wgmma-bwd-split", Hq, atomic, kind))
    n, L, kk = 7, 400, 150
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, kind)
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    dq, dk, _ = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=not atomic, version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(cp.asnumpy(dk)[untouched] == 0)
    split.WRITES = "direct"
    direct = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=not atomic, version=4)
    np.testing.assert_array_equal(bits(dq), bits(direct[0]))


@pytest.mark.parametrize("Hq", [16, 128])
def test_split_deterministic_reproducible_under_chunking(CA, split, Hq):
    """k 2048 (every slot valid but one) and a 'shared' selection with collisions: 20 runs identical,
    and the same bits when a small scratch cuts the queries into chunks of one."""
    rng = np.random.default_rng(seed("wgmma-bwd-split-bits", Hq))
    for n, L, kk, kind in ((4, 8192, 2048, "full"), (64, 512, 256, "shared")):
        k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, "shared")
        if kind == "full":
            idx = np.stack([rng.choice(L, kk, replace=False) for _ in range(n)]).astype(np.int32)
            idx[-1, 40] = -1
        ic = cp.asarray(idx)
        out, lse = CA.attend_forward(qd, k, v, ic, None)
        run = lambda sb=None: [bits(x) for x in CA.attend_backward(dod, qd, k, v, ic, out, lse, None, version=4,
                                                                   scratch_bytes=sb)[:2]]
        first = run()
        for _ in range(20 if kind == "shared" else 2):
            for a, b in zip(first, run()):
                np.testing.assert_array_equal(a, b)
        for a, b in zip(first, run(1)):
            np.testing.assert_array_equal(a, b)
        rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
        _rel_close(first[1].view(np.float32)[:, 0], RA.mla_dkv(rk, rv))


def test_split_atomics_close_to_staged_at_k_2048(CA, split):
    """128 heads, k 2048: the split atomics against the reference and close to the staged kernel's
    (the same products, the two head blocks summed inside the MMA instead of by two atomics)."""
    rng = np.random.default_rng(seed("wgmma-bwd-split-2048"))
    n, L, kk = 6, 8192, 2048
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, 128, L, kk, "shared")
    out, lse = CA.attend_forward(qd, k, v, cp.asarray(idx), None, out_dtype="float32")
    got = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=False, version=4)
    split.WRITES = "staged"
    staged = CA.attend_backward(dod, qd, k, v, cp.asarray(idx), out, lse, None, deterministic=False, version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(got[0]), rq)
    _rel_close(cp.asnumpy(got[1])[:, 0], RA.mla_dkv(rk, rv))
    np.testing.assert_array_equal(bits(got[0]), bits(staged[0]))
    dk = cp.asnumpy(got[1])
    np.testing.assert_allclose(dk, cp.asnumpy(staged[1]), rtol=1e-4, atol=1e-4 * float(abs(dk).max()))


@pytest.mark.parametrize("Hq", [8, 128])
def test_split_bulk_rows_equal_direct_ones(CA, monkeypatch, Hq):
    """The second pass's part rows are the same floats whether its accumulators or the TMA write
    them: the deterministic dk is the same bits either way (k 2048, masked slots, duplicates)."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    rng = np.random.default_rng(seed("wgmma-bwd-split-bulk", Hq))
    n, L, kk = 9, 4096, 2048
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, "dups")
    ic = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, ic, None, out_dtype="float32")
    monkeypatch.setattr(AWB, "WRITES", "split")

    def run(bulk):
        monkeypatch.setattr(AWB, "DKV_BULK", bulk)
        return [bits(x) for x in CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=True, version=4)[:2]]
    for a, b in zip(run(True), run(False)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("Hq", [16, 64, 128])
def test_auto_writes_take_the_faster_path(CA, monkeypatch, Hq):
    """WRITES = "auto" (the default), per AUTO_WRITES: split in the deterministic mode (its bits), and
    for the atomics at two head blocks (the ring); staged for the atomics at one head block (run 7 of
    results/h200-2026-12-04-s14). The launched kernels say which; dq is the same bits on every path."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    rng = np.random.default_rng(seed("wgmma-bwd-auto", Hq))
    n, L, kk = 5, 400, 150
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, "dups")
    ic = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, ic, None, out_dtype="float32")
    names, real = [], AWB._fn
    monkeypatch.setattr(AWB, "_fn", lambda name, *a, **kw: names.append(name) or real(name, *a, **kw))

    def run(writes, det):
        monkeypatch.setattr(AWB, "WRITES", writes)
        names.clear()
        got = [bits(x) for x in CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=det, version=4)[:2]]
        return got, names[0]
    nhb = -(-Hq // 64)
    assert AWB.AUTO_WRITES == {(True, 1): "split", (False, 1): "staged", (True, 2): "split", (False, 2): "split"}
    first = {"staged": AWB.INST.attend_wgmma_bwd_name(True, writes="staged"),
             "split": AWB.INST.attend_wgmma_bwd_ring_name(True) if nhb == 2 else "hytopk_attend_bwd_pds"}
    (auto_det, name), (split_det, _) = run("auto", True), run("split", True)
    for a, b in zip(auto_det, split_det):
        np.testing.assert_array_equal(a, b)
    (auto_at, name), (other, _) = run("auto", False), run(AWB.AUTO_WRITES[False, nhb], False)
    assert name == first[AWB.AUTO_WRITES[False, nhb]], name
    np.testing.assert_array_equal(auto_at[0], other[0])
    np.testing.assert_array_equal(auto_at[0], auto_det[0])


@pytest.mark.parametrize("Hq", [80, 128])
@pytest.mark.parametrize("atomic", [False, True], ids=["det", "atomic"])
@pytest.mark.parametrize("kind", ["random", "shared", "dups", "empty", "disjoint", "pad_only"])
def test_split_dq_pass_matches_reference(CA, monkeypatch, Hq, atomic, kind):
    """DQ_PASS (two head blocks): the first pass without dq (Q / dO in registers, 64-key tiles) and dq
    = dS K in a third pass, both gathering into the 128-byte swizzle. Against the reference, untouched
    keys exactly 0; dq the same bits as the two-pass split's (the same 16-key chunks in the same order),
    the deterministic dk too (the same P / dS)."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "split")
    rng = np.random.default_rng(seed("wgmma-bwd-split-dq-pass", Hq, atomic, kind))
    n, L, kk = 7, 400, 150
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, Hq, L, kk, kind)
    ic = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, ic, None, out_dtype="float32")
    monkeypatch.setattr(AWB, "DQ_PASS", True)
    dq, dk, _ = CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=not atomic, version=4)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(cp.asnumpy(dq), rq)
    _rel_close(cp.asnumpy(dk)[:, 0], RA.mla_dkv(rk, rv))
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(cp.asnumpy(dk)[untouched] == 0)
    monkeypatch.setattr(AWB, "DQ_PASS", False)
    two = CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=not atomic, version=4)
    np.testing.assert_array_equal(bits(dq), bits(two[0]))
    if not atomic:
        np.testing.assert_array_equal(bits(dk), bits(two[1]))


def _split_k2048(CA, monkeypatch, name, n, knob):
    """The split (WRITES = "split") at 128 heads, k 2048, L 8192, n queries of the "shared" case:
    (run(det, scratch_bytes, value) -> [dq, dk] as numpy with AWB.<knob> = value, the reference's
    inputs (kh, vh, qh, doh, idx))."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "split")
    rng = np.random.default_rng(seed(name))
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, 128, 8192, 2048, "shared")
    ic = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, ic, None, out_dtype="float32")

    def run(det, sb, value):
        monkeypatch.setattr(AWB, knob, value)
        return [cp.asnumpy(x) for x in CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=det,
                                                          version=4, scratch_bytes=sb)[:2]]
    return run, (kh, vh, qh, doh, idx)


def test_split_dq_pass_at_k_2048(CA, monkeypatch):
    """128 heads, k 2048, L 8192, DQ_PASS: the deterministic mode 20 / 20 identical and the same bits
    under chunks of one query and as the two-pass split's; the atomics' dq the same bits, dk close."""
    runs, (kh, vh, qh, doh, idx) = _split_k2048(CA, monkeypatch, "wgmma-bwd-split-dq-pass-2048", 6, "DQ_PASS")

    def run(det=True, sb=None, dq_pass=True):
        return runs(det, sb, dq_pass)
    first = [bits(x) for x in run()]
    for _ in range(20):
        for a, b in zip(first, [bits(x) for x in run()]):
            np.testing.assert_array_equal(a, b)
    for other in (run(sb=1), run(dq_pass=False)):
        for a, b in zip(first, [bits(x) for x in other]):
            np.testing.assert_array_equal(a, b)
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(first[0].view(np.float32), rq)
    _rel_close(first[1].view(np.float32)[:, 0], RA.mla_dkv(rk, rv))
    at = run(det=False)
    np.testing.assert_array_equal(bits(at[0]), first[0])
    dk = first[1].view(np.float32)
    np.testing.assert_allclose(at[1], dk, rtol=1e-4, atol=1e-4 * float(abs(dk).max()))


@pytest.mark.parametrize("ring", [(0, 1), (2, 3), (32, 128)])
@pytest.mark.parametrize("atomic", [False, True], ids=["det", "atomic"])
@pytest.mark.parametrize("kind", ["random", "dups", "empty", "pad_only"])
def test_split_ring_matches_three_launches(CA, monkeypatch, ring, atomic, kind):
    """RING (the dq pass's three passes in one launch over ring slots of P / dS, blocks in ticket order):
    dq and the deterministic dk the same bits as the three launches (the same floats, other block
    orders), the atomics' dk close; the deterministic mode under chunks of one query too (its part
    rows; the atomics take one chunk whatever the scratch); against the reference."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "split")
    monkeypatch.setattr(AWB, "DQ_PASS", True)
    rng = np.random.default_rng(seed("wgmma-bwd-split-ring-gpu", *ring, atomic, kind))
    n, L, kk = 7, 400, 150
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, n, 128, L, kk, kind)
    ic = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, ic, None, out_dtype="float32")

    def run(sb=None):
        return [cp.asnumpy(x) for x in CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=not atomic,
                                                          version=4, scratch_bytes=sb)[:2]]
    monkeypatch.setattr(AWB, "RING", False)
    base = run()
    monkeypatch.setattr(AWB, "RING", ring)
    for got in (run(), run(sb=1)):
        np.testing.assert_array_equal(bits(got[0]), bits(base[0]))
        if atomic:
            np.testing.assert_allclose(got[1], base[1], rtol=1e-4, atol=1e-4 * float(abs(base[1]).max()))
        else:
            np.testing.assert_array_equal(bits(got[1]), bits(base[1]))
    rq, rk, rv = RA.attend_backward(doh, qh, kh, vh, idx)
    _rel_close(got[0], rq)
    _rel_close(got[1][:, 0], RA.mla_dkv(rk, rv))
    untouched = np.setdiff1d(np.arange(L), idx[idx >= 0])
    assert np.all(got[1][untouched] == 0)


def test_ring_is_the_default_at_two_head_blocks(CA, monkeypatch):
    """With the dq pass (two head blocks) the wrapper takes the ring by default (instantiations.
    ATTEND_WGMMA_BWD_RING): one launch of hytopk_attend_bwd_ring, no three-launch kernel; a lag not
    below the slots is refused naming RING."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "WRITES", "auto")       # the op's default (the module's fixture sets "direct")
    assert AWB.INST.ATTEND_WGMMA_BWD_RING and AWB.RING is None and AWB.DQ_PASS is None
    rng = np.random.default_rng(seed("wgmma-bwd-ring-default"))
    k, v, kh, vh, qd, qh, dod, doh, idx = case(rng, 3, 128, 400, 150, "random")
    ic = cp.asarray(idx)
    out, lse = CA.attend_forward(qd, k, v, ic, None, out_dtype="float32")
    names = []
    real = AWB._fn
    monkeypatch.setattr(AWB, "_fn", lambda name, *a, **kw: names.append(name) or real(name, *a, **kw))
    CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=False, version=4)
    assert names == [AWB.INST.attend_wgmma_bwd_ring_name(True)], names
    monkeypatch.setattr(AWB, "RING", (4, 4))
    with pytest.raises(ValueError, match="RING"):
        CA.attend_backward(dod, qd, k, v, ic, out, lse, None, deterministic=False, version=4)


@pytest.mark.parametrize("ring", [(4, 8), (0, 1), (30, 31)])
def test_split_ring_at_k_2048(CA, monkeypatch, ring):
    """RING at 128 heads, k 2048, L 8192, 40 queries (each slot reused): the deterministic dq / dk the
    same bits as the default's, 5 / 5 identical, under chunks of 7 queries too; the atomics' dq the same
    bits, dk close."""
    from workbench.families.cupy import attend_wgmma_bwd as AWB
    monkeypatch.setattr(AWB, "DQ_PASS", True)
    runs, _ = _split_k2048(CA, monkeypatch, f"wgmma-bwd-split-ring-2048-{ring}", 40, "RING")
    kk = 2048

    def run(det=True, sb=None, knob=False):
        return runs(det, sb, knob)
    base = [bits(x) for x in run()]
    for got in [run(knob=ring) for _ in range(5)] + [run(knob=ring, sb=7 * kk * 576 * 4)]:
        for a, b in zip(base, [bits(x) for x in got]):
            np.testing.assert_array_equal(a, b)
    at, at0 = run(det=False, knob=ring), run(det=False)
    np.testing.assert_array_equal(bits(at[0]), base[0])
    np.testing.assert_allclose(at[1], at0[1], rtol=1e-4, atol=1e-4 * float(abs(at0[1]).max()))
