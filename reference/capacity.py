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
import sys

import numpy as np

from . import validate as V
from .sampling import sample_plan

SIGMAS = 6.0
ROUND_TO = 256


def default_capacity(k: int, lo, hi, oversample: float = 3.0) -> int:
    """Capacity for one selection: SIGMAS spreads above the largest expected
    candidate count (r * c / M) over its queries, rounded up to ROUND_TO, at
    least k and never more than the longest context."""
    k = V.check_k(k)
    oversample = V.check_oversample(oversample)
    lo, hi = V.check_ranges(lo, hi, None, None)
    c = hi - lo
    M, r = sample_plan(lo, hi, k, oversample)
    sampled = c > k
    if not np.any(sampled):
        return int(k)
    c, M, r = c[sampled], M[sampled].astype(np.float64), r[sampled].astype(np.float64)
    expect = r * c / M
    cap = float(np.max(expect * (1.0 + SIGMAS / np.sqrt(r))))
    cap = int(math.ceil(cap / ROUND_TO) * ROUND_TO)
    return int(max(k, min(cap, int(c.max()))))


def resolve_capacity(capacity, k: int, lo, hi, oversample: float = 3.0) -> int:
    """The capacity a selection runs with (validated arguments, host lo/hi): default_capacity
    when ``capacity`` is None; otherwise ``capacity`` clamped to max(k, the longest context),
    as default_capacity is. A larger buffer could never fill (count <= c), so the clamp
    changes no result or statistic and nothing of the requested size is allocated."""
    if capacity is None:
        return default_capacity(k, lo, hi, oversample)
    c = np.asarray(hi, np.int64) - np.asarray(lo, np.int64)
    longest = int(c.max()) if c.size else 0
    return int(min(int(capacity), max(int(k), longest)))


def failure_rates_iid(c: int, k: int, capacity: int, oversample: float = 3.0,
                      draws: int = 2_000_000, seed: int = 0):
    """(P(overflow), P(underflow)) per query for i.i.d. continuous scores.

    The r-th best of M i.i.d. samples leaves a fraction U ~ Beta(r, M - r + 1)
    of the distribution above it, so count = r + Binomial(c - M, U) exactly;
    this draws that law instead of scoring c keys per query.
    """
    M, r = sample_plan(np.array([0]), np.array([c]), k, oversample)
    M, r = int(M[0]), int(r[0])
    if M == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    u = rng.beta(r, M - r + 1, size=draws)
    count = r + rng.binomial(c - M, u)
    return float(np.mean(count > capacity)), float(np.mean(count < k))


def calibration_rows(k: int = 2048, contexts=(1 << 17, 1 << 20), draws: int = 20_000_000,
                     queries: int = 8192):
    """Rows (c, M, r, capacity, is_default, P(overflow), P(underflow), failing per `queries`,
    buffer bytes / table bytes) for a few capacities around the default, one at a time."""
    for c in contexts:
        M, r = sample_plan(np.array([0]), np.array([c]), k, 3.0)
        default = default_capacity(k, np.array([0]), np.array([c]))
        for cap in _capacities(k, default):
            po, pu = failure_rates_iid(c, k, cap, draws=draws)
            yield (c, int(M[0]), int(r[0]), cap, cap == default, po, pu, queries * (po + pu), cap * 8 / (c * 4))


def _capacities(k, default):
    return sorted({7 * k // 2, 4 * k, 5 * k, default, 6 * k})


def calibration_table(**kw):
    return list(calibration_rows(**kw))


def print_calibration_table(k: int = 2048, contexts=(1 << 17, 1 << 20), **kw):
    """Print the table row by row as each is drawn (a row takes seconds: the rows are the progress)."""
    total = sum(len(_capacities(k, default_capacity(k, np.array([0]), np.array([c])))) for c in contexts)
    print(f"calibration: {total} rows of {kw.get('draws', 20_000_000):.0e} draws each, printed as they are drawn",
          file=sys.stderr, flush=True)
    print(f"{'c':>8} {'M':>5} {'r':>4} {'capacity':>9} {'P(over)':>9} {'P(under)':>9} "
          f"{'fail/8192q':>10} {'buffer/table':>12}", flush=True)
    for c, M, r, cap, is_default, po, pu, nf, ratio in calibration_rows(k=k, contexts=contexts, **kw):
        mark = "*" if is_default else " "
        print(f"{c:>8} {M:>5} {r:>4} {cap:>8}{mark} {po:>9.2e} {pu:>9.2e} {nf:>10.4f} {ratio:>12.4f}", flush=True)
    print("* = default_capacity; i.i.d. continuous scores; buffer = 8 B/slot (int32 idx + float32 val),"
          " table = 4 B/key")
