"""Pure-torch indexer math (any device): dense scores, exact selection, replay and
its sparse backward.

These are the CPU backward, the CUDA fallback when no kernel family is usable,
and the capture-safe path under CUDA graphs (no host syncs, fixed shapes).
Scores are accumulated in float32 (bf16 and fp8 e4m3 inputs are widened first, which is exact);
with fp8 keys the head sum is multiplied by the key's float32 scale (reference.dtypes).
"""
from __future__ import annotations

import torch

from ..harness.oracle import order_keys_t as order_keys     # the one torch order key

# Work is split into query chunks whose largest float32 temporary has at most
# this many elements (1 GiB), whatever the shape.
ELEMENT_BUDGET = 1 << 28
# The keys gradient adds one chunk's segment sums at a time; the chunk size is
# part of the deterministic reduction order, so it depends only on k.
KEYS_GRAD_ENTRIES = 1 << 18
_LOW31 = (1 << 31) - 1


def values(x) -> torch.Tensor:
    """float32 values of an input (exact): bf16 / fp8 e4m3 tensors, or their raw bits as
    uint16 / uint8 tensors (the bit conventions of reference.dtypes)."""
    if x.dtype == torch.uint8:
        x = x.view(torch.float8_e4m3fn)
    elif x.dtype in (torch.uint16, torch.int16):
        x = x.view(torch.bfloat16)
    return x.float()


def _rows_per_chunk(per_row: int, budget: int = ELEMENT_BUDGET) -> int:
    return max(1, budget // max(1, per_row))


def dense_scores(q, w, keys, lo, hi, kscale=None) -> torch.Tensor:
    """[n, L] float32 indexer scores of a (small) query block; -inf outside [lo, hi)."""
    dots = torch.einsum("thd,sd->ths", values(q), values(keys))
    s = torch.einsum("ths,th->ts", torch.relu(dots), values(w))
    if kscale is not None:
        s = s * kscale.float()[None, :]
    s = s + 0.0                                                          # + 0.0: -0.0 -> +0.0, like the reference
    pos = torch.arange(keys.shape[0], device=q.device)
    inside = (pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None])
    return torch.where(inside, s, torch.full_like(s, float("-inf")))


def exact_select(q, w, keys, lo, hi, k: int, kscale=None):
    """Exact top-k in the contract's order (key desc, position asc), by torch.topk on
    unique int64 composites key<<31 | (2^31-1-pos); positions outside the context
    get -1 and come out as padding. Chunked over queries; no host syncs."""
    n, H, _ = q.shape
    L = keys.shape[0]
    idx = torch.full((n, k), -1, dtype=torch.int32, device=q.device)
    val = torch.full((n, k), float("-inf"), dtype=torch.float32, device=q.device)
    kk = min(k, L)
    if n == 0 or kk == 0:
        return idx, val
    pos = torch.arange(L, device=q.device, dtype=torch.int64)
    lo64, hi64 = lo.to(torch.int64), hi.to(torch.int64)
    step = _rows_per_chunk(L * max(H, 2))          # [c, H, L] dots, [c, L] int64 composites
    for s in range(0, n, step):
        e = min(n, s + step)
        sc = dense_scores(q[s:e], w[s:e], keys, lo64[s:e], hi64[s:e], kscale)
        inside = (pos[None, :] >= lo64[s:e, None]) & (pos[None, :] < hi64[s:e, None])
        comp = (order_keys(sc) << 31) | (_LOW31 - pos)[None, :]
        comp = torch.where(inside, comp, torch.full_like(comp, -1))
        top = torch.topk(comp, kk, dim=1, largest=True, sorted=True).values
        p = _LOW31 - (top & _LOW31)
        ok = top >= 0
        p = torch.where(ok, p, torch.full_like(p, -1))
        v = torch.gather(sc, 1, p.clamp(min=0))
        idx[s:e, :kk] = p.to(torch.int32)
        val[s:e, :kk] = torch.where(ok, v, torch.full_like(v, float("-inf")))
    return idx, val


def _gatherable(rows32):
    """rows (keys [L, D] or key scales [L]) to gather from with idx.clamp(min=0): with L = 0 every
    slot is padding (idx = -1), so one zero row stands in for the missing row 0."""
    return rows32 if rows32.shape[0] else rows32.new_zeros((1, *rows32.shape[1:]))


def replay(q, w, keys, idx, kscale=None) -> torch.Tensor:
    """[n, k] float32 scores at the selected positions, -inf where idx = -1."""
    n, H, D = q.shape
    k = idx.shape[1]
    out = torch.empty((n, k), dtype=torch.float32, device=q.device)
    keys32 = _gatherable(values(keys))
    ks32 = _gatherable(kscale.float()) if kscale is not None else None
    step = _rows_per_chunk(k * max(H, D))          # [c, k, D] gathered keys, [c, k, H] dots
    for s in range(0, n, step):
        e = min(n, s + step)
        ic = idx[s:e].to(torch.int64)
        dots = torch.bmm(keys32[ic.clamp(min=0)], values(q[s:e]).transpose(1, 2))   # [c, k, H]
        sc = torch.bmm(torch.relu(dots), values(w[s:e])[:, :, None])[..., 0]
        if kscale is not None:
            sc = sc * ks32[ic.clamp(min=0)]
        sc = sc + 0.0                                                                  # -0.0 -> +0.0
        out[s:e] = torch.where(ic >= 0, sc, torch.full_like(sc, float("-inf")))
    return out


def _add_keys_grad(dkeys, flat_idx, contrib, deterministic: bool):
    """dkeys[flat_idx[i]] += contrib[i] for flat_idx >= 0 (rows with -1 are zero).

    default: index_add_ (atomics on CUDA: the summation order varies run to run).
    deterministic: stable sort by key (ties keep (query, slot) order), then
    torch.segment_reduce sums each key's segment in that order; the result is
    added to dkeys. Extra cost: one sort of the chunk's indices and one gathered
    copy of its contributions."""
    L = dkeys.shape[0]
    if L == 0:                       # no keys: every slot is padding, nothing to add
        return
    if not deterministic:
        dkeys.index_add_(0, flat_idx.clamp(min=0), contrib)
        return
    keyed = torch.where(flat_idx >= 0, flat_idx, torch.full_like(flat_idx, L))
    sorted_keys, order = torch.sort(keyed, stable=True)
    bounds = torch.arange(L + 2, device=dkeys.device, dtype=sorted_keys.dtype)
    offsets = torch.searchsorted(sorted_keys, bounds)          # segment of key s: [off[s], off[s+1])
    part = torch.segment_reduce(contrib[order], "sum", offsets=offsets, axis=0)
    dkeys += part[:L]


def grad_dtype(x) -> torch.dtype:
    """The dtype of the gradient returned for input ``x``: its own, or float32 for fp8 e4m3 and
    raw-bit (integer) inputs: the gradient w.r.t. their decoded values."""
    return torch.float32 if x.dtype == torch.float8_e4m3fn or not x.dtype.is_floating_point else x.dtype


def replay_backward(grad, q, w, keys, idx, deterministic: bool, kscale=None):
    """Gradients of sum(grad * replay(q, w, keys, idx, kscale)) w.r.t. q, w, keys.

    Only the selected entries are touched: cost O(n k H D). Slots with idx = -1
    get no gradient. Accumulated in float32, returned in the inputs' dtypes (float32 for
    fp8 q/keys: the gradient w.r.t. their decoded values). With kscale the score of key s
    is kscale[s] times the head sum, so the slot's gradient is scaled by it first."""
    n, H, D = q.shape
    L, k = keys.shape[0], idx.shape[1]
    dq = torch.zeros((n, H, D), dtype=torch.float32, device=q.device)
    dw = torch.zeros((n, H), dtype=torch.float32, device=q.device)
    dkeys = torch.zeros((L, D), dtype=torch.float32, device=q.device)
    keys32 = _gatherable(values(keys))
    ks32 = _gatherable(kscale.float()) if kscale is not None else None
    step = _rows_per_chunk(k, KEYS_GRAD_ENTRIES)
    for s in range(0, n, step):
        e = min(n, s + step)
        ic = idx[s:e].to(torch.int64)
        valid = ic >= 0
        g = torch.where(valid, grad[s:e].float(), torch.zeros((), device=q.device))
        if kscale is not None:
            g = g * ks32[ic.clamp(min=0)]
        qc, wc = values(q[s:e]), values(w[s:e])
        kg = keys32[ic.clamp(min=0)]                                 # [c, k, D]
        dots = torch.bmm(kg, qc.transpose(1, 2))                     # [c, k, H]
        dw[s:e] = torch.bmm(g[:, None, :], torch.relu(dots))[:, 0]   # sum_j g * relu
        gd = g[:, :, None] * (dots > 0) * wc[:, None, :]             # d/d dots
        dq[s:e] = torch.bmm(gd.transpose(1, 2), kg)
        contrib = torch.bmm(gd, qc).reshape(-1, D)                   # per (query, slot)
        _add_keys_grad(dkeys, ic.reshape(-1), contrib, deterministic)
    return dq.to(grad_dtype(q)), dw.to(grad_dtype(w)), dkeys.to(grad_dtype(keys))
