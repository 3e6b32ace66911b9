"""The Numba CUDA family: one module per stage, each with a block-level variant
(runs in the CUDA simulator) and a GPU-only variant written for speed.

Array moves: NumPy is copied in; anything with __cuda_array_interface__ (CuPy,
torch CUDA tensors, Numba arrays) is wrapped zero-copy; bf16 torch tensors are
converted to float32 on the device first (Numba has no bf16 arrays); fp8 e4m3 q/keys
arrive as float32 values (decoded by the Backend) with their float32 key scales.
"""
from __future__ import annotations

import contextlib

import numpy as np
from numba import cuda

from .. import Family
from . import check, common, dense, filter, recover, replay, rows, select, threshold, tile  # noqa: F401  (registers variants)
from .common import BLOCK, SIM


class NumbaFamily(Family):
    name = "numba"
    preference = 1              # the torch ops' choice after CuPy
    runs_on = "host" if SIM else "gpu"
    takes_fp8_bits = False      # fp8 e4m3 q/keys arrive decoded to float32 (the Backend widens them), kscale beside
    simulated = SIM             # tests skip gpu_only variants in the simulator

    def stream_scope(self, ptr, device=0):
        """Nothing to do: every launch reads PyTorch's current stream itself (common.stream)."""
        return contextlib.nullcontext()

    def available(self):
        if SIM:
            return True, ""
        try:
            if cuda.is_available():
                return True, ""
        except Exception as e:          # broken driver install: say so
            return False, f"numba cannot reach a CUDA driver: {type(e).__name__}: {e}"
        return False, ("no CUDA GPU or driver for Numba here "
                       "(set NUMBA_ENABLE_CUDASIM=1 before importing numba to use the simulator)")

    def to_device(self, x):
        if isinstance(x, np.ndarray):
            if x.size == 0:
                return cuda.device_array(x.shape, x.dtype)
            return cuda.to_device(np.ascontiguousarray(x), stream=common.stream())
        if type(x).__module__.split(".", 1)[0] == "torch":
            import torch
            if x.dtype == torch.bfloat16:
                x = x.float()
            if x.device.type == "cpu":
                return cuda.to_device(np.ascontiguousarray(x.detach().numpy()), stream=common.stream())
            return cuda.as_cuda_array(x.detach())
        if cuda.is_cuda_array(x):
            return cuda.as_cuda_array(x)
        return cuda.to_device(np.ascontiguousarray(np.asarray(x)), stream=common.stream())

    def to_host(self, x) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return x
        if not hasattr(x, "copy_to_host"):
            x = cuda.as_cuda_array(x)
        return common.host(x)

    def synchronize(self):
        common.stream().synchronize()

    def empty(self, shape, dtype):
        return cuda.device_array(shape, dtype, stream=common.stream())

    def place(self, dst, start, src):
        if src.size:
            dst[start:start + int(src.shape[0])].copy_to_device(src, stream=common.stream())

    def scatter_rows(self, dst_idx, dst_val, rows, src_idx, src_val):
        nr, k = int(rows.shape[0]), int(src_idx.shape[1])
        if nr == 0 or k == 0:
            return
        common.scatter_rows_kernel[(common.blocks(nr, 8), common.blocks(k, 32)), (8, 32), common.stream()](
            dst_idx, dst_val, rows, src_idx, src_val)


_FAST = {
    "threshold": "numba.threshold.warp", "filter": "numba.filter.warp",
    "check": "numba.check.warp", "select": "numba.select.warp",
    "recover": "numba.recover.warp", "dense": "numba.dense.tiled",
    "replay": "numba.replay.tiled",
}
_SIM = {stage: name.replace(".warp", ".block") for stage, name in _FAST.items()}
# The backend's variant per stage: block-level ones in the simulator, fast ones on a GPU.
FAMILY = NumbaFamily(defaults={"float32": _SIM if SIM else _FAST})
