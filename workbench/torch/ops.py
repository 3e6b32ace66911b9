"""The ``hytopk`` torch.library ops.

    torch.ops.hytopk.select(q, w, keys, lo, hi, k, capacity=None, oversample=3.0, max_failed=64,
                            kscale=None) -> (idx, val)
    torch.ops.hytopk.replay_scores(q, w, keys, idx, deterministic=None, kscale=None) -> scores   (differentiable)
    torch.ops.hytopk.replay_scores_backward(grad, q, w, keys, idx, deterministic, kscale=None) -> (dq, dw, dkeys)

Inputs (reference.dtypes): q/keys float32, torch.bfloat16 or torch.float8_e4m3fn (+ kscale, a
float32 scale per key row); w float32 or bfloat16, whatever q's dtype. Gradients flow to float32 /
bf16 tensors; fp8 q/keys get none (they are not differentiable data): for gradients w.r.t. the
unquantised q and keys use workbench.torch.replay_scores(..., fp8=True), the straight-through
estimator of workbench/torch/fp8.py.

CPU runs the NumPy reference (forward) and the pure-torch sparse backward.
CUDA launches the chosen kernel family (dispatch.py) zero-copy on PyTorch's
current stream, or the pure-torch path. ``select`` runs a selection plan made
once per layout (plans.py), so a call only launches kernels; while a CUDA graph
is captured (torch.cuda.graph, torch.compile's CUDA graphs) the plan runs
capture-safe (no host syncs, device-side recovery: the same bits as eager) and
the kernels' scratch comes from torch's allocator (the graph's pool). A family
that cannot run without host syncs takes the pure-torch path under capture.

``deterministic`` (replay only; None = torch.are_deterministic_algorithms_enabled())
picks the keys-gradient reduction: see scoring._add_keys_grad.
"""
from __future__ import annotations

import collections
from typing import Optional

import torch
from torch import Tensor

import reference as R
from reference import dtypes as DT
from reference import validate as V

from workbench.arrays import to_kind

from . import dispatch, plans, scoring

# Implementation calls per op (tests count selection runs under recomputation).
CALLS: collections.Counter = collections.Counter()


_same_device = V.check_same_device


def _no_host_sync(x) -> bool:
    """True while tracing (torch.compile) or capturing a CUDA graph: checks of values must not
    copy to the host then, so they become device-side asserts (torch._assert_async)."""
    if torch.compiler.is_compiling():
        return True
    return isinstance(x, Tensor) and x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _check_target(target, idx):
    """The reference's rules for the KL target (reference.validate.check_target): one ValueError
    naming 'target'; value checks as device-side asserts while tracing or capturing."""
    deferred = _no_host_sync(idx)
    V.check_target(target, idx, values=not deferred)
    if deferred:
        for ok, msg in V.target_conditions(target, idx):
            torch._assert_async(ok, msg)


def _same_device_opt(kscale, **tensors):
    if kscale is not None:
        tensors["kscale"] = kscale
    _same_device(**tensors)


def _check_select(q, w, keys, lo, hi, k, capacity, oversample, max_failed, *, host=True, kscale=None):
    """Shape/dtype checks always; value checks of lo/hi (a host copy) unless ``host`` is False."""
    n, H, D, L, _ = DT.check_indexer_args(q, w, keys, kscale)
    _same_device_opt(kscale, q=q, w=w, keys=keys, lo=lo, hi=hi)
    if host:
        V.check_selection_args((n, L), lo, hi, k, capacity, oversample, max_failed)
    else:
        V.check_array("lo", lo, ndim=1, dtypes=V.INT_DTYPES, shape=(n,))
        V.check_array("hi", hi, ndim=1, dtypes=V.INT_DTYPES, shape=(n,))
        V.check_k(k), V.check_capacity(capacity, k), V.check_oversample(oversample), V.check_max_failed(max_failed)
    return n, L


def _check_replay(q, w, keys, idx, *, host=True, kscale=None):
    n, H, D, L, _ = DT.check_indexer_args(q, w, keys, kscale)
    _same_device_opt(kscale, q=q, w=w, keys=keys, idx=idx)
    if host:
        V.check_idx(idx, n, L)
    else:               # no host copy: a device-side assert guards the gathers
        V.check_array("idx", idx, ndim=2, dtypes=("int32",), shape=(n, None))
        torch._assert_async(((idx >= -1) & (idx < L)).all(), "argument 'idx': entries must lie in [-1, L)")
    return n, L


def _np(x):
    """A CPU tensor as the reference takes it: float32 values (bf16 widened: exact), fp8 e4m3 as
    its uint8 bits, anything else as is."""
    if x is None:
        return None
    x = x.detach().contiguous()
    if x.dtype == torch.bfloat16:
        return x.float().numpy()
    if x.dtype == torch.float8_e4m3fn:
        return x.view(torch.uint8).numpy()
    return x.numpy()



# --------------------------------------------------------------------------- select

@torch.library.custom_op("hytopk::select", mutates_args=(), device_types="cpu")
def select_op(q: Tensor, w: Tensor, keys: Tensor, lo: Tensor, hi: Tensor, k: int,
              capacity: Optional[int] = None, oversample: float = 3.0,
              max_failed: int = 64, kscale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """HyTopK selection over the indexer scores: idx int32 [n, k], val float32 [n, k] in rank order."""
    CALLS["select"] += 1
    _check_select(q, w, keys, lo, hi, k, capacity, oversample, max_failed, kscale=kscale)
    res = R.hytopk_indexer(_np(q), _np(w), _np(keys), lo.numpy(), hi.numpy(), k, kscale=_np(kscale),
                           capacity=capacity, oversample=oversample, max_failed=max_failed)
    return torch.from_numpy(res.idx), torch.from_numpy(res.val)


@select_op.register_kernel("cuda")
def _select_cuda(q, w, keys, lo, hi, k, capacity=None, oversample=3.0, max_failed=64, kscale=None):
    CALLS["select"] += 1
    capturing = torch.cuda.is_current_stream_capturing()
    n, L = _check_select(q, w, keys, lo, hi, k, capacity, oversample, max_failed, host=False, kscale=kscale)
    shape = {"L": L, "H": q.shape[1], "D": q.shape[2], "k": k, "dtype": V.dtype_name(q)}
    b = dispatch.cuda_backend("select", shape)
    if b is None or (capturing and not b.family.capture_safe):
        return scoring.exact_select(q, w, keys, lo, hi, k, kscale)
    # one plan per layout (plans.py): the host work of the ranges is done on the first call only
    plan = plans.get(b, lo, hi, L, k, capacity, oversample, max_failed, capturing=capturing)
    # detached, contiguous, dtypes unchanged: the plan hands each family what it takes
    qq, ww, kk, ss = dispatch.kernel_inputs(q, w, keys, kscale)
    with dispatch.on_torch_stream(b, q.device):
        res = plan(qq, ww, kk, kscale=ss, capture_safe=capturing)
        idx, val = (to_kind(x, "torch") for x in (res.idx, res.val))
    return (torch.as_tensor(idx, device=q.device).to(torch.int32).contiguous(),
            torch.as_tensor(val, device=q.device).to(torch.float32).contiguous())


@select_op.register_fake
def _select_fake(q, w, keys, lo, hi, k, capacity=None, oversample=3.0, max_failed=64, kscale=None):
    # also the Meta kernel: a meta tensor among real ones must fail here, not return garbage
    _same_device_opt(kscale, q=q, w=w, keys=keys, lo=lo, hi=hi)
    torch._check(q.dim() == 3 and w.dim() == 2 and keys.dim() == 2, lambda: "q, w, keys must be 3-D, 2-D, 2-D")
    if isinstance(k, int):
        V.check_k(k)
    torch._check(k >= 1, lambda: f"argument 'k' must be >= 1, got {k}")
    torch._check(k <= V.INT32_MAX, lambda: f"argument 'k' must be <= {V.INT32_MAX}, got {k}")
    n = q.shape[0]
    return q.new_empty((n, k), dtype=torch.int32), q.new_empty((n, k), dtype=torch.float32)


# --------------------------------------------------------------------------- replay

@torch.library.custom_op("hytopk::replay_scores", mutates_args=(), device_types="cpu")
def replay_op(q: Tensor, w: Tensor, keys: Tensor, idx: Tensor,
              deterministic: Optional[bool] = None, kscale: Optional[Tensor] = None) -> Tensor:
    """Indexer scores at the selected positions, float32 [n, k]; -inf where idx = -1."""
    CALLS["replay"] += 1
    _check_replay(q, w, keys, idx, kscale=kscale)
    return torch.from_numpy(R.replay_scores(_np(q), _np(w), _np(keys), idx.numpy(), kscale=_np(kscale)))


@replay_op.register_kernel("cuda")
def _replay_cuda(q, w, keys, idx, deterministic=None, kscale=None):
    CALLS["replay"] += 1
    capturing = torch.cuda.is_current_stream_capturing()
    n, L = _check_replay(q, w, keys, idx, host=False, kscale=kscale)
    shape = {"L": L, "H": q.shape[1], "D": q.shape[2], "k": idx.shape[1], "dtype": V.dtype_name(q)}
    b = None if L == 0 else dispatch.cuda_backend("replay", shape)
    if b is None or (capturing and not b.family.capture_safe):   # (L = 0: only padding, nothing to gather)
        return scoring.replay(q, w, keys, idx, kscale)
    qq, ww, kk, ss = dispatch.kernel_inputs(q, w, keys, kscale)
    with dispatch.on_torch_stream(b, q.device):
        dts = DT.check_indexer_dtypes(qq, ww, kk, ss)
        # the Backend's conversions without its host-side idx check (no sync: a device assert guards idx)
        qd, wd, kd, sd = b._indexer_args(qq, ww, kk, ss, dts)
        (idx_d,) = b._dev(("idx", idx.contiguous()))
        extra = {"kscale": sd} if sd is not None else {}
        out = to_kind(b.stages_for_kind(dts.kind).replay(qd, wd, kd, idx_d, **extra), "torch")
    return torch.as_tensor(out, device=q.device).to(torch.float32).contiguous()


@replay_op.register_fake
def _replay_fake(q, w, keys, idx, deterministic=None, kscale=None):
    _same_device_opt(kscale, q=q, w=w, keys=keys, idx=idx)
    torch._check(idx.dim() == 2, lambda: "argument 'idx' must be 2-D")
    return q.new_empty((q.shape[0], idx.shape[1]), dtype=torch.float32)


@torch.library.custom_op("hytopk::replay_scores_backward", mutates_args=())
def replay_backward_op(grad: Tensor, q: Tensor, w: Tensor, keys: Tensor, idx: Tensor,
                       deterministic: bool, kscale: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Sparse backward of replay_scores (pure torch on every device; see scoring.replay_backward).
    fp8 q/keys: gradients w.r.t. their decoded values, in float32 (scoring.grad_dtype)."""
    CALLS["replay_backward"] += 1
    _same_device(grad=grad, q=q, w=w, keys=keys, idx=idx)
    V.check_array("grad", grad, ndim=2, shape=tuple(idx.shape))
    return scoring.replay_backward(grad, q, w, keys, idx, deterministic, kscale)


@replay_backward_op.register_fake
def _replay_backward_fake(grad, q, w, keys, idx, deterministic, kscale=None):
    _same_device_opt(kscale, grad=grad, q=q, w=w, keys=keys, idx=idx)
    g = scoring.grad_dtype
    return (torch.empty_like(q, dtype=g(q)), torch.empty_like(w, dtype=g(w)), torch.empty_like(keys, dtype=g(keys)))


def _replay_setup(ctx, inputs, output):
    q, w, keys, idx, det, kscale = inputs
    ctx.save_for_backward(q, w, keys, idx, kscale)
    ctx.deterministic = torch.are_deterministic_algorithms_enabled() if det is None else bool(det)


def _replay_grad(ctx, grad):
    q, w, keys, idx, kscale = ctx.saved_tensors
    dq, dw, dkeys = torch.ops.hytopk.replay_scores_backward(grad.contiguous(), q, w, keys, idx,
                                                            ctx.deterministic, kscale)
    # fp8 tensors take no gradient (autograd would round it to e4m3): straight-through lives in fp8.py
    keep = lambda x, g: g if x.dtype.is_floating_point and x.dtype != torch.float8_e4m3fn else None
    return keep(q, dq), keep(w, dw), keep(keys, dkeys), None, None, None


replay_op.register_autograd(_replay_grad, setup_context=_replay_setup)


# --------------------------------------------------------------------------- loss (a composition)

def selected_kl(scores: Tensor, idx: Tensor, target: Tensor, reduction: str = "sum") -> Tensor:
    """sum_t KL(p_t || softmax(scores_t)) over the valid slots (idx >= 0), docs/CONTRACT.md §4.

    Plain torch ops, so autograd gives d loss / d scores = softmax * sum(p) - p
    (softmax - p for a normalised target), zero on padding slots."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"argument 'reduction' must be 'sum' or 'mean', got {reduction!r}")
    _check_target(target, idx)
    return _selected_kl(scores, idx, target, reduction)


def _selected_kl(scores, idx, target, reduction):
    valid = idx >= 0
    masked = scores.float().masked_fill(~valid, torch.finfo(torch.float32).min)   # finite: empty rows stay NaN-free
    logsm = torch.log_softmax(masked, dim=1)
    p = target.to(torch.float32).masked_fill(~valid, 0.0)
    loss = (torch.xlogy(p, p) - p * logsm).sum()
    return loss / max(1, idx.shape[0]) if reduction == "mean" else loss


def indexer_kl_loss(q: Tensor, w: Tensor, keys: Tensor, idx: Tensor, target: Tensor,
                    reduction: str = "sum", deterministic: Optional[bool] = None, *,
                    kscale: Optional[Tensor] = None, fp8: bool = False) -> Tensor:
    """The indexer loss: replay the selected scores (sparse backward) then ``selected_kl``.

    The target (main-attention distribution at the selected slots) is detached
    here: no gradient flows into it, nor through the choice of ``idx``. The target obeys the
    reference's rules (real floating, finite, >= 0, 0 where idx = -1), checked before anything runs.
    ``kscale``: fp8 e4m3 q/keys with their key scales (gradient to w only);
    ``fp8=True``: float q/keys quantised here, straight-through gradients (fp8.replay_scores_ste)."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"argument 'reduction' must be 'sum' or 'mean', got {reduction!r}")
    _check_target(target, idx)
    if fp8:
        from .fp8 import replay_scores_ste
        if kscale is not None:
            raise ValueError("argument 'kscale': fp8=True quantises q and keys itself; pass one or the other")
        scores = replay_scores_ste(q, w, keys, idx, deterministic)
    else:
        scores = torch.ops.hytopk.replay_scores(q, w, keys, idx, deterministic, kscale)
    return _selected_kl(scores, idx, target.detach(), reduction)
