"""The wgmma core (kernels_cuda/hytopk_wgmma.cuh + wgmma.cu, sm_90a) as
variants: fused filter, dense table and recovery, plus the score-only floor.
All call one scoring routine, so their scores agree bit for bit; a pipeline of
wgmma filter + wgmma recover is exact on its own scores.

Two input kinds, picked by the source:
  reference.IndexerSource      -> bf16 (float32 in: rounded to bf16 first), k16 MMAs
  reference.fp8.Fp8IndexerSource -> fp8 e4m3 bits with a float32 scale per key row
                                   and float32 weights (DeepSeek-V3.2's indexer), k32 MMAs
Heads are zero-padded to 16/32/64, dims to 32 bytes (zeros add exactly +0).
Needs a Hopper GPU (compute capability 9.0): wgmma exists on sm_90a only."""
from __future__ import annotations

import cupy as cp
import numpy as np

import reference as R
from reference.fp8 import Fp8IndexerSource
from workbench import instantiations as INST

from ... import loader
from ...registry import register
from ._launch import as_device, check_k_fits, chunks, i32, kernel, launch, launch_stream
from ._shared import candidate_buffers, check_capacity, recover_rows
from .mma_sync import BF16, MmaSyncInputs

KT = 128                  # keys per tile (64 per warpgroup)
TILES_PER_BLOCK = 32      # keys per block: 4096
WG_STAGES = 4             # ping-pong scan: 64-key tiles per warpgroup
SMEM_LIMIT = 227 * 1024   # a block's shared memory on sm_90


class WgGeometry:
    """Host mirror of hytopk::wg::Shape<H, D, In> (keep in step with the header)."""

    def __init__(self, H: int, D: int, elem_bytes: int):
        self.H, self.D = H, D
        self.qpb = 256 // H
        row = D * elem_bytes
        stages = 2 * WG_STAGES * 64 * row                                # ping-pong: 4 stages per warpgroup
        base = 256 * row + stages + 256 * 4 + self.qpb * 16
        self.stage_entries = min(128, (SMEM_LIMIT - base) // (8 * self.qpb * 8) // 16 * 16)   # filter staging
        self.smem = base + 8 * self.qpb * self.stage_entries * 8
        self.block_keys = KT * TILES_PER_BLOCK

    def groups(self, n: int) -> int:
        return -(-n // self.qpb)


def require_sm90():
    cc = loader.current_arch()
    if cc != "90":
        raise RuntimeError(f"the wgmma variants need a Hopper GPU (compute capability 9.0, sm_90a); this device is sm_{cc}")


class WgInputs:
    """Device inputs of the wgmma kernels: bf16 (from an IndexerSource or q, w, keys) or
    fp8 (from an Fp8IndexerSource), padded to the core's shape, 16-byte aligned."""

    def __init__(self, source):
        require_sm90()
        if isinstance(source, Fp8IndexerSource):
            self.kind = "wgmma_fp8"
            q, w, keys, ks = (cp.ascontiguousarray(as_device(a)) for a in source)
            for name, a, dt in (("q", q, cp.uint8), ("keys", keys, cp.uint8), ("w", w, cp.float32),
                                ("kscale", ks, cp.float32)):
                if a.dtype != dt:
                    raise TypeError(f"argument '{name}' of an Fp8IndexerSource must be {np.dtype(dt).name}"
                                    f"{' (e4m3 bits)' if dt == cp.uint8 else ''}, got {a.dtype}")
            if q.ndim != 3 or w.shape != q.shape[:2] or keys.ndim != 2 or keys.shape[1] != q.shape[2] \
                    or ks.shape != (keys.shape[0],):
                raise ValueError(f"arguments 'q', 'w', 'keys', 'kscale': shapes {q.shape}, {w.shape}, {keys.shape}, "
                                 f"{ks.shape} are not [n, H, D], [n, H], [L, D], [L]")
            self.n, H0, D0 = q.shape
            self.H, self.D = fp8_shape(H0, D0)
            if (H0, D0) != (self.H, self.D):
                qp = cp.zeros((self.n, self.H, self.D), cp.uint8)
                qp[:, :H0, :D0] = q
                wp = cp.zeros((self.n, self.H), cp.float32)
                wp[:, :H0] = w
                kp = cp.zeros((keys.shape[0], self.D), cp.uint8)
                kp[:, :D0] = keys
                q, w, keys = qp, wp, kp
            self.q, self.w, self.keys, self.kscale = (a if a.data.ptr % 16 == 0 else a.copy() for a in (q, w, keys, ks))
            self.geo = WgGeometry(self.H, self.D, 1)
            default = {fp8_shape(*s) for s in INST.SHAPES}
        else:
            if not isinstance(source, R.IndexerSource):
                raise TypeError(f"argument 'source': the wgmma variants take an IndexerSource (bf16) or an "
                                f"Fp8IndexerSource, got {type(source).__name__}")
            x = MmaSyncInputs(source.q, source.w, source.keys)
            self.kind = "wgmma"
            self.n, self.H, self.D = x.n, x.H, x.D
            self.q, self.w, self.keys = x.q, x.w, x.keys
            self.kscale = cp.zeros(1, cp.float32)          # not read by the bf16 kernels
            self.geo = WgGeometry(self.H, self.D, 2)
            default = {INST.tiled_shape(*s) for s in INST.SHAPES}
        self.L = self.keys.shape[0]
        self.shapes = INST.SHAPES if (self.H, self.D) in default else ((self.H, self.D),)

    def fn(self, stage: str):
        """hytopk_<stage>_<kind> (kind: wgmma / wgmma_fp8)."""
        return kernel("wgmma.cu", f"hytopk_{stage}_{self.kind}<{self.H}, {self.D}>", self.shapes)

    def head_args(self):
        return (self.q, self.w, self.keys, self.kscale, np.int64(self.L))

    def scan_grid(self, nq: int):
        return (self.geo.groups(nq), chunks(self.L + KT, self.geo.block_keys))

    def score_rows(self, part, lo, hi, buf, stride):
        """Recovery rows of the queries `part` into buf[len(part), stride] (_shared.recover_rows)."""
        launch(self.fn("score_rows"), self.scan_grid(part.shape[0]),
               (*self.head_args(), part, np.int32(part.shape[0]), lo, hi, buf, np.int64(stride)), self.geo.smem)


fp8_shape = INST.fp8_shape
NOTE = "wgmma m64n256 (sm_90a): keys as A, the block's (query, head) rows as B, both from shared memory"


@register("filter", "cupy.filter.wgmma", sources=("indexer",), gpu_only=True,
          notes=f"{NOTE}; ping-pong warpgroups (the MMA turn passed by named barriers), on-chip threshold "
                f"compare, candidates staged in shared memory {BF16}; fp8 e4m3 from an Fp8IndexerSource")
def filter_wgmma(source, lo, hi, T, capacity):
    return _filter(source, lo, hi, T, capacity)


def _filter(source, lo, hi, T, capacity):
    capacity = check_capacity(capacity)
    with launch_stream():
        x = WgInputs(source)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        T = cp.ascontiguousarray(cp.asarray(T, cp.float32))
        cand_idx, cand_val, count = candidate_buffers(x.n, capacity)
        launch(x.fn("filter"), x.scan_grid(x.n),
               (*x.head_args(), np.int32(x.n), lo, hi, T, np.int32(capacity), cand_idx, cand_val, count), x.geo.smem)
        return cand_idx, cand_val, count


def dense_wgmma_source(source, lo, hi):
    """[n, L] float32 table of the wgmma core's scores (-inf outside the context)."""
    with launch_stream():
        x = WgInputs(source)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        out = cp.empty((x.n, x.L), cp.float32)
        launch(x.fn("dense"), (x.geo.groups(x.n), chunks(x.L, x.geo.block_keys)),
               (*x.head_args(), np.int32(x.n), lo, hi, out), x.geo.smem)
        return out


@register("dense", "cupy.dense.wgmma", gpu_only=True, notes=f"{NOTE}, writing the table {BF16}")
def dense_wgmma(q, w, keys, lo, hi):
    return dense_wgmma_source(R.IndexerSource(q, w, keys), lo, hi)


@register("recover", "cupy.recover.wgmma", sources=("indexer",), gpu_only=True,
          notes=f"failed rows materialised by the wgmma core (same bits as its filter), exact radix top-k {BF16}")
def recover_wgmma(source, lo, hi, rows, k):
    k = check_k_fits(k)
    with launch_stream():
        x = WgInputs(source)
        return recover_rows(x, lo, hi, rows, k)


def score_only_wgmma(source, lo, hi):
    """The floor of the wgmma variants: the wgmma core over every context, nothing written
    but the wrapping uint64 sum of the order keys (uint64[1], not synchronised)."""
    with launch_stream():
        x = WgInputs(source)
        lo, hi = i32(lo, "lo"), i32(hi, "hi")
        checksum = cp.zeros(1, cp.uint64)
        launch(x.fn("score_only"), x.scan_grid(x.n), (*x.head_args(), np.int32(x.n), lo, hi, checksum), x.geo.smem)
        return checksum
