"""The torch ops with every input dtype combination (issue 17), CPU: torch.bfloat16 /
torch.float8_e4m3fn q and keys (+ kscale) with float32 or bf16 w through select, replay_scores,
the pure-torch path (the CUDA fallback) and the loss; gradients (fp8: to w only; fp8=True:
straight-through to the unquantised inputs); the quantiser against reference.fp8; the DSA layer."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reference as R  # noqa: E402
import workbench.torch as WT  # noqa: E402
from reference import dtypes as DT  # noqa: E402
from reference import generate as G  # noqa: E402
from reference.fp8 import e4m3_bits_to_float32, float32_to_e4m3_bits, quantize_indexer  # noqa: E402
from workbench.torch import scoring  # noqa: E402

COMBOS = [(kind, wd) for kind in DT.KINDS for wd in ("float32", "bf16")]


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _t(x, kind):
    """Host bits (reference.dtypes conventions) -> the torch tensor a user would pass."""
    if x is None:
        return None
    t = torch.from_numpy(np.ascontiguousarray(x))
    return {"bf16": lambda: t.view(torch.bfloat16), "fp8": lambda: t.view(torch.float8_e4m3fn)}.get(kind, lambda: t)()


def _case(kind, wd, seed=0, n=5, L=200, H=3, D=8, k=10):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout("random", n, L, k, rng)
    qq, ww, kk, ks = DT.encode_exact(q, w, keys, kind, wd, rng)
    T = (_t(qq, kind), _t(ww, wd), _t(kk, kind), _t(ks, "float32"))
    return (q, w, keys), T, torch.from_numpy(lo), torch.from_numpy(hi), k


@pytest.mark.parametrize("kind, wd", COMBOS)
def test_select_and_replay_every_combination(kind, wd):
    (q, w, keys), (Q, W, K, S), lo, hi, k = _case(kind, wd)
    table = R.indexer_scores(q, w, keys, lo.numpy(), hi.numpy())
    i, v = R.topk(table, lo.numpy(), hi.numpy(), k)
    idx, val = WT.select(Q, W, K, lo, hi, k, kscale=S, max_failed=1)
    np.testing.assert_array_equal(idx.numpy(), i)
    np.testing.assert_array_equal(bits(val.numpy()), bits(v))
    rep = WT.replay_scores(Q, W, K, idx, kscale=S)
    np.testing.assert_array_equal(bits(rep.numpy()), bits(v))
    # the pure-torch path (CUDA fallback, capture-safe) on the same tensors
    i2, v2 = scoring.exact_select(Q, W, K, lo.long(), hi.long(), k, S)
    np.testing.assert_array_equal(i2.numpy(), i)
    np.testing.assert_array_equal(bits(v2.numpy()), bits(v))
    np.testing.assert_array_equal(bits(scoring.replay(Q, W, K, idx, S).numpy()), bits(v))


@pytest.mark.parametrize("kind, wd", COMBOS)
def test_gradients_every_combination(kind, wd):
    """Gradients w.r.t. float32 / bf16 tensors equal the reference's (w.r.t. the decoded values);
    fp8 q/keys take none, their w does (in its own dtype)."""
    (q, w, keys), (Q, W, K, S), lo, hi, k = _case(kind, wd, seed=1)
    idx, _ = WT.select(Q, W, K, lo, hi, k, kscale=S)
    target = torch.where(idx >= 0, 1.0, 0.0)
    target = target / target.sum(1, keepdim=True).clamp(min=1)
    Wg = W.clone().requires_grad_()
    Qg, Kg = (Q, K) if kind == "fp8" else (Q.clone().requires_grad_(), K.clone().requires_grad_())
    loss = WT.indexer_kl_loss(Qg, Wg, Kg, idx, target, kscale=S)
    loss.backward()
    ref = R.indexer_kl_loss(_np(Q), _np(W), _np(K), idx.numpy(), target.double().numpy(),
                            kscale=None if S is None else S.numpy())
    assert float(loss.detach()) == pytest.approx(ref[0], rel=1e-5, abs=1e-6)
    assert Wg.grad.dtype == W.dtype
    np.testing.assert_allclose(Wg.grad.float().numpy(), ref[2], rtol=1e-2 if wd == "bf16" else 1e-5, atol=1e-6)
    if kind == "fp8":
        assert not Qg.requires_grad and not Kg.requires_grad
    else:
        assert Qg.grad.dtype == Q.dtype and Kg.grad.dtype == K.dtype
        tol = 1e-2 if kind == "bf16" else 1e-5
        np.testing.assert_allclose(Qg.grad.float().numpy(), ref[1], rtol=tol, atol=1e-6)
        np.testing.assert_allclose(Kg.grad.float().numpy(), ref[3], rtol=tol, atol=1e-6)
    # the backward op itself on fp8: float32 gradients w.r.t. the decoded values
    dq, dw, dk = torch.ops.hytopk.replay_scores_backward(torch.ones(idx.shape), Q, W, K, idx, True, S)
    assert dq.dtype == scoring.grad_dtype(Q) and dk.dtype == scoring.grad_dtype(K)


def _np(x):
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16)
    if x.dtype == torch.float8_e4m3fn:
        return x.view(torch.uint8).numpy()
    return x.numpy()


def test_op_errors_name_the_argument():
    (_, _, _), (Q, W, K, S), lo, hi, k = _case("fp8", "float32")
    with pytest.raises(TypeError, match="argument 'kscale'"):
        WT.select(Q, W, K, lo, hi, k)
    with pytest.raises(TypeError, match="argument 'keys'"):
        WT.select(Q, W, K.float().to(torch.bfloat16), lo, hi, k, kscale=S)
    with pytest.raises(TypeError, match="argument 'kscale'"):
        WT.replay_scores(Q.float(), W, K.float(), torch.zeros((5, 2), dtype=torch.int32), kscale=S)
    with pytest.raises(TypeError, match="argument 'w'"):
        WT.select(Q, W.to(torch.float8_e4m3fn), K, lo, hi, k, kscale=S)
    with pytest.raises(ValueError, match="argument 'kscale'"):
        WT.select(Q.float(), W, K.float(), lo, hi, k, kscale=S, fp8=True)
    with pytest.raises(TypeError, match="argument 'q'"):
        WT.replay_scores(Q, W, K, torch.zeros((5, 2), dtype=torch.int32), fp8=True)


# ------------------------------------------------------------------ the quantiser and the straight-through replay
def test_quantize_matches_the_reference_codec():
    rng = np.random.default_rng(5)
    q = (rng.standard_normal((6, 4, 32)) * np.exp(rng.uniform(-12, 6, (6, 4, 1)))).astype(np.float32)
    keys = (rng.standard_normal((70, 32)) * np.exp(rng.uniform(-12, 6, (70, 1)))).astype(np.float32)
    keys[3] = 0.0                                                # a zero row: scale 1
    keys[4, :5] = [1e-30, -1e-30, 0.0, -0.0, 7.0]                # subnormal range after scaling
    w = rng.random((6, 4)).astype(np.float32)
    ref = quantize_indexer(q, w, keys)
    f = WT.fp8.quantize(torch.from_numpy(q), torch.from_numpy(w), torch.from_numpy(keys))
    np.testing.assert_array_equal(f.q.view(torch.uint8).numpy(), ref.q)
    np.testing.assert_array_equal(f.keys.view(torch.uint8).numpy(), ref.keys)
    np.testing.assert_array_equal(bits(f.w.numpy()), bits(ref.w))
    np.testing.assert_array_equal(bits(f.kscale.numpy()), bits(ref.kscale))
    # torch's e4m3 cast = the reference codec (nearest even, saturating) on every float32 pattern class
    x = np.concatenate([np.linspace(-460, 460, 20001, dtype=np.float32), rng.standard_normal(5000).astype(np.float32)
                        * np.float32(2.0 ** -8), np.array([448.0, -448.0, 1e-9, 2.0 ** -10, 3 * 2.0 ** -11], np.float32)])
    np.testing.assert_array_equal(WT.fp8.to_e4m3(torch.from_numpy(x)).view(torch.uint8).numpy(),
                                  float32_to_e4m3_bits(x))
    assert np.all(np.isfinite(e4m3_bits_to_float32(float32_to_e4m3_bits(x))))


def test_straight_through_replay():
    """fp8=True: forward = the fp8 scores of quantize(q, w, keys) (what select(fp8=True) saw);
    backward = the float formula's gradient at the dequantised values."""
    rng = np.random.default_rng(6)
    n, L, H, D, k = 4, 90, 3, 16, 12
    q = torch.from_numpy(rng.standard_normal((n, H, D)).astype(np.float32)).requires_grad_()
    keys = torch.from_numpy(rng.standard_normal((L, D)).astype(np.float32)).requires_grad_()
    w = torch.from_numpy(rng.random((n, H)).astype(np.float32)).requires_grad_()
    lo, hi = torch.zeros(n, dtype=torch.int32), torch.full((n,), L, dtype=torch.int32)
    idx, val = WT.select(q, w, keys, lo, hi, k, fp8=True)
    f = WT.fp8.quantize(q, w, keys)
    i2, v2 = WT.select(f.q, f.w, f.keys, lo, hi, k, kscale=f.kscale)
    assert torch.equal(idx, i2) and torch.equal(val, v2)
    s = WT.replay_scores(q, w, keys, idx, fp8=True)
    assert torch.equal(s, val)
    g = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    (s * g).sum().backward()
    qd, kd = f.dequantized()
    qd, wd, kd = (x.detach().clone().requires_grad_() for x in (qd, w, kd))
    (scoring.replay(qd, wd, kd, idx) * g).sum().backward()         # reference math: torch autograd
    torch.testing.assert_close(q.grad, qd.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, wd.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(keys.grad, kd.grad, rtol=1e-5, atol=1e-6)
    loss = WT.indexer_kl_loss(q, w, keys, idx, torch.full((n, k), 1.0 / k), fp8=True)
    assert torch.isfinite(loss)


# ------------------------------------------------------------------ the DSA layer
@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_dsa_layer_trains_with_fp8_or_bf16_indexer(mode):
    from workbench.torch.dsa import DSAttention

    class Bf16Indexer(torch.nn.Module):            # bf16 q/keys, float32 w: the transformers layout
        def __init__(self, dim, H=2, D=8):
            super().__init__()
            self.H, self.D = H, D
            self.q = torch.nn.Linear(dim, H * D, bias=False)
            self.k = torch.nn.Linear(dim, D, bias=False)
            self.w = torch.nn.Linear(dim, H, bias=False)

        def forward(self, x):
            q = self.q(x).view(x.shape[0], self.H, self.D).to(torch.bfloat16)
            return q, self.w(x).float() * self.H ** -0.5, self.k(x).to(torch.bfloat16)

    torch.manual_seed(0)
    kw = dict(fp8=True) if mode == "fp8" else dict(indexer=Bf16Indexer(32))
    layer = DSAttention(32, heads=2, head_dim=8, index_heads=2, index_dim=8, k=16, checkpoint="replay", **kw)
    for p in layer.qkv.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in layer.parameters() if p.requires_grad], lr=3e-2)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(20):
        out = layer(x)
        opt.zero_grad()
        out.indexer_loss.backward()
        opt.step()
        losses.append(float(out.indexer_loss.detach()))
    assert losses[-1] < 0.7 * losses[0], losses
