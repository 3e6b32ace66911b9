"""Issue 19 through the Numba backend in the CUDA simulator (the `./wb test` simulator pass runs
tests/test_numba_*.py): the same errors as the reference, before anything is allocated, and the
documented edge results. On a GPU, tests/test_arguments_gpu.py runs these with device arrays."""
from __future__ import annotations

import os

import numpy as np
import pytest

import reference as R

from _argument_probes import ERROR_PROBES, HOST_ONLY_PROBES, SUCCESS_PROBES, no_big_allocation

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("simulator-only checks (run with NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import workbench  # noqa: E402

ALL_ERRORS = {**ERROR_PROBES, **HOST_ONLY_PROBES}


@pytest.fixture(scope="module")
def numba_backend():
    return workbench.backend("numba")


@pytest.mark.parametrize("probe", sorted(ALL_ERRORS))
def test_same_error_as_reference(numba_backend, probe, monkeypatch):
    call, exc, arg = ALL_ERRORS[probe]
    with pytest.raises(exc) as want:
        call(R, lambda x: x)
    moved = []
    monkeypatch.setattr(numba_backend.family, "to_device", lambda x: moved.append(x) or x)
    with no_big_allocation(), pytest.raises(exc) as got:
        call(numba_backend, lambda x: x)
    assert str(got.value) == str(want.value)
    assert not moved, "arguments were moved to the device before they were checked"


@pytest.mark.parametrize("probe", sorted(SUCCESS_PROBES))
def test_documented_results(numba_backend, probe):
    SUCCESS_PROBES[probe](numba_backend, lambda x: x, np.asarray)
