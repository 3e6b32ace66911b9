"""Stages 1-4: sample the context, then T = the r-th best sample score.

Two kernels: sample scoring (p_j = lo + (j*c)//M in 64-bit integers; table
rows one thread per sample, indexer samples a tile at a time by the family's
tiled scorer) into a [n, max M] scratch, then a
per-query radix select of the r-th largest order key. T is returned as a
float32 whose key is that key (the filter only ever compares keys); queries
with M = 0 get NaN (key 0: every key passes).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from ...registry import register
from . import common as C
from . import tile as TL
from .common import BLOCK, RADIX


@lru_cache(maxsize=None)
def sample_kernel(kind):
    score_at = C.SCORE_FNS[kind]

    @cuda.jit
    def kernel(a, b, c, lo, hi, M, out):
        t = cuda.blockIdx.x
        j = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
        if t < out.shape[0] and j < M[t] and j < out.shape[1]:
            lo_t = np.int64(lo[t])
            cnt = np.int64(hi[t]) - lo_t
            s = lo_t + (np.int64(j) * cnt) // np.int64(M[t])
            out[t, j] = score_at(a, b, c, t, s)
    return kernel


@lru_cache(maxsize=None)
def sample_tiled_kernel(hg: int, cfg: TL.Tile):
    """Indexer sample scores: block (query, tile of TK samples) through the tiled scorer."""
    score, scratch = TL.score_tile(hg, cfg), TL.scratch(cfg)
    TK, NT = cfg.tk, cfg.block

    @cuda.jit(**cfg.jit)                # launch bounds: the shape's registers per thread
    def kernel(q2, w, keys, scaled, lo, hi, M, out):
        key_s, q_s, acc_s, pos_s = scratch()
        t = cuda.blockIdx.x
        j0 = np.int64(cuda.blockIdx.y) * TK
        if t >= out.shape[0]:
            return
        m = min(np.int64(M[t]), out.shape[1])
        if j0 >= m:
            return
        lo_t = np.int64(lo[t])
        cnt = np.int64(hi[t]) - lo_t
        for j in range(cuda.threadIdx.x, TK, NT):
            pos_s[j] = lo_t + ((j0 + j) * cnt) // np.int64(M[t]) if j0 + j < m else -1
        score(q2, w, keys, scaled, t, pos_s, key_s, q_s, acc_s)
        for j in range(cuda.threadIdx.x, TK, NT):
            if j0 + j < m:
                out[t, j0 + j] = acc_s[j]
    return kernel


@lru_cache(maxsize=None)
def threshold_kernel(flavour: str):
    """T[t] = the value whose order key is the r-th largest sample key, by the flavour's radix select."""
    msb_select = C.msb_select(flavour)

    @cuda.jit
    def kernel(samples, M, r, T):
        t = cuda.blockIdx.x
        hist = cuda.shared.array(RADIX, np.int32)
        state = cuda.shared.array(4, np.int64)
        if t >= T.shape[0]:
            return
        m = min(np.int64(M[t]), samples.shape[1])
        if m <= 0:
            if cuda.threadIdx.x == 0:
                T[t] = C.key_value(0)
            return
        key, _ = msb_select(samples, samples, t, m, max(np.int64(r[t]), 1), True, -1, hist, state)
        if cuda.threadIdx.x == 0:
            T[t] = C.key_value(key)
    return kernel


def run_threshold(flavour, source, lo, hi, M, r):
    s = C.stream()
    a, b, c, kind = C.source_args(source)
    n = int(lo.shape[0])
    T = C.empty((n,), np.float32, s)
    if n == 0:
        return T
    m_max = int(C.host(M, s).max())
    samples = C.empty((n, max(m_max, 1)), np.float32, s)
    if m_max and kind == "table":
        sample_kernel(kind)[(n, C.blocks(m_max, BLOCK)), BLOCK, s](a, b, c, lo, hi, M, samples)
    elif m_max:
        cfg = TL.current()
        sample_tiled_kernel(cfg.heads_per_warp(b.shape[1]), cfg)[(n, C.blocks(m_max, cfg.tk)), cfg.block, s](
            a, b, c, np.int64(kind == "indexer_fp8"), lo, hi, M, samples)
    threshold_kernel(flavour)[n, BLOCK, s](samples, M, r, T)
    return T


@register("threshold", "numba.threshold.block")
def threshold_block(source, lo, hi, M, r):
    """Samples to scratch, block radix select (shared-memory atomics)."""
    return run_threshold("block", source, lo, hi, M, r)


@register("threshold", "numba.threshold.warp", gpu_only=True)
def threshold_warp(source, lo, hi, M, r):
    """Samples to scratch, warp-aggregated radix select with shuffle scans."""
    return run_threshold("warp", source, lo, hi, M, r)
