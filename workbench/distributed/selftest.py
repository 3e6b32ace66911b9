"""Self-test: context-parallel HyTopK equals the single-process result, bit for bit.

Every rank builds the same global inputs from a seed, keeps its own query
rows and key shard, and runs `ContextParallelHyTopK`; the assembled result of
case i is checked on rank i mod P against

* ``reference.hytopk_indexer`` (idx, val and every statistic) and the brute
  force ``reference.topk(reference.indexer_scores(...))``, for the reference
  family, and for every family on exact-arithmetic inputs;
* the same family's single-process ``workbench.backend(family).hytopk_indexer``
  when the family is not the reference (GPU scoring may flush subnormals, so
  only the family itself defines the answer on float families).

Cases: exact small-integer inputs over every layout (reference/generate.py), in
float32, bf16 (uint16 bits) and fp8 e4m3 (uint8 bits + per-key scales; the stage
set is the pipeline's for that dtype: the tensor-core cores on the CuPy family),
with tight capacities, low oversampling and max_failed = 0/1 to force
recovery and fall-back, tiny problems that leave ranks without queries or
keys; and the adversarial score families driven through the indexer path
(see `profile_inputs`).
"""
from __future__ import annotations

import time
from typing import NamedTuple, Optional

import numpy as np

import reference as R
from reference import dtypes as DT
from reference import generate as G

from .digest import result_digest


class Case(NamedTuple):
    name: str
    q: np.ndarray
    w: np.ndarray
    keys: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    k: int
    capacity: Optional[int]
    oversample: float
    max_failed: int
    sharding: str
    exact_scores: bool           # every implementation scores these inputs identically
    kscale: Optional[np.ndarray] = None     # fp8 e4m3 keys' scales (q/keys then uint8 bits)


PROFILE_SCALES = np.array([1.0, 2.0, 0.5, 4.0], np.float32)


def profile_inputs(profile, n, rng):
    """Indexer inputs whose scores are the table I[t, s] = a_t * profile[s], a_t a power of two.

    D = 1 and two heads with w = (1, -1): I = relu(a v) - relu(-a v) = a v,
    computed exactly in float64, for every float32 v, NaN and +-inf included
    (D = 1 keeps non-finite keys out of products with 0); only -0.0 turns
    into +0.0, which has the same order key. So any score family
    (aliasing with the sample stride, plateaus, ties, specials) reaches the
    selection through the real indexer path."""
    a = PROFILE_SCALES[rng.integers(0, len(PROFILE_SCALES), size=n)]
    q = np.stack([a, -a], axis=1)[:, :, None].astype(np.float32)       # [n, 2, 1]
    w = np.tile(np.array([1.0, -1.0], np.float32), (n, 1))
    keys = np.ascontiguousarray(np.asarray(profile, np.float32)[:, None])
    return q, w, keys


def build_cases(quick: bool = True, seed: int = 8) -> list:
    rng = np.random.default_rng(seed)
    cases = []

    def exact(name, n, L, H, D, k, lay, *, capacity=None, oversample=3.0, max_failed=64, sharding="zigzag"):
        q, w, keys = G.indexer_inputs(n, L, H, D, rng, exact=True)
        lo, hi = G.layout(lay, n, L, k, rng)
        cases.append(Case(name, q, w, keys, lo, hi, k, capacity, oversample, max_failed, sharding, True))

    # one (H, D) for every exact case: each new shape is a kernel compilation on the GPU
    exact("exact/full/strided-samples", 8, 9000, 2, 3, 32, "full")
    exact("exact/causal_tail/tight-capacity", 12, 5000, 2, 3, 16, "causal_tail",
          capacity=24, oversample=1.0, sharding="contiguous")
    exact("exact/varlen/max_failed=1", 10, 3000, 2, 3, 24, "varlen", oversample=0.5, max_failed=1)
    exact("exact/edge-lengths", 16, 4300, 2, 3, 8, "edge")
    exact("exact/random/k=1", 9, 700, 2, 3, 1, "random", sharding="contiguous")
    exact("exact/fall-back-all", 7, 2500, 2, 3, 12, "causal_tail", capacity=12, oversample=0.25, max_failed=0)
    exact("exact/tiny-L", 5, 3, 2, 3, 2, "random")
    exact("exact/L=1(ranks-without-keys)", 3, 1, 2, 3, 1, "full")
    exact("exact/one-query(ranks-without-queries)", 1, 600, 2, 3, 5, "full", sharding="contiguous")

    def typed(name, kind, n, L, k, lay, **kw):
        exact(name, n, L, 2, 3, k, lay, **kw)
        c = cases.pop()
        q, w, keys, ks = DT.encode_exact(c.q, c.w, c.keys, kind, rng=rng)
        cases.append(c._replace(q=q, w=w, keys=keys, kscale=ks))

    # the tensor-core stage sets (bf16, fp8): the ws threshold's shared-context path (full), the
    # per-query path (causal), recovery and fall-back; shard pieces that start off a 128-key tile
    typed("bf16/full/zigzag", "bf16", 8, 9000, 32, "full")
    typed("bf16/causal_tail/fall-back", "bf16", 12, 5000, 16, "causal_tail", capacity=24, oversample=0.5,
          max_failed=0)
    typed("fp8/full/contiguous", "fp8", 8, 9000, 32, "full", sharding="contiguous")
    typed("fp8/varlen/max_failed=1", "fp8", 10, 3000, 24, "varlen", oversample=0.5, max_failed=1)

    families = G.SCORE_FAMILIES if not quick else (
        "equal", "relu_plateau", "alias_on_samples", "alias_between_samples", "ties_at_kth", "specials")
    for i, fam in enumerate(families):
        n, L, k = 4, 8400, (16, 48)[i % 2]
        lay = "full" if i % 3 else "causal_tail"
        lo, hi = G.layout(lay, n, L, k, rng)
        profile = G.score_table(fam, 1, L, k, rng, lo[-1:], hi[-1:])[0]
        q, w, keys = profile_inputs(profile, n, rng)
        cases.append(Case(f"family/{fam}/{lay}", q, w, keys, lo, hi, k, None, 3.0,
                          (64, 1)[i % 2], ("zigzag", "contiguous")[i % 2], False))
    return cases


def _bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def compare(got, want, *, stats=True) -> list:
    """Differences between two HyTopKResults (val and threshold compared as bits)."""
    bad = []
    if not np.array_equal(got.idx, want.idx):
        bad.append(f"idx differs in {int(np.sum(np.any(got.idx != want.idx, axis=1)))} rows")
    if not np.array_equal(_bits(got.val), _bits(want.val)):
        bad.append("val differs (bitwise)")
    if stats:
        if not np.array_equal(_bits(got.threshold), _bits(want.threshold)):
            bad.append("threshold differs (bitwise)")
        for name in ("count", "failed", "num_samples", "rank"):
            if not np.array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name))):
                bad.append(f"{name} differs")
        if got.fell_back != want.fell_back:
            bad.append(f"fell_back {got.fell_back} != {want.fell_back}")
        if got.capacity != want.capacity:
            bad.append(f"capacity {got.capacity} != {want.capacity}")
    return bad


def check_case(case: Case, got, family: str, variants: dict | None = None) -> list:
    """Every problem found with the assembled CP result ``got`` of ``case``."""
    problems = []
    kw = dict(capacity=case.capacity, oversample=case.oversample, max_failed=case.max_failed)
    if family == "reference" or case.exact_scores:
        want = R.hytopk_indexer(case.q, case.w, case.keys, case.lo, case.hi, case.k, kscale=case.kscale, **kw)
        problems += [f"vs reference.hytopk_indexer: {p}" for p in compare(got, want)]
        scores = R.indexer_scores(case.q, case.w, case.keys, case.lo, case.hi, kscale=case.kscale)
        bi, bv = R.topk(scores, case.lo, case.hi, case.k)
        problems += [f"vs brute-force topk: {p}" for p in
                     compare(got, R.HyTopKResult(bi, bv, *[None] * 6), stats=False)]
    if family != "reference":
        import torch

        import workbench
        dev = torch.device("cuda", torch.cuda.current_device())
        args = [_torch(x, dev) for x in (case.q, case.w, case.keys, case.lo, case.hi)]
        ks = None if case.kscale is None else _torch(case.kscale, dev)
        want = workbench.backend(family, variants).hytopk_indexer(*args, case.k, kscale=ks, **kw)
        want.idx, want.val = want.idx.cpu().numpy(), want.val.cpu().numpy()
        problems += [f"vs single-process {family}: {p}" for p in compare(got, want)]
        if result_digest(got) != result_digest(want):
            problems.append(f"digest differs from the single-process {family} pipeline's")
    return problems


def _torch(x, dev):
    """A host input as the torch tensor a user would pass: uint16 bf16 bits -> torch.bfloat16."""
    import torch
    if x.dtype == np.uint16:
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16).to(dev)
    return torch.as_tensor(x, device=dev)


def run_worker(family: str, quick: bool = True, variants: dict | None = None) -> list:
    """This rank's part of the self-test (collective). Returns the records of the cases it checked."""
    import torch
    import torch.distributed as dist

    from .comm import default_device
    from .cp import ContextParallelHyTopK, gather_result
    from .sharding import make_sharding

    me, P = dist.get_rank(), dist.get_world_size()
    device = default_device()
    records = []
    for i, case in enumerate(build_cases(quick)):
        n, L = case.q.shape[0], case.keys.shape[0]
        sh = make_sharding(case.sharding, n, L, P)
        t0 = time.perf_counter()
        cp = ContextParallelHyTopK(case.lo, case.hi, case.k, sh, capacity=case.capacity,
                                   oversample=case.oversample, max_failed=case.max_failed,
                                   backend=family, variants=variants, device=device)
        q, w = (sh.take_queries(x, me) for x in (case.q, case.w))
        keys = sh.take_keys(case.keys, me)
        ks = None if case.kscale is None else sh.take_keys(case.kscale, me)
        res = cp(q, w, keys, ks)
        seconds = time.perf_counter() - t0
        checker = i % P
        got = gather_result(res, sh, dst=checker)
        if me == checker:
            t1 = time.perf_counter()
            problems = check_case(case, got, family, variants)
            records.append(dict(index=i, case=case.name, n=n, L=L, k=case.k, ok=not problems,
                                digest=result_digest(got)[:16],
                                problems=problems, failed=int(res.failed_total), fell_back=bool(got.fell_back),
                                cp_seconds=round(seconds, 3), check_seconds=round(time.perf_counter() - t1, 3)))
    return records


def summarize(records: list, world_size: int, backend: str, family: str) -> tuple[bool, str]:
    """A pass/fail table of every case (records from every rank)."""
    records = sorted(records, key=lambda r: r["index"])
    lines = [f"context-parallel HyTopK self-test: backend={backend} world_size={world_size} family={family}",
             f"{'case':44s} {'n':>4s} {'L':>6s} {'k':>4s} {'failed':>6s} {'fell_back':>9s}  result"]
    for r in records:
        lines.append(f"{r['case']:44s} {r['n']:4d} {r['L']:6d} {r['k']:4d} {r['failed']:6d} "
                     f"{str(r['fell_back']):>9s}  {'PASS' if r['ok'] else 'FAIL'}")
        lines += [f"    - {p}" for p in r["problems"]]
    npass = sum(r["ok"] for r in records)
    ok = bool(records) and npass == len(records)
    lines.append(f"{'PASS' if ok else 'FAIL'}: {npass}/{len(records)} cases bit-identical to the single-process result")
    return ok, "\n".join(lines)
