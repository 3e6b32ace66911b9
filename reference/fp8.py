"""fp8 e4m3 (the OCP "e4m3fn" format: no infinities, max 448) indexer inputs
as raw bits (uint8), as DeepSeek-V3.2's indexer keys are stored: every key row
has a float32 scale, every query head's scale is folded into its weight.

  I[t, s] = kscale[s] * sum_h w[t,h] * max(0, dot(q8[t,h], k8[s]))

with q8, k8 the decoded e4m3 values (exact in float32 and float64). Since
kscale > 0, this is the bf16 formula on the dequantised keys k8 * kscale. The
reference evaluates it in float64 and rounds once; kernels accumulate in
float32 (exact on exact-arithmetic inputs: small integers, power-of-two scales).
Works on NumPy and CuPy arrays alike (``xp``)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .xp import array_module as _xp

E4M3_MAX = 448.0


def _decode_table() -> np.ndarray:
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 0x7
    mag = np.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * 2.0 ** (e - 7))
    out = sign * mag
    out[(b & 0x7F) == 0x7F] = np.nan                    # S.1111.111 is NaN; there is no inf
    return out.astype(np.float32)


E4M3_VALUES = _decode_table()                             # bits -> float32 (exact)


def e4m3_bits_to_float32(b, xp=None):
    xp = xp or _xp(b)
    b = xp.asarray(b)
    if b.dtype != np.uint8:
        raise TypeError(f"argument 'b' must be uint8 e4m3 bits, got {b.dtype}")
    return xp.asarray(E4M3_VALUES)[b.astype(xp.int32)]


def float32_to_e4m3_bits(x, xp=None):
    """Round float32 to e4m3 (nearest, ties to even), saturating at +-448 -> uint8 bits.
    NaN -> 0x7F (sign kept)."""
    xp = xp or _xp(x)
    x = xp.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"argument 'x' must be float32, got {x.dtype}")
    bits = xp.ascontiguousarray(x).view(xp.uint32)
    sign = ((bits >> 24) & 0x80).astype(xp.uint8)
    a = xp.abs(x)
    # normal range [2^-6, 448]: keep 3 mantissa bits (round to nearest even on the float32 bits)
    ab = a.view(xp.uint32)
    r = (ab + 0x7FFFF + ((ab >> 20) & 1)) & xp.uint32(0xFFF00000)
    rf = xp.minimum(r.view(xp.float32), xp.float32(E4M3_MAX))
    rb = rf.view(xp.uint32)
    normal = ((((rb >> 23) & 0xFF).astype(xp.int32) - 127 + 7) << 3 | ((rb >> 20) & 0x7).astype(xp.int32))
    # subnormal range (< 2^-6): multiples of 2^-9, rint is ties-to-even; 8 * 2^-9 = 2^-6 rounds up into normals
    sub = xp.rint(a * xp.float32(512.0)).astype(xp.int32)
    mag = xp.where(a < xp.float32(2.0 ** -6), sub, normal)
    mag = xp.where(xp.isnan(x), 0x7F, mag).astype(xp.uint8)
    return mag | sign


class Fp8IndexerSource(NamedTuple):
    """q8[n, H, D] and keys8[L, D] uint8 e4m3 bits, w[n, H] and kscale[L] float32."""
    q: object
    w: object
    keys: object
    kscale: object

    @property
    def shape(self):
        return (self.q.shape[0], self.keys.shape[0])

    def at(self, t, pos):
        return fp8_score_block(self.q[t], self.w[t], np.asarray(self.keys)[pos], np.asarray(self.kscale)[pos])

    def row(self, t, a, b):
        return fp8_score_block(self.q[t], self.w[t], np.asarray(self.keys)[a:b], np.asarray(self.kscale)[a:b])


def fp8_score_block(q8_t, w_t, k8_blk, ks_blk) -> np.ndarray:
    """I[s] = kscale[s] * sum_h w[h] * relu(q8[h] . k8[s]) in float64, rounded once to float32."""
    qf = e4m3_bits_to_float32(np.asarray(q8_t, np.uint8), np).astype(np.float64)
    kf = e4m3_bits_to_float32(np.asarray(k8_blk, np.uint8), np).astype(np.float64)
    dots = kf @ qf.T                                                        # [B, H]
    s = np.maximum(dots, 0.0) @ np.asarray(w_t, np.float64)
    return (np.asarray(ks_blk, np.float64) * s).astype(np.float32)


def fp8_indexer_scores(q8, w, k8, kscale, lo=None, hi=None) -> np.ndarray:
    """[n, L] float32 table of fp8 indexer scores, -inf outside [lo, hi) when given."""
    n, L = q8.shape[0], k8.shape[0]
    out = np.full((n, L), -np.inf, np.float32)
    for t in range(n):
        a, b = (0, L) if lo is None else (int(lo[t]), int(hi[t]))
        if a < b:
            out[t, a:b] = fp8_score_block(q8[t], w[t], np.asarray(k8)[a:b], np.asarray(kscale)[a:b])
    return out


def quantize_indexer(q, w, keys, xp=None):
    """float32 q[n,H,D], w[n,H], keys[L,D] -> Fp8IndexerSource: each key row scaled by
    amax / 448 (kscale), each query head by its own amax / 448 (folded into w)."""
    xp = xp or _xp(q)
    q, w, keys = (xp.asarray(a, xp.float32) for a in (q, w, keys))
    ks = xp.max(xp.abs(keys), axis=1) / xp.float32(E4M3_MAX)
    ks = xp.where(ks > 0, ks, xp.float32(1.0)).astype(xp.float32)
    qs = xp.max(xp.abs(q), axis=2) / xp.float32(E4M3_MAX)
    qs = xp.where(qs > 0, qs, xp.float32(1.0)).astype(xp.float32)
    k8 = float32_to_e4m3_bits((keys / ks[:, None]).astype(xp.float32), xp)
    q8 = float32_to_e4m3_bits((q / qs[:, :, None]).astype(xp.float32), xp)
    return Fp8IndexerSource(q8, (w * qs).astype(xp.float32), k8, ks)


def exact_fp8_source(q, w, keys, xp=None):
    """Inputs already exact in e4m3 (small integers, |x| <= 16) -> Fp8IndexerSource with
    key scales of 1: its scores equal the bf16/float32 formula's bit for bit."""
    xp = xp or _xp(q)
    q, w, keys = (xp.asarray(a, xp.float32) for a in (q, w, keys))
    q8, k8 = float32_to_e4m3_bits(q, xp), float32_to_e4m3_bits(keys, xp)
    back = e4m3_bits_to_float32(k8, xp)
    if not bool(xp.all(back == keys)) or not bool(xp.all(e4m3_bits_to_float32(q8, xp) == q)):
        raise ValueError("arguments 'q', 'keys': not exactly representable in e4m3")
    return Fp8IndexerSource(q8, w, k8, xp.ones(keys.shape[0], xp.float32))
