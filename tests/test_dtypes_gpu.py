"""Every indexer input dtype combination on the GPU backends (issue 17; skipped without a GPU).

    python3 -m pytest -q -rs tests/test_dtypes_gpu.py            # on the H200 (about a minute)

q/keys float32, bf16 or fp8 e4m3 (+ a float32 scale per key row), w float32 or bf16
(reference.dtypes), on exact inputs (small integers; fp8 keys divided by power-of-two scales), so
every score is exact and every backend must equal the reference bit for bit:

* workbench.backend("cupy" | "numba"): hytopk_indexer, indexer_scores, replay_scores, with NumPy
  (host bits), CuPy (device bits) and torch CUDA (torch.bfloat16 / torch.float8_e4m3fn) inputs,
  on a small shape and on the real model shapes (H = 64 / 32, D = 128, k = 2048, 32K keys);
* the torch ops on CUDA under every HYTOPK_TORCH_BACKEND (cupy, numba, torch): select,
  replay_scores, gradients (fp8: w only; fp8=True: straight-through);
* the transformers drop-in on CUDA: a bf16 tiny model (bf16 q/keys, float32 weights) patched
  equals the unpatched model outside ties, and a real-size indexer (4096 tokens, H = 64, D = 128,
  k = 2048) selects the unpatched set outside ties.

The CuPy family takes float32 w beside bf16 / fp8 q and keys once its tensor-core core does
(the dispatch passes them through unchanged) and runs fp8 through its fp8 stage set (Family.defaults["fp8"]):
an Fp8IndexerSource (uint8 e4m3 bits, float32 w, float32 kscale) for threshold / filter / recover,
``dense(q, w, keys, lo, hi, kscale=...)`` and ``replay(q, w, keys, idx, kscale=...)``.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and driver")]

import reference as R  # noqa: E402
import workbench  # noqa: E402
from reference import dtypes as DT  # noqa: E402
from reference import generate as G  # noqa: E402

COMBOS = [(kind, wd) for kind in DT.KINDS for wd in ("float32", "bf16")]
FAMILIES = ("cupy", "numba")
SMALL = dict(n=64, L=20000, H=8, D=32, k=128)
MODEL_SHAPES = {"dsv32": dict(n=256, L=32768, H=64, D=128, k=2048),
                "glm5": dict(n=256, L=32768, H=32, D=128, k=2048)}


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _family(name):
    from workbench import registry
    if not registry.load_family(name):
        pytest.skip(f"backend {name!r} does not load here: {registry.load_error(name)}")
    from workbench.families import get_family
    ok, why = get_family(name).available()
    if not ok:
        pytest.skip(f"backend {name!r} unavailable: {why}")
    return workbench.backend(name)


def _case(shape, seed=0, layout="causal_tail"):
    rng = np.random.default_rng(seed)
    n, L, H, D, k = (shape[x] for x in ("n", "L", "H", "D", "k"))
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout(layout, n, L, k, rng)
    return q, w, keys, lo, hi, k, rng


def _oracle(q, w, keys, lo, hi, k):
    """Exact top-k on the GPU (pure-torch path, float32: exact on these inputs = the reference bits)."""
    from workbench.torch import scoring
    t = [torch.from_numpy(x).cuda() for x in (q, w, keys, lo, hi)]
    idx, val = scoring.exact_select(t[0], t[1], t[2], t[3].long(), t[4].long(), k)
    return idx.cpu().numpy(), val.cpu().numpy()


def _as(kind_of_array, x, dtype_kind):
    """Host bits (reference.dtypes conventions) as NumPy, CuPy or torch CUDA arrays."""
    if x is None:
        return None
    if kind_of_array == "numpy":
        return x
    if kind_of_array == "cupy":
        import cupy as cp
        return cp.asarray(x)
    t = torch.from_numpy(np.ascontiguousarray(x)).cuda()
    return {"bf16": lambda: t.view(torch.bfloat16), "fp8": lambda: t.view(torch.float8_e4m3fn)}.get(dtype_kind,
                                                                                                   lambda: t)()


def _host(x):
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get"):
        return x.get()
    return x.detach().cpu().numpy()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind, wd", COMBOS)
@pytest.mark.parametrize("arrays", ["numpy", "cupy", "torch"])
def test_backend_every_combination_bit_for_bit(family, kind, wd, arrays):
    if arrays == "cupy":
        pytest.importorskip("cupy")
    b = _family(family)
    q, w, keys, lo, hi, k, rng = _case(SMALL)
    want = R.hytopk_indexer(q, w, keys, lo, hi, k)
    qq, ww, kk, ks = (_as(arrays, x, d) for x, d in zip(DT.encode_exact(q, w, keys, kind, wd, rng),
                                                         (kind, wd, kind, "float32")))
    lo_a, hi_a = _as(arrays, lo, "int"), _as(arrays, hi, "int")
    res = b.hytopk_indexer(qq, ww, kk, lo_a, hi_a, k, kscale=ks)
    np.testing.assert_array_equal(_host(res.idx), want.idx)
    np.testing.assert_array_equal(bits(_host(res.val)), bits(want.val))
    table = R.indexer_scores(q, w, keys, lo, hi)
    np.testing.assert_array_equal(bits(_host(b.indexer_scores(qq, ww, kk, lo_a, hi_a, kscale=ks))), bits(table))
    rep = b.replay_scores(qq, ww, kk, _as(arrays, want.idx, "int"), kscale=ks)
    np.testing.assert_array_equal(bits(_host(rep)), bits(R.replay_scores(q, w, keys, want.idx)))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind, wd", [("bf16", "float32"), ("fp8", "float32"), ("bf16", "bf16")])
@pytest.mark.parametrize("shape", sorted(MODEL_SHAPES))
def test_model_shapes_bit_for_bit(family, kind, wd, shape):
    """The real indexer shapes with torch CUDA inputs, as the torch ops hand them over."""
    b = _family(family)
    q, w, keys, lo, hi, k, rng = _case(MODEL_SHAPES[shape], seed=1)
    want_idx, want_val = _oracle(q, w, keys, lo, hi, k)
    qq, ww, kk, ks = (_as("torch", x, d) for x, d in zip(DT.encode_exact(q, w, keys, kind, wd, rng),
                                                        (kind, wd, kind, "float32")))
    res = b.hytopk_indexer(qq, ww, kk, torch.from_numpy(lo).cuda(), torch.from_numpy(hi).cuda(), k, kscale=ks)
    np.testing.assert_array_equal(_host(res.idx), want_idx)
    np.testing.assert_array_equal(bits(_host(res.val)), bits(want_val))
    rep = b.replay_scores(qq, ww, kk, torch.from_numpy(want_idx).cuda(), kscale=ks)
    np.testing.assert_array_equal(bits(_host(rep)), bits(want_val))


def test_cupy_family_declares_its_fp8_stage_set():
    _family("cupy")
    from workbench import registry
    fam = registry.record("cupy")
    assert "fp8" in fam.defaults, "the CuPy family's record needs an fp8 stage set (its fp8 e4m3 stages)"
    for stage, name in fam.defaults["fp8"].items():
        assert registry.get(name).stage == stage


# ------------------------------------------------------------------ the torch ops on CUDA, every dispatch choice
@pytest.fixture(params=["cupy", "numba", "torch"])
def torch_backend(request, monkeypatch):
    from workbench.torch import dispatch
    monkeypatch.setenv("HYTOPK_TORCH_BACKEND", request.param)
    dispatch.reset()
    if request.param != "torch" and dispatch.cuda_backend("select") is None:
        pytest.skip(f"{request.param} unavailable: {dispatch.report()['skipped']}")
    yield request.param
    dispatch.reset()


@pytest.mark.parametrize("kind, wd", COMBOS)
def test_torch_ops_every_combination(torch_backend, kind, wd):
    import workbench.torch as wt
    q, w, keys, lo, hi, k, rng = _case(SMALL, seed=2, layout="varlen")
    want = R.hytopk_indexer(q, w, keys, lo, hi, k)
    Q, W, K, S = (_as("torch", x, d) for x, d in zip(DT.encode_exact(q, w, keys, kind, wd, rng),
                                                   (kind, wd, kind, "float32")))
    lo_t, hi_t = torch.from_numpy(lo).cuda(), torch.from_numpy(hi).cuda()
    idx, val = wt.select(Q, W, K, lo_t, hi_t, k, kscale=S)
    np.testing.assert_array_equal(idx.cpu().numpy(), want.idx)
    np.testing.assert_array_equal(bits(val.cpu().numpy()), bits(want.val))
    Wg = W.clone().requires_grad_()
    rep = wt.replay_scores(Q, Wg, K, idx, kscale=S)
    np.testing.assert_array_equal(bits(rep.detach().cpu().numpy()), bits(want.val))
    target = torch.where(idx >= 0, 1.0, 0.0)
    target = target / target.sum(1, keepdim=True).clamp(min=1)
    loss = wt.indexer_kl_loss(Q, Wg, K, idx, target, kscale=S)
    loss.backward()
    host = lambda x: x.detach().cpu()
    ref = R.indexer_kl_loss(*(_host(x) if x.dtype not in (torch.bfloat16, torch.float8_e4m3fn) else
                              (host(x).view(torch.int16).numpy().view(np.uint16) if x.dtype == torch.bfloat16
                               else host(x).view(torch.uint8).numpy()) for x in (Q, W, K)),
                            want.idx, target.double().cpu().numpy(), kscale=None if S is None else _host(S))
    np.testing.assert_allclose(Wg.grad.float().cpu().numpy(), ref[2], rtol=1e-2 if wd == "bf16" else 1e-5, atol=1e-6)


def test_torch_straight_through_on_cuda(torch_backend):
    import workbench.torch as wt
    rng = np.random.default_rng(3)
    n, L, H, D, k = 128, 8192, 8, 64, 256
    q = torch.from_numpy(rng.standard_normal((n, H, D)).astype(np.float32)).cuda().requires_grad_()
    keys = torch.from_numpy(rng.standard_normal((L, D)).astype(np.float32)).cuda().requires_grad_()
    w = torch.from_numpy(rng.random((n, H)).astype(np.float32)).cuda().requires_grad_()
    lo = torch.zeros(n, dtype=torch.int32, device="cuda")
    hi = torch.full((n,), L, dtype=torch.int32, device="cuda")
    idx, val = wt.select(q, w, keys, lo, hi, k, fp8=True)
    f = wt.fp8.quantize(q, w, keys)
    i2, v2 = wt.select(f.q, f.w, f.keys, lo, hi, k, kscale=f.kscale)
    assert torch.equal(idx, i2) and torch.equal(val, v2)                  # one quantiser, the same bits
    ref = R.replay_scores(*(x.cpu().view(torch.uint8).numpy() if x.dtype == torch.float8_e4m3fn else x.cpu().numpy()
                            for x in (f.q, f.w, f.keys)), idx.cpu().numpy(), kscale=f.kscale.cpu().numpy())
    if torch_backend == "cupy":
        # the wgmma_ws core's fp8 MMAs (QGMMA) accumulate with Hopper's reduced fp8 accumulator precision
        # (about 14 mantissa bits, DeepSeek-V3 report sec. 3.3.2), not float32: exact on exact inputs
        # (test_backend_every_combination_bit_for_bit), within ~2^-12 of the float64 sums on random ones
        scale = float(np.abs(ref).max())
        torch.testing.assert_close(val.cpu(), torch.from_numpy(ref), rtol=2.0 ** -11, atol=2.0 ** -11 * scale)
    else:
        torch.testing.assert_close(val.cpu(), torch.from_numpy(ref), rtol=1e-5, atol=1e-5)   # float32 vs float64 sums
    s = wt.replay_scores(q, w, keys, idx, fp8=True)
    torch.testing.assert_close(s, val, rtol=1e-5, atol=1e-5)
    s.sum().backward()
    assert q.grad is not None and keys.grad is not None and w.grad is not None


# ------------------------------------------------------------------ the transformers drop-in on CUDA
def test_transformers_bf16_model_patched_on_cuda():
    pytest.importorskip("transformers", minversion="5.17")
    import test_transformers_integration as T
    from workbench.torch.integrations import transformers as I
    model = I.tiny_model("deepseek_v32", seed=0, dtype=torch.bfloat16).cuda()
    ids = torch.randint(0, 97, (2, 64), generator=torch.Generator().manual_seed(1)).cuda()
    _, u = T._run(model, ids)
    _, p = T._run(model, ids, patch=True)
    rows, differ, _ = T._compare(u, p)
    assert rows >= 2 * 64 and differ <= rows // 4


@pytest.mark.parametrize("model_type, H", [("deepseek_v32", 64), ("glm_moe_dsa", 32)])
def test_transformers_real_size_indexer_on_cuda(model_type, H):
    """One real-size indexer (4096 tokens, D = 128, k = 2048, bf16): the patched top-k equals the
    unpatched one wherever the k-th score is not tied."""
    pytest.importorskip("transformers", minversion="5.17")
    from workbench.torch.integrations import transformers as I
    model = I.tiny_model(model_type, seed=0, dtype=torch.bfloat16, num_hidden_layers=1, hidden_size=256,
                         q_lora_rank=256, index_n_heads=H, index_head_dim=128, index_topk=2048,
                         qk_rope_head_dim=64, max_position_embeddings=8192).cuda()
    (_, ix), = I.find_indexers(model)
    S = 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(1, S, 256, device="cuda", generator=g).to(torch.bfloat16)
    q_resid = torch.randn(1, S, 256, device="cuda", generator=g).to(torch.bfloat16)
    pe = I.rotary_for(ix).cuda()(hidden, torch.arange(S, device="cuda")[None])
    mask = torch.ones(1, S, S, dtype=torch.bool, device="cuda").tril()
    with torch.no_grad():
        want = ix(hidden, q_resid, pe, mask, None)
        with I.patched(model):
            got = ix(hidden, q_resid, pe, mask, None)
        q, k, w = I.indexer_inputs(ix, hidden, q_resid, pe)
    s = torch.einsum("bshd,btd->bsht", q.double()[:, 2048:], k.double()).clamp(min=0)
    s = torch.einsum("bsht,bsh->bst", s, w.double()[:, 2048:])[0]                # queries with c > k
    s = s.masked_fill(~mask[0, 2048:], float("-inf"))
    kth = s.sort(dim=1, descending=True).values[:, 2047:2048]
    tol = 1e-5 * s.masked_fill(~mask[0, 2048:], 0).abs().amax(1, keepdim=True).clamp(min=1)
    g_sel = torch.zeros_like(s, dtype=torch.bool).scatter_(1, got[0, 2048:].long(), True)
    u_sel = torch.zeros_like(s, dtype=torch.bool).scatter_(1, want[0, 2048:].long(), True)
    differ = g_sel ^ u_sel
    assert bool(((s - kth).abs() <= tol)[differ].all()), "selections differ outside ties"
