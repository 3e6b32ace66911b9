"""`hytopk calibrate` at tiny scale: rates are fractions, the failure modes land
where the adversarial families put them, and the CLI writes JSON + plot."""
from __future__ import annotations

import json

import numpy as np

from reference import sampling
from workbench.harness import calibrate as cal

from _cli_util import run_cli


def test_rates_at_tiny_scale():
    out = cal.run(n=8, L=4096, k=16, draws=1, families=["gaussian", "equal", "relu_plateau"],
                  oversamples=[2.0, 3.0], bounds=[(512, 1024), cal.DEFAULT_BOUNDS], gpu=False, say=lambda m: None)
    for section in ("oversample", "capacity", "bounds"):
        assert out[section]
        for r in out[section]:
            for key in ("overflow_rate", "underflow_rate", "fail_rate", "fallback_rate"):
                if key in r:
                    assert 0.0 <= r[key] <= 1.0
    rows = {(r["family"], r["oversample"]): r for r in out["oversample"]}
    # every score equal: the threshold lets every key through, far beyond capacity
    assert rows[("equal", 3.0)]["overflow_rate"] == 1.0
    # the ReLU plateau: T = 0 floods the buffer too
    assert rows[("relu_plateau", 3.0)]["overflow_rate"] == 1.0
    # i.i.d. Gaussian scores with the default capacity: no failures
    assert rows[("gaussian", 3.0)]["fail_rate"] == 0.0
    assert 2.5 < rows[("gaussian", 3.0)]["mean_count_over_k"] < 3.5     # ~oversample * k candidates
    # the bounds sweep changed M, and the patch was undone afterwards
    Ms = {r["min_samples"]: r["M"] for r in out["bounds"] if r["family"] == "gaussian"}
    assert Ms[512] == 512 and Ms[cal.DEFAULT_BOUNDS[0]] == 4096
    assert (sampling.MIN_SAMPLES, sampling.MAX_SAMPLES) == cal.DEFAULT_BOUNDS
    # capacity sweep: overflow never grows with capacity
    caps = sorted((r["capacity"], r["overflow_rate"]) for r in out["capacity"] if r["family"] == "gaussian")
    assert all(a[1] >= b[1] for a, b in zip(caps, caps[1:]))


def test_counts_match_the_reference_filter():
    """The engine's counts are the filter stage's true counts."""
    import reference as R
    from reference import generate as G
    rng = np.random.default_rng(0)
    lo, hi = G.layout("varlen", 6, 2000, 8, rng)
    t = G.score_table("ties_at_kth", 6, 2000, 8, rng, lo, hi)
    M, r = R.sample_plan(lo, hi, 8, 3.0)
    eng = cal.pick_engine(gpu=False)
    got = eng.counts(t, lo, hi, M, r, 8)
    res = R.hytopk(t, lo, hi, 8)
    assert np.array_equal(got, res.count)


def test_cli_calibrate_writes_json_and_plot(tmp_path):
    out = tmp_path / "cal.json"
    p = run_cli(["calibrate", "--quick", "--n", "8", "--L", "4096", "--k", "16", "--draws", "1",
                 "--family", "gaussian", "--family", "sink", "--json", str(out)], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(out.read_text())
    assert {r["family"] for r in data["oversample"]} == {"gaussian", "sink"}
    assert (tmp_path / "cal.png").stat().st_size > 1000


def test_cli_calibrate_rejects_unknown_family(tmp_path):
    p = run_cli(["calibrate", "--quick", "--family", "nope"], tmp_path)
    assert p.returncode == 2 and "argument 'family'" in p.stdout
