"""Timing: warm-up, then repeats until the median is known to within the noise or a time
budget ends (as triton's do_bench fills a time budget), reported as quantiles; L2 flushed and
inputs rotated between repeats on a GPU; CUDA events there, perf_counter on CPU; peak extra memory.

The median's uncertainty is the half-width of its ~95% confidence interval, 1.57 * IQR /
sqrt(n) (the notch of a box plot). Repeats stop once that is below `target` of the median
(after at least `min_repeats`), when `budget_s` is spent, or at `max_repeats`; an explicit
`repeats` runs exactly that many. `watch` calls a change real only when the two intervals
do not overlap (`Timing.differs`).
"""
from __future__ import annotations

import math
import os
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

L2_FLUSH_BYTES = 256 << 20      # H200 L2 is 60 MB: writing 256 MB evicts it
CI_FACTOR = 1.57                # median +- 1.57 IQR / sqrt(n): ~95% interval of the median
CPU_POLICY = dict(min_repeats=5, max_repeats=1000, budget_s=0.25, target=0.02)
GPU_POLICY = dict(min_repeats=5, max_repeats=100, budget_s=0.5, target=0.01)


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    repeats: list = field(default_factory=list)     # every timed sample, in order (ms)
    q25_ms: float = 0.0
    q75_ms: float = 0.0
    max_ms: float = 0.0

    @classmethod
    def of(cls, times: Sequence[float]) -> "Timing":
        a = np.asarray(times, np.float64)
        q25, med, q75 = (float(x) for x in np.percentile(a, (25, 50, 75)))
        return cls(med, float(a.min()), [float(x) for x in a], q25, q75, float(a.max()))

    @property
    def n(self) -> int:
        return len(self.repeats)

    @property
    def ci_ms(self) -> float:
        """Half-width of the median's ~95% interval (inf from one sample: unknown)."""
        return CI_FACTOR * (self.q75_ms - self.q25_ms) / math.sqrt(self.n) if self.n > 1 else math.inf

    def spread(self) -> dict:
        """The JSON record: quantiles, extremes, the repeat count and the median's interval."""
        return dict(median_ms=self.median_ms, q25_ms=self.q25_ms, q75_ms=self.q75_ms, min_ms=self.min_ms,
                    max_ms=self.max_ms, repeats=self.n, ci_ms=None if self.n < 2 else self.ci_ms)


def median_ci_rel(times: Sequence[float]) -> float:
    """The median's interval half-width over the median, from samples."""
    if len(times) < 2:
        return math.inf
    q25, med, q75 = np.percentile(times, (25, 50, 75))
    return CI_FACTOR * (q75 - q25) / math.sqrt(len(times)) / med if med > 0 else math.inf


def differs(a: dict | None, b: dict | None) -> bool | None:
    """Is b's median outside a's noise? Two spreads (Timing.spread()) whose medians' intervals do
    not overlap; None when either interval is unknown (a single sample)."""
    if not a or not b or a.get("ci_ms") is None or b.get("ci_ms") is None:
        return None
    return abs(b["median_ms"] - a["median_ms"]) > a["ci_ms"] + b["ci_ms"]


def repeat(sample: Callable[[int], float], repeats: int | None = None, *, min_repeats=5, max_repeats=1000,
           budget_s=0.25, target=0.02) -> Timing:
    """sample(i) -> ms, called until the median is known to ``target`` (relative), the budget is
    spent or max_repeats is reached (never fewer than min_repeats); exactly ``repeats`` if given."""
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while True:
        times.append(sample(len(times)))
        n = len(times)
        if repeats is not None:
            if n >= repeats:
                break
        elif n >= max_repeats:
            break
        elif n >= min_repeats and (time.perf_counter() >= deadline
                                   or ((n < 64 or n % 8 == 0) and median_ci_rel(times) <= target)):
            break
    return Timing.of(times)


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

    def time(self, fn: Callable, arg_sets: Sequence[tuple], warmup=1, repeats=None, **policy) -> Timing:
        for i in range(warmup):
            fn(*arg_sets[i % len(arg_sets)])

        def sample(i):
            args = arg_sets[i % len(arg_sets)]
            t0 = time.perf_counter()
            fn(*args)
            return (time.perf_counter() - t0) * 1e3
        return repeat(sample, repeats, **{**CPU_POLICY, **policy})

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

    def time(self, fn: Callable, arg_sets: Sequence[tuple], warmup=2, repeats=None, **policy) -> Timing:
        torch = self.torch
        for i in range(warmup):
            fn(*arg_sets[i % len(arg_sets)])
        self.sync()

        def sample(i):
            args = arg_sets[i % len(arg_sets)]      # rotated inputs: not already in L2
            self.flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.sync()
            start.record()
            fn(*args)
            self.sync()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return repeat(sample, repeats, **{**GPU_POLICY, **policy})

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
        t = timer.time(lambda x, y: torch.matmul(x, y), [(a, b)], warmup=3)
    else:
        N = 512
        a, b = torch.randn(N, N), torch.randn(N, N)
        t = timer.time(lambda x, y: torch.matmul(x, y), [(a, b)], warmup=1)
    return 2.0 * N ** 3 / (t.median_ms * 1e-3) / 1e12


def copy_gbps(timer) -> float:
    """Device copy bandwidth (read + write bytes per second) measured now."""
    import torch
    nbytes = (1 << 30) if timer.device == "cuda" else (64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=timer.device).fill_(1.0)
    dst = torch.empty_like(src)
    t = timer.time(lambda d, s: d.copy_(s), [(dst, src)], warmup=2)
    return 2.0 * nbytes / (t.median_ms * 1e-3) / 1e9
