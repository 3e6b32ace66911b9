"""Correctness gates: a variant's output against the oracle's `Expected`.

Scores are compared through the contract's order key (so -0.0 == +0.0 and
every NaN is one value; nothing depends on flush-to-zero). Each check returns
(ok, detail); a wrong variant is reported and never timed nor made a winner.
Each stage's card (workbench.registry.STAGES) names its check here.
"""
from __future__ import annotations

import numpy as np
import torch

from .oracle import Expected, order_keys_t


def as_torch(x, family, device: str) -> torch.Tensor:
    """A family-native array as a torch tensor on `device` (zero-copy on the GPU)."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if device == "cpu" or isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(family.to_host(x))).to(device)
    if type(x).__module__.split(".")[0] == "cupy" or hasattr(x, "__dlpack__"):
        return torch.from_dlpack(x)
    return torch.as_tensor(x, device=device)           # __cuda_array_interface__ (Numba)


def _first_bad(bad: torch.Tensor) -> str:
    rows = torch.nonzero(bad.reshape(bad.shape[0], -1).any(1)).flatten()
    return f"{rows.numel()} row(s) differ, first row {int(rows[0])}" if rows.numel() else ""


def _shape(name, x, shape):
    if tuple(x.shape) != tuple(shape):
        return False, f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}"
    return True, ""


def same_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return order_keys_t(a.float()) == order_keys_t(b.float())


def selection(idx, val, e_idx, e_val, what="selection"):
    ok, why = _shape(f"{what} idx", idx, e_idx.shape)
    if not ok:
        return ok, why
    bad = (idx.long() != e_idx.long()) | ~same_scores(val, e_val)
    return (False, f"{what}: {_first_bad(bad)}") if bad.any() else (True, "")


def threshold(T, E: Expected, **_):
    ok, why = _shape("T", T, E.T.shape)
    if not ok:
        return ok, why
    bad = ~same_scores(T, E.T)
    return (False, f"threshold: {_first_bad(bad[:, None])}") if bad.any() else (True, "")


def filter_(out, E: Expected, oracle, lo, hi, **_):
    ci, cv, cnt = out
    n, cap = E.cand_idx.shape
    for name, x in (("cand_idx", ci), ("cand_val", cv)):
        ok, why = _shape(name, x, (n, cap))
        if not ok:
            return ok, why
    cnt = cnt.long()
    if not torch.equal(cnt, E.count):
        return False, f"count: {_first_bad((cnt != E.count)[:, None])}"
    # the first min(count, capacity) slots, in any order: distinct in-context candidates
    # whose stored value is the score there; with count <= capacity that is the whole set
    m = torch.clamp(cnt, max=cap)
    used = torch.arange(cap, device=ci.device)[None, :] < m[:, None]
    pos = torch.where(used, ci.long(), torch.full_like(ci, -1, dtype=torch.long))
    inside = (pos >= lo[:, None]) & (pos < hi[:, None])
    if (used & ~inside).any():
        return False, f"filter stored a position outside the context: {_first_bad(used & ~inside)}"
    truth = oracle.scores_at(pos)
    tkey = order_keys_t(E.T)[:, None]
    bad = used & (~same_scores(cv, truth) | (order_keys_t(truth) < tkey))
    if bad.any():
        return False, f"filter stored a wrong value or a non-candidate: {_first_bad(bad)}"
    srt = torch.sort(pos, dim=1).values
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if dup.any():
        return False, f"filter stored a position twice: {_first_bad(dup)}"
    return True, ""


def check(out, E: Expected, **_):
    failed, rows = out
    failed = failed.bool()
    if not torch.equal(failed, E.failed):
        return False, f"failed flags: {_first_bad((failed != E.failed)[:, None])}"
    want = torch.nonzero(E.failed).flatten()
    got = torch.sort(rows.long()).values
    if not torch.equal(got, want):
        return False, f"rows: got {got[:8].tolist()}..., expected {want[:8].tolist()}..."
    return True, ""


def select(out, E: Expected, **_):
    return selection(out[0], out[1], E.select_idx, E.select_val, "select")


def recover(out, E: Expected, rows, **_):
    r = rows.long()
    return selection(out[0], out[1], E.topk_idx[r], E.topk_val[r], "recover")


def dense(out, E: Expected, oracle, row_chunk=256, **_):
    ok, why = _shape("scores", out, (oracle.n, oracle.L))
    if not ok:
        return ok, why
    for a in range(0, oracle.n, row_chunk):
        b = min(oracle.n, a + row_chunk)
        bad = ~same_scores(out[a:b], oracle.scores_rows(a, b))
        if bad.any():
            return False, f"dense rows {a}..{b}: {_first_bad(bad)}"
    return True, ""


def replay(out, E: Expected, oracle, **_):
    ok, why = _shape("scores", out, E.topk_idx.shape)
    if not ok:
        return ok, why
    bad = ~same_scores(out, oracle.scores_at(E.topk_idx))
    return (False, f"replay: {_first_bad(bad)}") if bad.any() else (True, "")


def score_only(out, oracle, **_):
    """The floor's checksum (uint64[1]) against the oracle's sum of order keys."""
    got = int(np.asarray(out.cpu().numpy() if isinstance(out, torch.Tensor) else out).reshape(-1)[0]) % (1 << 64)
    want = oracle.key_checksum()
    return (True, "checksum matches") if got == want else (False, f"checksum {got} != expected {want}")


def topk_values(val, idx, E: Expected, lo, hi, rtol=0.0):
    """Baselines (torch.topk breaks ties its own way): the k values must be the
    oracle's (within rtol for reduced-precision scoring) and each index in context."""
    ok, why = _shape("val", val, E.topk_val.shape)
    if not ok:
        return ok, why
    fin = torch.isfinite(E.topk_val)
    if not torch.equal(torch.isfinite(val), fin):
        return False, "topk: padding differs"
    if rtol == 0.0:
        bad = ~same_scores(val, E.topk_val)
    else:
        scale = E.topk_val.abs().where(fin, torch.zeros_like(E.topk_val)).amax(1, keepdim=True).clamp(min=1)
        bad = fin & ((val - E.topk_val).abs() > rtol * scale)
    if bad.any():
        return False, f"topk values: {_first_bad(bad)}"
    i = idx.long()
    out_ctx = fin & ((i < lo[:, None]) | (i >= hi[:, None]))
    return (False, f"topk index outside context: {_first_bad(out_ctx)}") if out_ctx.any() else (True, "")

