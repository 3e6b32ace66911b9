"""Argument checks shared by every backend (reference, Numba, CuPy, torch).

Each check reads only shapes, dtypes and (for context ranges) a host copy of
``lo``/``hi``, so GPU backends call the very same functions on device arrays.
Every error names the argument and says what was expected.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "dtype_name", "check_array", "check_ranges", "check_k", "check_capacity",
    "check_oversample", "check_max_failed", "check_indexer_inputs", "check_scores",
    "check_idx", "check_target", "target_conditions", "check_selection_args", "check_contiguous",
    "check_same_device", "INT32_MAX",
]

INT32_MAX = 2**31 - 1       # outputs hold int32 positions: k and L stay within it


def dtype_name(x) -> str:
    """'float32', 'int32', 'bfloat16', ... for numpy, cupy, torch and numba arrays."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return type(x).__name__
    name = str(dt)
    return name[len("torch."):] if name.startswith("torch.") else name


def _shape(x):
    shp = getattr(x, "shape", None)
    if shp is None:
        raise TypeError(f"expected an array, got {type(x).__name__}")
    return tuple(int(s) for s in shp)


def check_array(name, x, *, ndim=None, dtypes=None, shape=None):
    """Check ``x`` is an array of the given rank, dtype(s) and (partial) shape.

    ``shape`` entries that are None are free. Returns the shape as a tuple.
    """
    try:
        shp = _shape(x)
    except TypeError as e:
        raise TypeError(f"argument '{name}': {e}") from None
    if ndim is not None and len(shp) != ndim:
        raise ValueError(f"argument '{name}' must be {ndim}-D, got shape {shp}")
    if dtypes is not None:
        dn = dtype_name(x)
        if dn not in dtypes:
            raise TypeError(
                f"argument '{name}' must have dtype {' or '.join(dtypes)}, got {dn}")
    if shape is not None:
        for i, (want, got) in enumerate(zip(shape, shp)):
            if want is not None and want != got:
                raise ValueError(
                    f"argument '{name}' has shape {shp}; dimension {i} must be {want}")
    return shp


INT_DTYPES = ("int32", "int64", "int16", "int8", "uint8", "uint16", "uint32")


def _host_ints(x):
    """A small host copy of an integer array (lo/hi/idx rows) from any array kind."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get"):                      # cupy
        return x.get()
    if hasattr(x, "copy_to_host"):             # numba device array
        return x.copy_to_host()
    if hasattr(x, "detach"):                   # torch
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _as_int_array(seq):
    a = np.asarray(seq)
    return a.astype(np.int64) if a.size == 0 else a


def check_ranges(lo, hi, n: int | None, L: int | None):
    """Context ranges: 1-D int arrays of length n with 0 <= lo <= hi <= L.

    ``n = None``: any length, the same for both; ``L = None``: no upper bound.
    Returns host int64 copies (lo, hi). Python sequences are accepted too."""
    lo, hi = (x if hasattr(x, "shape") else _as_int_array(x) for x in (lo, hi))
    if n is None:
        (n,) = check_array("lo", lo, ndim=1, dtypes=INT_DTYPES)
    check_array("lo", lo, ndim=1, dtypes=INT_DTYPES, shape=(n,))
    check_array("hi", hi, ndim=1, dtypes=INT_DTYPES, shape=(n,))
    lo_h = _host_ints(lo).astype(np.int64)
    hi_h = _host_ints(hi).astype(np.int64)
    if n:
        if lo_h.min() < 0:
            t = int(np.argmin(lo_h))
            bound = "L" if L is None else f"L = {L}"
            raise ValueError(f"argument 'lo': lo[{t}] = {lo_h[t]} is negative; need 0 <= lo <= hi <= {bound}")
        if L is not None and hi_h.max() > L:
            t = int(np.argmax(hi_h))
            raise ValueError(f"argument 'hi': hi[{t}] = {hi_h[t]} exceeds L = {L}; need 0 <= lo <= hi <= L")
        bad = np.nonzero(lo_h > hi_h)[0]
        if bad.size:
            t = int(bad[0])
            raise ValueError(f"arguments 'lo'/'hi': lo[{t}] = {lo_h[t]} > hi[{t}] = {hi_h[t]}; need lo <= hi")
    return lo_h, hi_h


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_k(k):
    """1 <= k <= 2**31 - 1: the outputs are [n, k] with int32 positions."""
    if not _is_int(k):
        raise TypeError(f"argument 'k' must be an int, got {type(k).__name__}")
    if not 1 <= k <= INT32_MAX:
        raise ValueError(f"argument 'k' must be an int in [1, {INT32_MAX}] (int32 outputs), got {k}")
    return int(k)


def check_capacity(capacity, k):
    """None (default_capacity) or an int >= k. A capacity beyond the longest context is
    not an error: reference.capacity.resolve_capacity clamps it before anything is allocated."""
    if capacity is None:
        return None
    if not _is_int(capacity):
        raise TypeError(f"argument 'capacity' must be an int or None, got {type(capacity).__name__}")
    if capacity < k:
        raise ValueError(f"argument 'capacity' must be >= k = {k}, got {capacity}")
    return int(capacity)


def check_oversample(oversample):
    if isinstance(oversample, bool) or not isinstance(oversample, numbers.Real):
        raise TypeError(f"argument 'oversample' must be a real number, got {type(oversample).__name__}")
    if not math.isfinite(oversample) or oversample <= 0:
        raise ValueError(f"argument 'oversample' must be finite and > 0, got {oversample}")
    return float(oversample)


def check_max_failed(max_failed):
    if not _is_int(max_failed):
        raise TypeError(f"argument 'max_failed' must be an int, got {type(max_failed).__name__}")
    if max_failed < 0:
        raise ValueError(f"argument 'max_failed' must be >= 0, got {max_failed}")
    return int(max_failed)


def check_contiguous(name, x):
    """Device kernels index raw pointers: demand C-contiguous arrays."""
    flags = getattr(x, "flags", None)
    ok = None
    if flags is not None and hasattr(flags, "c_contiguous"):
        ok = bool(flags.c_contiguous)
    elif hasattr(x, "is_contiguous"):
        ok = bool(x.is_contiguous())
    elif hasattr(x, "is_c_contiguous"):
        ok = bool(x.is_c_contiguous())
    if ok is False:
        raise ValueError(f"argument '{name}' must be C-contiguous (call .contiguous()/ascontiguousarray first)")


SCORE_DTYPES = ("float32", "bfloat16", "uint16")     # uint16 = raw bf16 bits; bf16 = its exact float32 widening
INPUT_DTYPES = ("float32", "bfloat16", "uint16")      # uint16 = raw bf16 bits (NumPy has no bf16)


def _check_L(name, L, what):
    if L > INT32_MAX:
        raise ValueError(f"argument '{name}' has L = {L} {what}; int32 positions address at most "
                         f"{INT32_MAX}")


def check_scores(scores):
    """A [n, L] score table with L <= 2**31 - 1: float32, or bf16 (torch.bfloat16 / uint16 bits)
    whose answer is that of the table widened exactly to float32. Returns (n, L)."""
    n, L = check_array("scores", scores, ndim=2, dtypes=SCORE_DTYPES)
    _check_L("scores", L, "columns")
    return n, L


def check_indexer_inputs(q, w, keys, *, dtypes=INPUT_DTYPES):
    """q[n,H,D], w[n,H], keys[L,D] with H >= 1, D >= 1, L <= 2**31 - 1. Returns (n, H, D, L)."""
    n, H, D = check_array("q", q, ndim=3, dtypes=dtypes)
    if H < 1 or D < 1:
        raise ValueError(f"argument 'q' has shape {(n, H, D)}; it must be [n, H, D] with H >= 1 heads "
                         f"and head dim D >= 1")
    same = (dtype_name(q),)                      # one input dtype for all three
    check_array("w", w, ndim=2, dtypes=same, shape=(n, H))
    L, _ = check_array("keys", keys, ndim=2, dtypes=same, shape=(None, D))
    _check_L("keys", L, "rows")
    return n, H, D, L


def _min_max(x):
    """(min, max) of a non-empty integer array: reduced where it lives (torch / CuPy: two scalars
    come back, not the array: a selection of 8192 x 2048 is 64 MB), else on the host."""
    if hasattr(x, "aminmax") and getattr(x, "is_cuda", False):     # torch CUDA
        lo, hi = x.detach().aminmax()
        return int(lo), int(hi)
    if hasattr(x, "get") and hasattr(x, "min"):                      # cupy
        return int(x.min()), int(x.max())
    h = _host_ints(x)
    return int(h.min()), int(h.max())


def check_idx(idx, n: int, L: int):
    """Selected indices [n, k] int32 in [-1, L). Returns k."""
    _, k = check_array("idx", idx, ndim=2, dtypes=("int32",), shape=(n, None))
    if n * k:
        lo, hi = _min_max(idx)
        if lo < -1 or hi >= L:
            raise ValueError(f"argument 'idx': entries must lie in [-1, L = {L}), got range [{lo}, {hi}]")
    return k


TARGET_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _array_kind(x) -> str:
    """'numpy' | 'torch' | 'cupy' | 'numba' | ...: the library an array comes from."""
    return type(x).__module__.split(".", 1)[0]


def _device(x) -> str:
    d = getattr(x, "device", None)
    return "cpu" if d is None or isinstance(x, np.ndarray) else str(d)


def check_same_device(**arrays):
    """Every array on one device (torch tensors: cpu / cuda:0 / meta ...). The error names the
    first argument off the device most of them share (ties: the first argument's device)."""
    devs = [(name, _device(x)) for name, x in arrays.items() if x is not None]
    counts: dict = {}
    for _, d in devs:
        counts[d] = counts.get(d, 0) + 1
    if len(counts) <= 1:
        return
    want = max(counts, key=lambda d: counts[d])          # first seen wins a tie (dicts keep order)
    name, got = next((n, d) for n, d in devs if d != want)
    raise ValueError(f"argument '{name}' is on {got}, expected {want} like the other inputs")


def target_conditions(target, idx):
    """The value rules of a KL target, as (condition, message) pairs. Each condition is a
    0-d boolean array of the target's own kind (computed where the target lives: no copy).
    Shared by check_target (which evaluates them) and the torch ops' capture-safe asserts."""
    if _array_kind(target) == "torch":
        import torch
        finite = torch.isfinite(target)
    elif _array_kind(target) == "cupy":
        import cupy
        finite = cupy.isfinite(target)
    else:
        target, idx = np.asarray(_host_values(target)), np.asarray(_host_ints(idx))
        finite = np.isfinite(target)
    return [
        (finite.all(), "argument 'target' must be finite: it holds NaN or +-inf"),
        ((target >= 0).all(), "argument 'target' must be >= 0 (a distribution over the selected slots)"),
        (((idx >= 0) | (target == 0)).all(), "argument 'target' must be 0 where idx = -1 (padding slots)"),
    ]


def _host_values(x):
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "copy_to_host"):             # numba device array
        return x.copy_to_host()
    return np.asarray(x)


def check_target(target, idx, *, values=True):
    """The KL loss target p[n, k]: an array of idx's kind and device, a real floating dtype
    (float16, bfloat16, float32, float64), idx's shape; with ``values``, finite, >= 0 and 0
    where idx = -1. Every violation is one ValueError naming 'target'."""
    if not (hasattr(target, "shape") and hasattr(target, "dtype")):
        raise ValueError(f"argument 'target' must be an array like 'idx' ({_array_kind(idx)}), "
                         f"got {type(target).__name__}")
    if _array_kind(target) != _array_kind(idx):
        raise ValueError(f"argument 'target' must be a {_array_kind(idx)} array like 'idx', got "
                         f"{_array_kind(target)}.{type(target).__name__}")
    if _device(target) != _device(idx):
        raise ValueError(f"argument 'target' is on {_device(target)}, expected {_device(idx)} like 'idx'")
    dn = dtype_name(target)
    if dn not in TARGET_DTYPES:
        raise ValueError(f"argument 'target' must have a real floating dtype ({', '.join(TARGET_DTYPES)}), "
                         f"got {dn}")
    if _shape(target) != _shape(idx):
        raise ValueError(f"argument 'target' has shape {_shape(target)}; it must have idx's shape {_shape(idx)}")
    if values and 0 not in _shape(target) and _device(target) != "meta":      # meta: no values to check
        conds = target_conditions(target, idx)
        for ok, (_, msg) in zip(_host_bools([c for c, _ in conds]), conds):
            if not ok:
                raise ValueError(msg)


def _host_bools(conds):
    """0-d boolean arrays -> Python bools, with one device-to-host copy for torch / cupy."""
    kind = _array_kind(conds[0])
    if kind == "torch":
        import torch
        return torch.stack(conds).tolist()
    if kind == "cupy":
        import cupy
        return cupy.stack(conds).get().tolist()
    return [bool(c) for c in conds]


def check_selection_args(scores_shape, lo, hi, k, capacity, oversample, max_failed):
    """Everything a selection needs, checked in one call. Returns host (lo, hi)."""
    n, L = scores_shape
    lo_h, hi_h = check_ranges(lo, hi, n, L)
    k = check_k(k)
    check_capacity(capacity, k)
    check_oversample(oversample)
    check_max_failed(max_failed)
    return lo_h, hi_h
