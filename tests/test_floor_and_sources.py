"""The score-only floor is a card (registry.FLOORS) and the fp8 e4m3 input a source kind
(registry.SOURCES) like the others: compare runs both through its one stage path
(stage_jobs -> Runner.stage_row), and their rows keep the names earlier results carry."""
from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch

import reference as R
from workbench import registry
from workbench.harness import checks as C
from workbench.harness import compare as CMP
from workbench.harness import sources as S
from workbench.harness.oracle import ReferenceOracle
from workbench.harness.presets import get as get_preset, make_inputs

from _cli_util import run_cli


@pytest.fixture(scope="module")
def tiny():
    q, w, keys, lo, hi = make_inputs(get_preset("tiny"))
    return q, w, keys, lo.astype(np.int32), hi.astype(np.int32)


def test_floor_card_is_complete():
    card = registry.FLOORS["score_only"]
    assert card.role == "floor" and registry.CARDS["score_only"] is card and "score_only" not in registry.STAGES
    params = [p for p in inspect.signature(card.reference_fn()).parameters.values() if p.default is p.empty]
    assert len(params) == len(card.args) == 3 and card.args[0] == "source"
    assert set(card.sources) <= set(registry.SOURCES)
    w = registry.Work(n=4, L=100, H=2, D=8, k=5, elem_bytes=2, sum_c=300.0, sum_M=40.0, stored=30.0, sum_c_rows=90.0)
    assert card.work(w, "indexer") == (w.hd2 * 300.0, 100 * 8 * 2)
    assert card.work(registry.SOURCES["indexer_fp8"].sized(w), "indexer_fp8") == (w.hd2 * 300.0, 100 * (8 + 4))


def test_floor_reference_is_the_oracle_checksum_on_every_source(tiny):
    q, w, keys, lo, hi = tiny
    want = ReferenceOracle(q, w, keys, lo, hi).key_checksum()
    X = dict(q=q, w=w, keys=keys, table=R.indexer_scores(q, w, keys, lo, hi))
    for kind in registry.FLOORS["score_only"].sources + ("table",):
        got = R.stage_score_only(registry.SOURCES[kind].build_fn()(X), lo, hi)
        assert got.dtype == np.uint64 and int(got[0]) == want, kind


def test_floor_check_rejects_a_wrong_checksum(tiny):
    q, w, keys, lo, hi = tiny
    oracle = ReferenceOracle(q, w, keys, lo, hi)
    good = R.stage_score_only(R.IndexerSource(q, w, keys), lo, hi)
    assert C.score_only(good, oracle=oracle)[0]
    assert C.score_only(torch.from_numpy(good.view(np.int64)), oracle=oracle)[0]    # the CuPy floors' int64 view
    hi_short = hi.copy()
    hi_short[np.argmax(hi - lo)] -= 1                         # one score left out: off by one at hi
    ok, why = C.score_only(R.stage_score_only(R.IndexerSource(q, w, keys), lo, hi_short), oracle=oracle)
    assert not ok and "checksum" in why


@pytest.mark.parametrize("name, source, stage, row", [
    ("cupy.score_only.simt", "indexer", "score-only", "cupy score_only[simt] (checksum)"),
    ("cupy.score_only.mma_sync", "indexer", "score-only-mma_sync", "cupy score_only[mma_sync] (checksum)"),
    ("cupy.score_only.wgmma_ws2", "indexer", "score-only-wgmma_ws2", "cupy score_only[wgmma_ws2] (checksum)"),
    ("cupy.score_only.wgmma_ws", "indexer_fp8", "score-only-wgmma_ws-fp8", "cupy score_only[wgmma_ws_fp8] (checksum)"),
    ("cupy.score_only.wgmma", "indexer_fp8", "score-only-wgmma-fp8", "cupy score_only[wgmma_fp8] (checksum)"),
    ("reference.score_only", "indexer", "score-only-reference", "reference score_only (checksum)"),
])
def test_floor_rows_keep_their_baseline_names(name, source, stage, row):
    v = registry.Variant("score_only", name, name.split(".")[0], lambda s, lo, hi: None)
    assert registry.FLOORS["score_only"].row_of(v, source) == ("baseline", stage, row, None)
    # a stage's rows: its variant's name and source
    f = registry.Variant("filter", "cupy.filter.wgmma", "cupy", lambda *a: None)
    assert registry.STAGES["filter"].row_of(f, "indexer_fp8") == ("stage", "filter", "cupy.filter.wgmma", "indexer_fp8")


def test_fp8_source_gives_the_same_scores(tiny):
    q, w, keys, lo, hi = tiny
    src = S.indexer_fp8(dict(q=q, w=w, keys=keys))
    assert src.q.dtype == np.uint8 and src.keys.dtype == np.uint8
    ref = R.IndexerSource(q, w, keys)
    for t in range(q.shape[0]):
        np.testing.assert_array_equal(src.row(t, int(lo[t]), int(hi[t])), ref.row(t, int(lo[t]), int(hi[t])))
    enc = S.encode_fp8(dict(q=q, w=w, keys=keys), 0, "cpu")
    assert set(enc) == {"q", "w", "keys", "kscale"} and enc["kscale"].shape == (keys.shape[0],)


def test_fp8_source_usable_per_family():
    ref = registry.Variant("filter", "reference.filter", "reference", lambda *a: None)
    assert registry.SOURCES["indexer_fp8"].usable_by(ref) == (True, "")
    cupy = registry.Variant("filter", "cupy.filter.wgmma", "cupy", lambda *a: None)
    ok, why = registry.SOURCES["indexer_fp8"].usable_by(cupy)
    assert ok or "Hopper" in why


def test_compare_plans_floor_and_fp8_rows_through_the_stage_path():
    assert registry.load_family("reference")
    usable = {"reference": True, "numba": False, "cupy": False}
    missing = {"numba": "no GPU", "cupy": "no GPU"}
    jobs, skipped = CMP.stage_jobs(["filter", "score_only"], {}, lambda name: False, usable, missing, "cpu", True)
    rows = {(k, s, v.name, src) for k, s, v, src in jobs}
    assert ("stage", "filter", "reference.filter", "indexer_fp8") in rows
    assert ("floor", "score_only", "reference.score_only", "indexer") in rows
    # --exclude matches a row's label too: 'fp8' drops the fp8 rows, not the variant's other rows
    jobs, skipped = CMP.stage_jobs(["filter"], {}, lambda name: "fp8" in name, usable, missing, "cpu", True)
    assert {src for *_, src in jobs} == {"table", "indexer"}
    assert {"name": "reference.filter[indexer_fp8]", "stage": "filter", "reason": "excluded (--exclude)"} in skipped


def test_floor_rows_run_outside_the_stage_budget_and_with_a_stage_subset():
    res = CMP.run_compare("tiny", stages=["check"], families=["reference"], say=lambda m: None)
    floors = [r for r in res.rows if r.kind == "baseline" and r.stage.startswith("score-only")]
    assert [r.name for r in floors] == ["reference score_only (checksum)"] and floors[0].correct
    assert floors[0].tflops is None or floors[0].tflops > 0
    checks = [r for r in res.rows if r.kind == "stage"]
    assert checks and all("score-only-reference" in r.ratios for r in checks)


def test_compare_cli_has_floor_and_fp8_rows(tmp_path):
    out = tmp_path / "out.json"
    p = run_cli(["compare", "--preset", "tiny", "--family", "reference", "--json", str(out), "--no-winners"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    by = {(r["kind"], r["stage"], r["name"], r["source"]): r for r in data["rows"]}
    fp8 = by[("stage", "filter", "reference.filter", "indexer_fp8")]
    assert fp8["correct"] and "fp8_rate_vs_bf16" in fp8["ratios"]
    floor = by[("baseline", "score-only-reference", "reference score_only (checksum)", None)]
    assert floor["correct"] and floor["detail"] == "checksum matches"
    assert "reference score_only (checksum)" in p.stdout and "reference.filter[indexer_fp8]" in p.stdout


def test_watch_maps_the_floor_kernel_to_its_card_and_runs_its_row():
    """score_only.cu is the floor's kernel: watch re-checks the floor variants (on the indexer
    source, the card's), not every stage."""
    from pathlib import Path
    from workbench.harness import watch as W
    assert W.stage_of_source(Path("score_only.cu")) == ["score_only"]
    assert registry.load_family("reference")
    loop = W.WatchLoop(preset="tiny", say=lambda m: None)
    outs = loop.check_and_time(Path("score_only.cu"), [registry.get("reference.score_only")], 0.0)
    assert [(o.variant, o.correct) for o in outs] == [("reference.score_only", True)]
