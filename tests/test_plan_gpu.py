"""Selection plans on the GPU (issue 14; skipped without a GPU):

    python3 -m pytest -q tests/test_plan_gpu.py            # on the H200

* a plan made once and called again gives the pipeline's bits (bf16, fp8, float32), over one
  pass and over many passes run round-robin on two streams;
* the capture-safe run (device-side check, recovery and fallback: no host sync) gives the
  eager run's bits, with no failure, with failures recovered and with the fallback;
* torch.ops.hytopk.select (and replay_scores) under torch.cuda.graph capture and under
  torch.compile(mode="reduce-overhead") equal eager bit for bit, bf16 and fp8;
* the op's plan cache: one plan per layout, a new one after lo/hi change.
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


def _cupy():
    from workbench import registry
    if not registry.load_family("cupy"):
        pytest.skip(f"cupy does not load: {registry.load_error('cupy')}")
    return workbench.backend("cupy")


def _case(n=64, L=20000, H=8, D=32, k=128, layout="causal_tail", kind="bf16", seed=0):
    rng = np.random.default_rng(seed)
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout(layout, n, L, k, rng)
    qq, ww, kk, ks = DT.encode_exact(q, w, keys, kind, "float32", rng)
    t = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}.get(kind)

    def dev(x):
        x = torch.from_numpy(np.ascontiguousarray(x)).cuda()
        return x.view(t) if t is not None and x.dtype in (torch.uint16, torch.uint8) else x
    return (dev(qq), dev(ww), dev(kk), None if ks is None else dev(ks),
            torch.from_numpy(lo).cuda(), torch.from_numpy(hi).cuda(), k, (q, w, keys, lo, hi))


def _bits(res):
    return (res.idx.get().tobytes() if hasattr(res.idx, "get") else np.asarray(res.idx).tobytes(),
            res.val.get().tobytes() if hasattr(res.val, "get") else np.asarray(res.val).tobytes())


KINDS = ("bf16", "fp8", "float32")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("query_chunk", [None, 8])
def test_plan_reuse_equals_the_pipeline(kind, query_chunk):
    b = _cupy()
    q, w, keys, ks, lo, hi, k, host = _case(kind=kind)
    want = b.hytopk_indexer(q, w, keys, lo, hi, k, kscale=ks, query_chunk=query_chunk)
    plan = b.plan(lo, hi, k, L=keys.shape[0], query_chunk=query_chunk)
    assert len(plan.passes) == (1 if query_chunk is None else 8)
    for _ in range(3):
        got = plan(q, w, keys, kscale=ks).host()
        assert np.array_equal(np.asarray(got.idx.get()), want.idx.cpu().numpy())
        assert got.val.get().tobytes() == want.val.cpu().numpy().tobytes()
        assert np.array_equal(got.count, want.count) and np.array_equal(got.failed, want.failed)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("regime", ["clean", "recover", "fallback"])
@pytest.mark.parametrize("query_chunk", [None, 16])
def test_capture_safe_run_equals_eager(kind, regime, query_chunk):
    """Device-side check, recovery and fallback give the eager run's bits and statistics."""
    b = _cupy()
    q, w, keys, ks, lo, hi, k, host = _case(kind=kind, layout="varlen", seed=3)
    capacity = {"clean": None, "recover": k + 8, "fallback": k + 8}[regime]
    max_failed = {"clean": 64, "recover": 64, "fallback": 2}[regime]
    plan = b.plan(lo, hi, k, L=keys.shape[0], capacity=capacity, max_failed=max_failed, query_chunk=query_chunk)
    eager = plan(q, w, keys, kscale=ks, capture_safe=False)
    dev = plan(q, w, keys, kscale=ks, capture_safe=True)
    assert _bits(eager) == _bits(dev)
    e, d = eager.host(), dev.host()
    assert np.array_equal(e.failed, d.failed) and e.fell_back == d.fell_back
    assert int(dev.nfailed.get()[0]) == eager.nfailed
    if regime == "recover":
        assert 0 < eager.nfailed <= max_failed and not e.fell_back
    if regime == "fallback":
        assert e.fell_back
    ref = R.hytopk_indexer(*host[:3], host[3], host[4], k, capacity=capacity, max_failed=max_failed) \
        if kind == "float32" else None
    if ref is not None:                  # float32: the SIMT stages equal the reference bit for bit
        assert np.array_equal(e.idx.get(), ref.idx) and e.val.get().tobytes() == ref.val.tobytes()


def test_plan_rejects_other_layouts():
    b = _cupy()
    q, w, keys, ks, lo, hi, k, _ = _case()
    plan = b.plan(lo, hi, k, L=keys.shape[0])
    with pytest.raises(ValueError, match="argument 'q'.*query rows"):
        plan(q[:-1], w[:-1], keys)
    with pytest.raises(ValueError, match="argument 'keys'.*L = "):
        plan(q, w, keys[: int(hi.max()) - 1])


def _capture(fn, *args):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                    # warm-up: makes the plan, loads the kernels
        eager = fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, eager, out


def _select_and_replay(q, w, keys, lo, hi, k, ks, capacity, max_failed):
    idx, val = torch.ops.hytopk.select(q, w, keys, lo, hi, k, capacity, 3.0, max_failed, ks)
    rep = torch.ops.hytopk.replay_scores(q, w, keys, idx, None, ks)
    return idx, val, rep


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("regime", ["clean", "recover", "fallback"])
def test_cuda_graph_capture_of_select_equals_eager(kind, regime):
    _cupy()
    import workbench.torch  # noqa: F401  (registers the ops)
    from workbench.torch import dispatch
    dispatch.reset()
    q, w, keys, ks, lo, hi, k, _ = _case(kind=kind, layout="varlen", seed=5)
    capacity = None if regime == "clean" else k + 8
    max_failed = 2 if regime == "fallback" else 64
    graph, eager, out = _capture(_select_and_replay, q, w, keys, lo, hi, k, ks, capacity, max_failed)
    for _ in range(2):
        for x in out:
            x.fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(eager, out):
            assert a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()


def test_cuda_graph_replay_follows_new_input_values():
    """The graph reads the captured input tensors: new q values in place give their selection."""
    _cupy()
    import workbench.torch  # noqa: F401
    q, w, keys, ks, lo, hi, k, _ = _case(kind="bf16")
    q2, w2, keys2, *_ = _case(kind="bf16", seed=9)
    graph, eager, out = _capture(_select_and_replay, q, w, keys, lo, hi, k, None, None, 64)
    want = _select_and_replay(q2, w2, keys2, lo, hi, k, None, None, 64)
    q.copy_(q2), w.copy_(w2), keys.copy_(keys2)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(want, out):
        assert a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_torch_compile_reduce_overhead_equals_eager(kind):
    _cupy()
    import workbench.torch  # noqa: F401
    q, w, keys, ks, lo, hi, k, _ = _case(kind=kind, seed=7)
    eager = _select_and_replay(q, w, keys, lo, hi, k, ks, None, 64)
    fn = torch.compile(_select_and_replay, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):                             # warm-up runs, the recording, then replays
        got = fn(q, w, keys, lo, hi, k, ks, None, 64)
        torch.cuda.synchronize()
        for a, b in zip(eager, got):
            assert a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()


def test_op_keeps_one_plan_per_layout():
    _cupy()
    import workbench.torch  # noqa: F401
    from workbench.torch import plans
    plans.clear()
    q, w, keys, ks, lo, hi, k, host = _case(kind="bf16")
    for _ in range(3):
        torch.ops.hytopk.select(q, w, keys, lo, hi, k)
    assert len(plans._PLANS) == 1
    hi2 = hi.clone()
    hi2[0] = max(int(lo[0]), int(hi[0]) - 1)
    idx, _ = torch.ops.hytopk.select(q, w, keys, lo, hi2, k)
    assert len(plans._PLANS) == 2
    hi.sub_(0)                                     # an in-place op bumps the version: a new plan
    torch.ops.hytopk.select(q, w, keys, lo, hi, k)
    assert len(plans._PLANS) == 3
    ref = R.hytopk_indexer(*host[:3], host[3], hi2.cpu().numpy(), k)
    assert np.array_equal(idx.cpu().numpy(), ref.idx)


# ---- issue 14 (s4): the device-side recovery in one slots launch, selections written in place;
# ---- CapturedSelect (workbench/torch/captured.py); the launch recorder on the GPU

@pytest.mark.parametrize("kind", KINDS + ("table",))
@pytest.mark.parametrize("regime", ["recover", "fallback"])
def test_capture_safe_recovery_over_several_chunks_equals_eager(monkeypatch, kind, regime):
    """Recovery chunks of 16 slots over 64 queries (4 chunks): the rows recoveries write their
    selections straight into idx/val, the table source's recovery scatters; eager's bits."""
    import workbench.families.cupy as fc
    b = _cupy()
    monkeypatch.setattr(fc, "_recovery_chunk", lambda n, longest: 16)
    q, w, keys, ks, lo, hi, k, host = _case(kind="float32" if kind == "table" else kind, layout="varlen", seed=3)
    max_failed = 64 if regime == "recover" else 2
    plan = b.plan(lo, hi, k, L=keys.shape[0], capacity=k + 8, max_failed=max_failed)
    if kind == "table":
        table = torch.from_numpy(R.indexer_scores(*host[:3], host[3], host[4])).cuda()
        eager, dev = plan.table(table, capture_safe=False), plan.table(table, capture_safe=True)
    else:
        eager, dev = plan(q, w, keys, kscale=ks, capture_safe=False), plan(q, w, keys, kscale=ks, capture_safe=True)
    assert _bits(eager) == _bits(dev)
    e, d = eager.host(), dev.host()
    assert e.fell_back == d.fell_back == (regime == "fallback") and eager.nfailed > 0


def test_capture_safe_launches_on_the_gpu_match_the_cpu_count():
    """The launch recorder on the GPU (launches run): the capture-safe call of a 2-pass plan
    issues one recovery-slots launch and no scatter (tests/test_launch_count.py counts the
    same sequence dry on the CPU)."""
    from workbench.families.cupy import _launch
    b = _cupy()
    q, w, keys, ks, lo, hi, k, _ = _case(kind="bf16", n=64)
    plan = b.plan(lo, hi, k, L=keys.shape[0], capacity=k + 8, query_chunk=32)
    plan(q, w, keys, capture_safe=True)
    with _launch.record_launches() as rec:
        plan(q, w, keys, capture_safe=True)
    names = [x.split(":", 1)[1].split("<", 1)[0] for x in rec.names()]
    assert names.count("hytopk_recovery_slots") == 1 and "hytopk_scatter_slots" not in names
    assert names.count("hytopk_select_rows_to") == names.count("hytopk_score_rows_ws") >= 1


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("regime", ["clean", "recover", "fallback"])
def test_captured_select_equals_eager_and_follows_new_inputs(kind, regime):
    _cupy()
    import workbench.torch as wt
    from workbench.torch import dispatch
    dispatch.reset()
    q, w, keys, ks, lo, hi, k, _ = _case(kind=kind, layout="varlen", seed=5)
    q2, w2, keys2, ks2, *_ = _case(kind=kind, layout="varlen", seed=11)
    capacity = None if regime == "clean" else k + 8
    max_failed = 2 if regime == "fallback" else 64
    op = lambda *a: torch.ops.hytopk.select(*a[:3], lo, hi, k, capacity, 3.0, max_failed, a[3])  # noqa: E731
    want1, want2 = op(q, w, keys, ks), op(q2, w2, keys2, ks2)
    sel = wt.CapturedSelect(q.clone(), w.clone(), keys.clone(), lo, hi, k, kscale=None if ks is None else ks.clone(),
                            capacity=capacity, max_failed=max_failed)
    for inputs, want in (((q, w, keys, ks), want1), ((q2, w2, keys2, ks2), want2), ((q, w, keys, ks), want1)):
        idx, val = sel(*inputs[:3], kscale=inputs[3])
        torch.cuda.synchronize()
        assert idx.cpu().numpy().tobytes() == want[0].cpu().numpy().tobytes()
        assert val.cpu().numpy().tobytes() == want[1].cpu().numpy().tobytes()
    sel.q.copy_(q2), sel.w.copy_(w2), sel.keys.copy_(keys2)        # in place: the replay alone
    if ks2 is not None:
        sel.kscale.copy_(ks2)
    idx, val = sel()
    torch.cuda.synchronize()
    assert idx.cpu().numpy().tobytes() == want2[0].cpu().numpy().tobytes()
    with pytest.raises(ValueError, match="argument 'q'"):
        sel(q[:-1], w, keys)
