"""Names as the user meets them: `--variant` takes what the table prints, messages keep the
user's brackets (rich markup would eat `[table]`), a variant of a family that cannot load here
says so, and the help texts' example variants exist."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from workbench import registry

from _cli_util import ROOT, run_cli


def test_variant_takes_the_label_the_table_prints(tmp_path):
    out = tmp_path / "o.json"
    p = run_cli(["compare", "--stage", "filter", "--variant", "reference.filter[table]", "--json", str(out)], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [(r["name"], r["source"]) for r in json.loads(out.read_text())["rows"] if r["kind"] == "stage"]
    assert rows == [("reference.filter", "table")]
    assert "reference.filter[table]" in p.stdout


def test_errors_keep_the_users_brackets(tmp_path):
    p = run_cli(["compare", "--variant", "reference.filter[tabel]"], tmp_path)
    assert p.returncode == 2
    assert "[tabel]" in p.stdout and "reference.filter[table]" in p.stdout      # the rows it has, intact


def test_a_family_that_cannot_load_is_named_not_unknown(tmp_path):
    p = run_cli(["compare", "--variant", "cupy.filter.simt"], tmp_path)
    text = p.stdout + p.stderr
    assert "unknown variant" not in text
    if registry.load_family("cupy"):            # CuPy installed: its variants exist; without a GPU they skip
        assert "cupy" in text
    else:
        assert p.returncode == 2 and "cupy family is not available here" in text and "cupy" in text.lower()


def test_unknown_names_get_the_closest_and_pipelines_a_hint(tmp_path):
    p = run_cli(["compare", "--variant", "reference.filtr"], tmp_path)
    assert p.returncode == 2 and "unknown variant 'reference.filtr'" in p.stdout and "reference.filter" in p.stdout
    p = run_cli(["compare", "--variant", "reference.hytopk"], tmp_path)
    assert p.returncode == 2 and "pipeline row" in p.stdout


def _registered_anywhere(name: str) -> bool:
    """Registered here, or (for a family that cannot load here) registered in its sources."""
    fam = name.split(".", 1)[0]
    if registry.load_family(fam):
        return name in {v.name for v in registry.variants(load=False)}
    folder = ROOT / "workbench" / "families" / fam
    return any(f'"{name}"' in p.read_text() for p in folder.glob("*.py"))


@pytest.mark.parametrize("cmd", ["selftest", "bench"])
def test_distributed_help_examples_exist(cmd):
    p = subprocess.run([sys.executable, "-m", "workbench.distributed", cmd, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0
    examples = re.findall(r"e\.g\.\s+(\w+)=([\w.]+)", " ".join(p.stdout.split()))
    assert examples
    for stage, name in examples:
        assert stage in registry.STAGES and name.split(".")[1] == stage
        assert _registered_anywhere(name), name
