"""workbench.torch.CapturedSelect's argument checks on the CPU (the capture and replays:
tests/test_plan_gpu.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.torch import CapturedSelect  # noqa: E402
from workbench.torch.captured import _check_like  # noqa: E402


def _inputs(n=4, L=64, H=2, D=8):
    return (torch.zeros(n, H, D, dtype=torch.bfloat16), torch.zeros(n, H), torch.zeros(L, D, dtype=torch.bfloat16),
            torch.zeros(n, dtype=torch.int32), torch.full((n,), L, dtype=torch.int32))


def test_cpu_tensors_are_refused_naming_the_argument():
    q, w, keys, lo, hi = _inputs()
    with pytest.raises(ValueError, match="argument 'q' must be a CUDA tensor"):
        CapturedSelect(q, w, keys, lo, hi, 8)


def test_non_tensors_are_refused():
    q, w, keys, lo, hi = _inputs()
    with pytest.raises(TypeError, match="argument 'keys' must be a torch.Tensor"):
        CapturedSelect(q, w, [[0.0] * 8] * 64, lo, hi, 8)


def test_replacement_inputs_must_match_the_static_ones():
    q, w, keys, lo, hi = _inputs()
    _check_like("q", q.clone(), q)
    with pytest.raises(ValueError, match="argument 'q'.*does not match the captured input"):
        _check_like("q", q[:-1], q)
    with pytest.raises(ValueError, match="argument 'w'.*does not match"):
        _check_like("w", w.double(), w)
    with pytest.raises(TypeError, match="argument 'keys' must be a torch.Tensor"):
        _check_like("keys", keys.float().numpy(), keys)
