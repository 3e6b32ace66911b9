"""docs/CONTRACT.md is kept in step with the reference: its formulas are the reference's, its
quoted numbers and examples are what the reference computes, and nothing in the repository
points to a contract outside it."""
from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import reference as R
from reference import capacity, sampling

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "CONTRACT.md"
TEXT = CONTRACT.read_text()
FLAT = " ".join(TEXT.split())             # prose wraps: phrases are looked up with single spaces


def _table_after(heading_text: str) -> list[list[str]]:
    """The cells of the first markdown table after the line containing heading_text."""
    rest = TEXT[TEXT.index(heading_text):]
    rows = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip().strip("`") for c in line.strip("|").split("|")])
        elif rows:
            break
    return [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]     # drop the header and the rule


@pytest.mark.parametrize("formula, fn", [
    ("M = min(c, clamp(c // 128, 4096, 8192))", R.num_samples),
    ("p_j = lo + (j * c) // M", R.sample_positions),
    ("r = min(M, ceil(((oversample * k) * M) / c))", R.threshold_rank),
    ("bits ^ 0x80000000", R.order_keys),
])
def test_formulas_are_the_references(formula, fn):
    assert formula in TEXT
    assert formula in inspect.getdoc(fn)


def test_constants_and_defaults():
    assert (sampling.SAMPLE_STRIDE, sampling.MIN_SAMPLES, sampling.MAX_SAMPLES) == (128, 4096, 8192)
    for f in (R.hytopk, R.hytopk_indexer):
        params = inspect.signature(f).parameters
        assert params["oversample"].default == 3.0 and params["max_failed"].default == 64
    assert "`oversample = 3`" in FLAT and "(default 64)" in FLAT
    assert capacity.SIGMAS == 6.0 and "six standard deviations" in FLAT
    assert capacity.ROUND_TO == 256 and "rounded up to 256" in FLAT


def test_order_key_examples():
    rows = _table_after("Examples (`reference.order_keys`")
    assert len(rows) >= 10
    for label, key in rows:
        first = label.split()[0]
        if first == "NaN":
            values = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
        else:
            values = np.array([float(first)], np.float32)
        assert set(R.order_keys(values).tolist()) == {int(key, 16)}, label


def test_quoted_sample_plan_and_capacity():
    rows = _table_after("Quoted values, `k = 2048`")
    assert {r[0].split()[0] for r in rows} >= {"131072", "1048576"}
    for c_txt, M, r, stands, cap in rows:
        c = int(c_txt.split()[0])
        lo, hi = np.array([0]), np.array([c])
        Mr = R.sample_plan(lo, hi, 2048, 3.0)
        assert (int(Mr[0][0]), int(Mr[1][0])) == (int(M), int(r)), c
        assert int(r) * c // int(M) == int(stands)
        assert R.default_capacity(2048, lo, hi) == int(cap), c


def test_executable_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"CONTRACT.md[python block {i}]", "exec"), {})


def test_check_boundaries_are_the_references():
    """§3.6: count == capacity and count == k pass; one more / one fewer fails; c <= k is never checked."""
    k, cap = 4, 8
    cases = [(10, 8, False), (10, 9, True), (10, 4, False), (10, 3, True), (4, 0, False), (5, 3, True)]
    c = np.array([x[0] for x in cases])
    count = np.array([x[1] for x in cases])
    failed, _ = R.stage_check(count, np.zeros_like(c), c, k, cap)
    assert failed.tolist() == [x[2] for x in cases]


def test_nothing_points_to_a_contract_outside_the_repository():
    """Code and docs cite docs/CONTRACT.md. results/ holds past records as written."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    bad = []
    for f in files:
        if f.startswith("results/") or f == "tests/test_contract.py":
            continue
        path = ROOT / f
        if not path.is_file() or path.suffix not in (".py", ".md", ".sh", ".cu", ".cuh", ".toml", "") :
            continue
        text = path.read_text(errors="replace")
        for pat in ("DESIGN.md", "DESIGN §", "shared folder", "../shared", "/work/shared", "seed/000_"):
            if pat in text:
                bad.append(f"{f}: {pat}")
    assert not bad, bad
