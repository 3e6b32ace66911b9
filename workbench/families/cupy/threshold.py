"""Stages 1-4 on the GPU: sampled threshold, one block per query."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...registry import register
from . import _scope
from ._launch import MAX_SAMPLES, RADIX, bind, i32, kernel, launch, launch_stream


@register("threshold", "cupy.threshold.block", gpu_only=True)
def threshold(source, lo, hi, M, r):
    """r-th best of the M samples by an in-block radix select over order keys."""
    with launch_stream():
        M = i32(M, "M")
        # a direct call's M is checked (a sync); in a pipeline call M is the contract's
        # sample plan, num_samples(c) <= MAX_SAMPLES, known on the host
        if _scope.current() is None and M.size and int(M.max()) > MAX_SAMPLES:
            raise ValueError(f"argument 'M': at most {MAX_SAMPLES} samples per query")
        return threshold_unchecked(source, lo, hi, M, r)


def threshold_unchecked(source, lo, hi, M, r):
    """The block threshold without the host-side check of M (no sync); the kernel
    itself never reads past MAX_SAMPLES samples."""
    with launch_stream():
        src = bind(source)
        lo, hi, M, r = i32(lo, "lo"), i32(hi, "hi"), i32(M, "M"), i32(r, "r")
        T = cp.empty(src.n, cp.float32)
        fn = kernel("threshold.cu", f"hytopk_threshold<{src.cxx}>", src.shapes)
        smem = 4 * (src.smem_floats + MAX_SAMPLES + RADIX + 4)
        launch(fn, (src.n,), (*src.args, np.int32(src.n), lo, hi, M, r, T), smem)
        return T
