"""Default candidate-buffer capacity.

The number of keys that pass the threshold is c times the fraction of the
score distribution above the r-th best of M evenly spaced samples. For
continuous i.i.d. scores that fraction is Beta(r, M - r + 1): mean ~ r/M
(so ~oversample*k keys pass) and relative spread ~ 1/sqrt(r). The capacity
leaves SIGMAS standard deviations of headroom above the mean at the smallest
r among the queries; `hytopk calibrate` and README "Default capacity" give
the failure rates this buys.
"""
from __future__ import annotations

import math

import numpy as np

from .sampling import sample_plan

SIGMAS = 6.0
ROUND_TO = 256


def default_capacity(k: int, lo, hi, oversample: float = 3.0) -> int:
    """Capacity for one selection: SIGMAS spreads above the largest expected
    candidate count (r * c / M) over its queries, rounded up to ROUND_TO, at
    least k and never more than the longest context."""
    c = np.asarray(hi, np.int64) - np.asarray(lo, np.int64)
    M, r = sample_plan(lo, hi, k, oversample)
    sampled = c > k
    if not np.any(sampled):
        return int(k)
    c, M, r = c[sampled], M[sampled].astype(np.float64), r[sampled].astype(np.float64)
    expect = r * c / M
    cap = float(np.max(expect * (1.0 + SIGMAS / np.sqrt(r))))
    cap = int(math.ceil(cap / ROUND_TO) * ROUND_TO)
    return int(max(k, min(cap, int(c.max()))))
