"""Sparse attention over the selected keys (docs/CONTRACT.md §8), float64: the oracle of the
`attend` / `attend_backward` stages.

Layouts (one function for both): q [n, Hq, Dqk], k [L, Hkv, Dqk], v [L, Hkv, Dv], Hq a
multiple of Hkv, query head h reading kv head h // (Hq // Hkv) (GQA). MLA (DeepSeek-V3.2,
GLM-5: one shared latent KV row per key, V = its first Dv columns, as FlashMLA) is Hkv = 1
with k = kv[:, None, :] and v = kv[:, None, :Dv]: `mla_kv` makes those views and
`mla_dkv` folds the two gradients back into one.

idx [n, kk] int32: every slot is one key occurrence; -1 slots are masked (a key listed twice
counts twice). A query with no valid slot outputs 0 and lse = -inf, and passes no gradient.
"""
from __future__ import annotations

import math

import numpy as np

from . import validate as V

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16", "uint16")   # uint16: bf16 bits
CHUNK = 256          # queries per gathered block (bounds the [chunk, kk, Hq, D] temporaries)


def default_scale(d_qk: int) -> float:
    return 1.0 / math.sqrt(d_qk)


def check_scale(scale, d_qk: int) -> float:
    if scale is None:
        return default_scale(d_qk)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(scale)) or float(scale) <= 0:
        raise ValueError(f"argument 'scale' must be a finite positive float or None, got {scale!r}")
    # the kernels take scale / ln 2 as a float32 and flush subnormals: it must stay a normal float32
    # (a flushed 0 would turn masked logits, -inf * 0, into NaN)
    if float(np.float32(float(scale) / math.log(2.0))) < float(np.finfo(np.float32).tiny):
        raise ValueError(f"argument 'scale' must be at least ln 2 x the smallest normal float32 "
                         f"(~8.2e-39), got {scale!r}")
    return float(scale)


def check_attention_args(q, k, v, idx, *, idx_values=True, dtypes=FLOAT_DTYPES):
    """Shapes, dtypes and idx range of an attend call; errors name the argument.
    Returns (n, Hq, Dqk, L, Hkv, Dv, kk)."""
    n, Hq, Dqk = V.check_array("q", q, ndim=3, dtypes=dtypes)
    L, Hkv, _ = V.check_array("k", k, ndim=3, dtypes=dtypes, shape=(None, None, Dqk))
    _, _, Dv = V.check_array("v", v, ndim=3, dtypes=dtypes, shape=(L, Hkv, None))
    if Hq < 1 or Dqk < 1 or Dv < 1 or Hkv < 1:
        raise ValueError(f"arguments 'q', 'k', 'v': heads and head dims must be >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Hq % Hkv:
        raise ValueError(f"argument 'k': {Hkv} kv heads do not divide the {Hq} query heads of 'q'")
    if L > V.INT32_MAX:
        raise ValueError(f"argument 'k' has L = {L} rows; int32 positions address at most {V.INT32_MAX}")
    _, kk = V.check_array("idx", idx, ndim=2, dtypes=("int32",), shape=(n, None))
    if idx_values:
        V.check_idx(idx, n, L)
    return n, Hq, Dqk, L, Hkv, Dv, kk


def mla_kv(kv, d_v: int):
    """(k, v) views of MLA's shared kv [L, Dqk]: k = kv[:, None, :], v = kv[:, None, :d_v]."""
    L, Dqk = V.check_array("kv", kv, ndim=2)
    if not 1 <= d_v <= Dqk:
        raise ValueError(f"argument 'd_v' must lie in [1, {Dqk}] (the kv width), got {d_v}")
    return kv[:, None, :], kv[:, None, :d_v]


def mla_dkv(dk, dv):
    """The gradient of the shared kv: dk[:, 0] plus dv[:, 0] on its first Dv columns."""
    out = np.array(dk[:, 0], np.float64)
    out[:, :dv.shape[2]] += dv[:, 0]
    return out


def _f64(x):
    x = np.asarray(x)
    if x.dtype == np.uint16:                       # bf16 bits
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def _logits(qc, kg, scale):
    """qc [c, Hkv, G, Dqk], kg [c, kk, Hkv, Dqk] -> [c, Hkv, G, kk]."""
    return np.einsum("cagd,ckad->cagk", qc, kg) * scale


def attend(q, k, v, idx, scale=None):
    """(out float64 [n, Hq, Dv], lse float64 [n, Hq]) of softmax(scale q.k) v over each query's
    valid slots; lse is the natural log of the softmax denominator (the logits scaled)."""
    n, Hq, Dqk, L, Hkv, Dv, kk = check_attention_args(q, k, v, idx)
    scale = check_scale(scale, Dqk)
    q, k, v, idx = _f64(q), _f64(k), _f64(v), np.asarray(idx)
    G = Hq // Hkv
    out = np.zeros((n, Hq, Dv))
    lse = np.full((n, Hq), -np.inf)
    if L == 0:                                                  # only padding slots
        return out, lse
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        ic = idx[a:b]
        valid = ic >= 0                                         # [c, kk]
        safe = np.where(valid, ic, 0)
        s = _logits(q[a:b].reshape(b - a, Hkv, G, Dqk), k[safe], scale)
        s = np.where(valid[:, None, None, :], s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)                    # rows with no valid slot
        p = np.exp(s - m)
        l = p.sum(axis=-1, keepdims=True)
        o = np.einsum("cagk,ckad->cagd", p, v[safe])
        has = l > 0
        out[a:b] = np.where(has, o / np.where(has, l, 1.0), 0.0).reshape(b - a, Hq, Dv)
        lse[a:b] = np.where(has, m + np.log(np.where(has, l, 1.0)), -np.inf).reshape(b - a, Hq)
    return out, lse


def attend_backward(dout, q, k, v, idx, scale=None):
    """(dq [n, Hq, Dqk], dk [L, Hkv, Dqk], dv [L, Hkv, Dv]) float64 of attend's out w.r.t. its
    inputs for the upstream gradient dout [n, Hq, Dv]; only selected keys get gradient."""
    n, Hq, Dqk, L, Hkv, Dv, kk = check_attention_args(q, k, v, idx)
    V.check_array("dout", dout, ndim=3, shape=(n, Hq, Dv))
    scale = check_scale(scale, Dqk)
    q, k, v, dout, idx = _f64(q), _f64(k), _f64(v), _f64(dout), np.asarray(idx)
    G = Hq // Hkv
    out, lse = attend(q, k, v, idx, scale)
    dq = np.zeros((n, Hq, Dqk))
    dk = np.zeros((L, Hkv, Dqk))
    dv = np.zeros((L, Hkv, Dv))
    if L == 0:
        return dq, dk, dv
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        c = b - a
        ic = idx[a:b]
        valid = ic >= 0
        safe = np.where(valid, ic, 0)
        kg, vg = k[safe], v[safe]                                # [c, kk, Hkv, D]
        qc = q[a:b].reshape(c, Hkv, G, Dqk)
        do = dout[a:b].reshape(c, Hkv, G, Dv)
        ls = lse[a:b].reshape(c, Hkv, G, 1)
        s = _logits(qc, kg, scale)
        p = np.where(valid[:, None, None, :] & np.isfinite(ls), np.exp(s - np.where(np.isfinite(ls), ls, 0.0)), 0.0)
        dp = np.einsum("cagd,ckad->cagk", do, vg)
        delta = (do * out[a:b].reshape(c, Hkv, G, Dv)).sum(-1, keepdims=True)
        ds = p * (dp - delta) * scale
        dq[a:b] = np.einsum("cagk,ckad->cagd", ds, kg).reshape(c, Hq, Dqk)
        gk = np.einsum("cagk,cagd->ckad", ds, qc)                # per-slot contributions
        gv = np.einsum("cagk,cagd->ckad", p, do)
        np.add.at(dk, safe[valid], gk[valid])
        np.add.at(dv, safe[valid], gv[valid])
    return dq, dk, dv


def pair_union(idx, xp=None):
    """The key list that two adjacent queries (2p, 2p+1) share in the `pair` variants.

    idx [n, kk] -> (uidx int32 [P, 2kk], mult int32 [P, 2kk, 2], count int32 [P]), P = ceil(n/2):
    row p lists the distinct valid keys of queries 2p and 2p+1 in ascending position, -1 past
    count[p]; mult[p, j, i] is how many slots of query 2p+i hold key uidx[p, j] (0: not selected
    by it). An odd n pairs its last query with an empty row. Runs on NumPy or CuPy arrays (xp)."""
    xp = xp or np
    n, kk = idx.shape
    P = (n + 1) // 2
    rows = xp.full((2 * P, kk), -1, np.int64)
    rows[:n] = idx
    a = rows.reshape(P, 2 * kk)
    tag = (xp.arange(2 * kk) >= kk).astype(np.int64)[None, :]
    none = np.int64(2**62)
    key = xp.where(a >= 0, a * 2 + tag, none)
    key = xp.sort(key, axis=1)
    pos = key >> 1
    valid = key != none
    first = valid.copy()
    first[:, 1:] &= pos[:, 1:] != pos[:, :-1]
    slot = xp.cumsum(first, axis=1) - 1                          # union slot of every entry
    count = first.sum(axis=1).astype(np.int32)
    uidx = xp.full((P, 2 * kk), -1, np.int32)
    r = xp.broadcast_to(xp.arange(P)[:, None], (P, 2 * kk))
    uidx[r[first], slot[first]] = pos[first].astype(np.int32)
    mult = xp.zeros((P * 2 * kk * 2,), np.int32)
    flat = (r * (2 * kk) + slot) * 2 + (key & 1)
    ones = valid.astype(np.int32)
    if xp is np:
        np.add.at(mult, flat[valid], 1)
    else:
        import cupyx
        cupyx.scatter_add(mult, flat[valid], ones[valid])
    return uidx, mult.reshape(P, 2 * kk, 2), count
