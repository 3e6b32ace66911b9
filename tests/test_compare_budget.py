"""The main job's time rule (workbench/harness/compare.py): a row slower than SLOW_ROW_MS per
call is checked once and timed by one warm call, not repeated; a row whose first call was slow
only because it compiled is timed like any fast row; --repeats overrides the rule; the per-stage
budget of a GPU run leaves the default main job within 90 s."""
from __future__ import annotations

import time

from workbench.harness import compare as CMP
from workbench.harness.timing import make_timer


class Calls:
    def __init__(self, first_ms, then_ms):
        self.n, self.first_ms, self.then_ms = 0, first_ms, then_ms

    def __call__(self):
        time.sleep((self.first_ms if self.n == 0 else self.then_ms) / 1e3)
        self.n += 1
        return self.n


def measure(fn, repeats=None):
    runner = CMP.Runner(None, make_timer("cpu"), repeats)
    row = CMP.Row("stage", "dense", "x.dense.y")
    return runner.measure(row, fn, [()], lambda out: (True, "")), fn.n


def test_slow_row_is_checked_once_and_timed_once():
    slow = CMP.SLOW_ROW_MS * 1.5
    row, calls = measure(Calls(slow, slow))
    assert calls == 2, "a slow row: its checked call plus one warm timed call"
    assert row.correct and row.time_ms >= CMP.SLOW_ROW_MS
    assert row.spread["repeats"] == 1 and "one warm call" in row.detail


def test_row_slow_only_while_compiling_is_timed_in_full():
    row, calls = measure(Calls(CMP.SLOW_ROW_MS * 1.5, 1.0))
    assert calls > 3 and row.time_ms < CMP.SLOW_ROW_MS and row.spread["repeats"] >= 5


def test_explicit_repeats_override_the_slow_rule():
    slow = CMP.SLOW_ROW_MS * 1.2
    row, calls = measure(Calls(slow, slow), repeats=2)
    assert row.spread["repeats"] == 2 and calls == 1 + 1 + 2      # checked, warm-up, two repeats


def test_wrong_row_is_not_timed():
    fn = Calls(1.0, 1.0)
    runner = CMP.Runner(None, make_timer("cpu"), None)
    row = runner.measure(CMP.Row("stage", "dense", "x"), fn, [()], lambda out: (False, "wrong"))
    assert row.correct is False and row.time_ms is None and fn.n == 1


def test_gpu_stage_budget_fits_the_main_job():
    # the per-stage rows' budget plus pipelines, baselines, inputs and oracle: 90 s on the H200
    assert CMP.GPU_BUDGET_S <= 60
