"""Issue 19 on a GPU: the CuPy and Numba backends (device arrays in) and the torch ops on CUDA
tensors give the same argument errors as the reference, before allocating anything, and the
documented edge results. Skipped with the reason where there is no GPU. One command on the H200:

    python3 -m pytest -q tests/test_arguments_gpu.py
"""
from __future__ import annotations

import numpy as np
import pytest

import reference as R

from _argument_probes import (ERROR_PROBES, HOST_ONLY_PROBES, SUCCESS_PROBES, check_torch_documented,
                              names_the_argument, torch_error_probes, usable_backend)

torch = pytest.importorskip("torch")
_REASON = None if torch.cuda.is_available() else "needs a CUDA GPU and driver (torch.cuda.is_available() is False)"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]

MiB = 1 << 20


def _backend(family):
    return usable_backend(family, real_gpu=True)


def _kinds():
    """Array kinds handed to the GPU backends: host NumPy, CuPy arrays, torch CUDA tensors."""
    out = [pytest.param("numpy", id="numpy")]
    try:
        import cupy  # noqa: F401
        out.append(pytest.param("cupy", id="cupy"))
    except ImportError:
        pass
    out.append(pytest.param("torch", id="torch"))
    return out


def _to(kind):
    if kind == "numpy":
        return lambda x: x
    if kind == "cupy":
        import cupy
        return cupy.asarray
    return lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()


def _host(x):
    from workbench.arrays import to_numpy
    return to_numpy(x)


class DeviceMemory:
    """Peak device memory of the block, from the CuPy pool and torch's allocator."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.torch0 = torch.cuda.memory_allocated()
        try:
            import cupy
            self.pool = cupy.get_default_memory_pool()
            self.cupy0 = self.pool.total_bytes()
        except ImportError:
            self.pool = None
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.torch_peak = torch.cuda.max_memory_allocated() - self.torch0
        self.cupy_growth = (self.pool.total_bytes() - self.cupy0) if self.pool is not None else 0
        return False


FAMILIES = ["cupy", "numba"]
ALL_ERRORS = {**ERROR_PROBES, **HOST_ONLY_PROBES}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize("probe", sorted(ALL_ERRORS))
def test_backend_same_error_as_reference(family, kind, probe, monkeypatch):
    if probe in HOST_ONLY_PROBES and kind != "numpy":
        pytest.skip("mixes array kinds on purpose: NumPy inputs only")
    b = _backend(family)
    call, exc, arg = ALL_ERRORS[probe]
    with pytest.raises(exc) as want:
        call(R, lambda x: x)
    A = _to(kind)
    moved = []
    to_device = b.family.to_device
    monkeypatch.setattr(b.family, "to_device", lambda x: moved.append(1) or to_device(x))
    with DeviceMemory() as mem, pytest.raises(exc) as got:
        call(b, A)
    assert str(got.value) == str(want.value)
    assert not moved, "arguments were moved to the device before they were checked"
    assert mem.torch_peak < 64 * MiB and mem.cupy_growth < 64 * MiB, (mem.torch_peak, mem.cupy_growth)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize("probe", sorted(SUCCESS_PROBES))
def test_backend_documented_results(family, kind, probe):
    b = _backend(family)
    with DeviceMemory() as mem:
        SUCCESS_PROBES[probe](b, _to(kind), _host)
    assert mem.torch_peak < 256 * MiB and mem.cupy_growth < 256 * MiB, (mem.torch_peak, mem.cupy_growth)


@pytest.mark.parametrize("probe", sorted(torch_error_probes("cuda") if _REASON is None else []))
def test_torch_ops_reject_early_on_cuda(probe):
    call, exc, arg = torch_error_probes("cuda")[probe]
    with DeviceMemory() as mem, pytest.raises(exc) as e:
        call()
    assert names_the_argument(str(e.value), arg), str(e.value)
    assert mem.torch_peak < 64 * MiB and mem.cupy_growth < 64 * MiB, (mem.torch_peak, mem.cupy_growth)


@pytest.mark.parametrize("name", ["q", "w", "keys", "lo", "hi"])
def test_torch_select_cpu_tensor_among_cuda_names_it(name):
    import workbench.torch as wt
    from _argument_probes import HI, KEYS, LO, Q, W
    args = {n: torch.from_numpy(x).cuda() for n, x in zip(("q", "w", "keys", "lo", "hi"), (Q, W, KEYS, LO, HI))}
    args[name] = args[name].cpu()
    with pytest.raises(ValueError) as e:
        wt.select(args["q"], args["w"], args["keys"], args["lo"], args["hi"], 4)
    assert names_the_argument(str(e.value), name), str(e.value)


def test_torch_kl_target_on_cpu_with_cuda_inputs_names_target():
    import workbench.torch as wt
    from _argument_probes import IDX, KEYS, Q, TARGET, W
    xs = [torch.from_numpy(x).cuda() for x in (Q, W, KEYS, IDX)]
    with pytest.raises(ValueError) as e:
        wt.indexer_kl_loss(*xs, torch.from_numpy(TARGET))
    assert names_the_argument(str(e.value), "target"), str(e.value)


def test_torch_ops_documented_results_on_cuda():
    check_torch_documented("cuda")
