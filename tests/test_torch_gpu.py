"""The hytopk ops on CUDA (run on the H200): kernels vs the reference, bf16,
determinism, opcheck, torch.compile(fullgraph=True), CUDA graph capture, streams."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and driver")]

import reference as R                                   # noqa: E402
from reference import generate as G                     # noqa: E402
import workbench.torch as wt                            # noqa: E402
from workbench.torch import dispatch, scoring           # noqa: E402


def case(seed=0, n=64, L=20000, H=8, D=32, k=128, layout="causal_tail", exact=True):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=exact)
    lo, hi = G.layout(layout, n, L, k, rng)
    return q, w, keys, lo, hi, k


def cuda(*xs, dtype=None):
    return [torch.from_numpy(x).cuda() if dtype is None or x.dtype.kind != "f"
            else torch.from_numpy(x).cuda().to(dtype) for x in xs]


def test_report_says_which_kernels():
    rep = dispatch.report()
    print(rep)
    assert set(rep) >= {"select", "replay", "skipped"}
    assert all(isinstance(rep[p], str) and rep[p] for p in ("select", "replay"))


@pytest.mark.parametrize("layout", G.LAYOUTS)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_select_and_replay_equal_reference(layout, dtype):
    q, w, keys, lo, hi, k = case(layout=layout)
    ref = R.hytopk_indexer(q, w, keys, lo, hi, k)
    idx, val = wt.select(*cuda(q, w, keys, lo, hi, dtype=dtype), k)
    assert np.array_equal(idx.cpu().numpy(), ref.idx)
    assert val.cpu().numpy().tobytes() == ref.val.tobytes()
    rep = wt.replay_scores(*cuda(q, w, keys, dtype=dtype), idx)
    assert rep.cpu().numpy().tobytes() == R.replay_scores(q, w, keys, ref.idx).tobytes()


def test_pure_torch_cuda_path_equals_reference():
    q, w, keys, lo, hi, k = case(layout="varlen")
    ref = R.hytopk_indexer(q, w, keys, lo, hi, k)
    idx, val = scoring.exact_select(*cuda(q, w, keys, lo, hi), k)
    assert np.array_equal(idx.cpu().numpy(), ref.idx)
    assert val.cpu().numpy().tobytes() == ref.val.tobytes()


def test_gradients_match_cpu_and_reference():
    q, w, keys, lo, hi, k = case(n=32, L=3000, exact=False)
    idx = R.hytopk_indexer(q, w, keys, lo, hi, k).idx
    p = np.random.default_rng(0).random(idx.shape) * (idx >= 0)
    p /= p.sum(1, keepdims=True)
    _, dq, dw, dk = R.indexer_kl_loss(q, w, keys, idx, p)
    xs = [x.requires_grad_() for x in cuda(q, w, keys)]
    wt.indexer_kl_loss(*xs, *cuda(idx, p)).backward()
    for got, want in zip((x.grad for x in xs), (dq, dw, dk)):
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-3, atol=1e-4)


def test_deterministic_keys_grad_is_bitwise_reproducible():
    rng = np.random.default_rng(3)
    n, L, H, D, k = 512, 300, 16, 64, 256                # every key hit by hundreds of queries
    q, w, keys = (torch.from_numpy(x).cuda() for x in G.indexer_inputs(n, L, H, D, rng, exact=False))
    idx = torch.from_numpy(rng.integers(-1, L, size=(n, k)).astype(np.int32)).cuda()
    g = torch.randn(n, k, device="cuda")
    runs = [torch.ops.hytopk.replay_scores_backward(g, q, w, keys, idx, True)[2] for _ in range(5)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    default = torch.ops.hytopk.replay_scores_backward(g, q, w, keys, idx, False)[2]
    assert torch.allclose(default, runs[0], rtol=1e-4, atol=1e-4)


def test_opcheck_on_cuda():
    q, w, keys, lo, hi, k = case(n=8, L=5000)
    qt, wt_, kt, lot, hit = cuda(q, w, keys, lo, hi)
    idx, _ = wt.select(qt, wt_, kt, lot, hit, k)
    g = torch.randn(idx.shape, device="cuda")
    torch.library.opcheck(torch.ops.hytopk.select.default, (qt, wt_, kt, lot, hit, k, None, 3.0, 64))
    torch.library.opcheck(torch.ops.hytopk.replay_scores.default,
                          (qt.requires_grad_(), wt_.requires_grad_(), kt.requires_grad_(), idx, None))
    torch.library.opcheck(torch.ops.hytopk.replay_scores_backward.default,
                          (g, qt.detach(), wt_.detach(), kt.detach(), idx, True))


def _step(q, w, keys, lo, hi, bias, k):
    idx, _ = torch.ops.hytopk.select(q.detach(), w.detach(), keys.detach(), lo, hi, k, None, 3.0, 64)
    p = torch.softmax(bias[idx.clamp(min=0).long()].masked_fill(idx < 0, float("-inf")), 1)
    return wt.indexer_kl_loss(q, w, keys, idx, p.masked_fill(idx < 0, 0.0))


def test_compile_fullgraph_inductor_with_replay():
    q, w, keys, lo, hi, k = case(n=64, L=8000, exact=False)
    bias = torch.randn(keys.shape[0], device="cuda")
    args = cuda(lo, hi) + [bias, k]
    eager = [x.requires_grad_() for x in cuda(q, w, keys)]
    _step(*eager, *args).backward()
    fn = torch.compile(lambda *a: wt.checkpoint_with_replay(_step, *a), fullgraph=True)
    comp = [x.requires_grad_() for x in cuda(q, w, keys)]
    fn(*comp, *args).backward()
    for a, b in zip(comp, eager):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_cuda_graph_capture_and_replay():
    q, w, keys, lo, hi, k = case(n=32, L=4000)
    ref = R.hytopk_indexer(q, w, keys, lo, hi, k)
    qt, wt_, kt, lot, hit = cuda(q, w, keys, lo, hi)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                    # warm up (allocator, lazy init, cuBLAS) off the capture
        idx0, _ = wt.select(qt, wt_, kt, lot, hit, k)
        rep0 = wt.replay_scores(qt, wt_, kt, idx0)
        torch.ops.hytopk.replay_scores_backward(torch.ones_like(rep0), qt, wt_, kt, idx0, True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, val = wt.select(qt, wt_, kt, lot, hit, k)
        rep = wt.replay_scores(qt, wt_, kt, idx)
        grads = torch.ops.hytopk.replay_scores_backward(torch.ones_like(rep), qt, wt_, kt, idx, True)
    graph.replay()
    torch.cuda.synchronize()
    assert np.array_equal(idx.cpu().numpy(), ref.idx)
    assert rep.cpu().numpy().tobytes() == R.replay_scores(q, w, keys, ref.idx).tobytes()
    assert torch.isfinite(grads[2]).all()


def test_side_stream_is_respected():
    q, w, keys, lo, hi, k = case(n=64, L=30000)
    ref = R.hytopk_indexer(q, w, keys, lo, hi, k)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        qt, wt_, kt, lot, hit = cuda(q, w, keys, lo, hi)       # produced on s
        idx, val = wt.select(qt, wt_, kt, lot, hit, k)
        rep = wt.replay_scores(qt, wt_, kt, idx)
        out = (idx.cpu(), rep.cpu())
    assert np.array_equal(out[0].numpy(), ref.idx)
    assert out[1].numpy().tobytes() == R.replay_scores(q, w, keys, ref.idx).tobytes()


def test_bench_train_runs_tiny_on_gpu(tmp_path):
    from workbench.torch import bench_train
    rep = bench_train.main(["--preset", "tiny", "--reps", "2", "--warmup", "1", "--json", str(tmp_path / "b.json")])
    assert rep["results"][0]["replay_grads_equal_full_recompute_grads_bitwise_deterministic"]
