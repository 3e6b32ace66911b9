"""Edge probes: small fixed problems at the contract's boundaries, part of every stage check.

The preset a `compare` or `watch` run checks on (tiny on a CPU, a model shape on a GPU)
exercises the common path; a count exactly at capacity, a context of exactly k or k + 1 keys,
a tie across the k-th slot between -0.0 and +0.0, a NaN among the candidates, a score just past
hi (docs/CONTRACT.md §3's adversarial cases) need not occur in it. So a stage variant is also
run on its stage's probes, answered by the NumPy reference and judged by the same gates
(harness/checks.py). `check_variant` is what `compare`, `watch` and the fast tests
(tests/test_variants.py) call; tests/known_bad.py keeps mutants of the stages that it must
reject.

Sizes stay within what tests/test_variants.py feeds every variant (n <= 10, L <= 24, k = 4,
H x D = 2 x 3), so a probe asks nothing of a kernel that the property tests do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

import reference as R
from reference import generate as G

from . import checks as C
from .oracle import ReferenceOracle

K, L, CAPACITY, OVERSAMPLE = 4, 24, 8, 1.5     # r = 6 of M = c samples: counts near and past capacity
SEED = 20
POISON_IDX = np.int32(0x3FFFFFFF)              # unused candidate slots: reading one is visible
POISON_VAL = np.float32(np.inf)
RECOVER_ROWS = {"table": (3, 0, 5, 6, 4), "indexer": (1, 0, 4, 5)}   # boundaries, in any order
NAN, NEG_NAN = np.array([0x7FC00000, 0xFFC00001], np.uint32).view(np.float32)


@dataclass(frozen=True)
class Probe:
    stage: str
    label: str
    source: str | None                         # "table" | "indexer" for the source stages
    args: Callable                             # family -> the variant's arguments
    check: Callable                            # torch outputs (CPU) -> (ok, detail)


# ---------------------------------------------------------------- the problems
def probe_table():
    """Rows of the table problem, each a boundary of the contract: (lo, hi) and its scores."""
    rng = np.random.default_rng(SEED)
    t = rng.standard_normal((10, L)).astype(np.float32)
    rows = []
    t[0, 0] = 9.0                                                  # the best key sits at lo
    rows.append((0, L))                                            # 0: distinct scores, count < capacity
    t[1] = rng.integers(0, 4, L)
    t[1, rng.permutation(L)[:8]] = [9, 8, 7, 6, 5, 4, 4, 4]
    rows.append((0, L))                                            # 1: a tie at T: count = capacity exactly
    t[2] = G.score_table("specials", 1, L, K, rng)[0]
    t[2, L - 2] = np.inf
    rows.append((3, L - 2))                                           # 2: NaN of both signs, +-inf, +-0, subnormals
    t[3, 10:16] = [-0.0, 0.0, -0.0, 0.0, 1.0, 100.0]
    rows.append((10, 15))                                          # 3: c = k + 1, -0.0/+0.0 tie across the k-th
    t[4, 12:17] = [NAN, 2.0, -np.inf, 5.0, 100.0]
    rows.append((12, 16))                                          # 4: c = k (not sampled), a NaN candidate
    t[5, 18:22] = [NEG_NAN, -np.inf, 7.0, 100.0]
    rows.append((18, 21))                                          # 5: c = k - 1: padding after a -NaN
    rows.append((20, 20))                                          # 6: empty context
    t[7] = 1.5
    rows.append((0, L))                                            # 7: all equal: count = c
    t[8] = 0.0
    t[8, ::3] = -0.0
    t[8, [5, 17]] = [2.0, 3.0]
    rows.append((0, L))                                            # 8: ReLU plateau: T = 0 floods the buffer
    t[9, L - 3:] = 50.0
    rows.append((0, L - 3))                                           # 9: big scores just past hi
    lo, hi = (np.array(x, np.int32) for x in zip(*rows))
    return np.ascontiguousarray(t), lo, hi


def probe_indexer():
    """Exact-arithmetic indexer inputs (small integers: every family scores them exactly) with
    contexts of L, k + 1, k and k - 1 keys and an empty one."""
    rng = np.random.default_rng(SEED)
    q, w, keys = G.indexer_inputs(6, 24, 2, 3, rng, exact=True)
    q[0] = 0                                   # 0: [0, 24): every score 0, count = c: overflow
    q[1], w[1], keys[7] = 1, 1, 2              # 1: [2, 7), c = k + 1; the key at hi scores highest
    keys[12:22] = 0
    keys[12:22, 0] = np.arange(10)
    q[2], w[2] = 0, 0
    q[2, 0, 0], w[2, 0] = 1, 1                 # 2: [12, 22): distinct scores 0..9, r-th != (r + 1)-th
    lo = np.array([0, 2, 12, 8, 20, 5], np.int32)
    hi = np.array([24, 2 + K + 1, 22, 8 + K, 20 + K - 1, 5], np.int32)    # 3: c = k; 4: c = k - 1; 5: empty
    return q, w, keys, lo, hi


def check_grid():
    """Every (context length, count) pair around k and capacity, count <= c, contexts not at 0."""
    lens = (0, 1, K - 1, K, K + 1, CAPACITY, CAPACITY + 1, L)
    counts = (0, K - 1, K, K + 1, CAPACITY - 1, CAPACITY, CAPACITY + 1, L)
    pairs = [(c, n) for c in lens for n in counts if n <= c]
    c, count = (np.array(x, np.int64) for x in zip(*pairs))
    lo = (np.arange(c.size, dtype=np.int64) * 7) % 50
    return count.astype(np.int32), lo.astype(np.int32), (lo + c).astype(np.int32)


@lru_cache(maxsize=None)
def _answers(source: str):
    if source == "table":
        table, lo, hi = probe_table()
        oracle, host = ReferenceOracle.of_table(table, lo, hi), dict(table=table)
    else:
        q, w, keys, lo, hi = probe_indexer()
        oracle, host = ReferenceOracle(q, w, keys, lo, hi), dict(q=q, w=w, keys=keys)
    E = oracle.compute(K, CAPACITY, OVERSAMPLE)
    host.update(lo=lo, hi=hi)
    return oracle, E, host


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _src(source, host, d):
    if source == "table":
        return R.TableSource(d(host["table"]))
    return R.IndexerSource(d(host["q"]), d(host["w"]), d(host["keys"]))


def _source_probes(stage, source):
    oracle, E, host = _answers(source)
    lo, hi = host["lo"], host["hi"]
    ctx = dict(E=E, oracle=oracle, lo=_t(lo).long(), hi=_t(hi).long())
    i32 = lambda x: np.ascontiguousarray(x, np.int32)
    if stage == "threshold":
        args = lambda f: (_src(source, host, f.to_device), f.to_device(lo), f.to_device(hi),
                          f.to_device(i32(E.M)), f.to_device(i32(E.r)))
        return Probe(stage, f"{source}: thresholds", source, args, lambda out: C.threshold(out, **ctx))
    if stage == "filter":
        T = E.T.numpy()
        args = lambda f: (_src(source, host, f.to_device), f.to_device(lo), f.to_device(hi), f.to_device(T),
                          CAPACITY)
        return Probe(stage, f"{source}: candidates", source, args, lambda out: C.filter_(out, **ctx))
    rows = np.array(RECOVER_ROWS[source], np.int32)                   # in any order
    args = lambda f: (_src(source, host, f.to_device), f.to_device(lo), f.to_device(hi), f.to_device(rows), K)
    return Probe(stage, f"{source}: recovery", source, args,
                 lambda out: C.recover(out, **ctx, rows=_t(rows)))


def shuffle_and_poison(ci, cv, count, capacity, rng):
    """In place: each row's stored candidates (the first min(count, capacity) slots) in a random
    order, as atomics may store them, and poison in the slots after them (never to be read)."""
    for t in range(len(count)):
        m = min(int(count[t]), capacity)
        perm = rng.permutation(m)
        ci[t, :m], cv[t, :m] = ci[t, perm], cv[t, perm]
        ci[t, m:], cv[t, m:] = POISON_IDX, POISON_VAL


def select_buffers():
    """Candidate buffers (capacity slots per row) that put the selection's rules at the k-th slot:
    a -0.0/+0.0 tie straddling it with a +NaN candidate (row 0, count = capacity), fewer
    candidates than k with -inf and a -NaN (row 1), an overflowed row whose count exceeds
    the buffer (row 2), no candidate at all (row 3). Returns (cand_idx, cand_val, count)."""
    ci = np.full((4, CAPACITY), -1, np.int32)
    cv = np.full((4, CAPACITY), -np.inf, np.float32)
    ci[0], cv[0] = [3, 11, 7, 5, 9, 2, 13, 4], [-0.0, 0.0, -0.0, 0.0, 1.0, 2.0, NAN, 0.5]
    ci[1, :3], cv[1, :3] = [6, 2, 9], [-np.inf, NEG_NAN, 7.0]
    ci[2], cv[2] = [20, 21, 22, 23, 16, 17, 18, 19], [3.0, 1.0, 1.0, 3.0, 2.0, 1.0, 2.0, 2.0]  # 2 of 3 tied at K*
    return ci, cv, np.array([CAPACITY, 3, CAPACITY + 4, 0], np.int32)


def _select_probe():
    """select_buffers, shuffled as atomics may store them, with poison in the slots past the count."""
    ci, cv, count = select_buffers()
    shuffle_and_poison(ci, cv, count, CAPACITY, np.random.default_rng(SEED))
    si, sv = R.stage_select(ci, cv, count, K)
    Es = SimpleNamespace(select_idx=_t(si), select_val=_t(sv))
    args = lambda f: (f.to_device(ci), f.to_device(cv), f.to_device(count), K)
    return Probe("select", "ties and NaN at the k-th, short, overflowed and empty buffers", None, args,
                 lambda out: C.select(out, Es))


def _check_probe():
    count, lo, hi = check_grid()
    failed, _ = R.stage_check(count, lo, hi, K, CAPACITY)
    Ec = SimpleNamespace(failed=_t(failed))
    args = lambda f: (f.to_device(count), f.to_device(lo), f.to_device(hi), K, CAPACITY)
    return Probe("check", "counts at k and capacity, contexts at k and k + 1", None, args,
                 lambda out: C.check(out, Ec))


def _indexer_probe(stage):
    oracle, E, host = _answers("indexer")
    d = dict(oracle=oracle, E=E)
    if stage == "dense":
        args = lambda f: tuple(f.to_device(host[x]) for x in ("q", "w", "keys", "lo", "hi"))
        return Probe(stage, "indexer: dense rows", None, args, lambda out: C.dense(out, **d))
    idx = E.topk_idx.numpy()
    args = lambda f: (*(f.to_device(host[x]) for x in ("q", "w", "keys")), f.to_device(idx))
    return Probe(stage, "indexer: selected keys with padding", None, args, lambda out: C.replay(out, **d))


def probes(stage: str, source: str | None = None) -> list[Probe]:
    """The probes of one stage (for a source stage: of one score source, default both). A source
    that re-encodes the indexer inputs (fp8) and the score-only floor (a checksum, no selection)
    have none: their rows are checked on the workload only."""
    if stage == "score_only" or source not in (None, "table", "indexer"):
        return []
    if stage in ("threshold", "filter", "recover"):
        return [_source_probes(stage, s) for s in (("table", "indexer") if source is None else (source,))]
    if stage == "check":
        return [_check_probe()]
    if stage == "select":
        return [_select_probe()]
    if stage in ("dense", "replay"):
        return [_indexer_probe(stage)]
    raise ValueError(f"argument 'stage': unknown stage {stage!r}")


def _as_torch(out, fam):
    if isinstance(out, tuple):
        return tuple(C.as_torch(x, fam, "cpu") for x in out)
    return C.as_torch(out, fam, "cpu")


class _Fresh:
    """A family whose to_device hands over a fresh copy: a variant that writes into its inputs
    cannot spoil the probes' cached problems for the next variant."""

    def __init__(self, fam):
        self.fam = fam

    def to_device(self, x):
        return self.fam.to_device(np.array(x, copy=True))


def check_variant(v, fam=None, source: str | None = None) -> tuple[bool, str]:
    """Run a stage variant on its stage's probes; (ok, what went wrong). ``source``: only that
    score source's probes (a source stage row checks the source it runs on)."""
    if fam is None:
        from ..families import get_family
        fam = get_family(v.family)
    for p in probes(v.stage, source):
        if p.source is not None and p.source not in v.sources:
            continue
        try:
            ok, why = p.check(_as_torch(v.fn(*p.args(_Fresh(fam))), fam))
        except Exception as e:               # a crash on a boundary is a wrong variant
            ok, why = False, f"{type(e).__name__}: {e}"[:300]
        if not ok:
            return False, f"edge probe ({p.label}): {why}"
    return True, ""
