"""Kernel families: how each moves arrays to and from its device.

A family module (reference.py, numba/, cupy/) registers its stage variants in
`workbench.registry` on import and exposes `FAMILY`, a `Family` instance.
"""
from __future__ import annotations

import contextlib
import importlib

import numpy as np


class Family:
    """The one record of a family: its stage sets per input kind, where it runs, its place in the
    order of preference, its availability (and why not), its stream adapter and its array moves.
    The Backend, the harness and the torch ops read these; nothing else names a family's facts."""
    name = "?"
    runs_on = "gpu"             # "host": NumPy on the CPU (the reference, the Numba simulator); "gpu"
    simulated = False           # True: the Numba CUDA simulator (tests skip gpu_only variants there)
    # the torch ops try families in this order (lower first), and compare runs their rows in it;
    # None: never picked by the torch ops (compare runs its rows last)
    preference: int | None = None
    takes_bf16_bits = False     # True: its kernels read uint16 bf16 bits; else the Backend widens them to float32
    # fp8 e4m3 q/keys: True = its stages read the uint8 bits (an Fp8IndexerSource of bits + float32 kscale);
    # False = the Backend decodes them to float32 values first (exact) and passes kscale beside
    takes_fp8_bits = True

    def __init__(self, defaults: dict | None = None):
        # input kind ("float32" | "bf16" | "fp8") -> {stage: variant name}; a kind it lacks runs "float32"'s
        self.defaults = {kind: dict(st) for kind, st in (defaults or {}).items()}

    def stage_defaults(self, kind: str = "float32") -> dict:
        """{stage: variant name} for inputs of ``kind``: its own set, else the float32 one."""
        return dict(self.defaults.get(kind) or self.defaults.get("float32", {}))

    def stream_scope(self, ptr: int, device: int = 0):
        """A context in which this family's launches go to the CUDA stream ``ptr`` (PyTorch's
        current stream, read by the caller at every call), or None when they cannot: the caller
        then orders the work by hand (waits for ``ptr`` before, synchronizes the family after)."""
        return None

    def available(self) -> tuple[bool, str]:
        """(usable here, reason if not)."""
        return True, ""

    def to_device(self, x):
        """Any host or device array -> this family's device array (zero-copy when already on the GPU)."""
        return x

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)

    def synchronize(self):
        pass

    def empty(self, shape, dtype):
        """An uninitialised device array for the caller to fill."""
        return self.to_device(np.empty(shape, dtype))

    def empty_selection(self, n: int, k: int):
        """Device idx [n, k] int32 and val [n, k] float32 for the caller to fill."""
        return self.empty((n, k), np.int32), self.empty((n, k), np.float32)

    def place(self, dst, start: int, src):
        """dst[start : start + len(src)] = src, in place (a pass's rows into the full result)."""
        dst[start:start + src.shape[0]] = src

    def scatter_rows(self, dst_idx, dst_val, rows, src_idx, src_val):
        """dst[rows[j]] = src[j] for the recovery results (in place)."""
        raise NotImplementedError

    def append_rows(self, dst_idx, dst_val, width, stored, total, src_idx, src_val, count, offset) -> bool:
        """Append a filter output (src_idx/val [n, w], count [n]) to running candidate buffers
        (dst_idx/val: rows of at least ``width`` slots; stored, total: int64 [n], updated in
        place), positions shifted by ``offset``, in one step on the device: context parallel's
        per-piece append (torch tensors; cp._Appender says what each holds). False: this
        family has no such kernel, and the caller does it with torch ops."""
        return False

    def call_scope(self, lo_h=None, hi_h=None, M_h=None, uploads=None):
        """A context for the stages of one pipeline call (every pass and the recovery): inside it
        the inputs do not change, so a family may reuse per-input preparation across passes;
        lo_h, hi_h, M_h: the call's context ranges and sample counts on the host (facts about
        them need no device sync); ``uploads``: a dict a selection plan keeps across its calls,
        where a family may keep device constants derived from those ranges."""
        return contextlib.nullcontext()

    def release(self, x):
        """Forget what this call prepared from the input array ``x`` (a pass's rows, done with)."""

    @contextlib.contextmanager
    def lanes(self, count):
        """``count`` contexts to run independent passes in (streams for a GPU family, forked
        from the launch stream and joined at exit); by default one order, no concurrency."""
        yield [contextlib.nullcontext() for _ in range(count)]

    # True: recover_on_device exists (check, recovery and fallback with no host sync)
    capture_safe = False

    def recover_on_device(self, recover, source, lo, hi, count, k, capacity, max_failed, idx, val):
        raise NotImplementedError(f"family {self.name!r} has no device-side recovery (capture_safe is False)")


def get_family(name: str) -> Family:
    from .. import registry
    if not registry.load_family(name):
        raise RuntimeError(f"backend {name!r} is unavailable here: {registry.load_error(name)}")
    return importlib.import_module(registry.FAMILY_MODULES[name]).FAMILY
