"""Helpers for the CLI tests: run `python -m workbench` in a fresh process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cli(args, tmp_path, sim: bool = False, timeout=600, extra_env=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HYTOPK_WINNERS"] = str(tmp_path / "winners.json")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_script(code: str, tmp_path, sim: bool = False, timeout=600, args=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HYTOPK_WINNERS"] = str(tmp_path / "winners.json")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
