"""The mma_sync core (bf16 mma.sync tensor-core tiles; kernels_cuda/hytopk_mma_sync.cuh + mma_sync.cu) as
variants: fused filter, dense table, recovery and replay, plus the score-only
floor. All five call one scoring routine, so their scores agree bit for bit
on any input; a pipeline of mma_sync filter + mma_sync recover is exact on its own
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
from ._launch import as_device, check_k_fits, chunks, i32, input_dtype, kernel, launch, launch_stream, pad_inputs
from ._shared import candidate_buffers, check_capacity, recover_rows, sample_scores, threshold_of_samples

BF16 = "(inputs rounded to bf16)"


class Geometry:
    """Host mirror of hytopk::mma_sync::Shape<H, D> (keep in step with the header)."""

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


class MmaSyncInputs:
    """q, w, keys as contiguous, 16-byte aligned bf16 bits padded to the tensor-core tile shape."""

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
        return kernel("mma_sync.cu", f"{kernel_name}<{self.H}, {self.D}>", self.shapes)

    def head_args(self):
        return (self.q, self.w, self.keys, np.int64(self.L))

    def scan_grid(self, nq: int):
        """(query groups, key runs) of the filter / rows / score-only kernels."""
        return (self.geo.groups(nq), chunks(self.L + self.geo.ntile, self.geo.block_keys))

    def score_rows(self, part, lo, hi, buf, stride):
        """Recovery rows of the queries `part` into buf[len(part), stride] (recover_rows)."""
        launch(self.fn("hytopk_score_rows_mma_sync"), self.scan_grid(part.shape[0]),
               (*self.head_args(), part, np.int32(part.shape[0]), lo, hi, buf, np.int64(stride)), self.geo.smem)


def _indexer(source, name):
    if not isinstance(source, R.IndexerSource):
        raise TypeError(f"argument 'source': {name} takes the indexer source only")
    return MmaSyncInputs(source.q, source.w, source.keys)


@register("filter", "cupy.filter.mma_sync", sources=("indexer",), gpu_only=True,
          notes=f"bf16 mma.sync core, cp.async + ldmatrix, on-chip threshold compare {BF16}")
def filter_mma_sync(source, lo, hi, T, capacity):
    capacity = check_capacity(capacity)
    with launch_stream():
        x = _indexer(source, "cupy.filter.mma_sync")
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = candidate_buffers(x.n, capacity)
        launch(x.fn("hytopk_filter_mma_sync"), x.scan_grid(x.n),
               (*x.head_args(), np.int32(x.n), lo, hi, T, np.int32(capacity), cand_idx, cand_val, count),
               x.geo.smem)
        return cand_idx, cand_val, count


@register("dense", "cupy.dense.mma_sync", gpu_only=True,
          notes=f"bf16 mma.sync core writing the table (the fast dense baseline) {BF16}")
def dense_mma_sync(q, w, keys, lo, hi):
    with launch_stream():
        x = MmaSyncInputs(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        out = cp.empty((x.n, x.L), cp.float32)
        launch(x.fn("hytopk_dense_mma_sync"), (x.geo.groups(x.n), chunks(x.L, x.geo.block_keys)),
               (*x.head_args(), np.int32(x.n), lo, hi, out), x.geo.smem)
        return out


@register("recover", "cupy.recover.mma_sync", sources=("indexer",), gpu_only=True,
          notes=f"failed rows materialised by the mma_sync core (same bits as its filter), exact radix top-k {BF16}")
def recover_mma_sync(source, lo, hi, rows, k):
    k = check_k_fits(k)
    with launch_stream():
        x = _indexer(source, "cupy.recover.mma_sync")
        return recover_rows(x, lo, hi, rows, k)


@register("replay", "cupy.replay.mma_sync", gpu_only=True,
          notes=f"gathered key tiles through the mma_sync core: equals its filter's scores bit for bit {BF16}")
def replay_mma_sync(q, w, keys, idx):
    with launch_stream():
        x = MmaSyncInputs(q, w, keys)
        idx = i32(idx, "idx")
        if idx.ndim != 2 or idx.shape[0] != x.n:
            raise ValueError(f"argument 'idx' must have shape ({x.n}, k), got {idx.shape}")
        k = idx.shape[1]
        out = cp.empty((x.n, k), cp.float32)
        if k:
            launch(x.fn("hytopk_replay_mma_sync"), (x.geo.groups(x.n), chunks(k, x.geo.r_block)),
                   (*x.head_args(), np.int32(x.n), idx, np.int32(k), out), x.geo.r_smem)
        return out


def _replay_source(source, pos):
    """The core's scores at pos[n, m] (its filter's own bits): the sample scores of its threshold."""
    return replay_mma_sync(source.q, source.w, source.keys, pos)


def score_only_mma_sync(q, w, keys, lo, hi):
    """The floor of the mma_sync variants: the core over every context, nothing
    written but the wrapping uint64 sum of the order keys (uint64[1], not synchronised)."""
    with launch_stream():
        x = MmaSyncInputs(q, w, keys)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        checksum = cp.zeros(1, cp.uint64)
        launch(x.fn("hytopk_score_only_mma_sync"), x.scan_grid(x.n),
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


@register("threshold", "cupy.threshold.mma_sync", sources=("indexer",), gpu_only=True,
          notes=f"samples scored through the mma_sync core's gathered tiles (its filter's own bits), "
                f"r-th best by the block threshold's in-shared-memory radix select {BF16}")
def threshold_mma_sync(source, lo, hi, M, r):
    if not isinstance(source, R.IndexerSource):
        raise TypeError("argument 'source': cupy.threshold.mma_sync takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        s, M = sample_scores(source, lo, hi, M, _replay_source)
        return threshold_of_samples(s, M, r)


@register("threshold", "cupy.threshold.mma_sync_rowsort", sources=("indexer",), gpu_only=True,
          notes=f"v1 of the mma_sync threshold: the same sample scores, r-th best by a cupy row sort "
                f"of the [n, M] order keys (kept to show the progression) {BF16}")
def threshold_mma_sync_rowsort(source, lo, hi, M, r):
    if not isinstance(source, R.IndexerSource):
        raise TypeError("argument 'source': cupy.threshold.mma_sync_rowsort takes the indexer source only")
    with launch_stream():
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        n = lo.shape[0]
        s, M = sample_scores(source, lo, hi, M, _replay_source)
        if s.shape[1] == 0:
            return cp.full(n, cp.nan, cp.float32)
        m_max = s.shape[1]
        keys = _order_keys(s)
        keys = cp.where(cp.arange(m_max)[None, :] < M[:, None], keys, cp.uint32(0))   # padding ranks last
        keys.sort(axis=1)                                     # ascending: the r-th best sits at m_max - r
        kth = keys[cp.arange(n), m_max - cp.maximum(r, 1)]
        return cp.where(M > 0, _key_to_float(kth), cp.float32(cp.nan)).astype(cp.float32)
