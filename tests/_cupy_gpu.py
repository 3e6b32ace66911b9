"""What the CuPy GPU test modules share: CuPy (the module is skipped without it) and the marks
that skip every test of a module, saying why, when no usable CUDA GPU is here.

    from tests._cupy_gpu import cp, GPU_MARKS
    pytestmark = GPU_MARKS
"""
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")


def _gpu_reason():
    try:
        n = cp.cuda.runtime.getDeviceCount()
        return None if n > 0 else "no CUDA device"
    except Exception as e:
        return f"no usable CUDA GPU ({type(e).__name__}: {e})"


REASON = _gpu_reason()
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]
