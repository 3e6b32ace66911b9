"""Scaling benchmark of context-parallel HyTopK: 1 rank vs N ranks, same problem.

Per world size (one launch each), every rank generates the same global
inputs from a seed on its device, keeps its rows and key shard, plans once,
warms up once (NCCL communicators, kernel compilation), then measures:

* ``cp_s``: one whole CP call (median of ``repeats``; per call the slowest
  rank counts);
* the filter ring three ways: keys circulating while filtering (``ring_s``),
  the transfers alone (``comm_s``) and the filtering alone on pre-cut shards
  (``compute_s``). ``overlap = (comm_s + compute_s - ring_s) / comm_s``,
  clipped to [0, 1]: the fraction of the communication hidden behind compute;
* with one rank, also the plain single-GPU pipeline
  ``workbench.backend(family).hytopk_indexer`` (``pipeline_s``);
* a SHA-256 of the assembled result (idx, val and statistics), so the N-rank
  result is checked bit for bit against the 1-rank one and the pipeline's.

GPU only in earnest (``bench`` launches NCCL ranks); ``--backend gloo`` with
the reference family and tiny shapes exercises the same code on a CPU.
"""
from __future__ import annotations

import hashlib
import statistics
import time

import numpy as np

from reference import generate as G

TARGET_SPEEDUP_2 = 1.8              # issue 8: 2 GPUs at least 1.8x faster than 1


def _digest(res) -> str:
    h = hashlib.sha256()
    for x in (res.idx, res.val, res.threshold, res.count, res.failed, res.num_samples, res.rank):
        h.update(np.ascontiguousarray(x).tobytes())
    h.update(repr((bool(res.fell_back), int(res.capacity))).encode())
    return h.hexdigest()


def _inputs(p, device):
    """Global (q, w, keys) on ``device``, identical on every rank (seeded generator)."""
    import torch
    g = torch.Generator(device=device).manual_seed(int(p.get("seed", 8)))
    n, L, H, D = p["n"], p["L"], p["H"], p["D"]
    q = torch.randn((n, H, D), generator=g, device=device) / float(np.sqrt(D))
    w = torch.rand((n, H), generator=g, device=device)
    keys = torch.randn((L, D), generator=g, device=device)
    dtype = getattr(torch, p.get("dtype", "float32"))
    return q.to(dtype), w.to(dtype), keys.to(dtype)


def run_worker(family: str, p: dict, variants: dict | None = None) -> dict:
    import torch
    import torch.distributed as dist

    from .comm import ring_pass
    from .cp import ContextParallelHyTopK, gather_result
    from .sharding import make_sharding

    me, P = dist.get_rank(), dist.get_world_size()
    gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    if gpu and family == "reference":
        raise ValueError("argument 'family': the NCCL benchmark needs a CUDA family (cupy or numba)")

    def sync():
        if gpu:
            torch.cuda.synchronize(device)

    def timed(fn, repeats):
        """Median over repeats of the slowest rank's time for fn()."""
        out = []
        for _ in range(repeats):
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            out.append(float(dt.item()))
        return statistics.median(out)

    say = (lambda m: print(f"bench: {m}", flush=True)) if me == 0 else (lambda m: None)   # rank 0's log: progress
    n, L, k = p["n"], p["L"], p["k"]
    q_all, w_all, keys_all = _inputs(p, device)
    lo, hi = G.layout(p["layout"], n, L, k, np.random.default_rng(int(p.get("seed", 8))))
    sh = make_sharding(p["sharding"], n, L, P)
    rows = torch.as_tensor(sh.query_rows[me], device=device)
    q, w = q_all[rows].contiguous(), w_all[rows].contiguous()
    shards = [sh.take_keys(keys_all, o) for o in range(P)]
    keys = shards[me]
    t0 = time.perf_counter()
    cp = ContextParallelHyTopK(lo, hi, k, sh, backend=family, variants=variants, device=device)
    plan_s = time.perf_counter() - t0

    say(f"planned in {plan_s:.1f} s; warm-up call")
    cp(q, w, keys)                                          # warm-up: communicators, compilation
    reps = int(p.get("repeats", 5))
    last = []
    say(f"timing the CP call ({reps} repeats)")
    cp_s = timed(lambda: last.append(cp(q, w, keys)), reps)
    res = last[-1]                                          # its phase times are reported
    T = cp.threshold(q, w, keys)
    say("timing the filter ring")
    ring_s = timed(lambda: cp.filter_ring(q, w, keys, T), reps)
    say("timing the filter alone")
    compute_s = timed(lambda: cp.filter_ring(q, w, keys, T, exchange_keys=False, shards=shards), reps)
    say("timing the transfers alone")
    comm_s = timed(lambda: ring_pass(cp.comm, keys, cp.shard_rows, None), reps) if P > 1 else 0.0
    overlap = None
    if comm_s > 0:
        overlap = float(min(1.0, max(0.0, (comm_s + compute_s - ring_s) / comm_s)))

    record = dict(world_size=P, plan_s=plan_s, cp_s=cp_s, ring_s=ring_s, comm_s=comm_s, compute_s=compute_s,
                  overlap_fraction=overlap, phases=res.timings,
                  failed_total=res.failed_total, fell_back=res.fell_back, capacity=res.capacity,
                  samples_fetched=cp.samples_fetched,
                  device=torch.cuda.get_device_name(device) if gpu else "cpu")
    full = gather_result(res, sh, dst=0)
    if me == 0:
        record["digest"] = _digest(full)
    if P == 1:                                              # the plain single-GPU pipeline, same inputs
        say("timing the single-process pipeline")
        import workbench
        be = workbench.backend(family, variants)
        lo_t, hi_t = (torch.as_tensor(x, device=device) for x in (lo, hi))
        ref = be.hytopk_indexer(q_all, w_all, keys_all, lo_t, hi_t, k)
        record["pipeline_s"] = timed(lambda: be.hytopk_indexer(q_all, w_all, keys_all, lo_t, hi_t, k), reps)
        ref.idx, ref.val = (x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x) for x in (ref.idx, ref.val))
        record["pipeline_digest"] = _digest(ref)
    return record


def report(params: dict, family: str, runs: dict):
    """The JSON result and a text summary from the per-world-size records (rank 0's)."""
    one = runs[1]
    sizes = sorted(runs)
    N = sizes[-1]
    many = runs[N]
    speedup = one["cp_s"] / many["cp_s"] if N > 1 else 1.0
    vs_pipeline = one.get("pipeline_s", float("nan")) / many["cp_s"]
    digests = {runs[s]["digest"] for s in sizes} | ({one["pipeline_digest"]} if "pipeline_digest" in one else set())
    equal = len(digests) == 1
    result = dict(problem=params, family=family, runs={str(s): runs[s] for s in sizes},
                  speedup=speedup, speedup_vs_single_gpu_pipeline=vs_pipeline, bitwise_equal=equal,
                  target_speedup=TARGET_SPEEDUP_2 if N == 2 else None,
                  meets_target=(speedup >= TARGET_SPEEDUP_2) if N == 2 else None)
    lines = [f"CP HyTopK bench: family={family} " + " ".join(f"{k}={v}" for k, v in params.items())]
    for s in sizes:
        r = runs[s]
        ov = "-" if r["overlap_fraction"] is None else f"{r['overlap_fraction']:.2f}"
        lines.append(f"  {s} rank(s): call {r['cp_s'] * 1e3:9.2f} ms | filter ring {r['ring_s'] * 1e3:8.2f} ms "
                     f"(compute {r['compute_s'] * 1e3:8.2f}, comm {r['comm_s'] * 1e3:7.2f}, overlap {ov}) "
                     f"| failed {r['failed_total']} fell_back {r['fell_back']}")
    if "pipeline_s" in one:
        lines.append(f"  single-GPU pipeline (workbench.backend): {one['pipeline_s'] * 1e3:9.2f} ms")
    lines.append(f"  speedup {N} vs 1 rank: {speedup:.2f}x (vs the plain pipeline: {vs_pipeline:.2f}x); "
                 f"results bit-identical: {equal}")
    return result, "\n".join(lines)
