"""PyTorch export: importing this package registers the ``hytopk`` ops.

    idx, val = workbench.torch.select(q, w, keys, lo, hi, k)       # torch.ops.hytopk.select
    idx, val = workbench.torch.topk(scores, lo, hi, k)             # torch.ops.hytopk.topk: exact, over a table
    scores   = workbench.torch.replay_scores(q, w, keys, idx)     # differentiable, sparse backward
    loss     = workbench.torch.indexer_kl_loss(q, w, keys, idx, target)
    out      = workbench.torch.checkpoint_with_replay(fn, *args)  # selection saved, not recomputed
    sel      = workbench.torch.CapturedSelect(q, w, keys, lo, hi, k)  # select as a CUDA graph: sel(q, w, keys)

Inputs (reference.dtypes): q/keys float32, bfloat16 or float8_e4m3fn (then ``kscale=``, a float32
scale per key row); w float32 or bfloat16. ``fp8=True`` quantises float q/keys here
(workbench.torch.fp8.quantize) and, in replay_scores / indexer_kl_loss, gives straight-through
gradients w.r.t. the unquantised inputs.
"""
from __future__ import annotations

import torch

from . import attention, dispatch, fp8, ops, scoring, table_topk
from .attention import sparse_attention
from .captured import CapturedSelect
from .fp8 import quantize as _quantize, replay_scores_ste as _replay_scores_ste
from .ops import CALLS, indexer_kl_loss, selected_kl
from .replay import checkpoint_with_replay, replay_policy
from .table_topk import topk


def _quantized(q, w, keys, kscale):
    if kscale is not None:
        raise ValueError("argument 'kscale': fp8=True quantises q and keys itself; pass one or the other")
    f = _quantize(q, w, keys)
    return f.q, f.w, f.keys, f.kscale


def select(q, w, keys, lo, hi, k, *, kscale=None, fp8=False, capacity=None, oversample=3.0, max_failed=64):
    """HyTopK top-k indices and scores of the lightning indexer (no gradient).
    ``kscale``: fp8 e4m3 q/keys' key scales; ``fp8=True``: quantise float q, w, keys first
    (the same bits replay_scores(..., fp8=True) rescores)."""
    if fp8:
        q, w, keys, kscale = _quantized(q, w, keys, kscale)
    return torch.ops.hytopk.select(q, w, keys, lo, hi, k, capacity, oversample, max_failed, kscale)


def replay_scores(q, w, keys, idx, *, kscale=None, fp8=False, deterministic=None):
    """Indexer scores at ``idx`` [n, k] float32, differentiable in q, w, keys (fp8 tensors: in w only).
    ``fp8=True``: float q, w, keys quantised here; straight-through gradients (fp8.replay_scores_ste)."""
    if fp8:
        if kscale is not None:
            _quantized(q, w, keys, kscale)
        return _replay_scores_ste(q, w, keys, idx, deterministic)
    return torch.ops.hytopk.replay_scores(q, w, keys, idx, deterministic, kscale)


__all__ = ["CapturedSelect", "sparse_attention", "attention", "select", "topk", "replay_scores", "indexer_kl_loss", "selected_kl",
           "checkpoint_with_replay",
           "replay_policy", "CALLS", "dispatch", "fp8", "ops", "scoring"]
