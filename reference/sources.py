"""Score sources: where a selection stage gets the score of (query t, key s).

A *table source* reads a given [n, L] float32 table (used to drive adversarial
distributions through the selection logic); the *indexer source* computes the
lightning-indexer score on the fly from q, w, keys (the real use). Kernels
take the same two as a template parameter / variant flag.
"""
from __future__ import annotations

from typing import NamedTuple, Union

import numpy as np


class TableSource(NamedTuple):
    scores: object          # [n, L] float32

    @property
    def shape(self):
        return tuple(self.scores.shape)

    def row(self, t, a, b):
        return np.asarray(self.scores[t, a:b])

    def at(self, t, pos):
        return np.asarray(self.scores[t])[pos]


class IndexerSource(NamedTuple):
    q: object               # [n, H, D]
    w: object               # [n, H]
    keys: object            # [L, D]

    @property
    def shape(self):
        return (self.q.shape[0], self.keys.shape[0])

    def at(self, t, pos):
        return indexer_score_block(self.q[t], self.w[t], np.asarray(self.keys)[pos])

    def row(self, t, a, b):
        return indexer_score_block(self.q[t], self.w[t], np.asarray(self.keys)[a:b])


Source = Union[TableSource, IndexerSource]


def _f64(x) -> np.ndarray:
    """Values as float64; uint16 arrays are bf16 bits (decoded exactly)."""
    a = np.asarray(x)
    if a.dtype == np.uint16 or a.dtype.name == "bfloat16":
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def indexer_score_block(q_t, w_t, keys_blk) -> np.ndarray:
    """I[s] = sum_h w[h] * relu(q[h] . keys[s]) in float64, rounded once to float32
    (bf16 inputs as uint16 bits are decoded first; see reference.dtypes)."""
    dots = _f64(keys_blk) @ _f64(q_t).T                                       # [B, H]
    return (np.maximum(dots, 0.0) @ _f64(w_t)).astype(np.float32)
