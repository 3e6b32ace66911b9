"""Sparse attention forward on wgmma (sm_90a), version 2 (kernels_cuda/attend_wgmma2.cu).

Variants of the `attend` stage, MLA only (kv [L, 576] shared rows, V = kv[:, :512]); the same function
as cupy.attend.one (docs/CONTRACT.md §8: base-2 online softmax in float32, P in bf16, out = O / l
correctly rounded, lse = (m + log2 l) ln 2), bit for bit on exact inputs; other layouts raise a
ValueError that says to use cupy.attend.one:
  cupy.attend.wgmma2   one query x 64 heads per block (3 warpgroups: a cp.async gather producer with
                       its index loads one tile ahead, two wgmma consumers). Version 1 (2026-12-01,
                       removed: wgmma2 gives its bits, faster) loaded each tile's indices in the loop
  cupy.attend.wgmma2c  the same, the two head blocks of a query as a 2-CTA cluster: each gathers
                       half of every key tile from L2 and copies it into the other's shared memory
  cupy.attend.wgmma2s  wgmma2 with the key tile in the 128-byte-swizzle layout, so the gather reads
                       whole 32-byte sectors (wgmma2's copies read each sector twice)
  cupy.attend.wgmma2sc both (swizzled tile, 2-CTA cluster)
  cupy.attend.wgmma2sp wgmma2s with two adjacent queries per block over the union of their
                       selections (as cupy.attend.pair; at most 32 heads: rows = 2 x heads, the
                       rest zero rows): half the key tiles of one query per block at 8 or 16 heads
"""
from __future__ import annotations

import os

import cupy as cp
import numpy as np

from workbench import instantiations as INST

from ... import loader
from ...registry import register
from ._launch import launch_stream
from .attend import NULL, Bound, pair_union
from .wgmma import require_sm90

FILE = "attend_wgmma2.cu"
PAIR_MAX_K = 1 << 15         # qpt 2: a slot's two counts are 16-bit fields (kk < 2^15 keeps them exact)


def _fn(name: str):
    opts = INST.FILE_OPTIONS[FILE]
    if os.environ.get("HYTOPK_ATTW2_V_SWAP") == "1":       # probe: the swizzled V descriptor's offsets swapped
        opts = opts + ("-DHYTOPK_ATTW2_V_SWAP",)
    return loader.module(FILE, (name,), options=opts).function(name)


def unsupported(b: Bound) -> str | None:
    """Why the wgmma kernel cannot take these inputs (None: it can)."""
    DQK, DV = INST.ATTEND_WGMMA_DIMS
    if not b.shared or b.Hkv != 1:
        return "needs MLA's shared kv (k = kv[:, None, :], v = kv[:, None, :d_v])"
    if b.d_qk != DQK or b.d_v != DV:
        return f"needs d_qk {DQK} and d_v {DV}, got {b.d_qk} and {b.d_v}"
    if b.k_stride % 8 or b.k.data.ptr % 16:
        return "needs 16-byte aligned kv rows"
    return None


def attend_forward_wgmma2(q, k, v, idx, scale=None, *, out_dtype="bfloat16", cluster=False, swz=False, qpt=1):
    """(out [n, Hq, 512], lse float32 [n, Hq]) on a Hopper GPU; inputs as attend.attend_forward.

    cluster: False, the one-block kernel; True, the 2-CTA cluster kernel (head blocks per query
    rounded up to even: at Hq <= 64 or 129..192 the extra block computes zero heads, so "auto"
    takes the cluster only when ceil(Hq / 64) is already even). swz: the 128-byte-swizzled key tile.
    qpt 2: two adjacent queries per block over their union (attend.pair_union; swz, no cluster,
    Hq <= 32)."""
    if out_dtype not in ("bfloat16", "float32"):
        raise ValueError(f"argument 'out_dtype' must be 'bfloat16' or 'float32', got {out_dtype!r}")
    if cluster not in (False, True, "auto"):
        raise ValueError(f"argument 'cluster' must be False, True or 'auto', got {cluster!r}")
    if qpt not in (1, 2) or (qpt == 2 and (cluster or not swz)):
        raise ValueError(f"argument 'qpt' must be 1, or 2 with swz and no cluster, got qpt={qpt!r}, "
                         f"cluster={cluster!r}, swz={swz!r}")
    require_sm90()
    with launch_stream():
        b = Bound(q, k, v, idx, scale)
        why = unsupported(b)
        if why:
            raise ValueError(f"arguments 'k', 'v': cupy.attend.wgmma2 {why}; use cupy.attend.one")
        if qpt == 2 and 2 * b.Hq > INST.ATTEND_WGMMA_HEADS:
            raise ValueError(f"argument 'q': a query pair per block takes at most {INST.ATTEND_WGMMA_HEADS // 2} "
                             f"heads, got {b.Hq}; use qpt=1")
        out_bf16 = out_dtype == "bfloat16"
        out = cp.empty((b.n, b.Hq, b.DV), cp.uint16 if out_bf16 else cp.float32)
        lse = cp.empty((b.n, b.Hq), cp.float32)
        nhb = -(-b.Hq // INST.ATTEND_WGMMA_HEADS)            # head blocks per query: adjacent blocks
        if cluster == "auto":
            cluster = nhb % 2 == 0
        if cluster:
            nhb += nhb % 2                                   # a cluster = head blocks 2j, 2j+1 of one query
        if b.n == 0 or b.Hq == 0:
            return out, lse
        if b.n * nhb >= 2 ** 31:
            raise ValueError(f"argument 'q': {b.n} queries x {nhb} head blocks exceed one launch's 2^31 - 1 blocks")
        if qpt == 2:                                         # the pairs' union rows (their widths: 2 kk)
            if b.kk >= PAIR_MAX_K:
                raise ValueError(f"argument 'idx': a query pair per block takes kk < {PAIR_MAX_K}, got {b.kk}")
            lst, mult, lens = pair_union(b.idx, b.L)
            blocks, width = lst.shape[0], lst.shape[1]
        else:
            lst, mult, lens, blocks, width = b.idx, NULL, NULL, b.n * nhb, b.kk
        fn = _fn(INST.attend_wgmma2_name(out_bf16, bool(cluster), bool(swz), qpt))
        smem = INST.ATTEND_WGMMA2_SMEM
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        head = (b.q, b.k, np.int64(b.k_stride), lst) + (() if cluster else (lens, mult))
        fn((blocks,), (INST.ATTEND_WGMMA_THREADS,),
           head + (np.int32(width), np.int32(b.n), np.int64(b.L), np.int32(b.Hq), np.int32(nhb), b.scale_log2, out,
                   lse), shared_mem=smem)
        return out, lse


@register("attend", "cupy.attend.wgmma2", gpu_only=True)
def attend_wgmma2(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), version 2: the gather's index loads one tile ahead."""
    return attend_forward_wgmma2(q, k, v, idx, scale, out_dtype="float32", cluster=False)


@register("attend", "cupy.attend.wgmma2c", gpu_only=True)
def attend_wgmma2c(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), version 2 with a 2-CTA cluster per query sharing the gather (even head blocks)."""
    return attend_forward_wgmma2(q, k, v, idx, scale, out_dtype="float32", cluster="auto")


@register("attend", "cupy.attend.wgmma2s", gpu_only=True)
def attend_wgmma2s(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), version 2 with the 128-byte-swizzled key tile (full-sector gather)."""
    return attend_forward_wgmma2(q, k, v, idx, scale, out_dtype="float32", cluster=False, swz=True)


@register("attend", "cupy.attend.wgmma2sc", gpu_only=True)
def attend_wgmma2sc(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), version 2: swizzled key tile and the 2-CTA cluster (even head blocks)."""
    return attend_forward_wgmma2(q, k, v, idx, scale, out_dtype="float32", cluster="auto", swz=True)


@register("attend", "cupy.attend.wgmma2sp", gpu_only=True)
def attend_wgmma2sp(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a), wgmma2s with two adjacent queries per block over their union (<= 32 heads)."""
    return attend_forward_wgmma2(q, k, v, idx, scale, out_dtype="float32", swz=True, qpt=2)
