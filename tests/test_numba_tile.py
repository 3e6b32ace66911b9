"""The Numba family's tiled scorer (workbench/families/numba/tile.py) against its one-position
routine (common.indexer_score_ks): the same float32 arithmetic in the same order, so the
scores must agree bit for bit on ANY float32 inputs, not only on exact ones (a different
summation order, a dropped head or dim, a lost NaN fails here).

Runs in the CUDA simulator on tiny shapes (several head rounds and dim tiles at the
simulator's tile sizes) and on a GPU on the model shapes (H = 64 / 32, D = 128), where it
also checks that both compile to the same fused multiply-adds. Skipped on a CPU without the
simulator."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
cuda = pytest.importorskip("numba.cuda")


def _gpu():
    try:
        return cuda.is_available()
    except Exception:
        return False


if not SIM and not _gpu():
    pytest.skip("needs a GPU or NUMBA_ENABLE_CUDASIM=1", allow_module_level=True)

from workbench.families.numba import common as C  # noqa: E402
from workbench.families.numba import rows, tile  # noqa: E402


@cuda.jit
def _one_position(q2, w, keys, lo, hi, out, scaled):
    """out[t, s] = common.indexer_score_ks(...) for s in [lo, hi), -inf elsewhere: one thread each."""
    t, s = cuda.grid(2)
    if t < out.shape[0] and s < out.shape[1]:
        if lo[t] <= s < hi[t]:
            out[t, s] = C.indexer_score_ks(q2[t], w[t], keys, s, w.shape[1], scaled)
        else:
            out[t, s] = C.NEG_INF


def one_position(q, w, keys, lo, hi, kscale=None):
    n, H, D = q.shape
    L = keys.shape[0]
    kk = keys if kscale is None else np.concatenate([keys, kscale[:, None]], 1)
    out = cuda.device_array((n, L), np.float32)
    _one_position[(C.blocks(n, 4), C.blocks(L, 32)), (4, 32)](
        cuda.to_device(np.ascontiguousarray(q.reshape(n, H * D))), cuda.to_device(w),
        cuda.to_device(np.ascontiguousarray(kk)), cuda.to_device(lo), cuda.to_device(hi), out,
        np.int64(kscale is not None))
    return out.copy_to_host()


def tiled(q, w, keys, lo, hi, kscale=None):
    d = cuda.to_device
    return rows.score_rows("dense", d(q), d(w), d(keys), d(lo), d(hi), keys.shape[0],
                           kscale=None if kscale is None else d(kscale)).copy_to_host()


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def inputs(rng, n, L, H, D, specials=False):
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    w = rng.standard_normal((n, H)).astype(np.float32)
    keys = rng.standard_normal((L, D)).astype(np.float32)
    if specials:                    # NaN, inf and -0 keys: NaN dots must survive the relu
        keys[rng.integers(0, L, 3), rng.integers(0, D, 3)] = [np.nan, np.inf, -0.0]
    lo = rng.integers(0, L // 2 + 1, n).astype(np.int32)
    hi = np.maximum(lo, rng.integers(L // 2, L + 1, n)).astype(np.int32)
    return q, w, keys, lo, hi


CFG = tile.current()
if SIM:
    # heads over several rounds (cfg.hg heads per warp and round) and dims over several tiles
    def shapes(cfg):
        return st.tuples(st.integers(1, 3), st.integers(1, 2 * cfg.tk + 3),
                         st.integers(1, 2 * cfg.warps * cfg.hg + 1), st.integers(1, 2 * cfg.dt + 1))
    EXAMPLES = settings(max_examples=6, deadline=None)
    SWEEP_EXAMPLES = settings(max_examples=3, deadline=None)
else:
    def shapes(cfg):
        return st.sampled_from([(4, 4096, 64, 128), (4, 3000, 32, 128), (3, 777, 5, 13), (2, 600, 72, 40),
                                (3, 257, 1, 1)])
    EXAMPLES = settings(max_examples=5, deadline=None)
    SWEEP_EXAMPLES = settings(max_examples=3, deadline=None)    # 12 shapes, each compiled once


def _check(shape, seed, specials, fp8):
    n, L, H, D = shape
    rng = np.random.default_rng(seed)
    q, w, keys, lo, hi = inputs(rng, n, L, H, D, specials)
    ks = rng.uniform(0.01, 4.0, L).astype(np.float32) if fp8 else None
    want = one_position(q, w, keys, lo, hi, ks)
    got = tiled(q, w, keys, lo, hi, ks)
    np.testing.assert_array_equal(bits(got), bits(want))


@EXAMPLES
@given(shape=shapes(CFG), seed=st.integers(0, 2**31 - 1), specials=st.booleans(), fp8=st.booleans())
def test_tile_equals_one_position_routine(shape, seed, specials, fp8):
    _check(shape, seed, specials, fp8)


# every shape of the sweep computes the same bits (the simulator's shapes there, the GPU's here)
@pytest.mark.parametrize("cfg", tile.SIM_SWEEP if SIM else tile.SWEEP, ids=lambda c: c.label)
def test_every_tile_shape_equals_one_position_routine(cfg):
    @SWEEP_EXAMPLES
    @given(shape=shapes(cfg), seed=st.integers(0, 2**31 - 1), specials=st.booleans(), fp8=st.booleans())
    def run(shape, seed, specials, fp8):
        with tile.use(cfg):
            _check(shape, seed, specials, fp8)
    run()


def test_heads_per_warp_covers_every_head():
    for cfg in (CFG,) + tile.SWEEP + tile.SIM_SWEEP:
        for H in range(1, 200):
            hg = cfg.heads_per_warp(H)
            assert 1 <= hg <= cfg.hg
            rounds = -(-H // (cfg.warps * hg))
            assert rounds * cfg.warps * hg >= H
            assert hg == cfg.hg or cfg.warps * hg >= H      # fewest rounds


def test_tile_source_has_one_dot_per_head_and_key():
    for cfg in (CFG, tile.SWEEP[0], tile.SIM_SWEEP[2]):
        src = tile._source(3, cfg)
        for i in range(3):
            for m in range(cfg.kpt):
                assert f"d_{i}_{m} = d_{i}_{m} + q_{i} * k_{m}" in src


def test_shapes_are_checked_and_parsed():
    assert tile.parse("kpt=4, hsum=warps", tile.SWEEP[0]) == tile.Tile(**{**tile.SWEEP[0].__dict__, "kpt": 4,
                                                                          "hsum": "warps"})
    assert tile.parse(tile.SWEEP[3].label) == tile.SWEEP[3]
    with pytest.raises(ValueError, match="kpt=3"):
        tile.Tile(kpt=3)
    with pytest.raises(ValueError, match="shared memory"):
        tile.Tile(kpt=8, dt=64, hg=8, block=256)
    with pytest.raises(ValueError, match="cannot read"):
        tile.parse("kpt8")
    with tile.use(tile.SIM_SWEEP[2]) as cfg:
        assert tile.current() is cfg
    assert tile.current() == CFG
