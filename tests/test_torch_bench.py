"""The training-step benchmark runs end to end (tiny preset on CPU) and reports honestly."""
import json

import pytest

torch = pytest.importorskip("torch")


def test_bench_train_tiny_cpu(tmp_path, capsys):
    from workbench.torch import bench_train
    out = tmp_path / "bench.json"
    bench_train.main(["--preset", "tiny", "--device", "cpu", "--reps", "1", "--warmup", "0", "--json", str(out)])
    rep = json.loads(out.read_text())
    res = rep["results"][0]
    assert set(res["cases"]) == set(bench_train.CASES)
    assert res["replay_grads_equal_full_recompute_grads_bitwise_deterministic"] is True
    assert res["ratio_c_vs_a"] > 0 and "date" in rep and rep["versions"]["torch"] == torch.__version__
    # (a) selects with its own (torch.topk) order; on the same inputs its loss is close to HyTopK's
    a = res["cases"]["a_plain_torch_full_recompute"]["loss"]
    c = res["cases"]["c_hytopk_selection_replay"]["loss"]
    assert a == pytest.approx(c, rel=1e-3)
