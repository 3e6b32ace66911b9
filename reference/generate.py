"""Input generators: adversarial score tables, context layouts, indexer inputs.

Pure NumPy and deterministic given ``rng``. The Hypothesis strategies in
tests/strategies.py and the GPU tests / `hytopk compare` presets draw from
these, so every backend is checked on the same families (docs/CONTRACT.md §3).
"""
from __future__ import annotations

import numpy as np

from .sampling import sample_plan, sample_positions

F32 = np.float32
TINY_SUB = np.float32(1e-45)          # smallest subnormal
FMAX = np.finfo(np.float32).max

SCORE_FAMILIES = (
    "gaussian", "equal", "relu_plateau", "alias_on_samples", "alias_between_samples",
    "ties_at_kth", "specials", "recency", "sink", "clustered", "bimodal", "integers",
)
LAYOUTS = ("full", "causal_tail", "varlen", "edge", "random")


def layout(kind: str, n: int, L: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Context ranges [lo, hi) per query (int32).

    full: every query sees [0, L). causal_tail: the last n positions of a causal
    sequence, hi[t] = L - n + t + 1. varlen: packed documents, each query sees
    its document's prefix. edge: the lengths the contract singles out (0, 1,
    k-1, k, k+1, M-1, M, L) with contexts ending at L. random: arbitrary ranges.
    """
    if kind == "full":
        lo, hi = np.zeros(n, np.int64), np.full(n, L, np.int64)
    elif kind == "causal_tail":
        hi = np.clip(L - n + np.arange(n) + 1, 0, L)
        lo = np.zeros(n, np.int64)
    elif kind == "varlen":
        cuts = np.sort(rng.integers(0, L + 1, size=max(0, min(n, 4) - 1)))
        bounds = np.concatenate([[0], cuts, [L]])
        doc = rng.integers(0, len(bounds) - 1, size=n)
        lo = bounds[doc]
        hi = lo + (rng.random(n) * (bounds[doc + 1] - lo + 1)).astype(np.int64)
        hi = np.minimum(hi, bounds[doc + 1])
    elif kind == "edge":
        M_full = int(sample_plan(np.array([0]), np.array([L]), k, 3.0)[0][0]) or L
        lengths = np.array([0, 1, k - 1, k, k + 1, M_full - 1, M_full, L])
        lengths = np.clip(lengths[rng.integers(0, len(lengths), size=n)], 0, L)
        hi = np.full(n, L, np.int64)
        lo = hi - lengths
    elif kind == "random":
        a = rng.integers(0, L + 1, size=n)
        b = rng.integers(0, L + 1, size=n)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
    else:
        raise ValueError(f"argument 'kind': unknown layout {kind!r}; choose from {LAYOUTS}")
    return lo.astype(np.int32), hi.astype(np.int32)


def _sample_mask(lo, hi, k, L, oversample=3.0):
    """[n, L] bool: which positions are HyTopK samples of each query."""
    n = len(lo)
    M, _ = sample_plan(lo, hi, k, oversample)
    mask = np.zeros((n, L), bool)
    for t in range(n):
        if M[t]:
            mask[t, sample_positions(int(lo[t]), int(hi[t] - lo[t]), int(M[t]))] = True
    return mask


def score_table(family: str, n: int, L: int, k: int, rng, lo=None, hi=None) -> np.ndarray:
    """An [n, L] float32 table from one adversarial family."""
    if lo is None:
        lo, hi = np.zeros(n, np.int32), np.full(n, L, np.int32)
    pos = np.arange(L, dtype=np.float64)[None, :]
    if family == "gaussian":
        s = rng.standard_normal((n, L))
    elif family == "equal":
        s = np.full((n, L), rng.choice([0.0, 1.5, -2.0]))
    elif family == "relu_plateau":
        # most scores exactly 0.0, fewer than k positive: T = 0 floods the buffer
        s = np.zeros((n, L))
        npos = max(1, k // 2)
        for t in range(n):
            s[t, rng.choice(L, size=min(npos, L), replace=False)] = rng.random(min(npos, L)) + 0.5
    elif family in ("alias_on_samples", "alias_between_samples"):
        # high scores exactly at sample positions (underflow) or just off them (overflow)
        mask = _sample_mask(lo, hi, k, L)
        if family == "alias_between_samples":
            mask = np.roll(mask, 1, axis=1) & ~mask
        s = rng.standard_normal((n, L)) * 0.01
        s[mask] += 10.0
    elif family == "ties_at_kth":
        # a few distinct levels: huge tie groups at the k-th score and at the threshold
        s = rng.integers(0, 4, size=(n, L)).astype(np.float64)
    elif family == "specials":
        vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, TINY_SUB, -TINY_SUB,
                         FMAX, -FMAX, 1.0, -1.0, np.float32(1.17549435e-38)], np.float32)
        t = rng.integers(0, len(vals), size=(n, L))
        s = vals[t].astype(np.float32)
        s_nan = np.isnan(s)
        b = s.view(np.uint32)
        b[s_nan] = (rng.integers(0, 2, size=s_nan.sum(), dtype=np.uint32) << np.uint32(31)) | np.uint32(0x7FC00000) \
            | rng.integers(0, 1 << 22, size=s_nan.sum(), dtype=np.uint32)   # NaNs of both signs, many payloads
        return np.ascontiguousarray(s)
    elif family == "recency":
        s = pos / max(L, 1) * 4.0 + rng.standard_normal((n, L)) * 0.1
    elif family == "sink":
        s = rng.standard_normal((n, L))
        s[:, :4] += 20.0
    elif family == "clustered":
        s = rng.standard_normal((n, L)) * 0.1
        w = max(1, L // 64)
        for t in range(n):
            c0 = rng.integers(0, max(1, L - w))
            s[t, c0:c0 + w] += 5.0
    elif family == "bimodal":
        s = np.where(rng.random((n, L)) < 0.3, 3.0, -3.0) + rng.standard_normal((n, L)) * 0.5
    elif family == "integers":
        s = rng.integers(-50, 50, size=(n, L)).astype(np.float64)
    else:
        raise ValueError(f"argument 'family': unknown score family {family!r}; choose from {SCORE_FAMILIES}")
    return np.ascontiguousarray(s.astype(F32))


def indexer_inputs(n: int, L: int, H: int, D: int, rng, exact: bool = True):
    """(q [n,H,D], w [n,H], keys [L,D]) float32.

    exact=True: small integers, so every product and sum is exact in float32
    (and in bf16 inputs), every implementation's scores agree bit for bit,
    and many scores tie."""
    if exact:
        q = rng.integers(-2, 3, size=(n, H, D))
        keys = rng.integers(-2, 3, size=(L, D))
        w = rng.integers(0, 3, size=(n, H))
    else:
        q = rng.standard_normal((n, H, D)) / np.sqrt(D)
        keys = rng.standard_normal((L, D))
        w = rng.random((n, H))
    return (np.ascontiguousarray(q, F32), np.ascontiguousarray(w, F32),
            np.ascontiguousarray(keys, F32))
