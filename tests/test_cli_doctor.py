"""`hytopk doctor` runs here and names what is missing with a fix."""
from __future__ import annotations

from workbench.harness.doctor import checks, environment

from _cli_util import run_cli


def test_doctor_runs_and_lists_every_component(tmp_path):
    p = run_cli(["doctor"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("CUDA driver", "GPU", "CuPy", "NVRTC", "nvcc", "numba-cuda", "Numba CUDA simulator", "torch",
                 "family reference"):
        assert name in p.stdout, name


def test_every_missing_optional_piece_has_a_fix():
    for c in checks():
        if not c.ok and c.name not in ("GPU", "CUDA driver") and not c.name.startswith("family"):
            assert c.fix, f"{c.name} is missing but no fix command is given"


def test_environment_records_versions_and_commit():
    env = environment()
    assert env["versions"]["numpy"] and env["versions"]["torch"]
    assert "date" in env and "gpu" in env
