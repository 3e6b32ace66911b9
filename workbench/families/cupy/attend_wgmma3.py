"""Sparse attention forward on wgmma (sm_90a), version 3 (kernels_cuda/attend_wgmma3.cu).

Variant of the `attend` stage (MLA only, the same function as cupy.attend.wgmma2*, other
rounding: compared with the reference within tolerance, not bitwise with wgmma2):
  cupy.attend.wgmma3   FlashMLA's sm90 schedule: a pair of 64-key tiles per step, one S per consumer
                       warpgroup (N = 64), O split by columns, each warpgroup's own P from registers
                       and the other's through shared memory, the row max chained through the pair;
                       stages released in two regions; version 2s's swizzled gather. The op's
                       forward above 32 heads per kv head.
  cupy.attend.wgmma3p  the same with two adjacent queries per block over the union of their
                       selections (as wgmma2sp; at most 32 heads: rows = 2 x heads, the rest zero
                       rows): one gather of the shared keys for both queries at 8 or 16 heads; the
                       sorted union taken interleaved. Slower than wgmma2sp (run 5 of
                       results/h200-2026-12-02-s5: 3.86 against 3.58 ms at 16 heads), so not the op's
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from workbench import instantiations as INST

from ... import loader
from ...cubin_info import check_launch
from ...registry import register
from ._launch import launch_stream
from .attend import NULL, Bound, pair_union
from .attend_wgmma2 import PAIR_MAX_K, unsupported
from .wgmma import require_sm90

FILE = "attend_wgmma3.cu"


_FITS: dict[int, object] = {}     # id -> function already checked (held, so ids are not reused)


def _fn(name: str):
    fn = loader.module(FILE, (name,), options=INST.FILE_OPTIONS[FILE]).function(name)
    if id(fn) not in _FITS:           # a launch that cannot fit says why (registers x threads)
        check_launch(fn.num_regs, fn.max_threads_per_block, INST.ATTEND_WGMMA3_THREADS, name,
                     roles=INST.ATTEND_WGMMA3_ROLES)
        _FITS[id(fn)] = fn
    return fn


def attend_forward_wgmma3(q, k, v, idx, scale=None, *, out_dtype="bfloat16", qpt=1, prefetch=None, interleave=None):
    """(out [n, Hq, 512], lse float32 [n, Hq]) on a Hopper GPU; inputs as attend.attend_forward.
    qpt 2: two adjacent queries per block over their union (attend.pair_union; Hq <= 32).
    prefetch: how many pairs of key tiles ahead the producer pulls rows into L2 (0: none; None:
    INST.ATTEND_WGMMA3_PREFETCH). interleave: tile t of a list of T
    tiles takes its slots t, t + T, ... (every tile spans a sorted list's key range; other rounding),
    else 64 consecutive slots (None: INST.attend_wgmma3_interleave(qpt))."""
    if out_dtype not in ("bfloat16", "float32"):
        raise ValueError(f"argument 'out_dtype' must be 'bfloat16' or 'float32', got {out_dtype!r}")
    if qpt not in (1, 2) or isinstance(qpt, bool):
        raise ValueError(f"argument 'qpt' must be 1 or 2, got {qpt!r}")
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, (int, np.integer))
                                 or not 0 <= prefetch <= 8):
        raise ValueError(f"argument 'prefetch' must be None or an int in [0, 8], got {prefetch!r}")
    if interleave is not None and not isinstance(interleave, (bool, np.bool_)):
        raise ValueError(f"argument 'interleave' must be None or a bool, got {interleave!r}")
    name = "cupy.attend.wgmma3p" if qpt == 2 else "cupy.attend.wgmma3"
    require_sm90()
    with launch_stream():
        b = Bound(q, k, v, idx, scale)
        why = unsupported(b)
        if why:
            raise ValueError(f"arguments 'k', 'v': {name} {why}; use cupy.attend.one")
        if qpt == 2 and 2 * b.Hq > INST.ATTEND_WGMMA_HEADS:
            raise ValueError(f"argument 'q': a query pair per block takes at most {INST.ATTEND_WGMMA_HEADS // 2} "
                             f"heads, got {b.Hq}; use qpt=1")
        if qpt == 2 and b.kk >= PAIR_MAX_K:
            raise ValueError(f"argument 'idx': a query pair per block takes kk < {PAIR_MAX_K}, got {b.kk}")
        out_bf16 = out_dtype == "bfloat16"
        out = cp.empty((b.n, b.Hq, b.DV), cp.uint16 if out_bf16 else cp.float32)
        lse = cp.empty((b.n, b.Hq), cp.float32)
        nhb = -(-b.Hq // INST.ATTEND_WGMMA_HEADS)            # head blocks per query: adjacent blocks
        prefetch = INST.ATTEND_WGMMA3_PREFETCH if prefetch is None else int(prefetch)
        interleave = INST.attend_wgmma3_interleave(qpt) if interleave is None else bool(interleave)
        if b.n == 0 or b.Hq == 0:
            return out, lse
        if b.n * nhb >= 2 ** 31:
            raise ValueError(f"argument 'q': {b.n} queries x {nhb} head blocks exceed one launch's 2^31 - 1 blocks")
        if qpt == 2:                                         # the pairs' union rows (their widths: 2 kk)
            lst, mult, lens = pair_union(b.idx, b.L)
            blocks, width = lst.shape[0], lst.shape[1]
        else:
            lst, mult, lens, blocks, width = b.idx, NULL, NULL, b.n * nhb, b.kk
        fn = _fn(INST.attend_wgmma3_name(out_bf16, qpt))
        smem = INST.ATTEND_WGMMA3_SMEM
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        fn((blocks,), (INST.ATTEND_WGMMA3_THREADS,),
           (b.q, b.k, np.int64(b.k_stride), lst, lens, mult, np.int32(width), np.int32(b.n), np.int64(b.L),
            np.int32(b.Hq), np.int32(nhb), np.int32(prefetch), np.int32(bool(interleave)), b.scale_log2, out, lse), shared_mem=smem)
        return out, lse


@register("attend", "cupy.attend.wgmma3", gpu_only=True)
def attend_wgmma3(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), version 3: per-warpgroup 64-key tiles, chained max, P exchange."""
    return attend_forward_wgmma3(q, k, v, idx, scale, out_dtype="float32")


@register("attend", "cupy.attend.wgmma3p", gpu_only=True)
def attend_wgmma3p(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), version 3 with two adjacent queries per block over their union (<= 32 heads)."""
    return attend_forward_wgmma3(q, k, v, idx, scale, out_dtype="float32", qpt=2)
