"""The tiled tensor-core core (kernels_cuda/hytopk_mma_tile.cuh + tiled.cu) as
variants: fused filter, dense table, recovery and replay, plus the score-only
floor. All five call one scoring routine, so their scores agree bit for bit
on any input; a pipeline of tiled filter + tiled recover is exact on its own
scores. Inputs are rounded to bf16 first (float32 in: round to nearest even;
exact on small-integer inputs); heads are zero-padded to 16/32/64, dims to a
multiple of 16 (zeros add exactly +0)."""
from __future__ import annotations

import cupy as cp
import numpy as np

import reference as R
from workbench import instantiations as INST

from ...bf16 import float32_to_bf16_bits
from ...registry import register
from . import _scope
from ._launch import (MAX_SAMPLES, as_device, check_k_fits, chunks, exact_topk_smem_bytes, i32, input_dtype,
                      kernel, launch, launch_stream, pad_inputs)
from .filter import _buffers, _capacity
from .threshold import threshold_unchecked

BF16 = "(inputs rounded to bf16)"


class Geometry:
    """Host mirror of hytopk::tiled::Shape<H, D> (keep in step with the header)."""

    def __init__(self, H: int, D: int):
        self.H, self.D = H, D
        self.qpb = min(256 // H, 8)
        self.wq = 8 // self.qpb
        self.kw = 2048 // H
        self.ntile = self.wq * self.kw
        rs = D + 8
        self.smem = self.qpb * H * rs * 2 + 2 * self.ntile * rs * 2
        self.tiles_per_block = 2048 // self.ntile
        self.block_keys = self.ntile * self.tiles_per_block
        self.rjt = self.wq * 16
        self.r_block = self.rjt * 8
        self.r_smem = self.qpb * H * rs * 2 + 8 * 16 * rs * 2

    def groups(self, n: int) -> int:
        return -(-n // self.qpb)


class TiledInputs:
    """q, w, keys as contiguous, 16-byte aligned bf16 bits padded to the tiled shape."""

    def __init__(self, q, w, keys):
        q, w, keys = (cp.ascontiguousarray(as_device(a)) for a in (q, w, keys))
        dts = {input_dtype(a) for a in (q, w, keys)}
        if len(dts) != 1:
            raise TypeError(f"arguments 'q', 'w', 'keys' must share one dtype, got {q.dtype}, {w.dtype}, {keys.dtype}")
        if dts == {"float32"}:
            q, w, keys = (float32_to_bf16_bits(a, cp) for a in (q, w, keys))
        q, w, keys = (a.view(cp.uint16) for a in (q, w, keys))
        if q.ndim != 3 or w.shape != q.shape[:2] or keys.ndim != 2 or keys.shape[1] != q.shape[2]:
            raise ValueError(f"arguments 'q', 'w', 'keys': shapes {q.shape}, {w.shape}, {keys.shape} "
                             "are not [n, H, D], [n, H], [L, D]")
        self.n, H0, D0 = q.shape
        self.H, self.D = INST.tiled_shape(H0, D0)
        q, w, keys = pad_inputs(q, w, keys, self.H, self.D)
        # cp.async moves 16-byte pieces: copy a misaligned view (e.g. an offset torch tensor)
        self.q, self.w, self.keys = (a if a.data.ptr % 16 == 0 else a.copy() for a in (q, w, keys))
        self.L = self.keys.shape[0]
        self.geo = Geometry(self.H, self.D)
        default = {INST.tiled_shape(*s) for s in INST.SHAPES}
        self.shapes = INST.SHAPES if (self.H, self.D) in default else ((self.H, self.D),)

    def fn(self, kernel_name: str):
        return kernel("tiled.cu", f"{kernel_name}<{self.H}, {self.D}>", self.shapes)

    def head_args(self):
        return (self.q, self.w, self.keys, np.int64(self.L))

    def scan_grid(self, nq: int):
        """(query groups, key runs) of the filter / rows / score-only kernels."""
        return (self.geo.groups(nq), chunks(self.L + self.geo.ntile, self.geo.block_keys))

    def score_rows(self, part, lo, hi, buf, stride):
        """Recovery rows of the queries `part` into buf[len(part), stride] (recover_rows)."""
        launch(self.fn("hytopk_score_rows_tiled"), self.scan_grid(part.shape[0]),
               (*self.head_args(), part, np.int32(part.shape[0]), lo, hi, buf, np.int64(stride)), self.geo.smem)


def _indexer(source, name):
    if not isinstance(source, R.IndexerSource):
        raise TypeError(f"argument 'source': {name} takes the indexer source only")
    return TiledInputs(source.q, source.w, source.keys)


@register("filter", "cupy.filter.tiled_mma", sources=("indexer",), gpu_only=True,
          notes=f"tiled bf16 mma.sync core, cp.async + ldmatrix, on-chip threshold compare {BF16}")
def filter_tiled(source, lo, hi, T, capacity):
    capacity = _capacity(capacity)
    with launch_stream():
        x = _indexer(source, "cupy.filter.tiled_mma")
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = _buffers(x.n, capacity)
        launch(x.fn("hytopk_filter_tiled"), x.scan_grid(x.n),
               (*x.head_args(), np.int32(x.n), lo, hi, T, np.int32(capacity), cand_idx, cand_val, count),
               x.geo.smem)
        return cand_idx, cand_val, count


@register("dense", "cupy.dense.tiled_mma", gpu_only=True,
          notes=f"tiled bf16 mma.sync core writing the table (the fast dense baseline) {BF16}")
def dense_tiled(q, w, keys, lo, hi):
    with launch_stream():
        x = TiledInputs(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        out = cp.empty((x.n, x.L), cp.float32)
        launch(x.fn("hytopk_dense_tiled"), (x.geo.groups(x.n), chunks(x.L, x.geo.block_keys)),
               (*x.head_args(), np.int32(x.n), lo, hi, out), x.geo.smem)
        return out


ROWS_PER_PASS = 64


@register("recover", "cupy.recover.tiled_mma", sources=("indexer",), gpu_only=True,
          notes=f"failed rows materialised by the tiled core (same bits as its filter), exact radix top-k {BF16}")
def recover_tiled(source, lo, hi, rows, k):
    k = check_k_fits(k)
    with launch_stream():
        x = _indexer(source, "cupy.recover.tiled_mma")
        return recover_rows(x, lo, hi, rows, k)


def recover_rows(x, lo, hi, rows, k):
    """Exact top-k of the failed rows: x.score_rows(part, lo, hi, buf, stride) (a tensor-core
    core's rows kernel) materialises ROWS_PER_PASS rows at a time, the radix top-k of
    recover.cu selects. Shared by the tiled and wgmma recoveries."""
    lo, hi, rows = i32(lo, "lo"), i32(hi, "hi"), i32(rows, "rows")
    nr = rows.shape[0]
    idx = cp.empty((nr, k), cp.int32)
    val = cp.empty((nr, k), cp.float32)
    if nr == 0:
        return idx, val
    select = kernel("recover.cu", "hytopk_select_rows")
    longest = _scope.longest_context()            # in a pipeline call: from its host ranges, no sync
    lengths = (hi - lo)[rows] if longest is None else None
    step = _scope.recovery_rows(ROWS_PER_PASS)
    for s in range(0, nr, step):
        part = cp.ascontiguousarray(rows[s:s + step])
        stride = max(1, longest if longest is not None else int(lengths[s:s + step].max()))
        buf = cp.empty((part.shape[0], stride), cp.float32)
        x.score_rows(part, lo, hi, buf, stride)
        launch(select, (part.shape[0],),
               (buf, np.int64(stride), np.int32(0), part, np.int32(part.shape[0]), lo, hi, np.int32(k),
                idx[s:s + step], val[s:s + step]), exact_topk_smem_bytes(k))
        del buf
    return idx, val


@register("replay", "cupy.replay.tiled_mma", gpu_only=True,
          notes=f"gathered key tiles through the tiled core: equals its filter's scores bit for bit {BF16}")
def replay_tiled(q, w, keys, idx):
    with launch_stream():
        x = TiledInputs(q, w, keys)
        idx = i32(idx, "idx")
        if idx.ndim != 2 or idx.shape[0] != x.n:
            raise ValueError(f"argument 'idx' must have shape ({x.n}, k), got {idx.shape}")
        k = idx.shape[1]
        out = cp.empty((x.n, k), cp.float32)
        if k:
            launch(x.fn("hytopk_replay_tiled"), (x.geo.groups(x.n), chunks(k, x.geo.r_block)),
                   (*x.head_args(), np.int32(x.n), idx, np.int32(k), out), x.geo.r_smem)
        return out


def score_only_tiled(q, w, keys, lo, hi):
    """The floor of the tiled variants: the tiled core over every context, nothing
    written but the wrapping uint64 sum of the order keys (uint64[1], not synchronised)."""
    with launch_stream():
        x = TiledInputs(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        checksum = cp.zeros(1, cp.uint64)
        launch(x.fn("hytopk_score_only_tiled"), x.scan_grid(x.n),
               (*x.head_args(), np.int32(x.n), lo, hi, checksum), x.geo.smem)
        return checksum


def _order_keys(s):
    """reference.order_keys on the device (elementwise)."""
    b = s.view(cp.uint32)
    sign = cp.uint32(0x80000000)
    key = cp.where((b & sign) != 0, ~b, b ^ sign)
    key = cp.where(b == sign, sign, key)                 # -0.0 ranks as +0.0
    return cp.where(cp.isnan(s), cp.uint32(0), key)      # NaN below -inf


def _key_to_float(key):
    sign = cp.uint32(0x80000000)
    return cp.where((key & sign) != 0, key ^ sign, ~key).astype(cp.uint32).view(cp.float32)


def _sample_scores(source, lo, hi, M, replay=None):
    """([n, m_max] float32 scores of every query's samples through a core's gathered tiles
    (replay(source, pos); default the tiled core's: the tiled filter's own bits), -inf past
    M[t]; M clamped to m_max).

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
    if replay is None:
        return replay_tiled(source.q, source.w, source.keys, pos), M
    return replay(source, pos), M


@register("threshold", "cupy.threshold.tiled_mma", sources=("indexer",), gpu_only=True,
          notes=f"samples scored through the tiled core's gathered tiles (the tiled filter's own bits), "
                f"r-th best by the block threshold's in-shared-memory radix select {BF16}")
def threshold_tiled(source, lo, hi, M, r):
    if not isinstance(source, R.IndexerSource):
        raise TypeError("argument 'source': cupy.threshold.tiled_mma takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        s, M = _sample_scores(source, lo, hi, M)
        if s.shape[1] == 0:
            return cp.full(lo.shape[0], cp.nan, cp.float32)
        # row t of s holds exactly its M[t] samples at 0 .. M[t]-1: as a table with
        # contexts [0, M[t]) sampled M[t] times, sample j is column j
        return threshold_unchecked(R.TableSource(s), cp.zeros_like(M), M, M, r)


@register("threshold", "cupy.threshold.tiled_mma_rowsort", sources=("indexer",), gpu_only=True,
          notes=f"v1 of the tiled threshold: the same sample scores, r-th best by a cupy row sort "
                f"of the [n, M] order keys (kept to show the progression) {BF16}")
def threshold_tiled_rowsort(source, lo, hi, M, r):
    if not isinstance(source, R.IndexerSource):
        raise TypeError("argument 'source': cupy.threshold.tiled_mma_rowsort takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        n = lo.shape[0]
        s, M = _sample_scores(source, lo, hi, M)
        if s.shape[1] == 0:
            return cp.full(n, cp.nan, cp.float32)
        m_max = s.shape[1]
        keys = _order_keys(s)
        keys = cp.where(cp.arange(m_max)[None, :] < M[:, None], keys, cp.uint32(0))   # padding ranks last
        keys.sort(axis=1)                                     # ascending: the r-th best sits at m_max - r
        kth = keys[cp.arange(n), m_max - cp.maximum(r, 1)]
        return cp.where(M > 0, _key_to_float(kth), cp.float32(cp.nan)).astype(cp.float32)
