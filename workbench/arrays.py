"""Array kinds at the API boundary: host NumPy in -> NumPy out; CuPy, torch
(CUDA) or Numba device arrays in -> the same kind out, zero-copy."""
from __future__ import annotations

import numpy as np


def kind_of(x) -> str:
    """'numpy' | 'cupy' | 'torch' | 'numba' | 'cuda' (other __cuda_array_interface__/__dlpack__)."""
    if isinstance(x, np.ndarray):
        return "numpy"
    mod = type(x).__module__.split(".", 1)[0]
    if mod == "cupy":
        return "cupy"
    if mod == "torch":
        return "numpy" if x.device.type == "cpu" else "torch"
    if mod == "numba":
        return "numba"
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__"):
        return "cuda"
    return "numpy"


def common_kind(*xs) -> str:
    kinds = {kind_of(x) for x in xs if x is not None and hasattr(x, "shape")}
    if len(kinds) > 1 and "numpy" in kinds:
        raise ValueError(f"inputs mix host and device arrays ({sorted(kinds)}); pass all on one side")
    return sorted(kinds)[0] if kinds else "numpy"


def to_numpy(x):
    k = kind_of(x)
    if k == "numpy":
        return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)
    if k == "cupy":
        return x.get()
    if k == "torch":
        return x.detach().cpu().numpy()
    if k == "numba":
        return x.copy_to_host()
    import cupy
    return cupy.asarray(x).get()


def to_kind(x, kind: str):
    """Convert a result (NumPy, CuPy or Numba device array) to the caller's kind."""
    if kind == "numpy":
        return to_numpy(x)
    k = kind_of(x)
    if k == kind:
        return x
    if kind == "cupy" or kind == "cuda":
        import cupy
        return cupy.asarray(x)
    if kind == "torch":
        import torch
        if k == "cupy":
            return torch.from_dlpack(x)
        return torch.as_tensor(x, device="cuda")
    if kind == "numba":
        from numba import cuda
        return cuda.as_cuda_array(x)
    raise ValueError(f"unknown array kind {kind!r}")
