"""Every validation error fires and names its argument."""
import numpy as np
import pytest

import reference as R

S = np.zeros((2, 10), np.float32)
LO, HI = np.zeros(2, np.int32), np.full(2, 10, np.int32)
Q, W, K = np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.float32), np.zeros((10, 4), np.float32)


@pytest.mark.parametrize("call, arg", [
    (lambda: R.hytopk(S.astype(np.float64), LO, HI, 3), "scores"),
    (lambda: R.hytopk(S[0], LO, HI, 3), "scores"),
    (lambda: R.hytopk(S, LO.astype(np.float32), HI, 3), "lo"),
    (lambda: R.hytopk(S, LO[:1], HI, 3), "lo"),
    (lambda: R.hytopk(S, LO - 1, HI, 3), "lo"),
    (lambda: R.hytopk(S, LO, HI + 1, 3), "hi"),
    (lambda: R.hytopk(S, LO + 5, HI - 6, 3), "lo'/'hi"),
    (lambda: R.hytopk(S, LO, HI, 0), "k"),
    (lambda: R.hytopk(S, LO, HI, 2.0), "k"),
    (lambda: R.hytopk(S, LO, HI, True), "k"),
    (lambda: R.hytopk(S, LO, HI, 3, capacity=2), "capacity"),
    (lambda: R.hytopk(S, LO, HI, 3, oversample=0.0), "oversample"),
    (lambda: R.hytopk(S, LO, HI, 3, oversample=float("nan")), "oversample"),
    (lambda: R.hytopk(S, LO, HI, 3, oversample=float("inf")), "oversample"),
    (lambda: R.hytopk(S, LO, HI, 3, max_failed=-1), "max_failed"),
    (lambda: R.topk(S, LO, HI, -1), "k"),
    (lambda: R.hytopk_indexer(Q, W[:, :2], K, LO, HI, 3), "w"),
    (lambda: R.hytopk_indexer(Q, W, K[:, :3], LO, HI, 3), "keys"),
    (lambda: R.hytopk_indexer(Q[0], W, K, LO, HI, 3), "q"),
    (lambda: R.indexer_scores(Q, W, K, LO, HI + 1), "hi"),
    (lambda: R.replay_scores(Q, W, K, np.zeros((2, 3), np.int64)), "idx"),
    (lambda: R.replay_scores(Q, W, K, np.full((2, 3), 10, np.int32)), "idx"),
    (lambda: R.replay_scores(Q, W, K, np.full((2, 3), -2, np.int32)), "idx"),
    (lambda: R.indexer_kl_loss(Q, W, K, np.zeros((2, 3), np.int32), np.zeros((2, 4))), "target"),
    (lambda: R.indexer_kl_loss(Q, W, K, np.zeros((2, 3), np.int32), np.zeros((2, 3)), reduction="max"), "reduction"),
    (lambda: R.indexer_kl_loss(Q, W, K, np.full((2, 3), -1, np.int32), np.ones((2, 3))), "target"),
    (lambda: R.order_keys(np.zeros(3)), "x"),
])
def test_bad_input_names_the_argument(call, arg):
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    assert f"'{arg}'" in str(e.value) or f"argument '{arg}" in str(e.value), str(e.value)
