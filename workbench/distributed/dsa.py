"""The DSA layer under context parallel: each rank holds a zigzag shard of the tokens.

    sh = make_sharding("zigzag", L, L, world_size)           # every token is a query and a key
    cp_layer = CPDSAttention(layer, sh)                       # layer: a workbench.torch.dsa.DSAttention
    out = cp_layer(x[sh.query_rows[rank]])                    # DSAOutput of this rank's tokens

Per rank and layer: the indexer runs on the rank's tokens (its queries and its key shard); the
selection is ``torch.ops.hytopk.cp_select``, context-parallel HyTopK (cp.py) returning global key
indices; the main attention and the indexer's KL loss read the selected key rows from an
all-gather of K, V and the indexer keys (differentiable: the backward sums every rank's
gradient and keeps this rank's rows). All-gather, not a sparse fetch from the ring: the main
attention needs arbitrary rows of every shard, and the gathered rows cost O(L (2 h d + D)) per
rank, which is what a dense CP attention holds anyway; a sparse fetch of only the selected rows
is the memory-saving next step.

Checkpointing is the layer's: "replay" (checkpoint_with_replay) saves cp_select's output
(replay.SAVED_OPS), so the recomputation in backward reruns the gathers and the replay but never
the selection, and keeps its global indices. ``indexer_loss`` is this rank's share: its queries'
KL sum over the global token count, so the sum over ranks is the single-process mean.
"""
from __future__ import annotations

import itertools
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..torch import ops as _ops  # noqa: F401  (registers torch.ops.hytopk)
from ..torch.dsa import DSAOutput, DSAttention, attention_target, causal_ranges, sparse_attention
from ..torch.fp8 import quantize
from ..torch.ops import CALLS, indexer_kl_loss
from ..torch.replay import SAVED_OPS, checkpoint_with_replay
from .cp import ContextParallelHyTopK
from .sharding import Sharding

_PLANS: dict = {}                    # handle -> ContextParallelHyTopK (cp_select's plan argument)
_handles = itertools.count(1)


@torch.library.custom_op("hytopk::cp_select", mutates_args=())
def cp_select(q: Tensor, w: Tensor, keys: Tensor, plan: int, kscale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Context-parallel HyTopK of this rank's queries over every rank's key shard (collective):
    idx int32 [n_local, k] of global key positions, val float32 [n_local, k]."""
    CALLS["cp_select"] += 1
    if plan not in _PLANS:
        raise ValueError(f"argument 'plan': no context-parallel plan {plan} (make one with register_plan)")
    res = _PLANS[plan](q, w, keys, kscale)
    return (res.idx.to(q.device, torch.int32).contiguous().clone(),
            res.val.to(q.device, torch.float32).contiguous().clone())


@cp_select.register_fake
def _cp_select_fake(q, w, keys, plan, kscale=None):
    k = _PLANS[plan].k if plan in _PLANS else 1
    return (q.new_empty((q.shape[0], k), dtype=torch.int32), q.new_empty((q.shape[0], k), dtype=torch.float32))


SAVED_OPS.add(torch.ops.hytopk.cp_select.default)


def register_plan(plan: ContextParallelHyTopK) -> int:
    """A handle for cp_select (plans live until forget_plan)."""
    h = next(_handles)
    _PLANS[h] = plan
    return h


def forget_plan(handle: int):
    _PLANS.pop(handle, None)


class _GatherRows(torch.autograd.Function):
    """All-gather of every rank's rows (padded to the longest shard); backward: the sum over
    ranks of the gradient at this rank's rows (an all-reduce, which gloo and NCCL both have)."""

    @staticmethod
    def forward(ctx, x, counts, group):
        me, P = dist.get_rank(group), dist.get_world_size(group)
        width = max(counts)
        pad = x.new_zeros((width,) + tuple(x.shape[1:]))
        pad[:x.shape[0]] = x
        parts = [torch.empty_like(pad) for _ in range(P)]
        dist.all_gather(parts, pad.contiguous(), group=group)
        ctx.counts, ctx.group, ctx.me = counts, group, me
        return torch.cat([p[:c] for p, c in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        start = sum(ctx.counts[:ctx.me])
        return grad[start:start + ctx.counts[ctx.me]], None, None


class CPDSAttention(nn.Module):
    """A DSAttention run over this rank's token shard (module docstring). ``sharding`` must be a
    self-attention sharding (n = L; each rank's query rows are its key positions). The layer's
    parameters are shared, not copied: train ``layer`` and all-reduce its gradients as in any
    data/context-parallel step. ``family``: the CP stage family (default: cupy on CUDA,
    reference on CPU)."""

    def __init__(self, layer: DSAttention, sharding: Sharding, *, group=None, family: str | None = None,
                 variants: dict | None = None):
        super().__init__()
        if not isinstance(layer, DSAttention):
            raise TypeError(f"argument 'layer' must be a DSAttention, got {type(layer).__name__}")
        if sharding.n != sharding.L:
            raise ValueError(f"argument 'sharding': self-attention needs n == L, got n={sharding.n}, L={sharding.L}")
        me = dist.get_rank(group)
        for p in range(sharding.world_size):
            held = np.concatenate([np.arange(a, b) for a, b in sharding.key_pieces[p]] or [np.zeros(0, np.int64)])
            if not np.array_equal(held, sharding.query_rows[p]):
                raise ValueError("argument 'sharding': each rank's query rows must be its key positions "
                                 "(make_sharding(kind, L, L, world_size))")
        self.layer, self.sharding, self.group = layer, sharding, group
        self.family, self.variants = family, variants
        self.rows = sharding.query_rows[me]
        self.counts = [int(len(r)) for r in sharding.query_rows]
        self._order = torch.as_tensor(np.argsort(np.concatenate(sharding.query_rows)))   # gathered -> global
        self._plans: dict = {}

    def _plan(self, device, lo, hi) -> int:
        key = (str(device), lo.tobytes(), hi.tobytes())
        if key not in self._plans:
            family = self.family or ("cupy" if device.type == "cuda" else "reference")
            L = self.layer
            plan = ContextParallelHyTopK(lo, hi, L.k, self.sharding, oversample=L.oversample,
                                         max_failed=L.max_failed, backend=family, variants=self.variants,
                                         group=self.group, device=device)
            self._plans[key] = register_plan(plan)
        return self._plans[key]

    def gather(self, x):
        """[L, ...] in global token order from every rank's rows (differentiable)."""
        g = _GatherRows.apply(x.contiguous(), self.counts, self.group)
        return g[self._order.to(g.device)]

    def _layer(self, x, plan: int):
        m = self.layer
        n = x.shape[0]
        iq, iw, ik = m.indexer_inputs(x.detach())
        if m.fp8:
            f = quantize(iq, iw, ik)
            idx, _ = torch.ops.hytopk.cp_select(f.q, f.w, f.keys, plan, f.kscale)
        else:
            idx, _ = torch.ops.hytopk.cp_select(iq, iw, ik, plan)
        Q, K, V = m.qkv(x).view(n, 3, m.heads, m.head_dim).unbind(1)
        out, probs = sparse_attention(Q, self.gather(K), self.gather(V), idx)
        loss = indexer_kl_loss(iq, iw, self.gather(ik), idx, attention_target(probs, idx), reduction="sum",
                               deterministic=m.deterministic, fp8=m.fp8) / self.sharding.L
        return m.proj(out.reshape(n, -1)), loss, idx

    def forward(self, x, lo=None, hi=None) -> DSAOutput:
        """x: this rank's tokens [n_local, dim] (rows sharding.query_rows[rank]); lo/hi: the global
        context ranges (host or device, every rank the same; default causal)."""
        if x.shape[0] != len(self.rows):
            raise ValueError(f"argument 'x' has {x.shape[0]} rows; this rank holds {len(self.rows)} tokens")
        if lo is None or hi is None:
            lo, hi = causal_ranges(self.sharding.L)
        lo_h = np.asarray(lo.cpu() if isinstance(lo, Tensor) else lo, np.int32)
        hi_h = np.asarray(hi.cpu() if isinstance(hi, Tensor) else hi, np.int32)
        plan = self._plan(x.device, lo_h, hi_h)
        mode = self.layer.checkpoint
        if mode == "none":
            return DSAOutput(*self._layer(x, plan))
        if mode == "full":
            return DSAOutput(*torch.utils.checkpoint.checkpoint(self._layer, x, plan, use_reentrant=False))
        return DSAOutput(*checkpoint_with_replay(self._layer, x, plan))
