"""Long steps show progress: a bar on a terminal, periodic lines in a log (workbench.progress).
Here output is never a terminal, so these check the log lines; HYTOPK_PROGRESS_PERIOD=0 makes
every step print one."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time

import pytest

from workbench.progress import Progress

from _cli_util import ROOT, run_cli


def test_log_lines_first_periodic_last():
    out = io.StringIO()
    with Progress(3, "job", stream=out, period_s=0) as p:
        for name in ("a", "b", "c"):
            p.advance(name)
        p.tick("still running")
    lines = out.getvalue().splitlines()
    assert lines[0] == "job: 3 step(s)"
    assert lines[1].startswith("job: [1/3] a (+") and lines[3].startswith("job: [3/3] c")
    assert lines[4].startswith("job: [3/3] still running")
    assert lines[-1].startswith("job: done, 3 step(s) in ")


def test_log_lines_are_periodic_not_per_step():
    out = io.StringIO()
    with Progress(1000, "job", stream=out, period_s=3600) as p:
        for i in range(1000):
            p.advance(str(i))
    assert len(out.getvalue().splitlines()) == 2          # the first and the last line only


def test_compare_prints_progress_lines_into_a_log(tmp_path):
    p = run_cli(["compare", "--stage", "check", "--family", "reference", "--no-winners"], tmp_path,
                extra_env={"HYTOPK_PROGRESS_PERIOD": "0"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^compare: (\d+) step\(s\)$", p.stdout, re.M)
    assert "compare: [1/" in p.stdout and re.search(r"^compare: done, \d+ step\(s\) in ", p.stdout, re.M)


def test_reference_calibration_streams_its_rows(capsys):
    from reference import capacity
    rows = capacity.calibration_rows(k=64, contexts=(5000,), draws=1000)
    assert next(rows)[0] == 5000                          # a generator: each row as it is drawn
    capacity.print_calibration_table(k=64, contexts=(5000,), draws=1000)
    out, err = capsys.readouterr()
    assert "calibration: 5 rows" in err and out.count("\n    5000 ") == 5


def test_bench_train_refuses_a_gpu_preset_on_a_cpu_at_once():
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "workbench.torch.bench_train", "--preset", "dsv32-128k",
                        "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 2 and "GPU shapes" in p.stderr and "--preset tiny" in p.stderr
    assert time.perf_counter() - t0 < 60


def test_bench_train_default_on_a_cpu_is_tiny(capsys):
    import torch
    from workbench.torch.bench_train import cpu_presets
    assert cpu_presets(None, torch.device("cpu")) == ["tiny"]
    assert "no GPU here" in capsys.readouterr().err
    assert cpu_presets(["dsv32-32k"], torch.device("cpu"), force=True) == ["dsv32-32k"]


def test_distributed_bench_on_gloo_refuses_default_sizes():
    p = subprocess.run([sys.executable, "-m", "workbench.distributed", "bench", "--backend", "gloo"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 2 and "GFLOP per scoring pass" in p.stderr and "--n 64" in p.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="spawns gloo ranks")
def test_distributed_bench_relays_rank_progress(tmp_path):
    pytest.importorskip("torch.distributed")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HYTOPK_PROGRESS_PERIOD="0")
    p = subprocess.run([sys.executable, "-m", "workbench.distributed", "bench", "--backend", "gloo", "--n", "16",
                        "--L", "256", "--H", "2", "--D", "4", "--k", "4", "--repeats", "1",
                        "--json", str(tmp_path / "cp.json")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "cp bench: 1 step(s)" in p.stderr and "cp bench: [1/1] 2 rank(s) done" in p.stderr
    assert "cp bench: done, 1 step(s)" in p.stderr
