"""The keys gradient's deterministic mode: a fixed, documented reduction order."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from workbench.torch import scoring                  # noqa: E402
import workbench.torch as wt                         # noqa: E402


def fixed_order_sum(L, flat_idx, contrib):
    """The documented order, one float32 add at a time: per key, entries in ascending flat (query, slot) order."""
    out = np.zeros((L, contrib.shape[1]), np.float32)
    for i, s in enumerate(flat_idx):
        if s >= 0:
            out[s] = out[s] + contrib[i]
    return out


def test_deterministic_reduction_is_the_documented_order():
    rng = np.random.default_rng(0)
    L, N, D = 7, 3000, 5                      # many collisions per key
    flat = rng.integers(-1, L, size=N)
    contrib = (rng.standard_normal((N, D)) * 10.0 ** rng.integers(-3, 4, size=(N, 1))).astype(np.float32)
    got = torch.zeros((L, D))
    scoring._add_keys_grad(got, torch.from_numpy(flat), torch.from_numpy(contrib), deterministic=True)
    want = fixed_order_sum(L, flat, contrib)
    assert got.numpy().tobytes() == want.tobytes()
    # the check is sensitive to the order: summing in reverse changes some bits
    assert fixed_order_sum(L, flat[::-1], contrib[::-1]).tobytes() != want.tobytes()


def test_deterministic_backward_is_reproducible_and_close_to_default():
    rng = np.random.default_rng(1)
    n, L, H, D, k = 40, 9, 3, 8, 6           # L tiny: every key is hit by many queries
    q = torch.from_numpy(rng.standard_normal((n, H, D)).astype(np.float32))
    w = torch.from_numpy(rng.random((n, H)).astype(np.float32))
    keys = torch.from_numpy(rng.standard_normal((L, D)).astype(np.float32))
    idx = torch.from_numpy(rng.integers(-1, L, size=(n, k)).astype(np.int32))
    g = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    a = torch.ops.hytopk.replay_scores_backward(g, q, w, keys, idx, True)
    b = torch.ops.hytopk.replay_scores_backward(g, q, w, keys, idx, True)
    c = torch.ops.hytopk.replay_scores_backward(g, q, w, keys, idx, False)
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y)
        assert torch.allclose(x, z, rtol=1e-5, atol=1e-5)
    # padding slots get nothing: zero their grads and the result is unchanged
    g2 = g.masked_fill(idx < 0, 123.0)
    assert all(torch.equal(x, y) for x, y in zip(a, torch.ops.hytopk.replay_scores_backward(
        g2, q, w, keys, idx, True)))


def test_deterministic_flag_follows_torch_setting():
    rng = np.random.default_rng(2)
    q = torch.from_numpy(rng.standard_normal((4, 2, 3)).astype(np.float32)).requires_grad_()
    w = torch.from_numpy(rng.random((4, 2)).astype(np.float32)).requires_grad_()
    keys = torch.from_numpy(rng.standard_normal((5, 3)).astype(np.float32)).requires_grad_()
    idx = torch.from_numpy(rng.integers(0, 5, size=(4, 3)).astype(np.int32))
    seen = []
    orig = scoring._add_keys_grad

    def spy(dkeys, flat, contrib, deterministic):
        seen.append(deterministic)
        return orig(dkeys, flat, contrib, deterministic)

    scoring._add_keys_grad = spy
    try:
        wt.replay_scores(q, w, keys, idx).sum().backward()
        torch.use_deterministic_algorithms(True)
        try:
            wt.replay_scores(q, w, keys, idx).sum().backward()
        finally:
            torch.use_deterministic_algorithms(False)
        wt.replay_scores(q, w, keys, idx, deterministic=True).sum().backward()
    finally:
        scoring._add_keys_grad = orig
    assert seen == [False, True, True]
