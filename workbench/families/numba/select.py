"""Stage 8: exact selection over the candidates of each query (one block per row).

Radix select (8-bit MSB-first) finds K*, the k-th best order key; a second
radix select over positions among the entries with key == K* keeps the `need`
lowest positions; a stable LSD radix sort on (pos, ~key) puts the k kept
entries in rank order. Compaction order is arbitrary (atomics) but the sort is
total, so results never depend on how candidates were stored.

One kernel, built per flavour (common.FLAVOURS): `block` counts digits with
shared-memory atomics and ranks a tile by scanning it; `warp` aggregates with
match_any / ballot and ranks with per-warp digit counts.

`select_rows` is also the engine of recovery (recover.py), which feeds it
materialised rows of a failed query's whole context.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from .common import BLOCK, RADIX


@lru_cache(maxsize=None)
def sort_pass(flavour: str):
    """One stable 8-bit counting pass src -> dst of a flavour, as a device function."""
    F = C.FLAVOURS[flavour]
    hist_add, tile_rank = F.hist_add, F.tile_rank

    @cuda.jit(device=True)
    def run(vals, pos, t, src, dst, nk, p, hist, offs, scratch, flags):
        """Returns 1 if it moved data, 0 if every entry has the same digit (pass skipped,
        src stays current)."""
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        for i in range(tid, RADIX, nt):
            hist[i] = 0
        cuda.syncthreads()
        for base in range(0, nk, nt):
            i = base + tid
            d = 0
            if i < nk:
                d = C.sort_digit(vals, pos, t, src[t, i], p)
            hist_add(hist, d, i < nk)
        cuda.syncthreads()
        if tid == 0:
            total = 0
            flags[1] = 0
            for d in range(RADIX):
                h = hist[d]
                offs[d] = total
                total += h
                if h == nk:
                    flags[1] = 1
        cuda.syncthreads()
        if flags[1] != 0:
            cuda.syncthreads()
            return 0
        for base in range(0, nk, nt):          # tiles in order keep the pass stable
            i = base + tid
            valid = i < nk
            slot = 0
            d = 0
            if valid:
                slot = src[t, i]
                d = C.sort_digit(vals, pos, t, slot, p)
            off = tile_rank(d, valid, offs, scratch)
            if valid:
                dst[t, off] = slot
        cuda.syncthreads()
        return 1
    return run


@lru_cache(maxsize=None)
def select_kernel(flavour: str):
    """The selection kernel of a flavour: (vals, pos, count, k, out_idx, out_val, scr_a, scr_b)."""
    F = C.FLAVOURS[flavour]
    msb_select, sort, reserve, SCRATCH = C.msb_select(flavour), sort_pass(flavour), F.reserve, F.scratch

    @cuda.jit
    def kernel(vals, pos, count, k, out_idx, out_val, scr_a, scr_b):
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        hist = cuda.shared.array(RADIX, np.int32)
        offs = cuda.shared.array(RADIX, np.int32)
        scratch = cuda.shared.array(SCRATCH, np.int32)
        state = cuda.shared.array(4, np.int64)
        flags = cuda.shared.array(2, np.int32)
        local = cuda.shared.array(2, np.int32)
        if t >= count.shape[0]:
            return
        m = min(max(np.int64(count[t]), 0), vals.shape[1])
        kstar = -1
        pstar = 0
        if m > k:
            kstar, need = msb_select(vals, pos, t, m, k, True, -1, hist, state)
            pstar, _ = msb_select(vals, pos, t, m, need, False, kstar, hist, state)
        if tid == 0:
            flags[0] = 0
        cuda.syncthreads()
        for base in range(0, m, nt):               # compaction of the kept entries
            i = base + tid
            keep = i < m and C.keep_entry(vals, pos, t, i, kstar, pstar)
            j = reserve(flags, 0, 1 if keep else 0, local)
            if keep and j < scr_a.shape[1]:
                scr_a[t, j] = i
        cuda.syncthreads()
        nk = min(m, k)
        cur = 0
        for p in range(8):
            if cur == 0:
                cur = cur ^ sort(vals, pos, t, scr_a, scr_b, nk, p, hist, offs, scratch, flags)
            else:
                cur = cur ^ sort(vals, pos, t, scr_b, scr_a, nk, p, hist, offs, scratch, flags)
        if cur == 0:
            C.write_rank_order(vals, pos, t, scr_a, nk, k, out_idx, out_val, t)
        else:
            C.write_rank_order(vals, pos, t, scr_b, nk, k, out_idx, out_val, t)
    return kernel


def select_rows(flavour, vals, pos, count, k, s=None):
    """Exact top-k of each row's first min(count, width) entries (vals, pos)."""
    s = s or C.stream()
    n = int(count.shape[0])
    out_idx = C.empty((n, k), np.int32, s)
    out_val = C.empty((n, k), np.float32, s)
    if n:
        scr_a = C.empty((n, k), np.int32, s)
        scr_b = C.empty((n, k), np.int32, s)
        select_kernel(flavour)[n, BLOCK, s](vals, pos, count, np.int64(k), out_idx, out_val, scr_a, scr_b)
    return out_idx, out_val


@register("select", "numba.select.block")
def select_block(cand_idx, cand_val, count, k):
    """Block radix select + stable block radix sort (shared-memory atomics only)."""
    return select_rows("block", cand_val, cand_idx, count, int(k))


@register("select", "numba.select.warp", gpu_only=True)
def select_warp(cand_idx, cand_val, count, k):
    """Warp-aggregated histograms (match_any), shuffle scans, ballot compaction."""
    return select_rows("warp", cand_val, cand_idx, count, int(k))
