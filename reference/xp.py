"""The array module of an array: NumPy, or CuPy for a CuPy array (CuPy is imported only then),
so the codecs (reference.fp8, workbench.bf16) run on host and device arrays alike."""
from __future__ import annotations

import numpy as np


def array_module(x):
    return np if isinstance(x, np.ndarray) or type(x).__module__.split(".")[0] != "cupy" else __import__("cupy")
