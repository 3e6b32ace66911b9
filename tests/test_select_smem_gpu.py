"""cupy.select.radix_smem (select.cu hytopk_select_smem_e*) and cupy.select.fast (select.cu
hytopk_select_fast: block_select_fast, no sort; its fallbacks) against the reference's stage 8, bit
for bit: every register-sort width E (k from 1 to 4096), the k > 4096 and large-capacity
fallbacks, storage order shuffled and slots past the count poisoned, ties at K* (plateaus of
one score, -0.0 beside +0.0, NaN of both signs, +-inf), counts of 0, < k, == k, == capacity,
and a dsv32-128k-sized problem (capacity 8960, ~6000 stored, k 2048)."""
from __future__ import annotations

import numpy as np
import pytest

import reference as R
from tests._cupy_gpu import GPU_MARKS, cp

pytestmark = GPU_MARKS


def _bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _candidates(rng, n, capacity, kind):
    """(cand_idx, cand_val, count): distinct positions per row, stored in random order, the
    slots past the count poisoned (a kernel that reads them gets a different answer)."""
    count = rng.integers(0, capacity + 1, n).astype(np.int32)
    edge = [0, 1, capacity, min(capacity, 3)][:n]                              # empty, one, full rows
    count[:len(edge)] = edge
    ci = np.full((n, capacity), 7, np.int32)
    cv = np.full((n, capacity), np.float32(3e38), np.float32)                  # poison: would win
    for t in range(n):
        c = int(count[t])
        ci[t, :c] = rng.choice(10 * capacity + 10, c, replace=False)
        if kind == "random":
            v = rng.standard_normal(c).astype(np.float32)
        elif kind == "tail":                                                   # a filter's output: the top of a normal
            v = (2.0 + np.abs(rng.standard_normal(c)) * 0.7).astype(np.float32)
        elif kind == "plateau":                                                # ties at K*: positions decide
            v = rng.choice(np.array([0.0, -0.0, 1.0, 2.0], np.float32), c)
        else:                                                                  # specials
            v = rng.choice(np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45,
                                     3.4028235e38, -3.4028235e38, 1.5], np.float32), c)
        cv[t, :c] = v
    return ci, cv, count


SELECTS = ["select_smem", "select_fast"]


@pytest.mark.parametrize("fn", SELECTS)
@pytest.mark.parametrize("k", [1, 5, 256, 300, 512, 1000, 2048, 4096, 4097])
@pytest.mark.parametrize("kind", ["random", "plateau", "specials", "tail"])
def test_select_smem_matches_reference(k, kind, fn):
    from workbench.families.cupy import select as S
    rng = np.random.default_rng(k + len(kind))
    capacity = max(2 * k + 17, 64)
    ci, cv, count = _candidates(rng, 12, capacity, kind)
    idx_ref, val_ref = R.stage_select(ci, cv, count, k)
    idx, val = getattr(S, fn)(cp.asarray(ci), cp.asarray(cv), cp.asarray(count), k)
    np.testing.assert_array_equal(idx.get(), idx_ref)
    np.testing.assert_array_equal(_bits(val.get()), _bits(val_ref))


@pytest.mark.parametrize("fn", SELECTS)
def test_select_smem_dsv32_shape_and_storage_order(fn):
    """capacity 8960, ~6000 stored, k 2048; the same answer for two storage orders."""
    from workbench.families.cupy import select as S
    rng = np.random.default_rng(5)
    n, capacity, k = 64, 8960, 2048
    ci, cv, count = _candidates(rng, n, capacity, "random")
    count[:] = rng.integers(5000, 7000, n)
    for t in range(n):
        c = int(count[t])
        ci[t, :c] = rng.choice(131072, c, replace=False)
        cv[t, :c] = rng.standard_normal(c).astype(np.float32)
    idx_ref, val_ref = R.stage_select(ci, cv, count, k)
    for _ in range(2):
        idx, val = getattr(S, fn)(cp.asarray(ci), cp.asarray(cv), cp.asarray(count), k)
        np.testing.assert_array_equal(idx.get(), idx_ref)
        np.testing.assert_array_equal(_bits(val.get()), _bits(val_ref))
        for t in range(n):                                                     # another storage order
            c = int(count[t])
            p = rng.permutation(c)
            ci[t, :c], cv[t, :c] = ci[t, :c][p], cv[t, :c][p]


@pytest.mark.parametrize("fn", SELECTS)
def test_select_smem_large_capacity_falls_back(fn):
    """A capacity whose keys do not fit shared memory takes cupy.select.radix_bitonic (select_fast:
    rows past 8192 candidates select from global memory): same answer."""
    from workbench.families.cupy import select as S
    rng = np.random.default_rng(9)
    capacity, k = 60000, 64
    ci, cv, count = _candidates(rng, 3, capacity, "random")
    idx_ref, val_ref = R.stage_select(ci, cv, count, k)
    idx, val = getattr(S, fn)(cp.asarray(ci), cp.asarray(cv), cp.asarray(count), k)
    np.testing.assert_array_equal(idx.get(), idx_ref)
    np.testing.assert_array_equal(_bits(val.get()), _bits(val_ref))
