"""Issue 19: CLI misuse is one clear line (no traceback) and a non-zero exit, found before any
work starts; no silent defaults. Every case runs the real entry point (`python -m workbench`,
and `./wb` where the caller's working directory matters)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from _cli_util import ROOT, _env, run_cli

STARTED = "preparing preset"          # compare's first line of work


def one_error_line(p, *needles):
    """Exit code != 0, no traceback anywhere, and stdout is exactly one 'error: ...' line
    holding every needle. Returns that line."""
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "Traceback" not in out, out
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _unwritable_dir(tmp_path):
    """A directory this process cannot create files in (root ignores modes: use /sys)."""
    if os.geteuid() == 0:
        if os.path.isdir("/sys") and _cannot_create("/sys"):
            return "/sys"
        pytest.skip("running as root and /sys is writable: no unwritable directory to try")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return str(d)


def _cannot_create(d):
    try:
        fd = os.open(os.path.join(d, ".hytopk-probe"), os.O_CREAT | os.O_WRONLY, 0o600)
    except OSError:
        return True
    os.close(fd)
    os.unlink(os.path.join(d, ".hytopk-probe"))
    return False


def _bad_paths(tmp_path):
    """name -> (path, what the message must say)."""
    f = tmp_path / "a_file"
    f.write_text("x")
    d = tmp_path / "a_dir"
    d.mkdir()
    return {
        "under_a_file": (str(f / "out.json"), "not a directory"),
        "a_directory": (str(d), "is a directory"),
        "unwritable": (os.path.join(_unwritable_dir(tmp_path), "out.json"), "cannot write"),
        "missing_parent": (str(tmp_path / "nope" / "out.json"), "does not exist"),
    }


CASES = ("under_a_file", "a_directory", "unwritable", "missing_parent")
QUICK = ["compare", "--preset", "tiny", "--family", "reference", "--stage", "check"]
RECORDS = ["compare", "--preset", "tiny", "--stage", "check"]     # no --family: winners are recorded


@pytest.mark.parametrize("case", CASES)
def test_compare_json_path_checked_before_the_run(tmp_path, case):
    path, says = _bad_paths(tmp_path)[case]
    p = run_cli(QUICK + ["--no-winners", "--json", path], tmp_path)
    line = one_error_line(p, "--json", says)
    assert STARTED not in p.stdout, line


@pytest.mark.parametrize("case", CASES)
def test_compare_plot_path_checked_before_the_run(tmp_path, case):
    path, says = _bad_paths(tmp_path)[case]
    p = run_cli(QUICK + ["--no-winners", "--plot", path], tmp_path)
    one_error_line(p, "--plot", says)


def test_compare_plot_next_to_json_checked_too(tmp_path):
    (tmp_path / "out.png").mkdir()                     # the default plot path is a directory
    p = run_cli(QUICK + ["--no-winners", "--json", str(tmp_path / "out.json")], tmp_path)
    one_error_line(p, "--plot", "is a directory")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("case", CASES)
def test_compare_winners_path_checked_before_the_run(tmp_path, case):
    path, says = _bad_paths(tmp_path)[case]
    p = run_cli(RECORDS, tmp_path, extra_env={"HYTOPK_WINNERS": path})
    one_error_line(p, "HYTOPK_WINNERS", says)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"version": 1, "entries": []}', '"text"'])
def test_compare_with_a_corrupt_winners_file(tmp_path, content):
    (tmp_path / "winners.json").write_text(content)
    p = run_cli(RECORDS, tmp_path)
    one_error_line(p, str(tmp_path / "winners.json"), "--no-winners")
    assert STARTED not in p.stdout
    # --no-winners does not read it
    p = run_cli(RECORDS + ["--no-winners"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"version": 1, "entries": {"x": 3}}', None])
def test_winners_path_corrupt_list_or_directory(tmp_path, content):
    target = tmp_path / "w.json"
    if content is None:
        target.mkdir()
    else:
        target.write_text(content)
    p = run_cli(["winners", "--path", str(target)], tmp_path)
    one_error_line(p, str(target))


def test_winners_env_var_pointing_at_a_directory(tmp_path):
    p = run_cli(["winners"], tmp_path, extra_env={"HYTOPK_WINNERS": str(tmp_path)})
    one_error_line(p, str(tmp_path))


def test_winners_path_is_shown_in_the_table(tmp_path):
    from workbench.harness import winners
    f = tmp_path / "mine.json"
    winners.record({"name": "tiny", "n": 4, "L": 320, "H": 2, "D": 8, "k": 16, "layout": "causal_tail",
                    "dtype": "float32"}, "cpu", None, None, "d",
                   {"stages": {"check": "reference.check"},
                    "by_source": {"check": {"variant": "reference.check", "time_ms": 1.0}}, "pipeline": None}, p=f)
    p = run_cli(["winners", "--path", str(f)], tmp_path)
    assert p.returncode == 0 and "mine.json" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("args, needles", [
    (["--repeats", "0"], ["'repeats'", ">= 1", "got 0"]),
    (["--repeats", "-2"], ["'repeats'", ">= 1", "got -2"]),
    (["--preset", ""], ["'preset'", "''"]),
    (["--budget", "-5"], ["'budget'", "> 0", "-5"]),
    (["--budget", "0"], ["'budget'", "> 0"]),
    (["--budget", "nan"], ["'budget'", "nan"]),
])
def test_compare_bad_numbers_are_errors_not_defaults(tmp_path, args, needles):
    p = run_cli(["compare", "--family", "reference", "--stage", "check", "--no-winners", *args], tmp_path)
    one_error_line(p, *needles)
    assert STARTED not in p.stdout


def test_compare_budget_inf_is_no_limit(tmp_path):
    p = run_cli(QUICK + ["--no-winners", "--budget", "inf"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("args, needles", [
    (["--draws", "0"], ["'draws'", ">= 1", "got 0"]),
    (["--n", "0"], ["'n'", ">= 1", "got 0"]),
    (["--L", "0"], ["'L'", ">= 1", "got 0"]),
    (["--k", "0"], ["'k'", ">= 1", "got 0"]),
    (["--L", "-5"], ["'L'", ">= 1", "got -5"]),
    (["--n", "-1"], ["'n'", ">= 1", "got -1"]),
    (["--k", "64", "--L", "64"], ["'k'", "< L = 64"]),
])
def test_calibrate_bad_sizes(tmp_path, args, needles):
    p = run_cli(["calibrate", "--quick", "--family", "gaussian", *args], tmp_path)
    line = one_error_line(p, *needles)
    assert "negative dimensions" not in line


@pytest.mark.parametrize("case", ["under_a_file", "a_directory", "missing_parent"])
def test_calibrate_json_path_checked_before_the_run(tmp_path, case):
    path, says = _bad_paths(tmp_path)[case]
    p = run_cli(["calibrate", "--quick", "--family", "gaussian", "--json", path], tmp_path)
    one_error_line(p, "--json", says)


def test_watch_unknown_stage(tmp_path):
    p = run_cli(["watch", "--stage", "nope", "--poll"], tmp_path, timeout=120)
    one_error_line(p, "'stage'", "'nope'")


def test_watch_missing_directories_name_the_directory(tmp_path):
    p = run_cli(["watch", "--kernels-dir", "/nope", "--numba-dir", "/nope2", "--poll"], tmp_path, timeout=120)
    one_error_line(p, "/nope")
    # one missing directory is not dropped silently either
    p = run_cli(["watch", "--numba-dir", str(tmp_path / "missing"), "--poll"], tmp_path, timeout=120)
    one_error_line(p, "--numba-dir", str(tmp_path / "missing"))
    f = tmp_path / "f.cu"
    f.write_text("")
    p = run_cli(["watch", "--kernels-dir", str(f), "--poll"], tmp_path, timeout=120)
    one_error_line(p, "--kernels-dir", "not a directory")


# ------------------------------------------------------------------ ./wb: the caller's working directory

def _wb(args, cwd, tmp_path):
    env = _env(tmp_path, sim=False)
    env["HYTOPK_PYTHON"] = sys.executable
    return subprocess.run([str(ROOT / "wb"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_wb_relative_paths_are_relative_to_the_callers_directory(tmp_path):
    work = tmp_path / "work"
    (work / "res").mkdir(parents=True)
    p = _wb(QUICK + ["--no-winners", "--json", "res/out.json"], work, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((work / "res" / "out.json").read_text())
    assert data["rows"] and (work / "res" / "out.png").exists()
    assert not (ROOT / "res").exists()


def test_wb_relative_missing_parent_names_the_callers_path(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    p = _wb(QUICK + ["--no-winners", "--json", "nope/out.json"], work, tmp_path)
    one_error_line(p, "--json", str(work / "nope"), "does not exist")
