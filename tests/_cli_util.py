"""Helpers for the CLI tests: run `python -m workbench` (or a script) in a fresh process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env(tmp_path, sim: bool, extra_env=None) -> dict:
    """This checkout first on the path, a private winners file, the simulator only when asked."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HYTOPK_WINNERS"] = str(tmp_path / "winners.json")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env.update(extra_env or {})
    return env


def run_cli(args, tmp_path, sim: bool = False, timeout=600, extra_env=None):
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, env=_env(tmp_path, sim, extra_env),
                          capture_output=True, text=True, timeout=timeout)


def run_script(code: str, tmp_path, sim: bool = False, timeout=600, args=()):
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=ROOT, env=_env(tmp_path, sim),
                          capture_output=True, text=True, timeout=timeout)
