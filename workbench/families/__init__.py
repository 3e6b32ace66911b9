"""Kernel families: how each moves arrays to and from its device.

A family module (reference.py, numba/, cupy/) registers its stage variants in
`workbench.registry` on import and exposes `FAMILY`, a `Family` instance.
"""
from __future__ import annotations

import contextlib
import importlib

import numpy as np


class Family:
    name = "?"
    takes_bf16_bits = False     # True: its kernels read uint16 bf16 bits; else the Backend widens them to float32
    # fp8 e4m3 q/keys: True = its stages read the uint8 bits (an Fp8IndexerSource of bits + float32 kscale);
    # False = the Backend decodes them to float32 values first (exact) and passes kscale beside
    takes_fp8_bits = True

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
