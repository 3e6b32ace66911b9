"""fp8 e4m3 indexer inputs in PyTorch: the quantiser and the straight-through replay.

    f = workbench.torch.fp8.quantize(q, w, keys)            # Fp8Indexer(q, w, keys, kscale, qscale)
    idx, _ = workbench.torch.select(f.q, f.w, f.keys, lo, hi, k, kscale=f.kscale)
    s = workbench.torch.replay_scores(q, w, keys, idx, fp8=True)   # = replay_scores_ste(...)

``quantize`` is reference.fp8.quantize_indexer in torch, bit for bit: each key row is scaled
by amax / 448 (its ``kscale``), each query head by its own amax / 448, folded into the float32
weight (w * qscale); values round to nearest e4m3 (ties to even), saturating at +-448. The fp8
score ``kscale[s] * sum_h (w*qscale)[h] * relu(q8[h] . k8[s])`` is then, in real arithmetic, the
float formula on the dequantised inputs q8 * qscale and k8 * kscale.

**Straight-through backward.** ``replay_scores_ste(q, w, keys, idx)`` takes the *unquantised*
q, w, keys (float32 or bf16, requiring grad or not): its forward quantises them with ``quantize``
(so it sees exactly the bits ``select`` saw) and returns the fp8 scores; its backward treats the
quantisation as the identity: the gradients w.r.t. q, w and keys are those of the float formula
``sum_h w[h] * relu(qd[h] . kd[s])`` at the dequantised values qd = q8 * qscale, kd = k8 * kscale
(torch.ops.hytopk.replay_scores_backward on them). No gradient flows into the scales (they are
functions of amax only) nor through the rounding. Passing fp8 tensors straight to
``torch.ops.hytopk.replay_scores`` instead gives gradients to w only: fp8 tensors take none.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import ops  # noqa: F401  (registers torch.ops.hytopk)

E4M3_MAX = 448.0


class Fp8Indexer(NamedTuple):
    q: torch.Tensor         # [n, H, D] torch.float8_e4m3fn
    w: torch.Tensor         # [n, H] float32: w * qscale
    keys: torch.Tensor      # [L, D] torch.float8_e4m3fn
    kscale: torch.Tensor    # [L] float32
    qscale: torch.Tensor    # [n, H] float32 (already folded into w; kept for dequantising)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q8 * qscale, k8 * kscale) in float32: the values the straight-through backward uses."""
        return self.q.float() * self.qscale[..., None], self.keys.float() * self.kscale[:, None]


def _scale(x: torch.Tensor, dim: int) -> torch.Tensor:
    s = x.abs().amax(dim=dim) / torch.tensor(E4M3_MAX, dtype=torch.float32, device=x.device)
    return torch.where(s > 0, s, torch.ones_like(s))


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float32 -> torch.float8_e4m3fn, nearest (ties to even), saturating at +-448 (NaN stays NaN)."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


@torch.no_grad()
def quantize(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> Fp8Indexer:
    """float32 / bf16 q[n,H,D], w[n,H], keys[L,D] -> Fp8Indexer (no gradient: see replay_scores_ste)."""
    q, w, keys = (x.detach().float() for x in (q, w, keys))
    ks = _scale(keys, 1)
    qs = _scale(q, 2)
    k8 = to_e4m3((keys / ks[:, None]).float())
    q8 = to_e4m3((q / qs[:, :, None]).float())
    return Fp8Indexer(q8.contiguous(), (w * qs).contiguous(), k8.contiguous(), ks.contiguous(), qs.contiguous())


class _SteReplay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, w, keys, idx, deterministic):
        f = quantize(q, w, keys)
        out = torch.ops.hytopk.replay_scores(f.q, f.w, f.keys, idx, deterministic, f.kscale)
        ctx.save_for_backward(f.q, f.keys, f.qscale, f.kscale, w, idx)
        ctx.deterministic = torch.are_deterministic_algorithms_enabled() if deterministic is None \
            else bool(deterministic)
        ctx.dtypes = (q.dtype, w.dtype, keys.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        q8, k8, qs, ks, w, idx = ctx.saved_tensors
        qd, kd = Fp8Indexer(q8, None, k8, ks, qs).dequantized()
        dq, dw, dkeys = torch.ops.hytopk.replay_scores_backward(grad.contiguous(), qd, w.float(), kd, idx,
                                                                ctx.deterministic, None)
        tq, tw, tk = ctx.dtypes
        return dq.to(tq), dw.to(tw), dkeys.to(tk), None, None


def replay_scores_ste(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor,
                      deterministic: Optional[bool] = None) -> torch.Tensor:
    """fp8 scores of quantize(q, w, keys) at ``idx`` [n, k] (float32, -inf where idx = -1), with
    straight-through gradients w.r.t. the unquantised q, w, keys (module docstring)."""
    for name, x in (("q", q), ("w", w), ("keys", keys)):
        if not x.dtype.is_floating_point or x.dtype == torch.float8_e4m3fn:
            raise TypeError(f"argument '{name}': fp8=True takes the unquantised float32 / bf16 tensors, got {x.dtype}")
    return _SteReplay.apply(q, w, keys, idx, deterministic)


__all__ = ["Fp8Indexer", "quantize", "to_e4m3", "replay_scores_ste", "E4M3_MAX"]
