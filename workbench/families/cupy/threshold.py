"""Stages 1-4 on the GPU: sampled threshold, one block per query."""
from __future__ import annotations

from ...registry import register
from . import _scope
from ._launch import MAX_SAMPLES, i32, launch_stream
from ._shared import block_threshold


@register("threshold", "cupy.threshold.block", gpu_only=True)
def threshold(source, lo, hi, M, r):
    """r-th best of the M samples by an in-block radix select over order keys."""
    with launch_stream():
        M = i32(M, "M")
        # a direct call's M is checked (a sync); in a pipeline call M is the contract's
        # sample plan, num_samples(c) <= MAX_SAMPLES, known on the host
        if _scope.current() is None and M.size and int(M.max()) > MAX_SAMPLES:
            raise ValueError(f"argument 'M': at most {MAX_SAMPLES} samples per query")
        return block_threshold(source, lo, hi, M, r)
