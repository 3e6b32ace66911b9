"""Selection replay under activation recomputation, the DSA module, torch.compile (CPU)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.checkpoint import checkpoint              # noqa: E402

from reference import generate as G                        # noqa: E402
import workbench.torch as wt                               # noqa: E402
from workbench.torch.dsa import DSAttention, sparse_attention   # noqa: E402


def inputs(seed=1, n=6, L=400, H=3, D=8, k=16):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=False)
    lo, hi = G.layout("causal_tail", n, L, k, rng)
    bias = torch.from_numpy(rng.standard_normal(L).astype(np.float32))
    return [torch.from_numpy(x) for x in (q, w, keys, lo, hi)] + [bias, k]


def step(q, w, keys, lo, hi, bias, k):
    """The indexer share of a DSA step: select, replay, KL against a detached target."""
    idx, _ = wt.select(q.detach(), w.detach(), keys.detach(), lo, hi, k)
    p = torch.softmax(bias[idx.clamp(min=0).long()].masked_fill(idx < 0, float("-inf")), 1)
    return wt.indexer_kl_loss(q, w, keys, idx, p.masked_fill(idx < 0, 0.0)) * 1.0


def run(mode, args):
    q, w, keys = (x.clone().requires_grad_() for x in args[:3])
    rest = args[3:]
    wt.CALLS.clear()
    if mode == "plain":
        loss = step(q, w, keys, *rest)
    elif mode == "full":
        loss = checkpoint(step, q, w, keys, *rest, use_reentrant=False)
    else:
        loss = wt.checkpoint_with_replay(step, q, w, keys, *rest)
    loss.backward()
    return dict(wt.CALLS), loss.detach(), [x.grad for x in (q, w, keys)]


def test_replay_skips_selection_in_recomputation_and_keeps_gradients_bitwise():
    args = inputs()
    calls0, loss0, grads0 = run("plain", args)
    calls_full, loss_full, grads_full = run("full", args)
    calls_rep, loss_rep, grads_rep = run("replay", args)
    assert calls0["select"] == 1
    assert calls_full["select"] == 2                 # full recomputation reruns the selection ...
    assert calls_rep["select"] == 1                  # ... selection replay does not
    assert calls_rep["replay"] == 2                  # only the cheap rescoring runs again
    for loss, grads in ((loss_full, grads_full), (loss_rep, grads_rep)):
        assert torch.equal(loss, loss0)
        assert all(torch.equal(a, b) for a, b in zip(grads, grads0))


def test_replay_policy_saves_only_select():
    from torch.utils.checkpoint import CheckpointPolicy
    assert wt.replay_policy(None, torch.ops.hytopk.select.default) == CheckpointPolicy.MUST_SAVE
    assert wt.replay_policy(None, torch.ops.hytopk.replay_scores.default) == CheckpointPolicy.PREFER_RECOMPUTE
    assert wt.replay_policy(None, torch.ops.aten.mm.default) == CheckpointPolicy.PREFER_RECOMPUTE


def test_dsa_module_modes_agree_bitwise():
    results = {}
    torch.use_deterministic_algorithms(True)          # the main attention's gather backward too
    try:
        for mode in ("none", "full", "replay"):
            torch.manual_seed(0)
            m = DSAttention(32, heads=2, head_dim=8, index_heads=2, index_dim=8, k=16, checkpoint=mode)
            x = torch.randn(80, 32, requires_grad=True)
            wt.CALLS.clear()
            o = m(x)
            (o.out.square().mean() + o.indexer_loss).backward()
            results[mode] = (dict(wt.CALLS), [p.grad.clone() for p in m.parameters()] + [x.grad])
            assert o.idx.shape == (80, 16) and torch.isfinite(o.indexer_loss)
            assert m.index_q.weight.grad.abs().sum() > 0      # the indexer learns from its loss
    finally:
        torch.use_deterministic_algorithms(False)
    assert results["full"][0]["select"] == 2 and results["replay"][0]["select"] == 1
    for mode in ("full", "replay"):
        assert all(torch.equal(a, b) for a, b in zip(results[mode][1], results["none"][1]))


def test_sparse_attention_padding_and_empty_context():
    Q, K, V = torch.randn(3, 2, 4), torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    idx = torch.tensor([[0, 1, -1], [-1, -1, -1], [4, 2, 3]], dtype=torch.int32)
    out, probs = sparse_attention(Q, K, V, idx)
    assert torch.all(probs[:, :, 2][0] == 0) and torch.all(probs[1] == 0) and torch.all(out[1] == 0)
    assert torch.allclose(probs[0].sum(-1), torch.ones(2)) and torch.allclose(probs[2].sum(-1), torch.ones(2))
    dense = torch.softmax(torch.einsum("hd,khd->hk", Q[2], K[[4, 2, 3]]) / 2.0, -1)
    assert torch.allclose(probs[2], dense)


def test_compile_fullgraph_traces_the_ops():
    """Dynamo + AOTAutograd with the fake kernels (aot_eager: no C++ compile on the CI box)."""
    args = inputs(seed=2)
    ref_calls, ref_loss, ref_grads = run("plain", args)
    fn = torch.compile(step, fullgraph=True, backend="aot_eager")
    q, w, keys = (x.clone().requires_grad_() for x in args[:3])
    loss = fn(q, w, keys, *args[3:])
    loss.backward()
    assert torch.allclose(loss, ref_loss)
    for a, b in zip((q.grad, w.grad, keys.grad), ref_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
