"""The CuPy family: raw CUDA C++ kernels of kernels_cuda/ loaded with NVRTC
(workbench.loader: hot reload, header-aware cache key), one module per stage.

Imports (and registers its variants) wherever CuPy imports; without a GPU the
family reports itself unavailable and refuses to move arrays to the device.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .. import Family
from ._launch import as_device, gpu_status, launch_stream
from . import attend, check, dense, filter, recover, replay, select, threshold, tiled, wgmma, wgmma_ws  # noqa: F401  (register variants)
from .score_only import score_only
from .tiled import score_only_tiled

DEFAULTS = {
    "threshold": "cupy.threshold.block",
    "filter": "cupy.filter.simt",
    "check": "cupy.check.atomic",
    "select": "cupy.select.radix_bitonic",
    "recover": "cupy.recover.materialise",
    "dense": "cupy.dense.simt",
    "replay": "cupy.replay.simt",
}
# bf16 inputs (torch.bfloat16 / uint16 bits): a tensor-core core loses nothing there, so it is
# the default (the threshold too: its samples get the filter's own bits). On Hopper (sm_90a)
# the warp-specialised wgmma core, elsewhere the tiled mma.sync core; float32 inputs keep the
# exact SIMT scorer above.
TILED_BF16 = dict(DEFAULTS, threshold="cupy.threshold.tiled_mma", filter="cupy.filter.tiled_mma",
                  recover="cupy.recover.tiled_mma", dense="cupy.dense.tiled_mma", replay="cupy.replay.tiled_mma")
WS_BF16 = dict(DEFAULTS, threshold="cupy.threshold.wgmma_ws", filter="cupy.filter.wgmma_ws",
               recover="cupy.recover.wgmma_ws", dense="cupy.dense.wgmma_ws", replay="cupy.replay.wgmma_ws")


def _hopper() -> bool:
    try:
        return cp.cuda.runtime.getDeviceCount() > 0 and cp.cuda.Device().compute_capability == "90"
    except Exception:
        return False


DEFAULTS_BF16 = WS_BF16 if _hopper() else TILED_BF16
# fp8 e4m3 q/keys with per-key scales (the Backend hands them over as uint8 bits + kscale): only the
# wgmma_ws core computes them (off Hopper its inputs say so: it needs sm_90a)
DEFAULTS_FP8 = WS_BF16


class CupyFamily(Family):
    name = "cupy"
    takes_bf16_bits = True

    def available(self):
        return gpu_status()

    def to_device(self, x):
        ok, why = gpu_status()
        if not ok:
            raise RuntimeError(f"backend 'cupy' needs a CUDA GPU: {why}")
        with launch_stream():
            return as_device(x)

    def to_host(self, x):
        if isinstance(x, cp.ndarray):
            with launch_stream() as s:       # the stream the kernels ran on (torch side streams don't sync)
                out = x.get(stream=s)
                s.synchronize()
            return out
        return np.asarray(x)

    def synchronize(self):
        with launch_stream() as s:
            s.synchronize()

    def empty(self, shape, dtype):
        return cp.empty(shape, dtype)

    def place(self, dst, start, src):
        with launch_stream():
            super().place(dst, start, as_device(src))

    def call_scope(self, lo_h=None, hi_h=None, M_h=None):
        """Keys put into the wgmma_ws core's layout once per pipeline call, not once per pass;
        whether every query shares one context (the wgmma_ws threshold's fast path)."""
        return wgmma_ws.call_scope(lo_h, hi_h, M_h)

    def scatter_rows(self, dst_idx, dst_val, rows, src_idx, src_val):
        with launch_stream():
            rows = as_device(rows)
            dst_idx[rows] = src_idx
            dst_val[rows] = src_val


FAMILY = CupyFamily()

__all__ = ["FAMILY", "DEFAULTS", "score_only", "score_only_tiled", "CupyFamily"]
