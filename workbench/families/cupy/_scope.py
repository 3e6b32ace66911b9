"""Host facts of one pipeline call (Family.call_scope), read by the CuPy stages instead of
syncing with the GPU: the keys already put into a core's layout, whether every query shares
one context, the longest context, and a plan's cache of uploads that outlive the call.

A stage called outside a scope (directly, by a test or `compare`) finds none of these facts
and computes what it needs on the device (with a sync where it must)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np


@dataclass
class CallFacts:
    prepared: dict = field(default_factory=dict)   # id(source keys) -> (keys, layout tag, layout copy)
    shared: tuple | None = None                    # (lo, c, M) when every query has that context and M
    max_len: int | None = None                     # the longest context hi - lo of the call
    uploads: dict = field(default_factory=dict)    # a plan's device constants (sample positions, ...)
    recovery_rows: int | None = None               # rows a recovery materialises at a time (None: its own)
    recovery_out: tuple | None = None              # (idx, val): a rows recovery writes its selections there


CURRENT: CallFacts | None = None


def current() -> CallFacts | None:
    return CURRENT


@contextlib.contextmanager
def call_scope(lo_h=None, hi_h=None, M_h=None, uploads: dict | None = None):
    """Facts of the call's host ranges; ``uploads``: a dict kept by the caller across calls
    (a selection plan) for device constants derived from those ranges."""
    global CURRENT
    outer = CURRENT
    facts = CallFacts(prepared=outer.prepared if outer is not None else {},
                      uploads=uploads if uploads is not None else {})
    if lo_h is not None and hi_h is not None and len(lo_h):
        lo_h, hi_h = np.asarray(lo_h), np.asarray(hi_h)
        facts.max_len = int(max(0, (hi_h.astype(np.int64) - lo_h).max()))
        if M_h is not None:
            M_h = np.asarray(M_h)
            if (lo_h == lo_h[0]).all() and (hi_h == hi_h[0]).all() and (M_h == M_h[0]).all():
                facts.shared = (int(lo_h[0]), int(hi_h[0]) - int(lo_h[0]), int(M_h[0]))
    CURRENT = facts
    try:
        yield facts
    finally:
        CURRENT = outer


def longest_context() -> int | None:
    """The call's longest context (a recovery row's buffer width), or None outside a call."""
    return CURRENT.max_len if CURRENT is not None else None


def recovery_rows(default: int) -> int:
    """Rows a recovery call materialises at a time: the call's setting, else ``default``."""
    return CURRENT.recovery_rows if CURRENT is not None and CURRENT.recovery_rows else default
