"""The reference family: the NumPy stages themselves, registered as variants,
so the harness and the tests treat the oracle like any other family."""
from __future__ import annotations

import contextlib

import numpy as np

import reference as R
from reference import attention as RA

from ..registry import register
from . import Family


class ReferenceFamily(Family):
    name = "reference"
    runs_on = "host"

    def stream_scope(self, ptr, device=0):
        """NumPy on the host: nothing is launched on a stream."""
        return contextlib.nullcontext()

    def to_device(self, x):
        from ..arrays import to_numpy
        return to_numpy(x)

    def scatter_rows(self, dst_idx, dst_val, rows, src_idx, src_val):
        dst_idx[rows], dst_val[rows] = src_idx, src_val


FAMILY = ReferenceFamily(defaults={"float32": {
    "threshold": "reference.threshold", "filter": "reference.filter", "check": "reference.check",
    "select": "reference.select", "recover": "reference.recover", "dense": "reference.dense",
    "replay": "reference.replay"}})

register("threshold", "reference.threshold")(R.stage_threshold)
register("filter", "reference.filter", sources=("table", "indexer", "indexer_fp8"))(R.stage_filter)
register("check", "reference.check")(R.stage_check)
register("select", "reference.select")(R.stage_select)
register("recover", "reference.recover")(R.stage_recover)
register("score_only", "reference.score_only", sources=("indexer",))(R.stage_score_only)   # the floor


@register("dense", "reference.dense")
def dense(q, w, keys, lo, hi, kscale=None):
    """Dense indexer scores in float64, rounded (the oracle's table)."""
    return R.indexer_scores(q, w, keys, np.asarray(lo), np.asarray(hi), kscale=kscale)


@register("replay", "reference.replay")
def replay(q, w, keys, idx, kscale=None):
    """Rescore only the selected entries."""
    return R.replay_scores(q, w, keys, idx, kscale=kscale)


@register("attend", "reference.attend")
def attend(q, k, v, idx, scale=None):
    """Sparse attention over the selected slots in float64 (reference.attention)."""
    return RA.attend(q, k, v, idx, scale)


@register("attend_backward", "reference.attend_backward")
def attend_backward(dout, q, k, v, idx, scale=None):
    """dq, dk, dv of the sparse attention in float64."""
    return RA.attend_backward(dout, q, k, v, idx, scale)
