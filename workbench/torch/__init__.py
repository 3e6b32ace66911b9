"""PyTorch export: importing this package registers the ``hytopk`` ops.

    idx, val = workbench.torch.select(q, w, keys, lo, hi, k)       # torch.ops.hytopk.select
    scores   = workbench.torch.replay_scores(q, w, keys, idx)     # differentiable, sparse backward
    loss     = workbench.torch.indexer_kl_loss(q, w, keys, idx, target)
    out      = workbench.torch.checkpoint_with_replay(fn, *args)  # selection saved, not recomputed
"""
from __future__ import annotations

import torch

from . import dispatch, ops, scoring
from .ops import CALLS, indexer_kl_loss, selected_kl
from .replay import checkpoint_with_replay, replay_policy


def select(q, w, keys, lo, hi, k, *, capacity=None, oversample=3.0, max_failed=64):
    """HyTopK top-k indices and scores of the lightning indexer (no gradient)."""
    return torch.ops.hytopk.select(q, w, keys, lo, hi, k, capacity, oversample, max_failed)


def replay_scores(q, w, keys, idx, *, deterministic=None):
    """Indexer scores at ``idx`` [n, k] float32, differentiable in q, w, keys."""
    return torch.ops.hytopk.replay_scores(q, w, keys, idx, deterministic)


__all__ = ["select", "replay_scores", "indexer_kl_loss", "selected_kl", "checkpoint_with_replay",
           "replay_policy", "CALLS", "dispatch", "ops", "scoring"]
