"""Stage 1-4: sample count M, sample positions, threshold rank r, threshold T."""
from __future__ import annotations

import numpy as np

from .order import order_keys, rank_order
from .sources import Source

MIN_SAMPLES = 4096
MAX_SAMPLES = 8192
SAMPLE_STRIDE = 128


def num_samples(c):
    """M = min(c, clamp(c // 128, 4096, 8192)), elementwise (int64)."""
    c = np.asarray(c, dtype=np.int64)
    return np.minimum(c, np.clip(c // SAMPLE_STRIDE, MIN_SAMPLES, MAX_SAMPLES))


def threshold_rank(c, M, k, oversample):
    """r = min(M, ceil(((oversample * k) * M) / c)) in float64, in exactly that order.

    The min is taken in float64 before the integer cast, so a huge oversample
    gives r = M instead of overflowing; r is at least 1 where c > 0 (the formula
    can only give 0 when the product underflows float64, and there is no
    0-th best sample)."""
    c = np.asarray(c, dtype=np.int64)
    M = np.asarray(M, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        r = np.ceil(((np.float64(oversample) * np.float64(k)) * M.astype(np.float64))
                    / c.astype(np.float64))
        r = np.minimum(M.astype(np.float64), r)
    r = np.where(c > 0, np.maximum(r, 1.0), 0.0)
    return np.minimum(M, r.astype(np.int64))


def sample_plan(lo, hi, k, oversample, min_rank: int = 0):
    """(M, r) per query as int32; both 0 where the context has c <= k keys (no sampling).
    ``min_rank`` > 0 (the table top-k's plan, not the contract's): r raised to at least
    min(M, min_rank)."""
    c = np.asarray(hi, np.int64) - np.asarray(lo, np.int64)
    M = num_samples(c)
    r = threshold_rank(c, M, k, oversample)
    if min_rank > 0:
        r = np.maximum(r, np.minimum(M, np.int64(min_rank)))
    sampled = c > k
    return (np.where(sampled, M, 0).astype(np.int32),
            np.where(sampled, r, 0).astype(np.int32))


def sample_positions(lo: int, c: int, M: int) -> np.ndarray:
    """p_j = lo + (j * c) // M for j in [0, M), in 64-bit integers."""
    j = np.arange(M, dtype=np.int64)
    return np.int64(lo) + (j * np.int64(c)) // np.int64(M)


def runs_apply(c: int, M: int) -> bool:
    """Whether run sampling takes a context of c keys (else the contract's positions): c >= 4 M, and
    M >= 64 (at least two runs of 32) whatever M a caller passes."""
    return M >= 64 and c >= 4 * M


def run_sample_positions(lo: int, c: int, M: int, run: int) -> np.ndarray:
    """The table top-k's cheaper sample positions (not the contract's; same M): U = ceil(M / run)
    runs of ``run`` consecutive keys (a power of two; 64 bytes of the table: 16 float32 or 32
    bf16 keys, one DRAM burst), run u starting at max(lo, x - x % run), x = lo + u * ((c - run) //
    (U - 1)); sample j is key j % run of run j // run. Where runs_apply(c, M) does not hold, the
    contract's positions. The contract's positions at 128K keys are one per 128 bytes, so they
    touch every burst of the row; runs touch 1/32 of them."""
    if not runs_apply(c, M):
        return sample_positions(lo, c, M)
    lo, c, M, run = np.int64(lo), np.int64(c), np.int64(M), np.int64(run)
    U = -(-M // run)
    j = np.arange(M, dtype=np.int64)
    x = lo + (j // run) * ((c - run) // (U - 1))
    return np.maximum(lo, x - x % run) + j % run


def coarse_key(keys, r: int, coarse: int) -> int:
    """The r-th best of ``keys`` (uint32 order keys) as the kernels' radix select finds it, 8 bits a
    level from the top; ``coarse`` > 0 (the table top-k's threshold, not the contract's): stopped
    after the first level whose chosen digit holds at most max(1, r // coarse) keys and whose prefix
    is at least 0x00800000 (the key of -FLT_MAX: a lower prefix is a NaN as a score), the lower bits
    0 (a key at or below the r-th best, at most that many more keys at or above it)."""
    keys = np.asarray(keys, np.uint32).astype(np.int64)
    few = max(1, r // coarse) if coarse > 0 else 0
    prefix, mask, rem = 0, 0, int(r)
    for shift in (24, 16, 8, 0):
        hist = np.bincount((keys[(keys & mask) == prefix] >> shift) & 0xFF, minlength=256)
        before, d = 0, 255
        while before + int(hist[d]) < rem:
            before += int(hist[d])
            d -= 1
        rem -= before
        prefix |= d << shift
        mask |= 0xFF << shift
        if few and int(hist[d]) <= few and prefix >= 0x00800000:       # below: a NaN as a score
            break
    return prefix


def key_score(key: int) -> np.float32:
    """A float32 score whose order key is ``key`` (the kernels' bits_of_key: key 0 -> a NaN)."""
    bits = key ^ 0x80000000 if key >= 0x80000000 else ~key & 0xFFFFFFFF
    return np.array([bits], np.uint32).view(np.float32)[0]


def stage_threshold(source: Source, lo, hi, M, r, run: int = 0, coarse: int = 0) -> np.ndarray:
    """T[t] = the r-th best sample score of query t (float32[n]); ``run`` > 0: the samples in runs
    of that many keys (run_sample_positions), 0: the contract's positions; ``coarse`` > 0: that key
    rounded down as coarse_key does (the table top-k's plan).

    Queries with M = 0 (c <= k) get NaN, whose key 0 lets every key through.
    """
    n = len(lo)
    T = np.full(n, np.nan, np.float32)
    for t in range(n):
        if M[t] == 0:
            continue
        c = int(hi[t]) - int(lo[t])
        pos = (run_sample_positions(lo[t], c, M[t], run) if run else sample_positions(lo[t], c, M[t]))
        vals = source.at(t, pos)
        if coarse:
            T[t] = key_score(coarse_key(order_keys(vals), int(r[t]), coarse))
            continue
        best = rank_order(order_keys(vals), pos)
        T[t] = vals[best[r[t] - 1]]
    return T
