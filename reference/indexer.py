"""Lightning-indexer scores, selection replay and the indexer KL loss (DESIGN.md §2, §4)."""
from __future__ import annotations

import numpy as np

from . import validate as V
from .sources import indexer_score_block

NEG_INF = np.float32(-np.inf)


def indexer_scores(q, w, keys, lo, hi) -> np.ndarray:
    """Dense [n, L] float32 table: I[t, s] inside [lo[t], hi[t]), -inf outside.
    Each score is computed in float64 and rounded once."""
    n, H, D, L = V.check_indexer_inputs(q, w, keys, dtypes=("float32",))
    lo_h, hi_h = V.check_ranges(lo, hi, n, L)
    out = np.full((n, L), NEG_INF, np.float32)
    for t in range(n):
        a, b = int(lo_h[t]), int(hi_h[t])
        out[t, a:b] = indexer_score_block(q[t], w[t], keys[a:b])
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


def replay_scores(q, w, keys, idx) -> np.ndarray:
    """Indexer score at each selected position [n, k] float32; -inf where idx = -1.
    Cost O(n k H D): only the selected entries are rescored."""
    n, H, D, L = V.check_indexer_inputs(q, w, keys, dtypes=("float32",))
    V.check_idx(idx, n, L)
    dots = _selected_dots(q, keys, idx)
    s = (np.maximum(dots, 0.0) @ np.asarray(w, np.float64)[:, :, None])[..., 0]
    out = s.astype(np.float32)
    out[idx < 0] = NEG_INF
    return out


def indexer_kl_loss(q, w, keys, idx, target, reduction="sum"):
    """loss = sum_t KL(p_t || softmax(I[t, idx_t])) over the valid slots, in float64.

    Returns (loss, dq, dw, dkeys) with float64 gradients. The gradient w.r.t. the
    selected scores is softmax * sum(p) - p (= softmax - p for a normalised
    target); it reaches q, w, keys through the ReLU at the selected entries only.
    """
    n, H, D, L = V.check_indexer_inputs(q, w, keys, dtypes=("float32", "float64"))
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
    gate = (dots > 0).astype(np.float64)                        # ReLU gate, [n, k, H]
    gd = gI[:, :, None] * gate * w64[:, None, :]                # d loss / d dots
    ks = _selected_keys(keys, idx)
    dq = np.einsum("tjh,tjd->thd", gd, ks)
    dw = np.einsum("tj,tjh->th", gI, relu)
    dkeys = np.zeros((L, D), np.float64)
    contrib = np.einsum("tjh,thd->tjd", gd, np.asarray(q, np.float64))
    np.add.at(dkeys, np.maximum(idx, 0)[valid], contrib[valid])
    return loss, dq, dw, dkeys
