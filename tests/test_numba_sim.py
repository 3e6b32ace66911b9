"""Simulator-only checks of the Numba family's helpers (its variants are covered by
tests/test_variants.py, its tiled scorer by tests/test_numba_tile.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("simulator-only checks (run with NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

from workbench.families.numba import FAMILY  # noqa: E402

def test_scatter_rows_writes_only_listed_rows():
    dst_i = FAMILY.to_device(np.full((4, 3), 7, np.int32))
    dst_v = FAMILY.to_device(np.full((4, 3), 7, np.float32))
    rows = FAMILY.to_device(np.array([2, 0], np.int32))
    FAMILY.scatter_rows(dst_i, dst_v, rows, FAMILY.to_device(np.arange(6, dtype=np.int32).reshape(2, 3)),
                        FAMILY.to_device(-np.arange(6, dtype=np.float32).reshape(2, 3)))
    got = FAMILY.to_host(dst_i)
    np.testing.assert_array_equal(got, [[3, 4, 5], [7, 7, 7], [0, 1, 2], [7, 7, 7]])
    np.testing.assert_array_equal(FAMILY.to_host(dst_v)[[1, 3]], 7)
