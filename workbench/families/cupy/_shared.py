"""Stage pieces that more than one core of the CuPy family uses (the SIMT stages, mma_sync,
wgmma, wgmma_ws): the candidate buffers of a filter, the block threshold (over a score source,
or over a core's own sample scores), the sample scores through a core's replay, and THE
recovery loop (a core's rows kernel materialises a bounded number of failed rows, the exact
radix top-k of recover.cu selects). Loading and launching are _launch.py's."""
from __future__ import annotations

import cupy as cp
import numpy as np

import reference as R

from . import _scope
from ._launch import (MAX_SAMPLES, RADIX, bind, chunks, exact_topk_smem_bytes, i32, kernel, launch,
                      launch_stream)

ROWS_PER_PASS = 64          # failed rows materialised at a time: memory bounded by 64 x the longest context


def check_candidates(cand_idx, cand_val, count):
    """The select stage's inputs on the device: (cand_idx int32 [n, cap], cand_val float32, count
    int32 [n], n, cap), shapes checked (call inside launch_stream())."""
    cand_idx = i32(cand_idx, "cand_idx")
    cand_val = cp.ascontiguousarray(cp.asarray(cand_val, cp.float32))
    count = i32(count, "count")
    n, capacity = cand_idx.shape
    if cand_val.shape != (n, capacity) or count.shape != (n,):
        raise ValueError(f"arguments 'cand_val'/'count' must have shapes {(n, capacity)}/{(n,)}, "
                         f"got {cand_val.shape}/{count.shape}")
    return cand_idx, cand_val, count, n, capacity


def check_capacity(capacity) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"argument 'capacity' must be a positive int, got {capacity!r}")
    return int(capacity)


def candidate_buffers(n, capacity):
    """A filter's outputs: counts 0; positions -1 and values -inf past the count, except inside a
    pipeline call (a call scope), whose consumers (the select, context parallel's append) read
    only the first min(count, capacity) slots: there the slots are left unset, saving two
    fills of n x capacity x 4 bytes per pass (0.3 ms at 4096 x 8960)."""
    if _scope.current() is not None:
        return cp.empty((n, capacity), cp.int32), cp.empty((n, capacity), cp.float32), cp.zeros(n, cp.int32)
    return (cp.full((n, capacity), -1, cp.int32), cp.full((n, capacity), -np.inf, cp.float32),
            cp.zeros(n, cp.int32))


def block_threshold(source, lo, hi, M, r):
    """The block threshold kernel (r-th best of each query's M samples, by an in-block radix
    select) without the host-side check of M (no sync); the kernel never reads past
    MAX_SAMPLES samples."""
    with launch_stream():
        src = bind(source)
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        T = cp.empty(src.n, cp.float32)
        fn = kernel("threshold.cu", f"hytopk_threshold<{src.cxx}>", src.shapes)
        smem = 4 * (src.smem_floats + MAX_SAMPLES + RADIX + 4)
        launch(fn, (src.n,), (*src.args, np.int32(src.n), lo, hi, M, r, T), smem)
        return T


def threshold_of_samples(s, M, r):
    """T from a core's sample scores s[n, m] (row t holds its M[t] samples at 0 .. M[t]-1): as a
    table with contexts [0, M[t]) sampled M[t] times, sample j is column j."""
    if s.shape[1] == 0:
        return cp.full(s.shape[0], cp.nan, cp.float32)
    return block_threshold(R.TableSource(s), cp.zeros_like(M), M, M, r)


def sample_scores(source, lo, hi, M, replay):
    """([n, m_max] float32 scores of every query's samples through a core's gathered tiles
    (replay(source, pos): the core's filter's own bits), -inf past M[t]; M clamped to m_max).

    m_max = num_samples(L) from the host: M(c) grows with c and c <= L, so no query of the
    contract has more samples, and no device-to-host sync is needed. A larger M (not from
    the contract's formula) is clamped to m_max, so nothing is read out of bounds; an empty
    context gets M = 0 (T = NaN, as the block threshold gives it)."""
    n, L = lo.shape[0], int(source.keys.shape[0])
    m_max = int(R.num_samples(L))
    if m_max > MAX_SAMPLES:
        raise ValueError(f"argument 'M': at most {MAX_SAMPLES} samples per query (num_samples(L) = {m_max})")
    M = cp.where(hi > lo, cp.minimum(M, np.int32(m_max)), np.int32(0))    # no samples of an empty context
    if n == 0 or m_max == 0:
        return cp.zeros((n, 0), cp.float32), M
    pos = cp.empty((n, m_max), cp.int32)
    launch(kernel("threshold.cu", "hytopk_sample_positions"), (n, chunks(m_max, 256)),
           (np.int32(n), np.int32(m_max), lo, hi, M, pos))
    return replay(source, pos), M


def select_rows(base, stride, by_query, rows, lo, hi, k, idx, val):
    """Exact top-k (recover.cu's radix select) of rows laid out at base[j * stride] (by_query = 0:
    one materialised row per listed query) or of the table rows of the listed queries (by_query = 1)."""
    launch(kernel("recover.cu", "hytopk_select_rows"), (rows.shape[0],),
           (base, np.int64(stride), np.int32(by_query), rows, np.int32(rows.shape[0]), lo, hi, np.int32(k),
            idx, val), exact_topk_smem_bytes(k))


def select_rows_to(base, stride, rows, lo, hi, k, idx, val):
    """select_rows of materialised rows (by_query = 0), each result written to its query's row
    idx/val[rows[j]] of the full outputs (slots -1 write nothing)."""
    launch(kernel("recover.cu", "hytopk_select_rows_to"), (rows.shape[0],),
           (base, np.int64(stride), rows, np.int32(rows.shape[0]), lo, hi, np.int32(k), idx, val),
           exact_topk_smem_bytes(k))


def recover_rows(x, lo, hi, rows, k):
    """Exact top-k of the failed rows: x.score_rows(part, lo, hi, buf, stride) (a core's rows
    kernel) materialises ROWS_PER_PASS rows at a time, select_rows selects. Every core's
    recovery of the indexer source runs this loop. Inside a device-side recovery that hands
    its outputs over (_scope.CallFacts.recovery_out) each selection goes straight to its
    query's row of them (no scatter launch) and this returns (None, None)."""
    lo, hi, rows = i32(lo, "lo"), i32(hi, "hi"), i32(rows, "rows")
    nr = rows.shape[0]
    facts = _scope.current()
    out = facts.recovery_out if facts is not None else None
    if out is None:
        idx = cp.empty((nr, k), cp.int32)
        val = cp.empty((nr, k), cp.float32)
    if nr == 0:
        return (None, None) if out is not None else (idx, val)
    longest = _scope.longest_context()            # in a pipeline call: from its host ranges, no sync
    lengths = (hi - lo)[rows] if longest is None else None
    step = _scope.recovery_rows(ROWS_PER_PASS)    # rows per materialisation (a capture-safe call: more)
    for s in range(0, nr, step):
        part = cp.ascontiguousarray(rows[s:s + step])
        stride = max(1, longest if longest is not None else int(lengths[s:s + step].max()))
        buf = cp.empty((part.shape[0], stride), cp.float32)
        x.score_rows(part, lo, hi, buf, stride)
        if out is not None:
            select_rows_to(buf, stride, part, lo, hi, k, *out)
        else:
            select_rows(buf, stride, 0, part, lo, hi, k, idx[s:s + step], val[s:s + step])
        del buf
    return (None, None) if out is not None else (idx, val)
