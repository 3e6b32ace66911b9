"""workbench.torch.integrations.transformers on tiny random-initialised DeepSeek-V3.2 and GLM-5
(glm_moe_dsa) models, CPU: the patched indexers select what the originals select wherever the
k-th score is not tied (inside ties: the contract's lower positions), the logits agree, unpatch
restores the originals, and a DSA layer on a transformers-shaped indexer trains its KL loss down
under checkpoint_with_replay."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.17", reason="transformers>=5.17 (the [transformers] extra)")

import reference as R  # noqa: E402
from workbench.torch.integrations import transformers as I  # noqa: E402

MODELS = ("deepseek_v32", "glm_moe_dsa")


class Recorder:
    """Inputs and outputs of every indexer call, in call order."""

    def __init__(self, model):
        self.calls = []
        self.handles = [m.register_forward_hook(self._hook(name), with_kwargs=True)
                        for name, m in I.find_indexers(model)]

    def _hook(self, name):
        def hook(mod, args, kwargs, out):
            self.calls.append((name, mod, args, kwargs, out.detach().cpu()))
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def _run(model, ids, mask=None, patch=False, **options):
    rec = Recorder(model)
    try:
        if patch:
            I.patch(model, **options)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
    finally:
        rec.close()
        if patch:
            I.unpatch(model)
    return logits, rec.calls


def _np(x):
    """NumPy for the reference: bf16 as uint16 bits (reference.dtypes)."""
    x = x.detach().cpu()
    return x.view(torch.int16).numpy().view(np.uint16) if x.dtype == torch.bfloat16 else x.numpy()


def _scores(mod, args):
    """float64 scores [B, S, T] of the indexer's own q, keys, weights (no mask), and the
    float32 q, w, keys the patched select saw."""
    hidden, q_resid, pe = args[:3]
    with torch.no_grad():
        q, k, w = I.indexer_inputs(mod, hidden, q_resid, pe)
    s = torch.einsum("bshd,btd->bsht", q.double(), k.double()).clamp(min=0)
    return torch.einsum("bsht,bsh->bst", s, w.double()).cpu().numpy(), (q, w, k)


def _compare(unpatched_calls, patched_calls, tol_rel=1e-5):
    """Per indexer call: the patched output is the exact top-k (contract order: lower position
    first inside ties) of the scores of its own inputs; against the unpatched top-k, the sets are
    equal wherever the k-th score is not tied. A later layer's inputs at position t equal the
    unpatched run's only while no earlier selection at positions <= t differed, so queries are
    compared up to the first differing position of their sequence. Returns (rows compared, rows
    that differ inside ties, first differing position per sequence)."""
    rows = differ = 0
    assert len(unpatched_calls) == len(patched_calls)
    first = None
    for (name, mod, args, kw, u), (name2, _, pargs, _, p) in zip(unpatched_calls, patched_calls):
        assert name == name2
        B, S, kk = p.shape
        first = [S] * B if first is None else first
        mask = args[3].cpu()
        vis = mask if mask.dtype == torch.bool else mask == 0
        vis = vis.expand(B, S, vis.shape[-1]).numpy()
        s64, _ = _scores(mod, args)
        _, (q, w, k) = _scores(mod, pargs)
        new_first = list(first)
        for b in range(B):
            lo = np.argmax(vis[b], axis=1)
            hi = lo + vis[b].sum(1)
            ours = R.hytopk_indexer(_np(q[b]), _np(w[b]), _np(k[b]), lo, hi, kk)
            for t in range(S):
                c = int(hi[t] - lo[t])
                got = p[b, t].numpy()
                n_ok = min(c, kk)
                np.testing.assert_array_equal(got[:n_ok], ours.idx[t, :n_ok], err_msg=f"{name} b={b} t={t}")
                if c == 0:
                    continue
                assert set(got[n_ok:].tolist()) <= {int(got[0])}, "padding repeats the best key (eager attention)"
                if t >= first[b]:
                    continue
                rows += 1
                uset = set(u[b, t].numpy().tolist()) & set(np.nonzero(vis[b, t])[0].tolist())
                pset = set(got[:n_ok].tolist())
                if c <= kk:
                    assert uset == pset == set(range(lo[t], hi[t]))
                    continue
                if uset == pset:
                    continue
                differ += 1
                new_first[b] = min(new_first[b], t)
                sc = s64[b, t, lo[t]:hi[t]]
                kth = np.sort(sc)[-kk]
                tol = tol_rel * max(1.0, np.abs(sc).max())
                for j in uset ^ pset:
                    assert abs(s64[b, t, j] - kth) <= tol, \
                        f"{name} b={b} t={t}: key {j} (score {s64[b, t, j]}) differs but the k-th score is {kth}"
        first = new_first
    return rows, differ, first


@pytest.mark.parametrize("model_type, dtype", [(m, torch.float32) for m in MODELS] +
                         [(m, torch.bfloat16) for m in MODELS])
def test_patched_selection_equals_unpatched_outside_ties(model_type, dtype):
    """bf16 models: bf16 q and keys with float32 weights (weights_proj kept in float32, as
    transformers' _keep_in_fp32_modules does) go to select as they are."""
    model = I.tiny_model(model_type, seed=0, dtype=dtype)
    ids = torch.randint(0, 97, (2, 48), generator=torch.Generator().manual_seed(1))
    _, u = _run(model, ids)
    _, p = _run(model, ids, patch=True)
    rows, differ, first = _compare(u, p)
    assert rows >= 2 * 48 and differ <= rows // 4, (rows, differ)


@pytest.mark.parametrize("model_type, dtype", [(m, torch.float32) for m in MODELS] + [("glm_moe_dsa", torch.bfloat16)])
def test_patched_logits_agree_and_unpatch_restores(model_type, dtype):
    # 8 index heads: an all-zero score row (every head's ReLU off) is rare, so the k-th score is untied
    model = I.tiny_model(model_type, seed=2, index_n_heads=8, dtype=dtype)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(5))
    a, u = _run(model, ids)
    b, p = _run(model, ids, patch=True)
    c, _ = _run(model, ids)
    assert torch.equal(a, c), "unpatch restores the original indexers bit for bit"
    assert not I.is_patched(model)
    _, differ, first = _compare(u, p)
    # logits at position t depend on the selections at positions <= t of every layer
    assert min(first) >= ids.shape[1] // 2, first
    for j, f in enumerate(first):
        torch.testing.assert_close(b[j, :f], a[j, :f], **tol)


def test_padding_mask_and_batch():
    """Left-padded batch: contexts start after the padding (lo > 0); padded queries are skipped."""
    model = I.tiny_model("deepseek_v32", seed=3)
    ids = torch.randint(0, 97, (2, 36), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 36, dtype=torch.long)
    mask[1, :9] = 0
    a, u = _run(model, ids, mask)
    b, p = _run(model, ids, mask, patch=True)
    rows, differ, first = _compare(u, p)
    assert rows >= 2 * 36 - 9
    torch.testing.assert_close(b[0, :first[0]], a[0, :first[0]], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b[1, 9:first[1]], a[1, 9:first[1]], rtol=1e-4, atol=1e-4)


def test_patch_options_fp8_and_state():
    model = I.tiny_model("glm_moe_dsa", seed=4)
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(2))
    with I.patched(model, fp8=True):
        assert I.is_patched(model)
        with torch.no_grad():
            out = model(ids).logits
        st = I.state(model)
        assert len(st) == 2 and all(v["calls"] == 1 and v["fp8"] and v["fallbacks"] == 0 for v in st.values())
    assert torch.isfinite(out).all() and not I.is_patched(model)
    with pytest.raises(ValueError, match="'model'"):
        I.patch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="'pad'"):
        I.patch(model, pad="zero")


def test_ranges_from_mask():
    S = T = 6
    causal = torch.ones(S, T, dtype=torch.bool).tril()[None]
    lo, hi = I.ranges_from_mask(causal, S, T)
    assert lo.tolist() == [[0] * 6] and hi.tolist() == [[1, 2, 3, 4, 5, 6]]
    fmask = torch.where(causal, 0.0, torch.finfo(torch.float32).min)
    lo2, hi2 = I.ranges_from_mask(fmask, S, T)
    assert torch.equal(lo, lo2) and torch.equal(hi, hi2)
    holes = causal.clone()
    holes[0, 5, 2] = False
    assert I.ranges_from_mask(holes, S, T) is None               # two runs: not a range
    biased = fmask.clone()
    biased[0, 5, 0] = -1.0
    assert I.ranges_from_mask(biased, S, T) is None              # a bias the range cannot carry
    lo3, hi3 = I.ranges_from_mask(None, 2, 5)
    assert lo3.tolist() == [[0, 0]] and hi3.tolist() == [[4, 5]]


def test_fallback_on_a_mask_that_is_not_a_range():
    model = I.tiny_model("deepseek_v32", seed=5, num_hidden_layers=1)
    (_, ix), = I.find_indexers(model)
    S = 12
    hidden = torch.randn(1, S, 32)
    q_resid = torch.randn(1, S, 24)
    pe = I.rotary_for(ix)(hidden, torch.arange(S)[None])
    mask = torch.ones(1, S, S, dtype=torch.bool).tril()
    mask[0, 11, 3] = False
    want = ix(hidden, q_resid, pe, mask, None)
    with I.patched(model):
        got = ix(hidden, q_resid, pe, mask, None)
        assert I.state(model)["model.layers.0.self_attn.indexer"]["fallbacks"] == 1
    assert torch.equal(got, want)


@pytest.mark.parametrize("model_type, fp8", [(m, False) for m in MODELS] + [("deepseek_v32", True)])
def test_dsa_layer_on_a_transformers_indexer_trains_with_replay(model_type, fp8):
    """DSAttention with a transformers indexer (float32 weights; fp8: selection on e4m3,
    straight-through gradients), checkpoint_with_replay: selection runs once per step."""
    from workbench.torch import CALLS
    from workbench.torch.dsa import DSAttention
    model = I.tiny_model(model_type, seed=0, index_topk=16)
    (_, indexer), *_ = I.find_indexers(model)
    cfg = indexer.config
    torch.manual_seed(0)
    layer = DSAttention(cfg.hidden_size, heads=2, head_dim=8, k=16, checkpoint="replay",
                        indexer=I.IndexerAdapter(indexer), fp8=fp8)
    for p in layer.qkv.parameters():
        p.requires_grad_(False)                     # a fixed main attention: its distribution is the target
    opt = torch.optim.Adam([p for p in layer.parameters() if p.requires_grad], lr=3e-2)
    x = torch.randn(64, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(25):
        before = CALLS["select"]
        out = layer(x)
        assert CALLS["select"] == before + 1
        opt.zero_grad()
        (out.out.sum() * 0 + out.indexer_loss).backward()
        assert CALLS["select"] == before + 1, "replay: the selection is not recomputed in backward"
        opt.step()
        losses.append(float(out.indexer_loss.detach()))
    assert indexer.wq_b.weight.grad is not None and indexer.weights_proj.weight.grad.abs().sum() > 0
    assert losses[-1] < 0.7 * losses[0], losses


def test_prefill_benchmark_quick_cpu(tmp_path):
    from workbench.torch.integrations import bench_prefill
    out = tmp_path / "prefill.json"
    rep = bench_prefill.main(["--quick", "--device", "cpu", "--json", str(out)])
    (row,) = rep["results"]
    assert set(row["impls"]) == {"unpatched", "unpatched_chunked", "patched"}
    assert all(v["status"] == "ok" for v in row["impls"].values())
    assert row["agreement_vs_unpatched"]["differ_only_inside_ties"] is True
    assert row["patch_state"] and out.exists() and rep["versions"]["transformers"]
