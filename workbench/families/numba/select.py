"""Stage 8: exact selection over the candidates of each query (one block per row).

Radix select (8-bit MSB-first) finds K*, the k-th best order key; a second
radix select over positions among the entries with key == K* keeps the `need`
lowest positions; a stable LSD radix sort on (pos, ~key) puts the k kept
entries in rank order. Compaction order is arbitrary (atomics) but the sort is
total, so results never depend on how candidates were stored.

`select_rows` is also the engine of recovery (recover.py), which feeds it
materialised rows of a failed query's whole context.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from .common import BLOCK, RADIX, WARP_BINS, WARPS


# ---------------------------------------------------------------- block variant
@cuda.jit(device=True)
def block_sort_pass(vals, pos, t, src, dst, nk, p, hist, offs, tile, flags):
    """One stable 8-bit counting pass src -> dst. Returns 1 if it moved data,
    0 if every entry has the same digit (pass skipped, src stays current)."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for i in range(tid, RADIX, nt):
        hist[i] = 0
    cuda.syncthreads()
    for i in range(tid, nk, nt):
        cuda.atomic.add(hist, C.sort_digit(vals, pos, t, src[t, i], p), 1)
    cuda.syncthreads()
    if tid == 0:
        run = 0
        flags[1] = 0
        for d in range(RADIX):
            h = hist[d]
            offs[d] = run
            run += h
            if h == nk:
                flags[1] = 1
    cuda.syncthreads()
    skip = flags[1]
    moved = 0
    if skip == 0:
        moved = 1
        for base in range(0, nk, nt):          # tiles in order keep the pass stable
            i = base + tid
            d = -1
            slot = 0
            if i < nk:
                slot = src[t, i]
                d = C.sort_digit(vals, pos, t, slot, p)
            tile[tid] = d
            cuda.syncthreads()
            before = 0
            after = 0
            if i < nk:
                for j in range(nt):
                    if tile[j] == d:
                        if j < tid:
                            before += 1
                        elif j > tid:
                            after += 1
                dst[t, offs[d] + before] = slot
            cuda.syncthreads()
            if i < nk and after == 0:           # last of its digit in this tile
                offs[d] += before + 1
            cuda.syncthreads()
    cuda.syncthreads()
    return moved


@cuda.jit
def select_block_kernel(vals, pos, count, k, out_idx, out_val, scr_a, scr_b):
    t = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    hist = cuda.shared.array(RADIX, np.int32)
    offs = cuda.shared.array(RADIX, np.int32)
    tile = cuda.shared.array(BLOCK, np.int32)
    state = cuda.shared.array(4, np.int64)
    flags = cuda.shared.array(2, np.int32)
    if t >= count.shape[0]:
        return
    m = min(max(np.int64(count[t]), 0), vals.shape[1])
    kstar = -1
    pstar = 0
    if m > k:
        kstar, need = C.block_msb_select(vals, pos, t, m, k, True, -1, hist, state)
        pstar, _ = C.block_msb_select(vals, pos, t, m, need, False, kstar, hist, state)
    if tid == 0:
        flags[0] = 0
    cuda.syncthreads()
    for i in range(tid, m, nt):
        if C.keep_entry(vals, pos, t, i, kstar, pstar):
            j = cuda.atomic.add(flags, 0, 1)
            if j < scr_a.shape[1]:
                scr_a[t, j] = i
    cuda.syncthreads()
    nk = min(m, k)
    cur = 0
    for p in range(8):
        if cur == 0:
            cur = cur ^ block_sort_pass(vals, pos, t, scr_a, scr_b, nk, p, hist, offs, tile, flags)
        else:
            cur = cur ^ block_sort_pass(vals, pos, t, scr_b, scr_a, nk, p, hist, offs, tile, flags)
    if cur == 0:
        C.write_rank_order(vals, pos, t, scr_a, nk, k, out_idx, out_val, t)
    else:
        C.write_rank_order(vals, pos, t, scr_b, nk, k, out_idx, out_val, t)


# ---------------------------------------------------------------- warp variant (GPU only)
@cuda.jit(device=True)
def warp_hist_add(hist, d, active):
    """Warp-aggregated shared histogram add: one atomic per distinct digit per warp."""
    key = d if active else RADIX
    peers = cuda.match_any_sync(C.FULL_MASK, key)
    lane = cuda.laneid
    leader = cuda.ffs(peers) - 1
    if active and lane == leader:
        cuda.atomic.add(hist, d, cuda.popc(peers))


@cuda.jit(device=True)
def warp_pick_digit(hist, remaining, largest, state, shift, prefix):
    """Warp 0 scans the 256 bins best-first (8 per lane, shuffle prefix sums)
    and records the chosen digit in state."""
    lane = cuda.laneid
    local = 0
    for j in range(8):
        b = lane * 8 + j
        d = RADIX - 1 - b if largest else b
        local += hist[d]
    incl = local
    for o in (1, 2, 4, 8, 16):
        v = cuda.shfl_up_sync(C.FULL_MASK, incl, o)
        if lane >= o:
            incl += v
    excl = incl - local
    hit = cuda.ballot_sync(C.FULL_MASK, incl >= remaining)
    owner = cuda.ffs(hit) - 1
    if lane == owner:
        before = excl
        for j in range(8):
            b = lane * 8 + j
            d = RADIX - 1 - b if largest else b
            h = hist[d]
            if before + h >= remaining:
                state[1] = remaining - before
                state[0] = prefix | (np.int64(d) << shift)
                break
            before += h


@cuda.jit(device=True)
def warp_msb_select(vals, pos, t, m, rank, largest, match_key, hist, state):
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    if tid == 0:
        state[0] = 0
        state[1] = rank
    for p in range(4):
        shift = 24 - 8 * p
        hmask = 0 if p == 0 else (1 << 32) - (1 << (shift + 8))
        for i in range(tid, RADIX, nt):
            hist[i] = 0
        cuda.syncthreads()
        prefix = state[0]
        for base in range(0, m, nt):
            i = base + tid
            act = False
            d = 0
            if i < m:
                a, v = C.select_value(vals, pos, t, i, match_key)
                if a and (v & hmask) == prefix:
                    act = True
                    d = (v >> shift) & 255
            warp_hist_add(hist, d, act)
        cuda.syncthreads()
        if tid < 32:
            warp_pick_digit(hist, state[1], largest, state, shift, prefix)
        cuda.syncthreads()
    value = state[0]
    need = state[1]
    cuda.syncthreads()
    return value, need


@cuda.jit(device=True)
def warp_sort_pass(vals, pos, t, src, dst, nk, p, hist, offs, whist, flags):
    """Stable counting pass; in-tile ranks from match_any_sync + per-warp digit counts."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    lane = cuda.laneid
    warp = tid // 32
    for i in range(tid, RADIX, nt):
        hist[i] = 0
    cuda.syncthreads()
    for base in range(0, nk, nt):
        i = base + tid
        d = 0
        if i < nk:
            d = C.sort_digit(vals, pos, t, src[t, i], p)
        warp_hist_add(hist, d, i < nk)
    cuda.syncthreads()
    if tid == 0:
        run = 0
        flags[1] = 0
        for d in range(RADIX):
            h = hist[d]
            offs[d] = run
            run += h
            if h == nk:
                flags[1] = 1
    cuda.syncthreads()
    if flags[1] != 0:
        cuda.syncthreads()
        return 0
    lt = (1 << lane) - 1
    for base in range(0, nk, nt):
        for i in range(tid, WARP_BINS, nt):
            whist[i] = 0
        cuda.syncthreads()
        i = base + tid
        valid = i < nk
        slot = 0
        d = RADIX
        if valid:
            slot = src[t, i]
            d = C.sort_digit(vals, pos, t, slot, p)
        peers = cuda.match_any_sync(C.FULL_MASK, d)
        rank = cuda.popc(peers & lt)
        if valid and rank == 0:
            whist[warp * RADIX + d] = cuda.popc(peers)
        cuda.syncthreads()
        if valid:
            off = offs[d] + rank
            for w in range(warp):
                off += whist[w * RADIX + d]
            dst[t, off] = slot
        cuda.syncthreads()
        for d2 in range(tid, RADIX, nt):
            tot = 0
            for w in range(WARPS):
                tot += whist[w * RADIX + d2]
            offs[d2] += tot
        cuda.syncthreads()
    return 1


@cuda.jit
def select_warp_kernel(vals, pos, count, k, out_idx, out_val, scr_a, scr_b):
    t = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    hist = cuda.shared.array(RADIX, np.int32)
    offs = cuda.shared.array(RADIX, np.int32)
    whist = cuda.shared.array(WARP_BINS, np.int32)
    state = cuda.shared.array(4, np.int64)
    flags = cuda.shared.array(2, np.int32)
    if t >= count.shape[0]:
        return
    m = min(max(np.int64(count[t]), 0), vals.shape[1])
    kstar = -1
    pstar = 0
    if m > k:
        kstar, need = warp_msb_select(vals, pos, t, m, k, True, -1, hist, state)
        pstar, _ = warp_msb_select(vals, pos, t, m, need, False, kstar, hist, state)
    if tid == 0:
        flags[0] = 0
    cuda.syncthreads()
    lt = (1 << cuda.laneid) - 1
    for base in range(0, m, nt):               # warp-aggregated compaction
        i = base + tid
        keep = i < m and C.keep_entry(vals, pos, t, i, kstar, pstar)
        ballot = cuda.ballot_sync(C.FULL_MASK, keep)
        first = 0
        if cuda.laneid == 0 and ballot != 0:
            first = cuda.atomic.add(flags, 0, cuda.popc(ballot))
        first = cuda.shfl_sync(C.FULL_MASK, first, 0)
        if keep:
            j = first + cuda.popc(ballot & lt)
            if j < scr_a.shape[1]:
                scr_a[t, j] = i
    cuda.syncthreads()
    nk = min(m, k)
    cur = 0
    for p in range(8):
        if cur == 0:
            cur = cur ^ warp_sort_pass(vals, pos, t, scr_a, scr_b, nk, p, hist, offs, whist, flags)
        else:
            cur = cur ^ warp_sort_pass(vals, pos, t, scr_b, scr_a, nk, p, hist, offs, whist, flags)
    if cur == 0:
        C.write_rank_order(vals, pos, t, scr_a, nk, k, out_idx, out_val, t)
    else:
        C.write_rank_order(vals, pos, t, scr_b, nk, k, out_idx, out_val, t)


# ---------------------------------------------------------------- host side
def select_rows(kernel, vals, pos, count, k, s=None):
    """Exact top-k of each row's first min(count, width) entries (vals, pos)."""
    s = s or C.stream()
    n = int(count.shape[0])
    out_idx = C.empty((n, k), np.int32, s)
    out_val = C.empty((n, k), np.float32, s)
    if n:
        scr_a = C.empty((n, k), np.int32, s)
        scr_b = C.empty((n, k), np.int32, s)
        kernel[n, BLOCK, s](vals, pos, count, np.int64(k), out_idx, out_val, scr_a, scr_b)
    return out_idx, out_val


@register("select", "numba.select.block")
def select_block(cand_idx, cand_val, count, k):
    """Block radix select + stable block radix sort (shared-memory atomics only)."""
    return select_rows(select_block_kernel, cand_val, cand_idx, count, int(k))


@register("select", "numba.select.warp", gpu_only=True)
def select_warp(cand_idx, cand_val, count, k):
    """Warp-aggregated histograms (match_any), shuffle scans, ballot compaction."""
    return select_rows(select_warp_kernel, cand_val, cand_idx, count, int(k))
