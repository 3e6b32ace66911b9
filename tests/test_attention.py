"""Sparse attention over the selected keys on the CPU (docs/CONTRACT.md §8): the float64
reference against a brute force per query (forward and torch-autograd gradients) on adversarial
selections (padding, duplicates, disjoint and overlapping neighbours, queries with no key, large
logits, GQA and MLA), the pair union the `pair` kernels run on, argument errors, the
torch.ops.hytopk.sparse_attention op (CPU kernel, chunked torch path, autograd, fake tensors,
opcheck), the registry and the kernels' shared-memory mirror.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from reference import attention as RA
import workbench.torch  # noqa: F401  (registers torch.ops.hytopk)
from workbench.torch import attention as TA


# ------------------------------------------------------------------ inputs
def make_idx(rng, n, L, kk, kind):
    """Selections of the adversarial kinds: 'random' (distinct keys, some padding), 'dups' (a key
    listed twice), 'shared' (adjacent queries pick nearly the same keys), 'disjoint' (adjacent
    queries share none), 'empty' (some queries have no valid slot), 'pad_only' (all -1)."""
    idx = np.full((n, kk), -1, np.int32)
    if kind == "pad_only" or L == 0:
        return idx
    for t in range(n):
        c = int(rng.integers(0, min(kk, L) + 1))
        if kind == "disjoint":
            pool = np.arange(L)[(np.arange(L) % 2) == (t % 2)] if L >= 2 else np.arange(L)
            c = min(c, len(pool))
            idx[t, :c] = rng.choice(pool, c, replace=False)
        elif kind == "shared" and t % 2 == 1:
            idx[t] = idx[t - 1]
            j = int(rng.integers(0, kk))
            idx[t, j] = int(rng.integers(0, L))            # one slot differs (maybe a duplicate)
        else:
            idx[t, :c] = rng.choice(L, c, replace=False)
        if kind == "dups" and c >= 1 and kk >= 2:
            idx[t, kk - 1] = idx[t, 0]
        if kind == "empty" and t % 3 == 0:
            idx[t] = -1
        rng.shuffle(idx[t])                                 # slots in any order, padding anywhere
    return idx


KINDS = ("random", "dups", "shared", "disjoint", "empty", "pad_only")


@st.composite
def attention_cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mla = draw(st.booleans())
    Hkv = 1 if mla else draw(st.sampled_from([1, 2]))
    Hq = Hkv * draw(st.sampled_from([1, 2, 3]))
    Dqk = draw(st.sampled_from([4, 8]))
    Dv = draw(st.integers(1, Dqk)) if mla else draw(st.sampled_from([3, 8]))
    n = draw(st.integers(1, 6))
    L = draw(st.integers(0 if draw(st.booleans()) else 1, 12))
    kk = draw(st.integers(1, 7))
    kind = draw(st.sampled_from(KINDS))
    big = draw(st.booleans())                               # large logits: exp would overflow unshifted
    q = rng.standard_normal((n, Hq, Dqk)) * (30.0 if big else 1.0)
    if mla:
        kv = rng.standard_normal((L, Dqk))
        k, v = RA.mla_kv(kv, Dv)
    else:
        kv = None
        k, v = rng.standard_normal((L, Hkv, Dqk)), rng.standard_normal((L, Hkv, Dv))
    idx = make_idx(rng, n, L, kk, kind)
    scale = draw(st.sampled_from([None, 0.5]))
    return q, k, v, idx, scale, kv


def brute(q, k, v, idx, scale):
    """Per query and head: softmax over the valid slots, autograd in float64."""
    n, Hq, Dqk = q.shape
    Hkv = k.shape[1]
    sc = 1.0 / math.sqrt(Dqk) if scale is None else scale
    qt, kt, vt = (torch.tensor(np.ascontiguousarray(x), dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    outs, lses = [], []
    for t in range(n):
        sl = [int(s) for s in idx[t] if s >= 0]
        ro, rl = [], []
        for h in range(Hq):
            g = h // (Hq // Hkv)
            if not sl:
                ro.append(torch.zeros(v.shape[2], dtype=torch.float64))
                rl.append(torch.tensor(-math.inf, dtype=torch.float64))
                continue
            s = torch.stack([qt[t, h] @ kt[j, g] for j in sl]) * sc
            p = torch.softmax(s, 0)
            ro.append((p[:, None] * torch.stack([vt[j, g] for j in sl])).sum(0))
            rl.append(torch.logsumexp(s, 0))
        outs.append(torch.stack(ro))
        lses.append(torch.stack(rl))
    return torch.stack(outs), torch.stack(lses), (qt, kt, vt)


# ------------------------------------------------------------------ reference
@given(attention_cases())
def test_reference_forward_matches_brute_force(case):
    q, k, v, idx, scale, _ = case
    out, lse = RA.attend(q, k, v, idx, scale)
    bo, bl, _ = brute(q, k, v, idx, scale)
    np.testing.assert_allclose(out, bo.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(bl.detach().numpy()))
    fin = np.isfinite(lse)
    np.testing.assert_allclose(lse[fin], bl.detach().numpy()[fin], rtol=1e-10, atol=1e-10)
    empty = (idx < 0).all(axis=1)
    assert np.all(out[empty] == 0) and np.all(lse[empty] == -np.inf)


@given(attention_cases())
def test_reference_backward_matches_autograd(case):
    q, k, v, idx, scale, kv = case
    rng = np.random.default_rng(int(np.abs(q).sum() * 1000) % 2**32)
    dout = rng.standard_normal((q.shape[0], q.shape[1], v.shape[2]))
    dq, dk, dv = RA.attend_backward(dout, q, k, v, idx, scale)
    bo, _, (qt, kt, vt) = brute(q, k, v, idx, scale)
    if bo.requires_grad:
        bo.backward(torch.from_numpy(dout))
    grad = lambda t, like: np.zeros(like.shape) if t.grad is None else t.grad.numpy()
    np.testing.assert_allclose(dq, grad(qt, q), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dk, grad(kt, k), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dv, grad(vt, v), rtol=1e-9, atol=1e-9)
    untouched = np.setdiff1d(np.arange(k.shape[0]), idx[idx >= 0])
    assert np.all(dk[untouched] == 0) and np.all(dv[untouched] == 0)
    if kv is not None:                                      # MLA: one gradient for the shared row
        dkv = RA.mla_dkv(dk, dv)
        assert dkv.shape == kv.shape
        np.testing.assert_allclose(dkv[:, :v.shape[2]], dk[:, 0, :v.shape[2]] + dv[:, 0])


def test_duplicate_slot_counts_twice_and_order_is_free():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 2, 4)), rng.standard_normal((3, 1, 4)), rng.standard_normal((3, 1, 5))
    a, _ = RA.attend(q, k, v, np.array([[0, 1, 1, -1]], np.int32))
    b, _ = RA.attend(q, k, v, np.array([[1, -1, 0, 1]], np.int32))
    c, _ = RA.attend(q, k, v, np.array([[0, 1, -1, -1]], np.int32))
    np.testing.assert_allclose(a, b, rtol=1e-13)
    assert not np.allclose(a, c)                            # the duplicate weighs key 1 twice


def test_large_logits_do_not_overflow():
    q = np.full((1, 1, 2), 1e3)
    k = np.array([[[1e3, 0.0]], [[1e3 - 1e-3, 0.0]]])
    v = np.array([[[1.0]], [[3.0]]])
    out, lse = RA.attend(q, k, v, np.array([[0, 1]], np.int32), 1.0)
    assert np.all(np.isfinite(out)) and np.isfinite(lse).all()
    p1 = 1.0 / (1.0 + math.exp(1.0))                        # logits 1e6 and 1e6 - 1
    np.testing.assert_allclose(out[0, 0, 0], (1 - p1) * 1.0 + p1 * 3.0, rtol=1e-9)


# ------------------------------------------------------------------ the pair union
def union_attend(q, k, v, idx, scale):
    """attend computed the way the pair kernels do: over the union rows, weighted by multiplicity."""
    uidx, mult, count = RA.pair_union(idx)
    n, Hq, _ = q.shape
    Hkv = k.shape[1]
    sc = RA.check_scale(scale, q.shape[2])
    out = np.zeros((n, Hq, v.shape[2]))
    for t in range(n):
        p, i = divmod(t, 2)
        keys = uidx[p, :count[p]]
        w = mult[p, :count[p], i].astype(np.float64)
        for h in range(Hq):
            g = h // (Hq // Hkv)
            if not (w > 0).any():
                continue
            s = np.where(w > 0, (k[keys, g] @ q[t, h]) * sc, -np.inf)
            e = w * np.exp(s - s.max())
            out[t, h] = e @ v[keys, g] / e.sum()
    return out


@given(attention_cases())
def test_pair_union_lists_each_key_once_with_its_counts(case):
    _, _, _, idx, _, _ = case
    uidx, mult, count = RA.pair_union(idx)
    n, kk = idx.shape
    assert uidx.shape == (-(-n // 2), 2 * kk) and mult.shape == uidx.shape + (2,)
    for p in range(uidx.shape[0]):
        c = count[p]
        row = uidx[p, :c]
        assert np.all(np.diff(row) > 0) and np.all(uidx[p, c:] == -1) and np.all(mult[p, c:] == 0)
        for i in range(2):
            t = 2 * p + i
            sel = idx[t][idx[t] >= 0] if t < n else np.array([], np.int32)
            assert mult[p, :c, i].sum() == len(sel)
            for j, key in enumerate(row):
                assert mult[p, j, i] == np.count_nonzero(sel == key)
        assert np.all(mult[p, :c].sum(axis=1) > 0)


@given(attention_cases())
def test_attention_over_the_pair_union_is_the_same_function(case):
    q, k, v, idx, scale, _ = case
    out, _ = RA.attend(q, k, v, idx, scale)
    np.testing.assert_allclose(union_attend(q, k, v, idx, scale), out, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ arguments
def _args():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2, 4, 8)).astype(np.float32), rng.standard_normal((5, 2, 8)).astype(np.float32),
            rng.standard_normal((5, 2, 6)).astype(np.float32), np.array([[0, 1], [4, -1]], np.int32))


@pytest.mark.parametrize("change,name", [
    (lambda a: (a[0][0], *a[1:]), "'q'"),
    (lambda a: (a[0], a[1][:, :, :4], *a[2:]), "'k'"),
    (lambda a: (a[0], a[1], a[2][:4], a[3]), "'v'"),
    (lambda a: (a[0], a[1][:, :1].repeat(3, 1), a[2][:, :1].repeat(3, 1), a[3]), "'k'"),   # 3 kv heads, 4 q heads
    (lambda a: (*a[:3], a[3].astype(np.int64)), "'idx'"),
    (lambda a: (*a[:3], a[3][:1]), "'idx'"),
    (lambda a: (*a[:3], np.array([[0, 5], [0, 0]], np.int32)), "'idx'"),
    (lambda a: (*a[:3], np.array([[0, -2], [0, 0]], np.int32)), "'idx'"),
    (lambda a: (a[0].astype(np.int32), *a[1:]), "'q'"),
])
def test_bad_arguments_name_the_argument(change, name):
    with pytest.raises((ValueError, TypeError), match=name):
        RA.attend(*change(_args()))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), True, "1", 1e-39, 5e-45])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="'scale'"):
        RA.attend(*_args(), scale)


def test_bad_dout_and_d_v():
    q, k, v, idx = _args()
    with pytest.raises(ValueError, match="'dout'"):
        RA.attend_backward(np.zeros((2, 4, 5)), q, k, v, idx)
    with pytest.raises(ValueError, match="'d_v'"):
        RA.mla_kv(np.zeros((3, 8)), 9)


# ------------------------------------------------------------------ torch op
def torch_case(seed=0, n=5, L=9, Hq=4, Hkv=2, Dqk=8, Dv=6, kk=5, mla=False, dtype=torch.float32):
    rng = np.random.default_rng(seed)
    q = torch.tensor(rng.standard_normal((n, Hq, Dqk)), dtype=dtype)
    idx = torch.from_numpy(make_idx(rng, n, L, kk, "dups"))
    if mla:
        return q, torch.tensor(rng.standard_normal((L, Dqk)), dtype=dtype), None, idx, Dv
    return (q, torch.tensor(rng.standard_normal((L, Hkv, Dqk)), dtype=dtype),
            torch.tensor(rng.standard_normal((L, Hkv, Dv)), dtype=dtype), idx, -1)


@pytest.mark.parametrize("mla", [False, True])
def test_op_cpu_matches_reference_with_gradients(mla):
    q, kv, v, idx, d_v = torch_case(mla=mla, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (q, kv) + ((v,) if v is not None else ())]
    out, lse = torch.ops.hytopk.sparse_attention(leaves[0], leaves[1], leaves[2] if v is not None else None,
                                                 idx, d_v, None, None)
    k, vv = RA.mla_kv(kv.numpy(), d_v) if mla else (kv.numpy(), v.numpy())
    ro, rl = RA.attend(q.numpy(), k, vv, idx.numpy())
    np.testing.assert_allclose(out.detach().numpy(), ro, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse.numpy(), rl.astype(np.float32), rtol=1e-6)
    dout = torch.randn_like(out)
    out.backward(dout)
    dq, dk, dv = RA.attend_backward(dout.numpy(), q.numpy(), k, vv, idx.numpy())
    np.testing.assert_allclose(leaves[0].grad.numpy(), dq, rtol=1e-10, atol=1e-12)
    if mla:
        np.testing.assert_allclose(leaves[1].grad.numpy(), RA.mla_dkv(dk, dv), rtol=1e-10, atol=1e-12)
    else:
        np.testing.assert_allclose(leaves[1].grad.numpy(), dk, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(leaves[2].grad.numpy(), dv, rtol=1e-10, atol=1e-12)


def test_torch_path_matches_reference():
    """The chunked pure-torch path (CUDA fallback) on the CPU, with chunks smaller than n."""
    q, k, v, idx, _ = torch_case(seed=3, n=11, dtype=torch.float64)
    old = TA.TORCH_CHUNK
    TA.TORCH_CHUNK = 4
    try:
        out, lse = TA.torch_forward(q, k, v, idx, 0.3)
        dout = torch.randn(out.shape, dtype=torch.float64)
        dq, dk, dv = TA.torch_backward(dout, q, k, v, idx, out, lse, 0.3)
    finally:
        TA.TORCH_CHUNK = old
    ro, rl = RA.attend(q.numpy(), k.numpy(), v.numpy(), idx.numpy(), 0.3)
    np.testing.assert_allclose(out.numpy(), ro, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), rl, rtol=1e-6)
    rq, rk, rv = RA.attend_backward(dout.numpy(), q.numpy(), k.numpy(), v.numpy(), idx.numpy(), 0.3)
    for a, b in ((dq, rq), (dk, rk), (dv, rv)):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-5)


def test_attention_probs_and_dsa_sparse_attention_agree_with_gather_einsum():
    from workbench.torch.dsa import gather_einsum, sparse_attention
    torch.manual_seed(0)
    Q, K, V = torch.randn(6, 2, 4), torch.randn(7, 2, 4), torch.randn(7, 2, 4)
    idx = torch.from_numpy(make_idx(np.random.default_rng(2), 6, 7, 4, "empty"))
    o1, p1 = gather_einsum(Q, K, V, idx)
    o2, p2 = sparse_attention(Q, K, V, idx)
    assert torch.allclose(o1, o2, atol=1e-5) and torch.allclose(p1, p2, atol=1e-5)


def test_op_argument_errors():
    q, kv, v, idx, _ = torch_case()
    with pytest.raises(ValueError, match="'idx'"):
        torch.ops.hytopk.sparse_attention(q, kv, v, idx.clamp(max=0) + 100, -1, None, None)
    with pytest.raises(TypeError, match="'kv'|'v'"):
        torch.ops.hytopk.sparse_attention(q, kv.double(), v, idx, -1, None, None)
    with pytest.raises(Exception, match="'d_v'"):
        torch.ops.hytopk.sparse_attention(q, kv[:, 0], None, idx, 99, None, None)
    with pytest.raises(ValueError, match="'scale'"):
        torch.ops.hytopk.sparse_attention(q, kv, v, idx, -1, -2.0, None)
    with pytest.raises(ValueError, match="'d_v'"):
        TA.sparse_attention(q, kv, idx)


def test_fake_tensors_give_the_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, kv, v, idx, _ = torch_case()
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.hytopk.sparse_attention(torch.empty_like(q), torch.empty_like(kv), torch.empty_like(v),
                                                     torch.empty_like(idx), -1, None, None)
        assert out.shape == (5, 4, 6) and lse.shape == (5, 4) and lse.dtype == torch.float32
        o2, _ = torch.ops.hytopk.sparse_attention(torch.empty_like(q), torch.empty(9, 8), None,
                                                  torch.empty_like(idx), 3, None, None)
        assert o2.shape == (5, 4, 3)


@pytest.mark.parametrize("mla", [False, True])
def test_opcheck(mla):
    q, kv, v, idx, d_v = torch_case(mla=mla)
    args = (q.requires_grad_(), kv.requires_grad_(), v.requires_grad_() if v is not None else None, idx, d_v, None, True)
    torch.library.opcheck(torch.ops.hytopk.sparse_attention.default, args)
    out, lse = torch.ops.hytopk.sparse_attention(*args)
    bargs = (torch.randn_like(out), q.detach(), kv.detach(), v.detach() if v is not None else None, idx,
             out.detach(), lse, d_v, None, True)
    torch.library.opcheck(torch.ops.hytopk.sparse_attention_backward.default, bargs)


# ------------------------------------------------------------------ registry, kernels' geometry
def test_attention_stages_are_registered_outside_the_hytopk_pipeline():
    from workbench import pipeline, registry
    assert {"attend", "attend_backward"} <= set(registry.ATTENTION_STAGES)
    assert not set(registry.ATTENTION_STAGES) & set(registry.STAGES)
    assert [v.name for v in registry.variants("attend", "reference")] == ["reference.attend"]
    assert [v.name for v in registry.variants("attend_backward", "reference")] == ["reference.attend_backward"]
    st_ = pipeline.stage_set("reference")                      # the HyTopK StageSet is unaffected
    assert st_.select.name == "reference.select"


def test_shipped_attend_blocks_fit_shared_memory():
    from workbench import instantiations as INST
    for dqk, dv, shared in INST.ATTEND_SHIPPED:
        for mt in (1, 2, 4):
            for qpt in (1, 2):
                assert INST.attend_smem(mt, dqk, dv, qpt, shared) <= INST.ATTEND_SMEM_LIMIT
            assert INST.attend_smem(mt, dqk, dv, 1, shared, backward=True) <= INST.ATTEND_SMEM_LIMIT
    names = INST.name_expressions("attend.cu")
    assert "hytopk_attend_fwd<4, 32, 576, 512, 1, true, true>" in names
    assert "hytopk_attend_bwd<4, 32, 576, 512, true, false>" in names
    assert len(INST.attend_static_asserts()) >= 12


def test_cupy_wrappers_against_emulated_kernels():
    """The CuPy wrappers (argument order and types against attend.cu's signatures, the pair union,
    MLA strides, padding, the chunked fixed-order dK/dV reduction) run on the CPU against Python
    emulations of the kernels' semantics, in a subprocess with a NumPy stand-in for CuPy; six layouts,
    then version 4 (the wgmma MLA backward's wrapper, its staged and split paths) on two and its
    refusal, and an empty context refusing idx other than -1."""
    import subprocess
    import sys
    from pathlib import Path
    run = Path(__file__).resolve().parent / "attend_emulation" / "run.py"
    res = subprocess.run([sys.executable, str(run)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    assert res.stdout.count("ok ") == 12 and res.stdout.count("ok version 4") == 5
    assert res.stdout.count("ok version 4 split") == 2


def test_wrapper_and_lse_is_not_differentiable():
    import workbench.torch as wt
    q, kv, _, idx, d_v = torch_case(mla=True)
    q.requires_grad_()
    out, lse = wt.sparse_attention(q, kv, idx, d_v=d_v)
    assert out.requires_grad and not lse.requires_grad
    o2, _ = TA.sparse_attention(q, kv[:, None, :], idx, v=kv[:, None, :d_v])     # the same as GQA with one kv head
    assert torch.allclose(out, o2)
