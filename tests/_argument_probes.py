"""The argument probes of issue 19, shared by the CPU tests (tests/test_arguments.py), the
Numba simulator pass (tests/test_numba_arguments.py) and the GPU run (tests/test_arguments_gpu.py).

Each error probe is ``call(api, A) -> None`` with the exception type it must raise and the
argument its message must name. ``api`` is the ``reference`` module or a ``workbench.Backend``;
``A`` turns a host NumPy array into the array kind under test (identity for NumPy, cupy.asarray,
a CUDA tensor, ...). Probes marked host-only mix array kinds on purpose and run with NumPy only.
"""
from __future__ import annotations

import contextlib
import resource
import sys

import numpy as np

INT32_MAX = 2**31 - 1

_rng = np.random.default_rng(19)
S = _rng.standard_normal((3, 50)).astype(np.float32)
LO, HI = np.zeros(3, np.int32), np.full(3, 50, np.int32)
SHORT_HI = np.array([2, 3, 1], np.int32)                      # every context shorter than k = 4
Q = _rng.integers(-2, 3, (3, 2, 4)).astype(np.float32)
W = _rng.integers(0, 3, (3, 2)).astype(np.float32)
KEYS = _rng.integers(-2, 3, (50, 4)).astype(np.float32)
IDX = np.array([[0, 1, 2, -1], [3, 4, -1, -1], [5, 6, 7, 8]], np.int32)
_p = _rng.random(IDX.shape) * (IDX >= 0)
TARGET = (_p / _p.sum(1, keepdims=True)).astype(np.float32)   # a distribution, zero at padding


def _with(a, pos, value, dtype=None):
    a = a.astype(dtype or a.dtype)
    a[pos] = value
    return a


# target variants that must all fail with one ValueError naming 'target'
BAD_TARGETS = {
    "nan": _with(TARGET, (0, 0), np.nan),
    "inf": _with(TARGET, (0, 0), np.inf),
    "minus_inf": _with(TARGET, (0, 0), -np.inf),
    "negative": _with(TARGET, (0, 0), -0.25),
    "nonzero_at_padding": _with(TARGET, (0, 3), 0.25),
    "complex": TARGET.astype(np.complex64),
    "int": (TARGET > 0).astype(np.int64),
    "bool": TARGET > 0,
    "wrong_shape": TARGET[:, :3].copy(),
}

# name -> (call(api, A), exception type, argument named in the message)
ERROR_PROBES = {
    "hytopk_k_2**31": (lambda api, A: api.hytopk(A(S), A(LO), A(HI), 2**31), ValueError, "k"),
    "hytopk_k_int32_max+1": (lambda api, A: api.hytopk(A(S), A(LO), A(HI), INT32_MAX + 1), ValueError, "k"),
    "topk_k_2**31": (lambda api, A: api.topk(A(S), A(LO), A(HI), 2**31), ValueError, "k"),
    "hytopk_indexer_k_2**31": (lambda api, A: api.hytopk_indexer(A(Q), A(W), A(KEYS), A(LO), A(HI), 2**31),
                               ValueError, "k"),
    "hytopk_indexer_H0": (lambda api, A: api.hytopk_indexer(A(Q[:, :0]), A(W[:, :0]), A(KEYS), A(LO), A(HI), 4),
                          ValueError, "q"),
    "hytopk_indexer_D0": (lambda api, A: api.hytopk_indexer(A(Q[:, :, :0]), A(W), A(KEYS[:, :0]), A(LO), A(HI), 4),
                          ValueError, "q"),
    "indexer_scores_H0": (lambda api, A: api.indexer_scores(A(Q[:, :0]), A(W[:, :0]), A(KEYS), A(LO), A(HI)),
                          ValueError, "q"),
    "indexer_scores_D0": (lambda api, A: api.indexer_scores(A(Q[:, :, :0]), A(W), A(KEYS[:, :0]), A(LO), A(HI)),
                          ValueError, "q"),
    "replay_scores_H0": (lambda api, A: api.replay_scores(A(Q[:, :0]), A(W[:, :0]), A(KEYS), A(IDX)),
                         ValueError, "q"),
    "replay_scores_D0": (lambda api, A: api.replay_scores(A(Q[:, :, :0]), A(W), A(KEYS[:, :0]), A(IDX)),
                         ValueError, "q"),
    "kl_loss_H0": (lambda api, A: api.indexer_kl_loss(A(Q[:, :0]), A(W[:, :0]), A(KEYS), A(IDX), A(TARGET)),
                   ValueError, "q"),
}
for _name, _t in BAD_TARGETS.items():
    ERROR_PROBES[f"kl_loss_target_{_name}"] = (
        lambda api, A, _t=_t: api.indexer_kl_loss(A(Q), A(W), A(KEYS), A(IDX), A(_t)), ValueError, "target")

# probes that mix array kinds on purpose: NumPy inputs only
HOST_ONLY_PROBES = {
    "kl_loss_target_list": (lambda api, A: api.indexer_kl_loss(Q, W, KEYS, IDX, TARGET.tolist()),
                            ValueError, "target"),
    # a table / keys with 2**31 columns / rows: int32 indices cannot address them (no memory: stride 0)
    "hytopk_L_2**31": (lambda api, A: api.hytopk(np.broadcast_to(np.float32(0), (1, 2**31)), np.zeros(1, np.int32),
                                                 np.ones(1, np.int32), 1), ValueError, "scores"),
    "hytopk_indexer_L_2**31": (lambda api, A: api.hytopk_indexer(Q[:1], W[:1], np.broadcast_to(KEYS[:1], (2**31, 4)),
                                                                 np.zeros(1, np.int32), np.ones(1, np.int32), 1),
                               ValueError, "keys"),
}


def names_the_argument(msg: str, arg: str) -> bool:
    return f"'{arg}'" in msg


@contextlib.contextmanager
def no_big_allocation(headroom=1 << 30):
    """Cap this process's address space at its current size + ``headroom`` while the block runs:
    any large allocation attempted before an argument check raises MemoryError (or torch's
    allocator error) instead of the expected ValueError. Not in a process that may hold a CUDA
    context (its driver threads share the address space): on a GPU the device-memory checks of
    tests/test_arguments_gpu.py stand in."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        yield
        return
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        yield                                   # not Linux: no cap, the error check still runs
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + headroom
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# ------------------------------------------------------------------ documented results

def check_capacity_clamped(api, A, H):
    """A capacity beyond the longest context is clamped to it (as default_capacity does):
    nothing of that size is allocated and the result is the exact top-k."""
    import reference as R
    want_idx, want_val = R.topk(S, LO, HI, 4)
    for cap in (10**9, 2**40):
        res = api.hytopk(A(S), A(LO), A(HI), 4, capacity=cap)
        assert res.capacity == 50, res.capacity
        assert np.array_equal(H(res.idx), want_idx) and H(res.val).tobytes() == want_val.tobytes()
        res = api.hytopk_indexer(A(Q), A(W), A(KEYS), A(LO), A(HI), 4, capacity=cap)
        assert res.capacity == 50, res.capacity
    # every context shorter than k: the clamp never goes below k
    res = api.hytopk(A(S), A(LO), A(SHORT_HI), 4, capacity=2**40)
    assert res.capacity == 4
    ref = R.topk(S, LO, SHORT_HI, 4)
    assert np.array_equal(H(res.idx), ref[0])


def check_replay_empty_keys(api, A, H):
    """L = 0 and only padding: replay gives all -inf, the loss 0 with zero gradients."""
    keys0, idx0 = np.zeros((0, 4), np.float32), np.full((3, 4), -1, np.int32)
    out = H(api.replay_scores(A(Q), A(W), A(keys0), A(idx0)))
    assert out.shape == (3, 4) and out.dtype == np.float32 and np.all(out == -np.inf)
    loss, dq, dw, dkeys = api.indexer_kl_loss(A(Q), A(W), A(keys0), A(idx0), A(np.zeros((3, 4), np.float32)))
    assert float(loss) == 0.0
    dq, dw, dkeys = H(dq), H(dw), H(dkeys)
    assert dq.shape == Q.shape and dw.shape == W.shape and dkeys.shape == (0, 4)
    assert not dq.any() and not dw.any()


def check_kl_loss_equals_reference(api, A, H):
    """The backend's indexer_kl_loss is the reference's, value for value."""
    import reference as R
    want = R.indexer_kl_loss(Q, W, KEYS, IDX, TARGET)
    got = api.indexer_kl_loss(A(Q), A(W), A(KEYS), A(IDX), A(TARGET))
    assert float(got[0]) == want[0]
    for g, x in zip(got[1:], want[1:]):
        assert np.array_equal(H(g), x)


SUCCESS_PROBES = {
    "capacity_clamped": check_capacity_clamped,
    "replay_empty_keys": check_replay_empty_keys,
    "kl_loss_equals_reference": check_kl_loss_equals_reference,
}


# ------------------------------------------------------------------ the torch ops

def torch_error_probes(device: str):
    """name -> (call(), exception type, argument) for workbench.torch on ``device`` ('cpu' / 'cuda')."""
    import torch
    import workbench.torch as wt

    def T(a, dev=device):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    q, w, keys, lo, hi, idx, target = (T(x) for x in (Q, W, KEYS, LO, HI, IDX, TARGET))
    probes = {
        "select_k_2**31": (lambda: wt.select(q, w, keys, lo, hi, 2**31), ValueError, "k"),
        "select_H0": (lambda: wt.select(q[:, :0], w[:, :0], keys, lo, hi, 4), ValueError, "q"),
        "select_D0": (lambda: wt.select(q[:, :, :0], w, keys[:, :0], lo, hi, 4), ValueError, "q"),
        "replay_D0": (lambda: wt.replay_scores(q[:, :, :0], w, keys[:, :0], idx), ValueError, "q"),
        "kl_target_numpy": (lambda: wt.indexer_kl_loss(q, w, keys, idx, TARGET), ValueError, "target"),
        "selected_kl_target_numpy": (lambda: wt.selected_kl(q[:, 0, :], idx, TARGET), ValueError, "target"),
        "kl_target_meta": (lambda: wt.indexer_kl_loss(q, w, keys, idx, target.to("meta")), ValueError, "target"),
    }
    for name, bad in BAD_TARGETS.items():
        probes[f"kl_target_{name}"] = (lambda bad=bad: wt.indexer_kl_loss(q, w, keys, idx, T(bad)),
                                       ValueError, "target")
        probes[f"selected_kl_target_{name}"] = (lambda bad=bad: wt.selected_kl(T(Q[:, 0, :]), idx, T(bad)),
                                                ValueError, "target")
    # a meta tensor among the inputs: the fake kernel must not run on real inputs
    args = dict(q=q, w=w, keys=keys, lo=lo, hi=hi)
    for name in args:
        mixed = dict(args, **{name: args[name].to("meta")})
        probes[f"select_{name}_on_meta"] = (lambda m=mixed: wt.select(m["q"], m["w"], m["keys"], m["lo"], m["hi"], 4),
                                            ValueError, name)
    args = dict(q=q, w=w, keys=keys, idx=idx)
    for name in args:
        mixed = dict(args, **{name: args[name].to("meta")})
        probes[f"replay_{name}_on_meta"] = (lambda m=mixed: wt.replay_scores(m["q"], m["w"], m["keys"], m["idx"]),
                                            ValueError, name)
    g = torch.zeros(IDX.shape)
    probes["replay_backward_grad_on_meta"] = (
        lambda: torch.ops.hytopk.replay_scores_backward(g.to("meta"), q, w, keys, idx, False), ValueError, "grad")
    return probes


def check_torch_documented(device: str):
    """capacity beyond the longest context, L = 0 with only padding (forward and backward)."""
    import torch
    import reference as R
    import workbench.torch as wt

    def T(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    ref = R.hytopk_indexer(Q, W, KEYS, LO, HI, 4)
    idx, val = wt.select(T(Q), T(W), T(KEYS), T(LO), T(HI), 4, capacity=2**40)
    assert np.array_equal(idx.cpu().numpy(), ref.idx) and val.cpu().numpy().tobytes() == ref.val.tobytes()
    q, w = T(Q).requires_grad_(), T(W).requires_grad_()
    keys0 = torch.zeros((0, 4), device=device, requires_grad=True)
    idx0 = torch.full((3, 4), -1, dtype=torch.int32, device=device)
    out = wt.replay_scores(q, w, keys0, idx0)
    assert out.shape == (3, 4) and bool(torch.all(out == float("-inf")))
    loss = wt.indexer_kl_loss(q, w, keys0, idx0, torch.zeros((3, 4), device=device))
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert keys0.grad.shape == (0, 4) and not q.grad.any() and not w.grad.any()


def usable_backend(family, *, real_gpu=False):
    """workbench.backend(family), or a skip naming why it cannot run here (``real_gpu``: the
    Numba CUDA simulator does not count)."""
    import pytest
    import workbench
    from workbench.families import get_family
    try:
        fam = get_family(family)
    except Exception as e:
        pytest.skip(str(e))
    ok, why = fam.available()
    if not ok:
        pytest.skip(f"backend {family!r} unavailable here: {why}")
    if real_gpu and fam.simulated:
        pytest.skip(f"{family} runs in the CUDA simulator here (NUMBA_ENABLE_CUDASIM=1)")
    return workbench.backend(family)
