"""The winners file: record / merge / load round trip, and `hytopk winners`."""
from __future__ import annotations

import json

from workbench.harness import winners

from _cli_util import run_cli

TINY = {"name": "tiny", "n": 4, "L": 320, "H": 2, "D": 8, "k": 16, "layout": "causal_tail", "dtype": "float32"}
BIG = {"name": "dsv32-128k", "n": 4096, "L": 131072, "H": 64, "D": 128, "k": 2048, "layout": "causal_tail",
       "dtype": "bfloat16"}


def _w(stages, by=None, pipe=None):
    return {"stages": stages, "by_source": by or {s: {"variant": v, "time_ms": 1.0} for s, v in stages.items()},
            "pipeline": pipe}


def test_round_trip_and_partial_update(tmp_path):
    p = tmp_path / "w.json"
    winners.record(TINY, "cpu", None, "abc", "today", _w({"select": "a.select", "check": "a.check"}), p=p)
    assert winners.load("tiny", p) == {"select": "a.select", "check": "a.check"}
    # a run over one stage replaces only that stage
    winners.record(TINY, "cpu", None, "abd", "today", _w({"select": "b.select", "check": "b.check"}),
                   stages_run=["select"], p=p)
    assert winners.load("tiny", p) == {"select": "b.select", "check": "a.check"}
    assert winners.load("unknown-preset", p) == {}


def test_load_by_shape_picks_the_nearest_context(tmp_path):
    p = tmp_path / "w.json"
    winners.record(TINY, "cpu", None, None, "d", _w({"select": "tiny.select"}), p=p)
    winners.record(BIG, "cuda", "H200", None, "d", _w({"select": "big.select"}), p=p)
    winners.record({**BIG, "name": "dsv32-32k", "L": 32768}, "cuda", "H200", None, "d",
                   _w({"select": "small.select"}), p=p)
    assert winners.load({"L": 100000, "H": 64, "D": 128, "k": 2048}, p) == {"select": "big.select"}
    assert winners.load({"L": 40000, "H": 64, "D": 128, "k": 2048}, p) == {"select": "small.select"}
    assert winners.load({"L": 40000, "H": 3, "D": 128, "k": 2048}, p) == {}


def test_env_var_sets_the_location(tmp_path, monkeypatch):
    monkeypatch.setenv("HYTOPK_WINNERS", str(tmp_path / "x" / "w.json"))
    assert winners.path() == tmp_path / "x" / "w.json"
    winners.record(TINY, "cpu", None, None, "d", _w({"check": "c"}))
    assert json.loads((tmp_path / "x" / "w.json").read_text())["entries"]["tiny"]["stages"] == {"check": "c"}


def test_cli_shows_winners(tmp_path):
    p = run_cli(["winners"], tmp_path)
    assert p.returncode == 0 and "no winners recorded" in p.stdout
    winners.record(TINY, "cpu", None, None, "d", _w({"check": "reference.check"}, pipe="reference.hytopk"),
                   p=tmp_path / "winners.json")
    p = run_cli(["winners"], tmp_path)
    assert p.returncode == 0 and "reference.check" in p.stdout and "tiny" in p.stdout
