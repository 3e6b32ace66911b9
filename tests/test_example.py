"""The documented session in examples/ runs end to end on the CPU path (Numba in the simulator)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _cli_util import ROOT


@pytest.mark.sim
def test_example_session_runs(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", HYTOPK_WINNERS=str(tmp_path / "winners.json"))
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "workbench_loop.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "example finished: OK" in p.stdout
