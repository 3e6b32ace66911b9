"""bf16 as raw bits (uint16): NumPy has no bfloat16, so the CuPy kernels take
bf16 inputs as uint16 arrays of their bit patterns (or torch.bfloat16 tensors).
Works on NumPy and CuPy arrays alike (``xp`` is the array module)."""
from __future__ import annotations

import numpy as np

from reference.xp import array_module as _xp


def float32_to_bf16_bits(x, xp=None):
    """Round float32 to bf16 (round to nearest, ties to even) -> uint16 bits.
    NaN stays NaN (quiet, sign kept); overflow rounds to +-inf as IEEE says."""
    xp = xp or _xp(x)
    x = xp.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"argument 'x' must be float32, got {x.dtype}")
    bits = xp.ascontiguousarray(x).view(xp.uint32)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(xp.uint16)
    nan = ((bits >> 16) | 0x0040).astype(xp.uint16)
    return xp.where(xp.isnan(x), nan, rounded)


def bf16_bits_to_float32(b, xp=None):
    """uint16 bf16 bits -> float32 (exact)."""
    xp = xp or _xp(b)
    b = xp.asarray(b)
    if b.dtype not in (np.uint16, np.int16):
        raise TypeError(f"argument 'b' must be uint16 bf16 bits, got {b.dtype}")
    return (b.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)
