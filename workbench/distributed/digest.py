"""SHA-256 digests of a selection, so two runs (CP vs the single-GPU pipeline) are compared
bit for bit without moving whole results between ranks.

A digest covers idx, val (as bits), threshold (bits), count, failed, num_samples, rank of the
given query rows, in row order, plus fell_back and capacity.
"""
from __future__ import annotations

import hashlib

import numpy as np

FIELDS = ("idx", "val", "threshold", "count", "failed", "num_samples", "rank")
DTYPES = {"idx": np.int32, "val": np.float32, "threshold": np.float32, "count": np.int32,
          "failed": np.bool_, "num_samples": np.int32, "rank": np.int32}


def _host(x):
    if hasattr(x, "detach"):                     # torch
        return x.detach().cpu().numpy()
    if hasattr(x, "get"):                        # cupy
        return x.get()
    if hasattr(x, "copy_to_host"):               # numba
        return x.copy_to_host()
    return np.asarray(x)


def digest(fields: dict, fell_back: bool, capacity: int) -> str:
    """``fields``: name -> array over the same query rows (FIELDS, any array kind)."""
    h = hashlib.sha256()
    for name in FIELDS:
        a = np.ascontiguousarray(_host(fields[name]), DTYPES[name])
        h.update(name.encode())
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    h.update(repr((bool(fell_back), int(capacity))).encode())
    return h.hexdigest()


def result_digest(res, rows=None) -> str:
    """Digest of a reference.HyTopKResult (any array kind), restricted to ``rows`` if given."""
    fields = {}
    for name in FIELDS:
        a = _host(getattr(res, name))
        fields[name] = a if rows is None else a[np.asarray(rows, np.int64)]
    return digest(fields, res.fell_back, res.capacity)


def cp_digest(res) -> str:
    """Digest of one rank's CPResult (its query rows, in its row order)."""
    return digest(dict(idx=res.idx, val=res.val, threshold=res.threshold, count=res.count, failed=res.failed,
                       num_samples=res.num_samples, rank=res.rank), res.fell_back, res.capacity)
