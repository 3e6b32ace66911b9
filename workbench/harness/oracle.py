"""What every checked row is compared with.

`ReferenceOracle` (small presets) is the NumPy reference itself. `TorchOracle`
(large presets) is a trusted stand-in that runs where the data lives: exact
float32 scoring of the exact-arithmetic inputs, the contract's order key
(docs/CONTRACT.md §2) in torch, and top-k over keys made unique by the position, so it
yields exactly the contract's order; rows are processed in chunks to bound
memory. Both produce the same `Expected` bundle of torch tensors, and the
tests check that they agree on small shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import reference as R

_SIGN = 0x80000000
_LOW32 = 0xFFFFFFFF


def order_keys_t(x: torch.Tensor) -> torch.Tensor:
    """The contract's uint32 order key of float32 scores, as int64 (bigger = better)."""
    if x.dtype != torch.float32:
        raise TypeError(f"argument 'x' must be float32, got {x.dtype}")
    b = x.contiguous().view(torch.int32).to(torch.int64) & _LOW32
    key = torch.where((b & _SIGN) != 0, b ^ _LOW32, b ^ _SIGN)
    key = torch.where(b == _SIGN, torch.full_like(key, _SIGN), key)       # -0.0 ranks as +0.0
    return torch.where(torch.isnan(x), torch.zeros_like(key), key)         # NaN: below -inf


def exact_topk_t(keys: torch.Tensor, pos: torch.Tensor, vals: torch.Tensor, k: int):
    """Top-k per row in the contract's order: key desc, then position asc.

    keys int64 [n, m] (-1 marks an empty slot), pos int64 [n, m], vals float32
    [n, m]. Key and position are packed into one int64 that is unique per row,
    so torch.topk's order is the contract's. Returns (idx int32 [n, k], val
    float32 [n, k]) padded with -1 / -inf."""
    n, m = keys.shape
    shift = max(1, int(pos.max().item() if pos.numel() else 0).bit_length() + 1) if pos.numel() else 1
    if shift > 31:
        raise ValueError("positions must fit in 31 bits")
    mask = (1 << shift) - 1
    comp = torch.where(keys >= 0, (keys << shift) | (mask - pos.clamp(min=0)), torch.full_like(keys, -1))
    take = min(k, m)
    top, arg = torch.topk(comp, take, dim=1, largest=True, sorted=True) if take else (comp[:, :0], comp[:, :0])
    ok = top >= 0
    idx = torch.full((n, k), -1, dtype=torch.int32, device=keys.device)
    val = torch.full((n, k), float("-inf"), dtype=torch.float32, device=keys.device)
    idx[:, :take] = torch.where(ok, mask - (top & mask), torch.full_like(top, -1)).to(torch.int32)
    val[:, :take] = torch.where(ok, torch.gather(vals, 1, arg), torch.full_like(top, float("-inf"), dtype=torch.float32))
    return idx, val


@dataclass
class Expected:
    """The oracle's answer for every stage on one preset (torch tensors on the oracle's device)."""
    M: np.ndarray                 # host int32 [n]
    r: np.ndarray                 # host int32 [n]
    capacity: int
    T: torch.Tensor               # [n] float32
    count: torch.Tensor           # [n] int64
    cand_idx: torch.Tensor        # [n, cap] int32 (-1 in empty slots)
    cand_val: torch.Tensor        # [n, cap] float32
    failed: torch.Tensor          # [n] bool
    select_idx: torch.Tensor      # exact top-k of the candidate buffer
    select_val: torch.Tensor
    topk_idx: torch.Tensor        # the answer: exact top-k over each whole context
    topk_val: torch.Tensor


class _Oracle:
    device = "cpu"

    def __init__(self, q, w, keys, lo, hi):
        self.n, self.H, self.D = q.shape
        self.L = keys.shape[0]
        self.lo_h = np.asarray(lo, np.int64)
        self.hi_h = np.asarray(hi, np.int64)

    def plan(self, k, capacity, oversample):
        M, r = R.sample_plan(self.lo_h, self.hi_h, k, oversample)
        cap = R.resolve_capacity(capacity, k, self.lo_h, self.hi_h, oversample)
        return M, r, int(cap)


    def key_checksum(self, row_chunk=64) -> int:
        """Sum of the order keys of every in-context score, modulo 2**64 (the
        score-only floor's checksum; computed once per oracle: every floor row checks against it)."""
        if getattr(self, "_key_checksum", None) is not None:
            return self._key_checksum
        total = 0
        for a in range(0, self.n, row_chunk):
            b = min(self.n, a + row_chunk)
            S = self.scores_rows(a, b)
            pos = torch.arange(self.L, device=S.device)
            lo = torch.as_tensor(self.lo_h[a:b], device=S.device)[:, None]
            hi = torch.as_tensor(self.hi_h[a:b], device=S.device)[:, None]
            key = torch.where((pos >= lo) & (pos < hi), order_keys_t(S), torch.zeros(1, dtype=torch.int64, device=S.device))
            total += sum(key.sum(1).tolist())          # per-row sums < 2**52: exact in int64
        self._key_checksum = total % (1 << 64)
        return self._key_checksum


class ReferenceOracle(_Oracle):
    """The NumPy reference (the executable spec): for the small presets."""

    def __init__(self, q, w, keys, lo, hi):
        super().__init__(q, w, keys, lo, hi)
        self.table = R.indexer_scores(q, w, keys, self.lo_h, self.hi_h)

    @classmethod
    def of_table(cls, table, lo, hi) -> "ReferenceOracle":
        """The oracle of a given [n, L] float32 score table (table-source problems)."""
        self = cls.__new__(cls)
        self.n, self.L = table.shape
        self.H = self.D = None
        self.lo_h, self.hi_h = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        self.table = np.ascontiguousarray(table, np.float32)
        return self

    def scores_rows(self, a, b) -> torch.Tensor:
        return torch.from_numpy(self.table[a:b])

    def scores_at(self, idx: torch.Tensor) -> torch.Tensor:
        i = idx.cpu().numpy().astype(np.int64)
        out = np.take_along_axis(self.table, np.maximum(i, 0), axis=1)
        out[i < 0] = -np.inf
        return torch.from_numpy(out)

    def compute(self, k, capacity, oversample) -> Expected:
        M, r, cap = self.plan(k, capacity, oversample)
        src = R.TableSource(self.table)
        T = R.stage_threshold(src, self.lo_h, self.hi_h, M, r)
        ci, cv, count = R.stage_filter(src, self.lo_h, self.hi_h, T, cap)
        failed, _ = R.stage_check(count, self.lo_h, self.hi_h, k, cap)
        si, sv = R.stage_select(ci, cv, count, k)
        ti, tv = R.topk(self.table, self.lo_h, self.hi_h, k)
        t = torch.from_numpy
        return Expected(M, r, cap, t(T), t(count.astype(np.int64)), t(ci), t(cv), t(failed),
                        t(si), t(sv), t(ti), t(tv))


class TorchOracle(_Oracle):
    """Exact scoring + the contract's order in torch, row chunks at a time: for large presets."""

    def __init__(self, q, w, keys, lo, hi, device="cuda", budget_elems=1 << 28):
        super().__init__(q, w, keys, lo, hi)
        self.device = device
        # exact-arithmetic inputs: float32 products and sums are exact, so this equals every
        # implementation's scores bit for bit (TF32 would break that: keep it off)
        torch.backends.cuda.matmul.allow_tf32 = False
        as_t = lambda x: torch.as_tensor(x, device=device)
        self.q, self.w, self.keys = (as_t(x).float() for x in (q, w, keys))
        self.lo, self.hi = as_t(self.lo_h), as_t(self.hi_h)
        self.budget = budget_elems

    def _row_chunk(self):
        return max(1, min(self.n, self.budget // max(1, 3 * self.L)))

    def scores_rows(self, a, b) -> torch.Tensor:
        """[b-a, L] float32 scores, -inf outside each context."""
        q, w = self.q[a:b], self.w[a:b]
        B = b - a
        out = torch.empty((B, self.L), dtype=torch.float32, device=self.device)
        step = max(1, self.budget // max(1, B * self.H))
        for s0 in range(0, self.L, step):
            s1 = min(self.L, s0 + step)
            dots = torch.einsum("bhd,sd->bhs", q, self.keys[s0:s1]).clamp_(min=0)
            out[:, s0:s1] = torch.einsum("bhs,bh->bs", dots, w)
        pos = torch.arange(self.L, device=self.device)
        inside = (pos[None, :] >= self.lo[a:b, None]) & (pos[None, :] < self.hi[a:b, None])
        return out.masked_fill_(~inside, float("-inf"))

    def scores_at(self, idx: torch.Tensor) -> torch.Tensor:
        """Scores at the given positions [n, m] (-inf where idx = -1)."""
        idx = idx.to(self.device).long()
        n, m = idx.shape
        out = torch.empty((n, m), dtype=torch.float32, device=self.device)
        B = max(1, self.budget // max(1, m * max(self.H, self.D)))
        for a in range(0, n, B):
            b = min(n, a + B)
            kg = self.keys[idx[a:b].clamp(min=0)]                          # [B, m, D]
            dots = torch.einsum("bhd,bmd->bhm", self.q[a:b], kg).clamp_(min=0)
            out[a:b] = torch.einsum("bhm,bh->bm", dots, self.w[a:b])
        return out.masked_fill_(idx < 0, float("-inf"))

    def compute(self, k, capacity, oversample) -> Expected:
        M, r, cap = self.plan(k, capacity, oversample)
        dev, n = self.device, self.n
        Mt, rt = torch.as_tensor(M, device=dev).long(), torch.as_tensor(r, device=dev).long()
        T = torch.full((n,), float("nan"), device=dev)
        count = torch.zeros(n, dtype=torch.int64, device=dev)
        ci = torch.full((n, cap), -1, dtype=torch.int32, device=dev)
        cv = torch.full((n, cap), float("-inf"), device=dev)
        ti = torch.empty((n, k), dtype=torch.int32, device=dev)
        tv = torch.empty((n, k), dtype=torch.float32, device=dev)
        Mmax = int(M.max()) if n else 0
        B = self._row_chunk()
        for a in range(0, n, B):
            b = min(n, a + B)
            S = self.scores_rows(a, b)
            key = order_keys_t(S)
            pos = torch.arange(self.L, device=dev).expand(b - a, -1)
            key = torch.where(self._inside(a, b), key, torch.full_like(key, -1))
            # threshold: the r-th best of the M samples p_j = lo + (j*c)//M
            Mc, rc = Mt[a:b], rt[a:b]
            if Mmax:
                j = torch.arange(Mmax, device=dev)[None, :]
                c = (self.hi[a:b] - self.lo[a:b])[:, None]
                p = self.lo[a:b, None] + (j * c) // Mc.clamp(min=1)[:, None]
                p = torch.where(j < Mc[:, None], p, torch.zeros_like(p)).clamp(max=self.L - 1)
                sk = torch.where(j < Mc[:, None], torch.gather(key, 1, p), torch.full_like(p, -1))
                sval, sarg = torch.sort(sk, dim=1, descending=True)
                pick = torch.gather(sarg, 1, (rc - 1).clamp(min=0)[:, None])
                tval = torch.gather(S, 1, torch.gather(p, 1, pick))[:, 0]
                T[a:b] = torch.where(Mc > 0, tval, torch.full_like(tval, float("nan")))
            tkey = order_keys_t(T[a:b])
            hit = key >= tkey[:, None]
            count[a:b] = hit.sum(1)
            slot = hit.cumsum(1) - 1
            keep = hit & (slot < cap)
            rows = torch.arange(a, b, device=dev)[:, None].expand_as(keep)
            ci[rows[keep], slot[keep]] = pos[keep].to(torch.int32)
            cv[rows[keep], slot[keep]] = S[keep]
            ti[a:b], tv[a:b] = exact_topk_t(key, pos, S, k)
        c_all = self.hi - self.lo
        failed = (c_all > k) & ((count > cap) | (count < k))
        ck = torch.where(ci >= 0, order_keys_t(cv), torch.full_like(ci, -1, dtype=torch.int64))
        si, sv = exact_topk_t(ck, ci.long(), cv, k)
        return Expected(M, r, cap, T, count, ci, cv, failed, si, sv, ti, tv)

    def _inside(self, a, b):
        pos = torch.arange(self.L, device=self.device)
        return (pos[None, :] >= self.lo[a:b, None]) & (pos[None, :] < self.hi[a:b, None])
