"""Timing: warm-up, median of repeats, L2 flushed and inputs rotated between
repeats; CUDA events on a GPU, a perf_counter fallback on CPU; peak extra memory.
"""
from __future__ import annotations

import os
import statistics
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Callable, Sequence

L2_FLUSH_BYTES = 256 << 20      # H200 L2 is 60 MB: writing 256 MB evicts it


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    repeats: list = field(default_factory=list)


def gpu_available() -> bool:
    """A CUDA GPU the harness may use. NUMBA_ENABLE_CUDASIM=1 asks for the CPU path
    (Numba variants in the simulator cannot take GPU arrays): then False even on a GPU machine."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


class CpuTimer:
    """Wall-clock timer for the CPU path (reference and simulator variants)."""
    device = "cpu"

    def sync(self):
        pass

    def flush(self):
        pass

    def time(self, fn: Callable, arg_sets: Sequence[tuple], warmup=1, repeats=3) -> Timing:
        for i in range(warmup):
            fn(*arg_sets[i % len(arg_sets)])
        times = []
        for i in range(repeats):
            args = arg_sets[i % len(arg_sets)]
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
        return Timing(statistics.median(times), min(times), times)

    def peak_extra_bytes(self, fn: Callable, args: tuple) -> int:
        """NumPy reports its allocations to tracemalloc: the peak over one call."""
        tracemalloc.start()
        try:
            fn(*args)
            return int(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()


class CudaTimer:
    """CUDA events around each call. Variants launch on CuPy, Numba or torch
    streams; a device-wide sync before the end event makes the measurement
    cover all of them (a few microseconds of overhead on millisecond kernels)."""
    device = "cuda"

    def __init__(self):
        import torch
        self.torch = torch
        self._flush_buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def sync(self):
        self.torch.cuda.synchronize()

    def flush(self):
        self._flush_buf.zero_()

    def time(self, fn: Callable, arg_sets: Sequence[tuple], warmup=2, repeats=10) -> Timing:
        torch = self.torch
        for i in range(warmup):
            fn(*arg_sets[i % len(arg_sets)])
        self.sync()
        times = []
        for i in range(repeats):
            args = arg_sets[i % len(arg_sets)]      # rotated inputs: not already in L2
            self.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.sync()
            start.record()
            fn(*args)
            self.sync()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return Timing(statistics.median(times), min(times), times)

    def peak_extra_bytes(self, fn: Callable, args: tuple) -> int:
        """Largest of: torch's peak allocation growth, CuPy pool growth, and the
        driver-level drop in free memory (Numba allocates directly)."""
        torch = self.torch
        self.sync()
        torch.cuda.reset_peak_memory_stats()
        base_torch = torch.cuda.memory_allocated()
        pool = None
        try:
            import cupy
            pool = cupy.get_default_memory_pool()
            pool.free_all_blocks()
            base_pool = pool.total_bytes()
        except Exception:
            pool = None
        free0 = torch.cuda.mem_get_info()[0]
        out = fn(*args)
        self.sync()
        free1 = torch.cuda.mem_get_info()[0]
        extra = max(0, torch.cuda.max_memory_allocated() - base_torch, free0 - free1)
        if pool is not None:
            extra = max(extra, pool.total_bytes() - base_pool)
        del out
        return int(extra)


def make_timer(device: str):
    return CudaTimer() if device == "cuda" else CpuTimer()


def gemm_tflops(timer) -> float:
    """Dense GEMM rate measured now: bf16 8192^3 on a GPU, float32 512^3 on CPU."""
    import torch
    if timer.device == "cuda":
        N, dt = 8192, torch.bfloat16
        a = torch.randn(N, N, device="cuda", dtype=dt)
        b = torch.randn(N, N, device="cuda", dtype=dt)
        t = timer.time(lambda x, y: torch.matmul(x, y), [(a, b)], warmup=3, repeats=10)
    else:
        N = 512
        a, b = torch.randn(N, N), torch.randn(N, N)
        t = timer.time(lambda x, y: torch.matmul(x, y), [(a, b)], warmup=1, repeats=5)
    return 2.0 * N ** 3 / (t.median_ms * 1e-3) / 1e12


def copy_gbps(timer) -> float:
    """Device copy bandwidth (read + write bytes per second) measured now."""
    import torch
    nbytes = (1 << 30) if timer.device == "cuda" else (64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=timer.device).fill_(1.0)
    dst = torch.empty_like(src)
    t = timer.time(lambda d, s: d.copy_(s), [(dst, src)], warmup=2, repeats=5)
    return 2.0 * nbytes / (t.median_ms * 1e-3) / 1e9
