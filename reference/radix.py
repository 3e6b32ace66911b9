"""Stage 8: exact selection with 8-bit MSB-first radix passes (a mirror of the kernels).

select_kth_key  -> K*, the k-th best order key, and need = k - #{key > K*}
select_positions -> among entries with key == K*, the `need` lowest positions
sort_rank_order  -> LSD radix sort of the kept entries: key desc, then position asc
The result depends only on the multiset of (position, score) entries, never on
the order they were stored in.
"""
from __future__ import annotations

import numpy as np

DIGIT_BITS = 8
RADIX = 1 << DIGIT_BITS
SHIFTS_MSB_FIRST = (24, 16, 8, 0)


def _msb_select(values: np.ndarray, rank: int, largest: bool):
    """The rank-th largest (or smallest) uint32 in ``values`` (1-based), by 4
    histogram passes of 8 bits. Returns (value, number of entries equal to it
    that are still needed to reach ``rank``)."""
    prefix = np.uint32(0)
    mask = np.uint32(0)
    remaining = rank
    for shift in SHIFTS_MSB_FIRST:
        active = values[(values & mask) == prefix]
        digits = (active >> np.uint32(shift)) & np.uint32(RADIX - 1)
        hist = np.bincount(digits, minlength=RADIX)
        scan = hist[::-1] if largest else hist          # best digit first
        before = 0
        for i in range(RADIX):
            if before + scan[i] >= remaining:
                break
            before += scan[i]
        digit = (RADIX - 1 - i) if largest else i
        remaining -= before
        prefix |= np.uint32(digit) << np.uint32(shift)
        mask |= np.uint32(RADIX - 1) << np.uint32(shift)
    return prefix, remaining


def select_kth_key(keys: np.ndarray, k: int):
    """K* = k-th largest key (1 <= k <= len(keys)) and need = k - #{key > K*}."""
    return _msb_select(keys.astype(np.uint32), k, largest=True)


def select_positions(pos: np.ndarray, need: int) -> np.ndarray:
    """Boolean mask of the ``need`` lowest (distinct) positions."""
    if need == 0:
        return np.zeros(pos.shape, bool)
    p_star, _ = _msb_select(pos.astype(np.uint32), need, largest=False)
    return pos.astype(np.uint32) <= p_star


def sort_rank_order(keys: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Permutation into rank order by an LSD radix sort on (~key, pos): 8 stable
    8-bit passes, position digits first."""
    perm = np.arange(keys.size)
    words = [pos.astype(np.uint32), ~keys.astype(np.uint32)]   # least significant word first
    for word in words:
        for shift in (0, 8, 16, 24):
            digit = (word[perm] >> np.uint32(shift)) & np.uint32(RADIX - 1)
            perm = perm[np.argsort(digit, kind="stable")]
    return perm


def exact_topk_of_entries(pos: np.ndarray, val: np.ndarray, keys: np.ndarray, k: int):
    """Exact top-k (rank order) of a set of (pos, val) entries with order keys.

    Returns (idx, val) of length min(k, len(pos))."""
    if pos.size > k:
        k_star, need = select_kth_key(keys, k)
        above = keys > k_star
        tied = keys == k_star
        keep = above.copy()
        keep[tied] = select_positions(pos[tied], int(need))
        pos, val, keys = pos[keep], val[keep], keys[keep]
    perm = sort_rank_order(keys, pos)
    return pos[perm].astype(np.int32), val[perm]
