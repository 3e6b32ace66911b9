"""The Numba family with every indexer input dtype combination (issue 17), in the CUDA simulator:
bf16 / fp8 e4m3 q and keys (decoded exactly by the Backend; fp8 keys packed with their float32
scales), float32 / bf16 w — the pipeline, dense and replay equal the float32 reference bit for bit
on exact inputs. On a GPU, tests/test_dtypes_gpu.py runs the same checks."""
from __future__ import annotations

import os

import numpy as np
import pytest

import reference as R
from reference import dtypes as DT
from reference import generate as G

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("simulator-only checks (run with NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import workbench  # noqa: E402
from workbench.families.numba import FAMILY, dense, replay  # noqa: E402

COMBOS = [(kind, wd) for kind in DT.KINDS for wd in ("float32", "bf16")]


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("kind, wd", COMBOS)
def test_numba_backend_every_combination(kind, wd):
    rng = np.random.default_rng(11)
    n, L, H, D, k = 3, 150, 2, 4, 8
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout("random", n, L, k, rng)
    qq, ww, kk, ks = DT.encode_exact(q, w, keys, kind, wd, rng)
    b = workbench.backend("numba")
    want = R.hytopk_indexer(q, w, keys, lo, hi, k, max_failed=1)
    res = b.hytopk_indexer(qq, ww, kk, lo, hi, k, kscale=ks, max_failed=1)
    np.testing.assert_array_equal(res.idx, want.idx)
    np.testing.assert_array_equal(bits(res.val), bits(want.val))
    np.testing.assert_array_equal(bits(b.indexer_scores(qq, ww, kk, lo, hi, kscale=ks)),
                                  bits(R.indexer_scores(q, w, keys, lo, hi)))
    np.testing.assert_array_equal(bits(b.replay_scores(qq, ww, kk, want.idx, kscale=ks)),
                                  bits(R.replay_scores(q, w, keys, want.idx)))


def test_tiled_dense_and_replay_take_key_scales():
    """The tiled scorer's dense and replay variants with fp8 key scales (packed beside the keys)."""
    rng = np.random.default_rng(12)
    n, L, H, D, k = 2, 40, 2, 3, 5
    q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
    lo, hi = G.layout("random", n, L, k, rng)
    q8, w32, k8, ks = DT.encode_exact(q, w, keys, "fp8", "float32", rng)
    d = FAMILY.to_device
    qf, kf = (DT.decode(x, "fp8") for x in (q8, k8))
    table = dense.dense_tiled(d(qf), d(w32), d(kf), d(lo), d(hi), kscale=d(ks))
    np.testing.assert_array_equal(bits(FAMILY.to_host(table)), bits(R.indexer_scores(q, w, keys, lo, hi)))
    idx, _ = R.topk(R.indexer_scores(q, w, keys, lo, hi), lo, hi, k)
    out = replay.replay_tiled(d(qf), d(w32), d(kf), d(idx), kscale=d(ks))
    np.testing.assert_array_equal(bits(FAMILY.to_host(out)), bits(R.replay_scores(q, w, keys, idx)))
