"""A small DSA-style attention layer (DeepSeek-V3.2 sparse stage) on the hytopk ops.

Per layer: the lightning indexer scores every key of each query's context,
HyTopK keeps the top k, the main attention attends only to those k keys, and
the indexer is trained by the KL loss against the main attention's (detached,
head-summed, renormalised) distribution at the selected keys. As in DSA the
indexer reads a detached copy of the input, so it learns only from its loss.

The indexer is pluggable (``indexer=``: any module x [L, dim] -> (q [L, H, D], w [L, H], keys [L, D]),
e.g. workbench.torch.integrations.transformers.IndexerAdapter around a transformers DSA indexer);
q/keys may be float32 or bf16 with float32 w. ``fp8=True`` selects on the fp8 e4m3 quantisation
of the indexer's outputs (workbench.torch.fp8.quantize) and trains through the straight-through
replay (fp8.replay_scores_ste).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from . import attention, ops  # noqa: F401  (register torch.ops.hytopk)
from .attention import attention_probs
from .fp8 import quantize
from .ops import indexer_kl_loss
from .replay import checkpoint_with_replay

CHECKPOINT_MODES = ("none", "full", "replay")


class DSAOutput(NamedTuple):
    out: torch.Tensor           # [L, dim]
    indexer_loss: torch.Tensor  # scalar
    idx: torch.Tensor           # [L, k] int32 selected keys (-1 padding)


def causal_ranges(L: int, device=None):
    """lo = 0, hi = t + 1: causal self-attention over one sequence."""
    hi = torch.arange(1, L + 1, dtype=torch.int32, device=device)
    return torch.zeros_like(hi), hi


def gather_einsum(Q, K, V, idx):
    """The baseline: gather K[idx], V[idx] into [n, k, h, d] and einsum (memory grows with n k h d).

    Q [n, h, d], K/V [L, h, d], idx [n, k]. Returns (out [n, h, d], probs [n, h, k]);
    padding slots get probability 0, and a query with no key gets zeros."""
    valid = idx >= 0
    safe = idx.clamp(min=0).long()
    logits = torch.einsum("nhd,nkhd->nhk", Q, K[safe]) * Q.shape[-1] ** -0.5
    logits = logits.float().masked_fill(~valid[:, None, :], float("-inf"))
    any_key = valid.any(dim=1)[:, None, None]
    probs = torch.softmax(torch.where(any_key, logits, torch.zeros_like(logits)), dim=-1)
    probs = torch.where(valid[:, None, :], probs, torch.zeros_like(probs))
    out = torch.einsum("nhk,nkhd->nhd", probs.to(V.dtype), V[safe])
    return out, probs


def sparse_attention(Q, K, V, idx, deterministic=None):
    """softmax(Q . K[idx] / sqrt(d)) V[idx] per head, over the selected keys only, through
    torch.ops.hytopk.sparse_attention (the selection replayed as given; no [n, k, h, d] gather).

    Q [n, h, d], K/V [L, h, d], idx [n, k]. Returns (out [n, h, d], probs [n, h, k]); probs are
    detached (the indexer's KL target), 0 on padding slots; a query with no key gets zeros."""
    out, lse = torch.ops.hytopk.sparse_attention(Q, K, V, idx, -1, None, deterministic)
    return out, attention_probs(Q, K, idx, lse)


def attention_target(probs, idx):
    """Main-attention distribution at the selected slots: summed over heads, L1-normalised, detached."""
    p = probs.detach().sum(dim=1)
    return p / p.sum(dim=1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


class DSAttention(nn.Module):
    """Indexer + top-k sparse attention + indexer KL loss, over one packed sequence x [L, dim].

    checkpoint: "none" (keep activations), "full" (torch.utils.checkpoint: the
    selection runs again in backward) or "replay" (checkpoint_with_replay: the
    saved selection is reused and only replay_scores reruns).
    indexer: a module x -> (q, w, keys) replacing the built-in linear indexer (index_q/k/w);
    fp8: select on fp8 e4m3 inputs, train with straight-through gradients (module docstring)."""

    def __init__(self, dim: int, heads: int = 4, head_dim: int = 16, index_heads: int = 4,
                 index_dim: int = 16, k: int = 64, *, checkpoint: str = "replay", oversample: float = 3.0,
                 max_failed: int = 64, deterministic: bool | None = None, indexer: nn.Module | None = None,
                 fp8: bool = False):
        super().__init__()
        if checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"argument 'checkpoint' must be one of {CHECKPOINT_MODES}, got {checkpoint!r}")
        self.heads, self.head_dim, self.index_heads, self.index_dim = heads, head_dim, index_heads, index_dim
        self.k, self.checkpoint, self.oversample, self.max_failed = k, checkpoint, oversample, max_failed
        self.deterministic = deterministic
        self.fp8 = bool(fp8)
        self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
        self.proj = nn.Linear(heads * head_dim, dim, bias=False)
        self.indexer = indexer
        if indexer is None:
            self.index_q = nn.Linear(dim, index_heads * index_dim, bias=False)
            self.index_k = nn.Linear(dim, index_dim, bias=False)
            self.index_w = nn.Linear(dim, index_heads, bias=False)

    def indexer_inputs(self, xi):
        """(q [L, H, D], w [L, H], keys [L, D]) of the indexer on the (detached) input."""
        if self.indexer is not None:
            return self.indexer(xi)
        L = xi.shape[0]
        iq = self.index_q(xi).view(L, self.index_heads, self.index_dim)
        return iq, self.index_w(xi) * self.index_heads ** -0.5, self.index_k(xi)

    def _layer(self, x, lo, hi):
        L = x.shape[0]
        iq, iw, ik = self.indexer_inputs(x.detach())
        if self.fp8:
            f = quantize(iq, iw, ik)
            idx, _ = torch.ops.hytopk.select(f.q, f.w, f.keys, lo, hi, self.k, None, self.oversample,
                                             self.max_failed, f.kscale)
        else:
            idx, _ = torch.ops.hytopk.select(iq, iw, ik, lo, hi, self.k, None, self.oversample, self.max_failed)
        Q, K, V = self.qkv(x).view(L, 3, self.heads, self.head_dim).unbind(1)
        out, probs = sparse_attention(Q, K, V, idx, self.deterministic)
        loss = indexer_kl_loss(iq, iw, ik, idx, attention_target(probs, idx), reduction="mean",
                               deterministic=self.deterministic, fp8=self.fp8)
        return self.proj(out.reshape(L, -1)), loss, idx

    def forward(self, x, lo=None, hi=None) -> DSAOutput:
        if lo is None or hi is None:
            lo, hi = causal_ranges(x.shape[0], x.device)
        if self.checkpoint == "none":
            return DSAOutput(*self._layer(x, lo, hi))
        if self.checkpoint == "full":
            return DSAOutput(*torch.utils.checkpoint.checkpoint(self._layer, x, lo, hi, use_reentrant=False))
        return DSAOutput(*checkpoint_with_replay(self._layer, x, lo, hi))
