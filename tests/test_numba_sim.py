"""Numba variants registered gpu_only for speed that use no warp intrinsics
(shared-memory staging only) still run in the simulator: check them there too,
so CI covers their indexing. On a GPU, tests/test_variants.py covers them."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings

import reference as R

from strategies import indexer_cases

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("simulator-only checks (run with NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

from workbench.families.numba import FAMILY, dense, replay  # noqa: E402

SMALL = dict(max_n=2, max_L=40, max_H=2, max_D=3, max_k=6)


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


@settings(max_examples=4)
@given(case=indexer_cases(**SMALL))
def test_dense_smem_in_simulator(case):
    d = FAMILY.to_device
    out = dense.dense_smem(d(case.q), d(case.w), d(case.keys), d(case.lo.astype(np.int32)),
                           d(case.hi.astype(np.int32)))
    ref = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    np.testing.assert_array_equal(bits(FAMILY.to_host(out)), bits(ref))


@settings(max_examples=4)
@given(case=indexer_cases(**SMALL))
def test_replay_smem_in_simulator(case):
    d = FAMILY.to_device
    table = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi)
    idx, _ = R.topk(table, case.lo, case.hi, case.k)
    out = replay.replay_smem(d(case.q), d(case.w), d(case.keys), d(idx))
    np.testing.assert_array_equal(bits(FAMILY.to_host(out)), bits(R.replay_scores(case.q, case.w, case.keys, idx)))


def test_scatter_rows_writes_only_listed_rows():
    dst_i = FAMILY.to_device(np.full((4, 3), 7, np.int32))
    dst_v = FAMILY.to_device(np.full((4, 3), 7, np.float32))
    rows = FAMILY.to_device(np.array([2, 0], np.int32))
    FAMILY.scatter_rows(dst_i, dst_v, rows, FAMILY.to_device(np.arange(6, dtype=np.int32).reshape(2, 3)),
                        FAMILY.to_device(-np.arange(6, dtype=np.float32).reshape(2, 3)))
    got = FAMILY.to_host(dst_i)
    np.testing.assert_array_equal(got, [[3, 4, 5], [7, 7, 7], [0, 1, 2], [7, 7, 7]])
    np.testing.assert_array_equal(FAMILY.to_host(dst_v)[[1, 3]], 7)
