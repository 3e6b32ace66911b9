"""Timings with their spread: repeats until the median is known or the budget ends, quantiles in
the record, and `watch` calling a change only outside the noise."""
from __future__ import annotations

import itertools
import math

import pytest

from workbench.harness import timing as T
from workbench.harness.watch import time_change


def test_fixed_repeats_run_exactly_that_many():
    t = T.repeat(lambda i: 1.0 + i, repeats=4)
    assert t.n == 4 and t.repeats == [1.0, 2.0, 3.0, 4.0]
    assert (t.min_ms, t.median_ms, t.max_ms) == (1.0, 2.5, 4.0)
    assert t.q25_ms == pytest.approx(1.75) and t.q75_ms == pytest.approx(3.25)


def test_steady_samples_stop_at_the_minimum():
    t = T.repeat(lambda i: 2.0, min_repeats=5, max_repeats=1000, budget_s=60, target=0.02)
    assert t.n == 5 and t.ci_ms == 0.0


def test_noisy_samples_repeat_until_the_median_is_known():
    noise = itertools.cycle([1.0, 1.2, 0.8, 1.1, 0.9])          # IQR 0.2: 1.57 * 0.2 / sqrt(n) <= 2% at n >= 246
    t = T.repeat(lambda i: next(noise), min_repeats=5, max_repeats=10_000, budget_s=60, target=0.02)
    assert 200 < t.n < 400
    assert t.ci_ms / t.median_ms <= 0.02


def test_the_budget_ends_a_noisy_row():
    import random
    rng = random.Random(0)
    t = T.repeat(lambda i: rng.choice([1.0, 30.0]), min_repeats=5, max_repeats=10 ** 9, budget_s=0.05, target=0.0)
    assert t.n >= 5 and t.n < 10 ** 6
    assert t.max_ms == 30.0 and t.min_ms == 1.0


def test_spread_record_and_unknown_noise_of_one_call():
    one = T.Timing.of([3.0])
    assert one.spread() == dict(median_ms=3.0, q25_ms=3.0, q75_ms=3.0, min_ms=3.0, max_ms=3.0, repeats=1, ci_ms=None)
    assert math.isinf(one.ci_ms)
    assert T.differs(one.spread(), T.Timing.of([1.0, 1.0, 1.0]).spread()) is None


def test_differs_only_outside_both_intervals():
    a = T.Timing.of([1.0, 1.1, 0.9, 1.05, 0.95] * 4).spread()       # median 1.0, interval ~ +-0.035
    near = T.Timing.of([1.02, 1.12, 0.92, 1.07, 0.97] * 4).spread()
    far = T.Timing.of([1.3, 1.4, 1.2, 1.35, 1.25] * 4).spread()
    assert T.differs(a, near) is False
    assert T.differs(a, far) is True


def test_watch_words_a_change_by_the_noise():
    a = T.Timing.of([1.0, 1.1, 0.9, 1.05, 0.95] * 4).spread()
    near = T.Timing.of([1.02, 1.12, 0.92, 1.07, 0.97] * 4).spread()
    far = T.Timing.of([1.3, 1.4, 1.2, 1.35, 1.25] * 4).spread()
    assert "within the noise" in time_change(1.0, 1.02, a, near)
    assert "+30%" in time_change(1.0, 1.3, a, far) and "outside the noise" in time_change(1.0, 1.3, a, far)
    assert "noise unknown" in time_change(1.0, 1.3, T.Timing.of([1.0]).spread(), far)


def test_cpu_timer_reports_quantiles():
    t = T.CpuTimer().time(lambda: sum(range(200)), [()], warmup=1)
    assert t.n >= T.CPU_POLICY["min_repeats"]
    assert t.min_ms <= t.q25_ms <= t.median_ms <= t.q75_ms <= t.max_ms
