"""``CapturedSelect``: torch.ops.hytopk.select captured once into a CUDA graph, replayed per call.

    sel = workbench.torch.CapturedSelect(q, w, keys, lo, hi, k)     # warm-up + capture (once)
    idx, val = sel(q2, w2, keys2)       # new values copied into the static inputs, one graph replay
    sel.q.copy_(...); idx, val = sel()  # or write the static inputs yourself: the replay only

The eager op pays Python per launch (its plan is cached, but each call still issues its
~100-300 kernels through CuPy) and waits for the check's failed count; a replay is one
cudaGraphLaunch of the capture-safe run (device-side recovery, no host sync), whose host time
grows only with the graph's node count. Same bits as the eager op (tests/test_plan_gpu.py).

Static buffers, as torch.cuda.graphs has them: the tensors given at construction ARE the graph's
inputs (no copy is made; a call with those same tensors copies nothing); lo/hi are the layout,
fixed for the object's life (a new layout: a new CapturedSelect). ``idx``/``val`` are the same
two tensors after every call: clone them to keep a result past the next call.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from reference import dtypes as DT
from reference import validate as V


def _check_cuda(**tensors):
    for name, x in tensors.items():
        if not isinstance(x, Tensor):
            raise TypeError(f"argument '{name}' must be a torch.Tensor, got {type(x).__name__}")
    for name, x in tensors.items():
        if x.device.type != "cuda":
            raise ValueError(f"argument '{name}' must be a CUDA tensor (a CUDA graph replays GPU work), "
                             f"got device {x.device}")


def _check_like(name: str, x, static: Tensor):
    """x may replace the static input ``static``: a tensor of its shape, dtype and device."""
    if not isinstance(x, Tensor):
        raise TypeError(f"argument '{name}' must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != static.shape or x.dtype != static.dtype or x.device != static.device:
        raise ValueError(f"argument '{name}': {tuple(x.shape)} {x.dtype} on {x.device} does not match the captured "
                         f"input {tuple(static.shape)} {static.dtype} on {static.device} (capture a new "
                         f"CapturedSelect for new shapes)")


class CapturedSelect:
    """torch.ops.hytopk.select(q, w, keys, lo, hi, k, ...) as a CUDA graph (see the module doc)."""

    def __init__(self, q: Tensor, w: Tensor, keys: Tensor, lo: Tensor, hi: Tensor, k: int, *,
                 kscale: Optional[Tensor] = None, capacity: Optional[int] = None, oversample: float = 3.0,
                 max_failed: int = 64, pool=None):
        tensors = dict(q=q, w=w, keys=keys, lo=lo, hi=hi)
        if kscale is not None:
            tensors["kscale"] = kscale
        _check_cuda(**tensors)
        DT.check_indexer_args(q, w, keys, kscale)
        V.check_same_device(**tensors)
        for name, x in tensors.items():
            if not x.is_contiguous():
                raise ValueError(f"argument '{name}' must be contiguous (it becomes a static graph input)")
        self.q, self.w, self.keys, self.kscale, self.lo, self.hi = q, w, keys, kscale, lo, hi
        self.k, self.capacity, self.oversample, self.max_failed = int(k), capacity, float(oversample), int(max_failed)
        # warm-up on a side stream (torch.cuda.graph's rule): the eager call checks lo/hi on the
        # host, makes the layout's plan (plans.py) and compiles the kernels; its result is the
        # reference the first replay must equal
        side = torch.cuda.Stream(device=q.device)
        side.wait_stream(torch.cuda.current_stream(q.device))
        with torch.cuda.stream(side):
            self._op()
        torch.cuda.current_stream(q.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.idx, self.val = self._op()

    def _op(self):
        return torch.ops.hytopk.select(self.q, self.w, self.keys, self.lo, self.hi, self.k, self.capacity,
                                       self.oversample, self.max_failed, self.kscale)

    def __call__(self, q: Optional[Tensor] = None, w: Optional[Tensor] = None, keys: Optional[Tensor] = None, *,
                 kscale: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """(idx, val) of the given inputs (None: the static input as it holds now). An input that
        is not the static tensor itself is copied into it (same shape and dtype) first."""
        for name, x in (("q", q), ("w", w), ("keys", keys), ("kscale", kscale)):
            if x is None:
                continue
            static = getattr(self, name)
            if x is static:
                continue
            if static is None:
                raise ValueError(f"argument '{name}': this CapturedSelect was captured without {name}")
            _check_like(name, x, static)
            static.copy_(x)
        self.graph.replay()
        return self.idx, self.val

    def replay(self) -> tuple[Tensor, Tensor]:
        """The replay alone (the static inputs as they hold now)."""
        self.graph.replay()
        return self.idx, self.val

    def __repr__(self):
        return (f"CapturedSelect(n={self.q.shape[0]}, L={self.keys.shape[0]}, k={self.k}, "
                f"dtype={self.q.dtype}, max_failed={self.max_failed})")
