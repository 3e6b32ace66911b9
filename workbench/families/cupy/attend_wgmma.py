"""Sparse attention forward on wgmma (sm_90a) for MLA's shared kv (kernels_cuda/attend_wgmma.cu).

Variant of the `attend` stage:
  cupy.attend.wgmma  one query x 64 heads per block (3 warpgroups: a cp.async gather producer, two
                     wgmma consumers); MLA only: kv [L, 576] shared rows, V = kv[:, :512]

The same function as cupy.attend.one (docs/CONTRACT.md §8: base-2 online softmax in float32, P in
bf16, out = O / l correctly rounded, lse = (m + log2 l) ln 2); results agree within the tolerance of
tests/test_attention_gpu.py, and bit for bit on exact inputs. Other layouts (GQA, other head dims)
raise a ValueError that says to use cupy.attend.one.
"""
from __future__ import annotations

import os

import cupy as cp
import numpy as np

from workbench import instantiations as INST

from ... import loader
from ...registry import register
from ._launch import launch_stream
from .attend import Bound
from .wgmma import require_sm90

FILE = "attend_wgmma.cu"


def _fn(name: str):
    opts = INST.FILE_OPTIONS.get(FILE, ())
    if os.environ.get("HYTOPK_ATTW_V_SWAP") == "1":        # probe: V's descriptor offsets swapped
        opts = opts + ("-DHYTOPK_ATTW_V_SWAP",)
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


def attend_forward_wgmma(q, k, v, idx, scale=None, *, out_dtype="bfloat16"):
    """(out [n, Hq, 512], lse float32 [n, Hq]) on a Hopper GPU; inputs as attend.attend_forward."""
    if out_dtype not in ("bfloat16", "float32"):
        raise ValueError(f"argument 'out_dtype' must be 'bfloat16' or 'float32', got {out_dtype!r}")
    require_sm90()
    with launch_stream():
        b = Bound(q, k, v, idx, scale)
        why = unsupported(b)
        if why:
            raise ValueError(f"arguments 'k', 'v': cupy.attend.wgmma {why}; use cupy.attend.one")
        out_bf16 = out_dtype == "bfloat16"
        out = cp.empty((b.n, b.Hq, b.DV), cp.uint16 if out_bf16 else cp.float32)
        lse = cp.empty((b.n, b.Hq), cp.float32)
        nhb = -(-b.Hq // INST.ATTEND_WGMMA_HEADS)            # head blocks per query: adjacent blocks
        if b.n == 0 or b.Hq == 0:
            return out, lse
        if b.n * nhb >= 2 ** 31:
            raise ValueError(f"argument 'q': {b.n} queries x {nhb} head blocks exceed one launch's 2^31 - 1 blocks")
        fn = _fn(INST.attend_wgmma_name(out_bf16))
        smem = INST.ATTEND_WGMMA_SMEM
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        fn((b.n * nhb,), (INST.ATTEND_WGMMA_THREADS,),
           (b.q, b.k, np.int64(b.k_stride), b.idx, np.int32(b.kk), np.int32(b.n), np.int64(b.L), np.int32(b.Hq),
            np.int32(nhb), b.scale_log2, out, lse), shared_mem=smem)
        return out, lse


@register("attend", "cupy.attend.wgmma", gpu_only=True)
def attend_wgmma(q, k, v, idx, scale=None):
    """MLA on wgmma (sm_90a): 64 heads x one query per block, a gather producer and two MMA warpgroups."""
    return attend_forward_wgmma(q, k, v, idx, scale, out_dtype="float32")
