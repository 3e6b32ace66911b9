"""Every known-bad variant (tests/known_bad.py) is rejected by each gate the real variants
pass: the edge probes (the fast tests' gate, tests/test_variants.py::test_edge_probes),
`compare`'s stage check (the preset's answer, then the probes) and `watch`. The reference
mutants run in every pass; the Numba one where the Numba family runs (the simulator pass of
`./wb test`, or a GPU)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from workbench import registry
from workbench.families import get_family
from workbench.harness import probes
from workbench.harness.compare import Runner, Workload
from workbench.harness.presets import get
from workbench.harness.timing import CpuTimer
from workbench.harness.watch import WatchLoop

from known_bad import MUTANTS, numba_mutants


def _numba_mutants():
    if not registry.load_family("numba"):
        return []
    ok, _ = get_family("numba").available()
    return numba_mutants() if ok else []


ALL = MUTANTS + _numba_mutants()
IDS = [m.name for m in ALL]


def test_mutants_cover_the_listed_slips():
    names = " ".join(m.name for m in MUTANTS)
    for slip in ("check.known_bad_capacity_ge", "check.known_bad_k_le", "context_short", "hi_inclusive",
                 "lo_plus_one", "flipped_ties", "no_nan_rule", "no_zero_fold", "past_capacity"):
        assert slip in names
    assert {m.stage for m in MUTANTS} == set(registry.STAGES)


def test_mutants_are_never_registered():
    registered = {v.name for v in registry.variants()}
    assert not registered & set(IDS)
    assert not any("known_bad" in n for n in registered)


@pytest.mark.parametrize("m", ALL, ids=IDS)
def test_edge_probes_reject(m):
    ok, why = probes.check_variant(m)
    assert not ok and why.startswith("edge probe")


@pytest.fixture(scope="module")
def runner():
    wl = Workload(get("tiny"), "cpu")
    return Runner(wl, CpuTimer(), repeats=1)


@pytest.mark.parametrize("m", ALL, ids=IDS)
def test_compare_stage_check_rejects(m, runner):
    sources = m.sources if m.stage in registry.SOURCE_STAGES else (None,)
    for src in sources:
        row = runner.stage_row(m.stage, m, src)
        assert row.correct is False and row.time_ms is None, (src, row.detail)


def test_watch_rejects_every_mutant():
    said = []
    loop = WatchLoop(preset="tiny", say=said.append, repeats=1)
    outs = loop.check_and_time(Path("tests/known_bad.py"), ALL, time.perf_counter())
    assert {o.variant for o in outs} == set(IDS)
    assert not [o.variant for o in outs if o.correct is not False]
    assert sum("WRONG" in str(s) for s in said) == len(outs)


def test_a_variant_writing_into_its_inputs_spoils_no_later_probe():
    import reference as R
    from workbench.registry import Variant

    def scribbles(cand_idx, cand_val, count, k):
        out = R.stage_select(cand_idx, cand_val, count, k)
        cand_idx[:], cand_val[:], count[:] = 0, 0.0, 0
        return out
    assert probes.check_variant(Variant("select", "reference.select.scribbles", "reference", scribbles)) == (True, "")
    assert probes.check_variant(registry.get("reference.select")) == (True, "")
