"""One card per stage (workbench.registry.STAGES): signature, arguments, reference, check and
work model in one place, read by compare (stage_call, the checks, the work columns) and here.
Adding a stage is one card plus its variants: the toy stage below goes through the registry
and compare's call builder with no other edit."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from workbench import registry
from workbench.harness import compare as CMP


def positional(fn):
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


@pytest.mark.parametrize("stage", list(registry.STAGES) + list(registry.FLOORS))
def test_card_is_complete(stage):
    card = registry.CARDS[stage]
    assert card.name == stage and card.signature and card.args
    assert len(positional(card.reference_fn())) == len(card.args), "the reference stage takes the card's arguments"
    assert callable(card.check_fn())
    w = registry.Work(n=4, L=100, H=2, D=8, k=5, elem_bytes=4, sum_c=300.0, sum_M=40.0, stored=30.0, sum_c_rows=90.0)
    for source in card.sources or (None,):
        flops, nbytes = card.work(w, source)
        assert flops >= 0 and nbytes > 0
    assert ("source" in card.args) == bool(card.sources)


@pytest.mark.parametrize("stage", list(registry.STAGES) + list(registry.FLOORS))
def test_every_variant_takes_its_cards_arguments(stage):
    card = registry.CARDS[stage]
    for v in registry.variants(stage):
        assert len(positional(v.fn)) == len(card.args), f"{v.name}: {positional(v.fn)} vs {card.args}"
        if card.sources:
            assert set(v.sources) <= set(card.sources), v.name
    assert set(card.sources) <= set(registry.SOURCES), "every source kind a card lists is built by compare"


def test_source_stages_come_from_the_cards():
    assert registry.SOURCE_STAGES == tuple(s for s, c in registry.STAGES.items() if c.sources)


def toy_reference(a, lo, k):
    """The toy stage's spec: the k largest of each row of a, descending."""
    return -np.sort(-np.asarray(a), axis=1)[:, :k]


def toy_check(out, E=None, **_):
    return (True, "") if out is not None else (False, "no output")


def test_a_new_stage_is_one_card_and_its_variants(monkeypatch):
    card = registry.StageCard("toy", "(a, lo, k) -> float32[n, k]", ("a", "lo", "k"),
                              f"{__name__}:toy_reference", f"{__name__}:toy_check",
                              lambda w, source: (0.0, 4.0 * w.n * w.L))
    monkeypatch.setitem(registry.STAGES, "toy", card)
    monkeypatch.setattr(registry, "_VARIANTS", dict(registry._VARIANTS))

    @registry.register("toy", "reference.toy.sort")
    def toy_sort(a, lo, k):
        return toy_reference(a, lo, k)

    v = registry.get("reference.toy.sort")
    a = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]], np.float32)
    fn, args = CMP.stage_call("toy", v, None, {"a": a, "lo": np.zeros(2, np.int32)}, None, k=2, cap=0)
    np.testing.assert_array_equal(fn(*args), [[3.0, 2.0], [5.0, 4.0]])
    assert registry.STAGES["toy"].check_fn()(fn(*args)) == (True, "")
    assert [x.name for x in registry.variants("toy", load=False)] == ["reference.toy.sort"]


def test_compare_plans_one_row_per_card_source():
    usable = {"reference": True, "numba": False, "cupy": False}
    missing = {"numba": "no GPU", "cupy": "no GPU"}
    jobs, skipped = CMP.stage_jobs(["filter", "check"], {}, lambda name: False, usable, missing, "cpu", True)
    rows = {(s, v.name, src) for _, s, v, src in jobs}
    assert ("filter", "reference.filter", "table") in rows and ("filter", "reference.filter", "indexer") in rows
    assert ("check", "reference.check", None) in rows
    assert all(v.family == "reference" for _, _, v, _ in jobs)
    assert {x["reason"] for x in skipped if x["name"].startswith("numba.")} <= {"no GPU"}
    jobs, skipped = CMP.stage_jobs(["filter"], {}, lambda name: True, usable, missing, "cpu", False)
    assert not jobs and {x["reason"] for x in skipped if x["name"] == "reference.filter"} == {"excluded (--exclude)"}
    jobs, skipped = CMP.stage_jobs(["filter"], {}, lambda name: False, usable, missing, "cpu", False)
    assert {src for _, _, _, src in jobs} == {"indexer", "indexer_fp8"}  # no room for the [n, L] table
