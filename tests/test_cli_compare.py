"""`hytopk compare`: every row checked before timing, wrong rows never win, the
torch oracle agrees with the reference, and the tiny preset is all correct on CPU."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import reference as R
from reference import generate as G
from workbench import registry
from workbench.harness import compare as CMP
from workbench.harness.oracle import ReferenceOracle, TorchOracle, exact_topk_t, order_keys_t

from _cli_util import run_cli


def _rows_ok(data):
    assert data["rows"], "no rows"
    bad = [(r["name"], r["source"], r["detail"]) for r in data["rows"] if r["correct"] is not True]
    assert not bad, bad


def test_compare_tiny_cpu_every_row_correct(tmp_path):
    out = tmp_path / "out.json"
    p = run_cli(["compare", "--preset", "tiny", "--json", str(out)], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    _rows_ok(data)
    kinds = {(r["kind"], r["stage"]) for r in data["rows"]}
    for s in registry.STAGES:
        assert ("stage", s) in kinds
    assert ("pipeline", "hytopk_indexer") in kinds and ("baseline", "torch") in kinds
    assert ("baseline", "dense+topk") in kinds
    assert all(r["time_ms"] > 0 for r in data["rows"])
    # each timing with its spread: quantiles and repeats, the median in time_ms (CPU: at least 5 repeats)
    for r in data["rows"]:
        sp = r["spread"]
        assert sp["median_ms"] == r["time_ms"] and sp["repeats"] >= 5, (r["name"], sp)
        assert sp["min_ms"] <= sp["q25_ms"] <= sp["median_ms"] <= sp["q75_ms"] <= sp["max_ms"]
    assert "IQR ms" in p.stdout
    assert data["environment"]["git_commit"] is None or len(data["environment"]["git_commit"]) == 40
    assert data["ceilings"]["gemm_tflops"] > 0 and data["ceilings"]["copy_gbps"] > 0
    assert (tmp_path / "out.png").stat().st_size > 1000
    win = json.loads((tmp_path / "winners.json").read_text())
    assert set(win["entries"]["tiny"]["stages"]) == set(registry.STAGES)
    # Numba without a GPU or the simulator: listed as skipped with the reason, not silently dropped
    if registry.load_family("numba"):
        assert any("NUMBA_ENABLE_CUDASIM" in s["reason"] for s in data["skipped"] if s["name"].startswith("numba"))


@pytest.mark.sim
def test_compare_tiny_simulator_every_row_correct(tmp_path):
    out = tmp_path / "sim.json"
    p = run_cli(["compare", "--preset", "tiny", "--json", str(out), "--no-winners"], tmp_path, sim=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    data = json.loads(out.read_text())
    _rows_ok(data)
    if registry.load_family("numba"):
        numba_rows = [r for r in data["rows"] if r["name"].startswith("numba")]
        assert {r["stage"] for r in numba_rows} >= set(registry.STAGES), "Numba variants did not run in the simulator"


def test_exclude_skips_matching_variants_and_keeps_pipelines():
    """--exclude drops stage rows by name (listed as skipped, with the reason); pipelines,
    which run the family's own stages, and the baselines still run."""
    res = CMP.run_compare("tiny", say=lambda m: None, families=["reference"], exclude=["select", "recover"])
    names = {r.name for r in res.rows if r.kind == "stage"}
    assert names and not any("select" in n or "recover" in n for n in names)
    assert {s["name"] for s in res.skipped if s["reason"] == "excluded (--exclude)"} == \
        {v.name for v in registry.variants(load=False) if v.stage in ("select", "recover")}
    assert any(r.kind == "pipeline" and r.correct for r in res.rows)
    assert any(r.kind == "baseline" and r.stage == "torch" for r in res.rows)


def test_compare_unknown_preset_names_the_argument(tmp_path):
    p = run_cli(["compare", "--preset", "nope"], tmp_path)
    assert p.returncode == 2 and "argument 'preset'" in p.stdout


def test_large_preset_without_gpu_runs_tiny_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(CMP, "gpu_available", lambda: False)
    notes = []
    res = CMP.run_compare("dsv32-128k", stages=["check"], families=["reference"], say=notes.append)
    assert res.preset["name"] == "tiny"
    assert any("no GPU" in n and "tiny" in n for n in notes)


@pytest.fixture
def broken_variant():
    """A deliberately wrong select variant, removed from the registry afterwards."""
    name = "reference.select.broken_for_test"

    def broken(cand_idx, cand_val, count, k):
        idx, val = R.stage_select(cand_idx, cand_val, count, k)
        return idx[:, ::-1].copy(), val[:, ::-1].copy()          # reversed rank order: wrong
    registry.register("select", name)(broken)
    yield name
    registry._VARIANTS.pop(name, None)


def test_wrong_variant_is_reported_and_never_wins(broken_variant):
    res = CMP.run_compare("tiny", stages=["select"], families=["reference"], say=lambda m: None, repeats=1)
    rows = {r.name: r for r in res.rows if r.kind == "stage"}
    assert rows[broken_variant].correct is False and rows[broken_variant].time_ms is None
    assert "select" in rows[broken_variant].detail
    assert rows["reference.select"].correct is True
    assert res.winners["stages"]["select"] == "reference.select"
    assert not [r for r in res.rows if r.kind == "pipeline"], "a stage subset compares stages only"


def test_crashing_variant_is_a_wrong_row():
    name = "reference.check.crash_for_test"
    registry.register("check", name)(lambda *a: 1 / 0)
    try:
        res = CMP.run_compare("tiny", stages=["check"], variant_names=[name], families=["reference"],
                              say=lambda m: None, repeats=1)
    finally:
        registry._VARIANTS.pop(name, None)
    (row,) = [r for r in res.rows if r.kind == "stage"]
    assert row.correct is False and "ZeroDivisionError" in row.detail
    assert "check" not in res.winners["stages"]


def test_order_keys_in_torch_match_the_reference():
    x = G.score_table("specials", 8, 512, 8, np.random.default_rng(3))
    assert np.array_equal(order_keys_t(torch.from_numpy(x)).numpy(), R.order_keys(x).astype(np.int64))


def test_exact_topk_in_torch_is_the_contract_order():
    rng = np.random.default_rng(4)
    for fam in ("ties_at_kth", "specials", "equal"):
        s = G.score_table(fam, 5, 300, 7, rng)
        lo, hi = G.layout("random", 5, 300, 7, rng)
        st = torch.from_numpy(s)
        pos = torch.arange(300).expand(5, -1)
        key = order_keys_t(st)
        inside = (pos >= torch.from_numpy(lo).long()[:, None]) & (pos < torch.from_numpy(hi).long()[:, None])
        idx, val = exact_topk_t(torch.where(inside, key, torch.full_like(key, -1)), pos, st, 7)
        want_i, want_v = R.topk(s, lo, hi, 7)
        assert np.array_equal(idx.numpy(), want_i)
        assert np.array_equal(val.numpy().view(np.uint32), want_v.view(np.uint32))


@pytest.mark.parametrize("lay", G.LAYOUTS)
def test_torch_oracle_equals_reference_oracle(lay):
    rng = np.random.default_rng(G.LAYOUTS.index(lay))
    n, L, H, D, k = 6, 600, 2, 4, 9
    q, w, keys = G.indexer_inputs(n, L, H, D, rng)
    lo, hi = G.layout(lay, n, L, k, rng)
    for cap in (None, 9, 40):
        a = ReferenceOracle(q, w, keys, lo, hi).compute(k, cap, 3.0)
        b = TorchOracle(q, w, keys, lo, hi, device="cpu", budget_elems=4000).compute(k, cap, 3.0)
        for f in ("T", "count", "failed", "select_idx", "select_val", "topk_idx", "topk_val"):
            x, y = getattr(a, f), getattr(b, f)
            if x.dtype == torch.float32:
                x, y = order_keys_t(x), order_keys_t(y)
            assert torch.equal(x.to(y.dtype), y), (lay, cap, f)
        for t in range(n):
            m = min(int(a.count[t]), a.capacity)
            assert sorted(a.cand_idx[t, :m].tolist()) == sorted(b.cand_idx[t, :m].tolist())


def test_checks_catch_each_kind_of_wrong_filter_output():
    """The filter gate: right count and distinct in-context candidates with their true values."""
    from workbench.harness import checks as C
    from workbench.harness.presets import get
    wl = CMP.Workload(get("tiny"), "cpu")
    E, ctx = wl.E, dict(oracle=wl.oracle, lo=wl.lo_t, hi=wl.hi_t)
    good = (E.cand_idx.clone(), E.cand_val.clone(), E.count.to(torch.int32))
    assert C.filter_(good, E, **ctx) == (True, "")
    t = int(torch.nonzero(E.count > 1)[0])
    dup = (good[0].clone(), good[1].clone(), good[2])
    dup[0][t, 1], dup[1][t, 1] = dup[0][t, 0], dup[1][t, 0]
    assert not C.filter_(dup, E, **ctx)[0]
    wrongval = (good[0], good[1].clone(), good[2])
    wrongval[1][t, 0] += 1
    assert not C.filter_(wrongval, E, **ctx)[0]
    wrongcount = (good[0], good[1], good[2] + 1)
    assert not C.filter_(wrongcount, E, **ctx)[0]


def test_exclude_patterns_are_substrings_or_regular_expressions():
    from workbench.harness.compare import _matches
    assert _matches("simt", "cupy.filter.simt")
    assert _matches("wgmma$", "cupy.filter.wgmma") and not _matches("wgmma$", "cupy.filter.wgmma_ws")
    assert _matches("score_only[mma_sync]", "cupy score_only[mma_sync] (checksum)")      # a substring, not a class
    assert not _matches("(", "cupy.filter.simt")                                     # a bad expression matches nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="the simulator default is for machines without a GPU")
def test_wb_main_job_without_gpu_checks_numba_in_the_simulator(tmp_path):
    """./wb compare (the README's main job) on a CPU: the Numba variants are checked in the CUDA
    simulator by default, one call each, not timed as winners; NUMBA_ENABLE_CUDASIM=0 opts out."""
    import subprocess
    import sys

    from _cli_util import ROOT, _env
    out = tmp_path / "out.json"
    env = dict(_env(tmp_path, False), HYTOPK_PYTHON=sys.executable)
    args = ["bash", str(ROOT / "wb"), "compare", "--preset", "tiny", "--stage", "check", "--json", str(out)]
    p = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "CUDA simulator" in p.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["numba.check.block"]["correct"] is True
    p = subprocess.run(args, cwd=tmp_path, env=dict(env, NUMBA_ENABLE_CUDASIM="0"), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0 and "numba.check.block" not in {r["name"] for r in json.loads(out.read_text())["rows"]}
