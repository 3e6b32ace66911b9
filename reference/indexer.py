"""Lightning-indexer scores, selection replay and the indexer KL loss (docs/CONTRACT.md §2, §4).

q and keys are float32, bf16 (uint16 bits) or fp8 e4m3 (uint8 bits, with ``kscale``, a float32
scale per key row); w is float32 or bf16. reference.dtypes defines each combination's score."""
from __future__ import annotations

import numpy as np

from . import dtypes as DT
from . import validate as V
from .fp8 import Fp8IndexerSource
from .sources import IndexerSource

NEG_INF = np.float32(-np.inf)


def indexer_source(q, w, keys, kscale=None, dts=None):
    """The reference score source of checked inputs: IndexerSource on the decoded float32 values
    (float32 / bf16 kinds) or Fp8IndexerSource on the e4m3 bits and the key scales (fp8)."""
    dts = dts or DT.check_indexer_dtypes(q, w, keys, kscale)
    w32 = DT.decode(w, dts.w)
    if dts.fp8:
        return Fp8IndexerSource(np.asarray(q).view(np.uint8), w32, np.asarray(keys).view(np.uint8),
                                np.asarray(kscale, np.float32))
    return IndexerSource(DT.decode(q, dts.kind), w32, DT.decode(keys, dts.kind))


def indexer_scores(q, w, keys, lo, hi, *, kscale=None) -> np.ndarray:
    """Dense [n, L] float32 table: I[t, s] inside [lo[t], hi[t]), -inf outside.
    Each score is computed in float64 and rounded once."""
    n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
    lo_h, hi_h = V.check_ranges(lo, hi, n, L)
    src = indexer_source(q, w, keys, kscale, dts)
    out = np.full((n, L), NEG_INF, np.float32)
    for t in range(n):
        a, b = int(lo_h[t]), int(hi_h[t])
        if a < b:
            out[t, a:b] = src.row(t, a, b)
    return out


def _selected_keys(keys, idx):
    """keys[idx[t, j]] in float64, [n, k, D]; zero rows where idx = -1 (also when L = 0)."""
    keys = np.asarray(keys, np.float64)
    if keys.shape[0] == 0:                   # no keys: every slot is padding (check_idx)
        return np.zeros(np.shape(idx) + keys.shape[1:], np.float64)
    ks = keys[np.maximum(idx, 0)]
    ks[np.asarray(idx) < 0] = 0.0
    return ks


def _selected_dots(q, keys, idx):
    """dots[t, j, h] = q[t, h] . keys[idx[t, j]] in float64 (0 where idx = -1)."""
    dots = np.einsum("tjd,thd->tjh", _selected_keys(keys, idx), np.asarray(q, np.float64))
    dots[np.asarray(idx) < 0] = 0.0
    return dots


def _selected_scale(kscale, idx):
    """kscale[idx] in float64 (1 where idx = -1), or None without key scales."""
    if kscale is None:
        return None
    return np.where(idx >= 0, np.asarray(kscale, np.float64)[np.maximum(idx, 0)], 1.0)


def replay_scores(q, w, keys, idx, *, kscale=None) -> np.ndarray:
    """Indexer score at each selected position [n, k] float32; -inf where idx = -1.
    Cost O(n k H D): only the selected entries are rescored."""
    n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale)
    V.check_idx(idx, n, L)
    dots = _selected_dots(DT.decode_float64(q, dts.kind), DT.decode_float64(keys, dts.kind), idx)
    s = (np.maximum(dots, 0.0) @ DT.decode_float64(w, dts.w)[:, :, None])[..., 0]
    if kscale is not None:
        s = _selected_scale(kscale, idx) * s
    out = s.astype(np.float32)
    out[idx < 0] = NEG_INF
    return out


def indexer_kl_loss(q, w, keys, idx, target, reduction="sum", *, kscale=None):
    """loss = sum_t KL(p_t || softmax(I[t, idx_t])) over the valid slots, in float64.

    Returns (loss, dq, dw, dkeys) with float64 gradients. The gradient w.r.t. the
    selected scores is softmax * sum(p) - p (= softmax - p for a normalised
    target); it reaches q, w, keys through the ReLU at the selected entries only.
    bf16 / fp8 inputs: the gradients are w.r.t. their decoded values (straight-through
    of the rounding); with fp8 keys the scores carry kscale[s], so do the gradients
    (none w.r.t. kscale itself).
    """
    n, H, D, L, dts = DT.check_indexer_args(q, w, keys, kscale, allow_float64=True)
    q, w, keys = (DT.decode_float64(x, kd) for x, kd in ((q, dts.kind), (w, dts.w), (keys, dts.kind)))
    V.check_idx(idx, n, L)
    V.check_target(target, idx)             # finite, >= 0, 0 at padding: one ValueError naming 'target'
    if reduction not in ("sum", "mean"):
        raise ValueError(f"argument 'reduction' must be 'sum' or 'mean', got {reduction!r}")
    p = np.asarray(target, np.float64)
    valid = idx >= 0
    w64 = np.asarray(w, np.float64)
    dots = _selected_dots(q, keys, idx)                       # [n, k, H]
    relu = np.maximum(dots, 0.0)
    I = np.einsum("tjh,th->tj", relu, w64)
    sc = _selected_scale(kscale, idx)
    if sc is not None:
        I = sc * I
    I = np.where(valid, I, -np.inf)
    m = np.max(np.where(valid, I, -np.inf), axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(valid, np.exp(I - m), 0.0)
    z = e.sum(axis=1, keepdims=True)
    logz = np.log(np.where(z > 0, z, 1.0))
    logsm = np.where(valid, I - m - logz, 0.0)
    sm = np.where(valid, e / np.where(z > 0, z, 1.0), 0.0)
    pos = p > 0
    loss = float(np.sum(np.where(pos, p * (np.log(np.where(pos, p, 1.0)) - logsm), 0.0)))
    gI = sm * p.sum(axis=1, keepdims=True) - p                  # d loss / d I_sel
    scale = 1.0 / n if (reduction == "mean" and n) else 1.0
    loss *= scale
    gI *= scale
    if sc is not None:
        gI = gI * sc                                            # d loss / d (unscaled sum)
    gate = (dots > 0).astype(np.float64)                        # ReLU gate, [n, k, H]
    gd = gI[:, :, None] * gate * w64[:, None, :]                # d loss / d dots
    ks = _selected_keys(keys, idx)
    dq = np.einsum("tjh,tjd->thd", gd, ks)
    dw = np.einsum("tj,tjh->th", gI, relu)
    dkeys = np.zeros((L, D), np.float64)
    contrib = np.einsum("tjh,thd->tjd", gd, np.asarray(q, np.float64))
    np.add.at(dkeys, np.maximum(idx, 0)[valid], contrib[valid])
    return loss, dq, dw, dkeys
