"""The contract's order (docs/CONTRACT.md §2) and the brute-force top-k that defines the answer."""
from __future__ import annotations

import numpy as np

from .validate import check_k, check_ranges, check_scores, dtype_name

SIGN = np.uint32(0x80000000)
PAD_IDX = -1
PAD_VAL = np.float32(-np.inf)


def order_keys(x) -> np.ndarray:
    """uint32 order key of float32 scores: bigger key = better score.

    -0.0 ranks as +0.0, every NaN gets key 0 (below -inf), otherwise
    ``bits ^ 0x80000000`` for sign 0 and ``~bits`` for sign 1.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"argument 'x' must be float32, got {x.dtype}")
    b = x.view(np.uint32)
    key = np.where(b & SIGN, ~b, b ^ SIGN).astype(np.uint32)
    key[b == SIGN] = SIGN              # -0.0 -> key of +0.0
    key[np.isnan(x)] = 0
    return key


def stage_score_only(source, lo, hi) -> np.ndarray:
    """The score-only floor's answer: uint64[1], the sum modulo 2**64 of the order keys of every
    in-context score of ``source`` (a kernel's atomic sum of them is the same in any order)."""
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    total = 0
    for t in range(source.shape[0]):
        if lo[t] < hi[t]:
            total += int(order_keys(np.asarray(source.row(t, int(lo[t]), int(hi[t])), np.float32)).sum(dtype=np.uint64))
    return np.array([total % (1 << 64)], np.uint64)


def table_float32(scores) -> np.ndarray:
    """A score table as float32 NumPy: float32 as is, bf16 (uint16 bits, torch.bfloat16)
    widened exactly (bits << 16)."""
    if dtype_name(scores) == "bfloat16":                 # a torch tensor (the widening is exact)
        return scores.detach().cpu().float().numpy()
    a = np.asarray(scores)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a


def rank_order(keys: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Permutation putting (pos, key) entries in rank order: key desc, then pos asc."""
    return np.lexsort((pos, ~keys.astype(np.uint32)))


def empty_selection(n: int, k: int):
    return np.full((n, k), PAD_IDX, np.int32), np.full((n, k), PAD_VAL, np.float32)


def topk(scores, lo, hi, k):
    """Brute-force top-k per query over its context [lo, hi): the definition.

    Returns idx [n, k] int32 and val [n, k] float32 in rank order, padded with
    -1 / -inf when the context is shorter than k.
    """
    n, L = check_scores(scores)
    lo_h, hi_h = check_ranges(lo, hi, n, L)
    k = check_k(k)
    scores = table_float32(scores)
    idx, val = empty_selection(n, k)
    for t in range(n):
        a, b = int(lo_h[t]), int(hi_h[t])
        if a == b:
            continue
        row = scores[t, a:b]
        order = rank_order(order_keys(row), np.arange(a, b))[:k]
        idx[t, :order.size] = order + a
        val[t, :order.size] = row[order]
    return idx, val
