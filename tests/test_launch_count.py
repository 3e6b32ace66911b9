"""Issue 14 without a GPU: the launches of a planned capture-safe call, counted by the launch
recorder (workbench.families.cupy._launch.record_launches(dry=True)) with NumPy standing in for
CuPy (tests/fake_cupy, in a subprocess: the stand-in must never reach this process). Each
launch is a node of the call's CUDA graph, so a replay's host time grows with this count: the
bounds below are what the s4 pipeline issues (assert them so a regression shows).
The same sequence, run, on the GPU: tests/test_plan_gpu.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "fake_cupy" / "run_pipeline.py"


def _run(*args):
    out = subprocess.run([sys.executable, str(SCRIPT), *map(str, args), "--reps", "1"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# (n, L, k, extra args) -> at most this many launches (s3 issued 129, 532 and 1063, and 57, 141 and
# 284 memsets, here)
CASES = [
    pytest.param((4096, 131072, 2048), 98, id="dsv32-128k"),
    pytest.param((8192, 1048576, 2048, "--D", "16"), 183, id="dsv32-1m-shape", marks=pytest.mark.slow),
    pytest.param((32768, 262144, 2048, "--layout", "full", "--H", "32", "--D", "16"), 202,
                 id="glm5-256k-allkeys-shape", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("case,bound", CASES)
def test_capture_safe_launch_count(case, bound):
    r = _run(*case)
    by = r["by_kernel"]
    assert r["launches"] <= bound, r
    # the device-side recovery: one launch fills every chunk's slots; a rows launch and a select
    # writing in place per chunk, no scatter
    assert by["hytopk_recovery_slots"] == 1 and "hytopk_scatter_slots" not in by, by
    assert by["hytopk_select_rows_to"] == by["hytopk_score_rows_ws"], by
    # memsets: a count per pass, the check's two, the shared-context threshold's lo per span; none per stage
    assert r["array_ops"].get("zeros", 0) <= r["passes"] + 2 + 2 * r["threshold_spans"], r["array_ops"]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_capture_safe_small_layout_runs_dry(dtype):
    r = _run(256, 4096, 64, "--dtype", dtype, "--H", "8", "--D", "32")
    assert r["by_kernel"]["hytopk_check"] == 1 and r["by_kernel"]["hytopk_recovery_slots"] == 1
    assert r["launches"] <= 12, r
