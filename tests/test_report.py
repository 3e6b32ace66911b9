"""The compare table's ratio columns (CPU only)."""
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("rich")

from rich.console import Console  # noqa: E402

from workbench.harness.compare import Row  # noqa: E402
from workbench.harness.report import compare_table  # noqa: E402


def _render(rows):
    res = NS(preset={"name": "x"}, device="cuda", ceilings={"gemm_tflops": 700.0, "copy_gbps": 4000.0}, rows=rows)
    c = Console(width=300, record=True, color_system=None)
    c.print(compare_table(res))
    return c.export_text()


def test_floor_column_uses_the_mma_sync_floor_when_the_simt_floor_was_excluded():
    rows = [Row("stage", "filter", "cupy.filter.x", "indexer", True, time_ms=30.0,
                ratios={"score-only-mma_sync": 1.25, "flop-bound": 2.5}),
            Row("baseline", "score-only-mma_sync", "cupy score_only[mma_sync] (checksum)", None, True, time_ms=24.0,
                ratios={"score-only-mma_sync": 1.0})]
    text = _render(rows)
    line = next(ln for ln in text.splitlines() if "cupy.filter.x" in ln)
    assert "1.25" in line and "2.5" in line


def test_time_spread_column_shows_the_middle_half_and_the_repeat_count():
    spread = dict(median_ms=1.5, q25_ms=1.25, q75_ms=1.75, min_ms=1.0, max_ms=9.0, repeats=37, ci_ms=0.13)
    one = dict(median_ms=2.0, q25_ms=2.0, q75_ms=2.0, min_ms=2.0, max_ms=2.0, repeats=1, ci_ms=None)
    text = _render([Row("stage", "check", "reference.check", None, True, time_ms=1.5, spread=spread),
                    Row("stage", "check", "numba.check.block", None, True, time_ms=2.0, spread=one)])
    assert "IQR ms ×n" in text
    assert "1.25–1.75 ×37" in next(ln for ln in text.splitlines() if "reference.check" in ln)
    assert "– ×1" in next(ln for ln in text.splitlines() if "numba.check.block" in ln)
