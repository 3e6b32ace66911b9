"""The CP scaling model's arithmetic (workbench/distributed/scaling.py, issue 16)."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.distributed import scaling as S
from workbench.distributed.sharding import causal_ranges

UNIT = S.Inputs(rate=1.0, t_thr=0.0, t_sel=0.0, t_piece=0.0, bw=1.0, bw_inter=0.25, alpha=0.0, gpus_per_node=8)


@pytest.mark.parametrize("n,L", [(4, 8), (5, 5), (3, 10), (16, 4), (1, 1)])
def test_causal_pairs_is_the_sum_of_the_context_lengths(n, L):
    lo, hi = causal_ranges(n, L)
    assert S.causal_pairs(n, L) == int(np.sum(hi.astype(np.int64) - lo))
    assert S.causal_pairs(4, 8) == 2 + 4 + 6 + 8


def test_compute_bound_ring_by_hand():
    r = S.predict(2, 2, 8, 1, UNIT, M=1, pieces_per_step=2)
    # n = 4, W = 20; one GPU: 20 s; per step compute 20 / 4 = 5 s, transfer 8 / 2 = 4 s (hidden)
    assert r["pairs"] == 20 and r["single_s"] == 20.0
    assert r["compute_step_s"] == 5.0 and r["comm_step_s"] == 4.0
    assert r["ring_s"] == 10.0                      # c + (P - 1) max(c, m)
    assert r["fetch_s"] == 1.0                      # min(L, n_rank M) (P - 1) / P row_bytes / bw
    assert r["cp_s"] == 11.0 and r["speedup"] == pytest.approx(20 / 11)
    assert r["overlap"] == 1.0


def test_comm_bound_ring_and_the_slow_inter_node_link():
    slow = S.Inputs(**{**UNIT.__dict__, "bw": 0.5})
    r = S.predict(2, 2, 8, 1, slow, M=1)
    assert r["comm_step_s"] == 8.0 and r["ring_s"] == 5.0 + 8.0 and r["overlap"] == pytest.approx(5 / 8)
    # past one node the ring runs at the inter-node bandwidth
    r16 = S.predict(16, 16, 256, 1, UNIT, M=1)
    assert r16["comm_step_s"] == pytest.approx(256 / 16 / 0.25)


def test_fixed_costs_and_one_gpu():
    inp = S.Inputs(**{**UNIT.__dict__, "t_thr": 0.5, "t_sel": 0.25, "t_piece": 1.0, "alpha": 2.0})
    one = S.predict(1, 4, 8, 1, inp)
    assert one["cp_s"] == one["single_s"] == 20.0 + 4 * 0.75 and one["speedup"] == 1.0
    r = S.predict(2, 2, 8, 1, inp, M=1)
    assert r["compute_step_s"] == 5.0 + 2 * 1.0 and r["comm_step_s"] == 2.0 + 4.0
    assert r["cp_s"] == 2 * 0.75 + 1.0 + 7.0 + 7.0
    with pytest.raises(ValueError, match="P >= 1"):
        S.predict(0, 1, 1, 1, inp)


def test_inputs_from_a_bench_json_and_placeholders_are_reported():
    n, L, P = 16, 64, 2
    rec = {"date": "d", "problems": [{"name": "causal1m-bf16", "world_size": P, "compute_s": 0.5, "comm_s": 0.25,
                                      "params": {"n": n, "L": L, "D": 4, "dtype": "bfloat16", "layout": "causal"},
                                      "phases": {"threshold_s": 0.08, "select_recover_s": 0.16}}]}
    inp = S.from_bench(rec)
    assert inp.rate == pytest.approx(S.causal_pairs(n, L) / P / 0.5)
    assert inp.bw == pytest.approx((L / P) * 8 / 0.25)          # one step of a 32-row bf16 D=4 shard
    assert inp.t_thr == pytest.approx(0.01) and inp.t_sel == pytest.approx(0.02)
    assert set(inp.placeholders()) == {"t_piece", "bw_inter", "alpha"}
    text = S.report(inp)
    assert "PLACEHOLDER" in text and "512 GPUs" in text and "8 x H200" in text
    with pytest.raises(ValueError, match="'record'"):
        S.from_bench(rec, "no-such-problem")
