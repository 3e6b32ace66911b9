"""Indexer input dtypes: the one rule every backend calls (docs/CONTRACT.md §2, issue 17).

q and keys come in one of three input kinds, w in one of two:

==========  =====================================  ==========  ===============================
kind        q [n,H,D] and keys [L,D]               w [n,H]     kscale [L]
==========  =====================================  ==========  ===============================
float32     float32                                float32     not allowed
                                                   or bf16
bf16        bf16: torch.bfloat16, or uint16 bits   float32     not allowed
            (NumPy/CuPy have no bf16 dtype)        or bf16
fp8         e4m3 ("e4m3fn": no inf, max 448):      float32     float32, required: one scale
            torch.float8_e4m3fn, or uint8 bits     or bf16     per key row (DeepSeek-V3.2's
                                                               indexer cache)
==========  =====================================  ==========  ===============================

q and keys share one kind; w is float32 or bf16 whatever the kind (the models compute it in
float32 and fold the softmax scale, ``H**-0.5`` and, for fp8, each query head's scale into it).
The score of query t at key s, on the *decoded* values (bf16 and e4m3 widen exactly to float32):

    float32, bf16:  I[t, s] =             sum_h w[t,h] * max(0, dot(q[t,h], keys[s]))
    fp8:            I[t, s] = kscale[s] * sum_h w[t,h] * max(0, dot(q[t,h], keys[s]))

The reference evaluates it in float64 and rounds once to float32: every product q*k is exact in
float64 (float32 x float32 needs 48 significand bits, bf16 x bf16 16, e4m3 x e4m3 8), the dot
products, the weighted sum over heads and the key scale are float64 operations in that order
(d, then h, then the scale). Kernels accumulate in float32 (d, then h, then x kscale); on exact
inputs (small integers, power-of-two scales: every partial sum representable) both are exact, so
every backend matches the reference bit for bit. Since kscale > 0 the fp8 score is the bf16
formula on the dequantised keys ``keys * kscale`` (in real arithmetic).

Mixed kinds are refused with an error naming the argument: fp8 q with bf16 keys, a kscale
without fp8 keys, fp8 keys without a kscale, fp8 or float64 weights, ...
(``allow_float64`` admits float64 q/w/keys as a fourth kind for the reference's loss only.)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .validate import _check_L, check_array, dtype_name

__all__ = [
    "KINDS", "Q_DTYPES", "W_DTYPES", "IndexerDtypes", "input_kind", "check_indexer_dtypes",
    "check_indexer_args", "decode", "decode_float64", "encode_exact",
]

# dtype name (numpy / cupy / torch / ml_dtypes spelling) -> input kind
Q_DTYPES = {
    "float32": "float32",
    "bfloat16": "bf16", "uint16": "bf16",
    "float8_e4m3fn": "fp8", "uint8": "fp8",
}
W_DTYPES = {"float32": "float32", "bfloat16": "bf16", "uint16": "bf16"}
KINDS = ("float32", "bf16", "fp8")
_SPELL = {"float32": "float32", "bf16": "bf16 (torch.bfloat16 or uint16 bits)",
          "fp8": "fp8 e4m3 (torch.float8_e4m3fn or uint8 bits)", "float64": "float64"}


class IndexerDtypes(NamedTuple):
    kind: str           # "float32" | "bf16" | "fp8" (| "float64": reference loss only)
    w: str              # "float32" | "bf16" (| "float64")

    @property
    def fp8(self) -> bool:
        return self.kind == "fp8"


def input_kind(name: str, x, *, allow_float64: bool = False) -> str:
    """The input kind of q or keys; TypeError naming ``name`` if its dtype is not one."""
    dn = dtype_name(x)
    if allow_float64 and dn == "float64":
        return "float64"
    kind = Q_DTYPES.get(dn)
    if kind is None:
        hint = " (only e4m3 'float8_e4m3fn' is supported among the fp8 formats)" if "float8" in dn else ""
        raise TypeError(f"argument '{name}' must have dtype float32, bf16 (bfloat16 / uint16 bits) or "
                        f"fp8 e4m3 (float8_e4m3fn / uint8 bits), got {dn}{hint}")
    return kind


def check_indexer_dtypes(q, w, keys, kscale=None, *, allow_float64: bool = False) -> IndexerDtypes:
    """The dtype rule above (dtypes only; shapes are check_indexer_args')."""
    kind = input_kind("q", q, allow_float64=allow_float64)
    kk = input_kind("keys", keys, allow_float64=allow_float64)
    if kk != kind:
        raise TypeError(f"argument 'keys' is {_SPELL[kk]} ({dtype_name(keys)}) but 'q' is {_SPELL[kind]} "
                        f"({dtype_name(q)}): q and keys must share one input kind (float32, bf16 or fp8 e4m3)")
    wn = dtype_name(w)
    if kind == "float64" and wn == "float64":
        wk = "float64"
    else:
        wk = W_DTYPES.get(wn)
        if wk is None:
            raise TypeError(f"argument 'w' must have dtype float32 or bf16 (bfloat16 / uint16 bits), got {wn}"
                            + (" (the weights are never fp8: fold the query scales into float32 weights)"
                               if wn in ("uint8", "float8_e4m3fn") else ""))
    if kind == "fp8":
        if kscale is None:
            raise TypeError("argument 'kscale' is required with fp8 e4m3 keys: a float32 scale per key row "
                            "(I = kscale[s] * sum_h w * relu(q . keys[s]))")
        dn = dtype_name(kscale)
        if dn != "float32":
            raise TypeError(f"argument 'kscale' must have dtype float32, got {dn}")
    elif kscale is not None:
        raise TypeError(f"argument 'kscale' is only for fp8 e4m3 keys; 'keys' is {_SPELL[kind]} "
                        f"({dtype_name(keys)}): drop kscale, or pass fp8 q and keys")
    return IndexerDtypes(kind, wk)


def check_indexer_args(q, w, keys, kscale=None, *, allow_float64: bool = False):
    """Shapes and dtypes of q[n,H,D], w[n,H], keys[L,D] (+ kscale[L] for fp8), checked in argument
    order. Returns (n, H, D, L, IndexerDtypes)."""
    n, H, D = check_array("q", q, ndim=3)
    if H < 1 or D < 1:
        raise ValueError(f"argument 'q' has shape {(n, H, D)}; it must be [n, H, D] with H >= 1 heads "
                         f"and head dim D >= 1")
    input_kind("q", q, allow_float64=allow_float64)
    check_array("w", w, ndim=2, shape=(n, H))
    L, _ = check_array("keys", keys, ndim=2, shape=(None, D))
    _check_L("keys", L, "rows")
    dts = check_indexer_dtypes(q, w, keys, kscale, allow_float64=allow_float64)
    if kscale is not None:
        check_array("kscale", kscale, ndim=1, shape=(L,))
    return n, H, D, L, dts


def decode(x, kind: str) -> np.ndarray:
    """Host NumPy values of an input of ``kind`` as float32 (exact), or float64 for float64.
    uint16 = bf16 bits, uint8 = e4m3 bits; ml_dtypes' bfloat16 / float8_e4m3fn are read as bits."""
    a = np.asarray(x)
    if kind in ("float32", "float64") or a.dtype == np.float32:
        return a
    if kind == "bf16":
        bits = a.view(np.uint16) if a.dtype.itemsize == 2 else a.astype(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if kind == "fp8":
        from .fp8 import E4M3_VALUES
        return E4M3_VALUES[a.view(np.uint8).astype(np.int32)]
    raise ValueError(f"unknown input kind {kind!r}")


def decode_float64(x, kind: str) -> np.ndarray:
    return np.asarray(decode(x, kind), np.float64)


def encode_exact(q, w, keys, kind: str, w_dtype: str = "float32", rng=None, scale_keys: bool = True):
    """Exact float32 inputs (small integers: reference.generate.indexer_inputs(exact=True)) as host
    inputs of one dtype combination, with the same scores bit for bit:
    -> (q, w, keys, kscale or None). bf16 as uint16 bits, fp8 as uint8 e4m3 bits; for fp8 each key
    row gets a power-of-two scale in {1/2, 1, 2} when ``scale_keys`` (keys / kscale stays exact in
    e4m3 for |keys| <= 8), so the scale path is exercised without changing a score."""
    from .fp8 import e4m3_bits_to_float32, float32_to_e4m3_bits
    q, w, keys = (np.asarray(a, np.float32) for a in (q, w, keys))

    def bf16(a):
        b = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        if not np.array_equal((b.astype(np.uint32) << 16).view(np.float32), a):
            raise ValueError("inputs are not exact in bf16")
        return b
    ww = w if w_dtype == "float32" else bf16(w)
    if kind == "float32":
        return q, ww, keys, None
    if kind == "bf16":
        return bf16(q), ww, bf16(keys), None
    if kind != "fp8":
        raise ValueError(f"argument 'kind' must be one of {KINDS}, got {kind!r}")
    L = keys.shape[0]
    rng = rng if rng is not None else np.random.default_rng(0)
    ks = (2.0 ** rng.integers(-1, 2, size=L)).astype(np.float32) if scale_keys else np.ones(L, np.float32)
    kd = (keys / ks[:, None]).astype(np.float32)
    q8, k8 = float32_to_e4m3_bits(q, np), float32_to_e4m3_bits(kd, np)
    if not (np.array_equal(e4m3_bits_to_float32(q8, np), q) and np.array_equal(e4m3_bits_to_float32(k8, np), kd)):
        raise ValueError("inputs are not exact in e4m3 (use small integers)")
    return q8, ww, k8, ks
