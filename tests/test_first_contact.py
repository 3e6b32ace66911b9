"""What a new user meets first: a Python without the CLI's packages points to ./wb, the
example session on a CPU says how its Numba variants run (one line, no traceback), and
`watch` on a machine without CuPy says that CuPy is the reason."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workbench import registry
from workbench.harness.doctor import driver_version

from _cli_util import ROOT

no_driver = pytest.mark.skipif(driver_version() is not None, reason="a CUDA driver is present: the GPU path runs")


def _py(code, env_extra=None, drop=("NUMBA_ENABLE_CUDASIM",)):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(ROOT)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_python_without_typer_points_to_wb():
    p = _py("import sys, runpy; sys.modules['typer'] = None; sys.argv = ['workbench', 'doctor'];"
            "runpy.run_module('workbench', run_name='__main__')")
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "No module named 'typer'" in p.stderr or "typer" in p.stderr
    assert f"{ROOT / 'wb'} doctor" in p.stderr and "pip install -e '.[cli]'" in p.stderr


@no_driver
def test_example_turns_the_simulator_on_itself_and_says_so():
    p = _py("import os; from workbench.harness.doctor import numba_cuda_mode as m;"
            "print(m(), os.environ.get('NUMBA_ENABLE_CUDASIM'))")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "no CUDA driver here" in lines[0] and "NUMBA_ENABLE_CUDASIM=1" in lines[0]
    assert lines[-1] == "simulator 1"


@no_driver
def test_example_with_numba_already_imported_says_what_to_do_in_one_message():
    p = _py("import numba; exec(open('examples/workbench_loop.py').read(), {'__file__': 'examples/workbench_loop.py'})")
    assert p.returncode == 1
    assert "Traceback" not in p.stderr and "NUMBA_ENABLE_CUDASIM=1" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_watch_says_cupy_is_why_a_cuda_source_is_not_checked(tmp_path):
    if registry.load_family("cupy"):
        pytest.skip("CuPy loads here")
    from workbench.harness.watch import WatchLoop
    said = []
    src = tmp_path / "check.cu"
    src.write_text("// edited\n")
    assert WatchLoop(stage="check", say=said.append).on_change(src) == []
    text = "\n".join(map(str, said))
    assert "CuPy" in text and "cannot load here" in text and "no variants" not in text
