"""Benchmark of context-parallel HyTopK against the single-GPU pipeline, same problem, one run.

One launch of N ranks (NCCL, one GPU each) runs every problem in turn. Per
problem every rank generates the same global inputs from a seed on its
device, keeps its query rows and key shard, plans once, warms up once (NCCL
communicators, kernel compilation), then measures:

* ``pipeline_s``: the plain single-GPU pipeline
  ``workbench.backend(family).hytopk_indexer`` on the whole problem, on rank
  0's GPU, before and after the CP runs (the other ranks wait); the smaller
  median counts, both are reported;
* ``cp_s``: one whole CP call (median of ``repeats``; per call the slowest
  rank counts); ``speedup = pipeline_s / cp_s``;
* the filter ring three ways: keys circulating while filtering (``ring_s``),
  the transfers alone (``comm_s``) and the filtering alone on pre-cut shards
  (``compute_s``). ``overlap = 1 - (ring_s - compute_s) / comm_s``, clipped to
  [0, 1]: the fraction of the communication hidden behind compute. When a
  shard's transfer is tiny next to its filtering, that difference of two
  medians is noise; ``overlap_fraction_events`` measures the same directly:
  CUDA events per ring step give how long the compute stream waited for the
  next shard (``exposed_transfer_s``), ``1 - exposed / comm_s``;
* SHA-256 digests (digest.py) of every rank's rows of the CP result and of the
  same rows of the pipeline's result: ``bitwise_equal`` when all match.

Problems: the presets of the issue-15 targets (``PROBLEMS``; ``n_per_rank``
makes n scale with the world size) or one custom problem from --n/--L/...
``--backend gloo`` (the reference family, tiny shapes) exercises the same
code on a CPU; ``--backend gloo-cuda`` runs the ranks on CUDA devices over
gloo (several may share one GPU): a correctness check on one GPU.
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import time

import numpy as np

from reference import generate as G

# issue 15 targets on nvidia-h200-x2 (2 ranks): CP / single-GPU pipeline speed-up per problem
PROBLEMS = {
    "full128k-bf16": dict(n=8192, L=131072, H=64, D=128, k=2048, layout="full", sharding="zigzag",
                          dtype="bfloat16", target_speedup=1.8),
    "causal1m-bf16": dict(n_per_rank=8192, L=1048576, H=64, D=128, k=2048, layout="causal", sharding="zigzag",
                          dtype="bfloat16", target_speedup=1.85),
    "causal1m-fp8": dict(n_per_rank=8192, L=1048576, H=64, D=128, k=2048, layout="causal", sharding="zigzag",
                         dtype="fp8", target_speedup=1.8),
}
TARGETS = ("full128k-bf16", "causal1m-bf16", "causal1m-fp8")
TARGET_OVERLAP = 0.9
# issue 16: the causal 1M bf16 problem on 4 and 8 ranks (same n per rank)
SCALING_TARGETS = {("causal1m-bf16", 4): 3.5, ("causal1m-bf16", 8): 7.0}


def target_speedup(name: str, params: dict, world_size: int):
    """The speed-up target of a problem on this many ranks, or None where no issue sets one."""
    if world_size == 2:
        return params.get("target_speedup")
    return SCALING_TARGETS.get((name, world_size))
LAYOUTS = ("full", "causal", "causal_tail")


def resolve(p: dict, world_size: int) -> dict:
    """A problem's parameters with n fixed for this world size."""
    p = dict(p)
    if "n_per_rank" in p:
        p["n"] = int(p["n_per_rank"]) * world_size
    return p


def ranges(layout: str, n: int, L: int, k: int, seed: int = 8):
    """Global (lo, hi): ``causal`` puts query i at position (i + 1) L / n - 1 of a causal
    sequence (every token a query when n = L; evenly strided queries otherwise)."""
    if layout == "causal":
        from .sharding import causal_ranges
        return causal_ranges(n, L)
    return G.layout(layout, n, L, k, np.random.default_rng(seed))


def inputs(p, device):
    """Global (q, w, keys, kscale or None) on ``device``, identical on every rank (seeded generator).
    fp8: workbench.torch.fp8.quantize of the float32 inputs (per-key and per-head scales)."""
    import torch
    g = torch.Generator(device=device).manual_seed(int(p.get("seed", 8)))
    n, L, H, D = p["n"], p["L"], p["H"], p["D"]
    q = torch.randn((n, H, D), generator=g, device=device) / float(np.sqrt(D))
    w = torch.rand((n, H), generator=g, device=device)
    keys = torch.randn((L, D), generator=g, device=device)
    dtype = p.get("dtype", "float32")
    if dtype == "fp8":                  # e4m3 as uint8 bits: every gather / cat supports uint8
        from ..torch.fp8 import quantize
        f = quantize(q, w, keys)
        return f.q.view(torch.uint8), f.w, f.keys.view(torch.uint8), f.kscale
    dt = getattr(torch, dtype)
    return q.to(dt), w.to(dt), keys.to(dt), None


def _versions(gpu):
    import torch
    out = dict(python=platform.python_version(), torch=torch.__version__, numpy=np.__version__)
    try:
        import cupy
        out["cupy"] = cupy.__version__
    except ImportError:
        pass
    if gpu:
        out["cuda"] = torch.version.cuda
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    return out


def run_worker(family: str, params: dict, variants: dict | None = None) -> dict:
    """Every problem of ``params["problems"]`` on this rank (collective); rank 0's record is the result."""
    import torch
    import torch.distributed as dist

    from .comm import default_device

    me, P = dist.get_rank(), dist.get_world_size()
    device = default_device()
    gpu = device.type == "cuda"
    if gpu and family == "reference":
        raise ValueError("argument 'family': the GPU benchmark needs a CUDA family (cupy or numba)")
    say = (lambda m: print(f"bench: {m}", flush=True)) if me == 0 else (lambda m: None)   # rank 0's log
    out = []
    for i, prob in enumerate(params["problems"]):
        p = resolve(prob, P)
        say(f"problem {i + 1}/{len(params['problems'])}: {p.get('name', 'custom')}")
        out.append(_problem(family, p, variants, int(params.get("repeats", 5)), device, say))
        if gpu:                             # the problem's inputs and scratch go back before the next one
            torch.cuda.empty_cache()
    from .launch import GPU_ENV
    env = {k: os.environ.get(k) for k in GPU_ENV}                   # multicast off (KINDS.md)
    return dict(world_size=P, family=family, variants=variants or {}, problems=out, env=env,
                devices=sorted({torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())})
                if gpu else ["cpu"], backend=dist.get_backend(), versions=_versions(gpu),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def _problem(family, p, variants, reps, device, say) -> dict:
    import torch
    import torch.distributed as dist

    import workbench

    from .comm import exposed_transfer_s, ring_pass
    from .cp import ContextParallelHyTopK
    from .digest import cp_digest, result_digest
    from .sharding import make_sharding

    me, P = dist.get_rank(), dist.get_world_size()
    gpu = device.type == "cuda"
    host = torch.device("cpu") if dist.get_backend() == "gloo" else device

    def sync():
        if gpu:
            torch.cuda.synchronize(device)

    def timed(fn, repeats, everyone=True):
        """Median over repeats of the slowest rank's time for fn() (everyone=False: this rank alone)."""
        times = []
        for _ in range(repeats):
            sync()
            if everyone:
                dist.barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            dt = time.perf_counter() - t0
            if everyone:
                t = torch.tensor([dt], dtype=torch.float64, device=host)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                dt = float(t.item())
            times.append(dt)
        return statistics.median(times)

    n, L, k = p["n"], p["L"], p["k"]
    q_all, w_all, keys_all, ks_all = inputs(p, device)
    lo, hi = ranges(p["layout"], n, L, k, int(p.get("seed", 8)))
    sh = make_sharding(p["sharding"], n, L, P)
    be = workbench.backend(family, variants)
    lo_t, hi_t = (torch.as_tensor(x, device=device) for x in (lo, hi))

    def pipeline():
        return be.hytopk_indexer(q_all, w_all, keys_all, lo_t, hi_t, k, kscale=ks_all)

    pipe_s, want = [], None
    if me == 0:
        say("single-GPU pipeline (before)")
        want = pipeline()                                   # warm-up, and the result to compare with
        pipe_s.append(timed(pipeline, reps, everyone=False))
    dist.barrier()

    rows = torch.as_tensor(sh.query_rows[me], device=device)
    q, w = q_all[rows].contiguous(), w_all[rows].contiguous()
    keys = sh.take_keys(keys_all, me)
    ks = None if ks_all is None else sh.take_keys(ks_all, me)
    t0 = time.perf_counter()
    cp = ContextParallelHyTopK(lo, hi, k, sh, backend=family, variants=variants, device=device)
    plan_s = time.perf_counter() - t0
    say(f"planned in {plan_s:.1f} s; warm-up call")
    res = cp(q, w, keys, ks)                                # warm-up: communicators, compilation
    digest = cp_digest(res)
    last = []
    say(f"timing the CP call ({reps} repeats)")
    cp_s = timed(lambda: last.append(cp(q, w, keys, ks)), reps)
    res = last[-1]                                          # its phase times are reported
    stable = cp_digest(res) == digest

    call = cp.prepare(q, w, keys, ks)
    shards = [call.shard if o == me else
              cp.shard_form(sh.take_keys(keys_all, o), None if ks_all is None else sh.take_keys(ks_all, o))
              for o in range(P)]
    with cp.scope():
        T = cp.threshold(call)
        say("timing the filter ring")
        ring_s = timed(lambda: cp.filter_ring(call, T), reps)
        say("timing the filter alone")
        compute_s = timed(lambda: cp.filter_ring(call, T, exchange_keys=False, shards=shards), reps)
        exposed = []                                         # CUDA events: the direct measure
        for _ in range(reps if gpu and P > 1 else 0):
            events = []
            cp.filter_ring(call, T, events=events)
            sync()
            if exposed_transfer_s(events) is not None:
                exposed.append(exposed_transfer_s(events))
    shards = None
    say("timing the transfers alone")
    comm_s = timed(lambda: ring_pass(cp.comm, call.shard, cp.shard_rows, None), reps) if P > 1 else 0.0
    overlap = overlap_events = None
    if comm_s > 0:
        overlap = float(min(1.0, max(0.0, 1.0 - (ring_s - compute_s) / comm_s)))
        if exposed:
            overlap_events = float(min(1.0, max(0.0, 1.0 - statistics.median(exposed) / comm_s)))

    if me == 0:
        say("single-GPU pipeline (after)")
        pipe_s.append(timed(pipeline, reps, everyone=False))
    dist.barrier()
    profiles = None
    if gpu and p.get("profile"):                             # where each call's time goes, by kernel
        from ..harness.kernel_profile import kernel_profile
        say("kernel profiles (rank 0: one CP call, one single-GPU pipeline call)")
        mine = kernel_profile(lambda: cp(q, w, keys, ks))     # every rank runs the call (collectives)
        profiles = dict(cp_rank0=mine, pipeline=kernel_profile(pipeline)) if me == 0 else None
        dist.barrier()
    digests = [None] * P
    dist.all_gather_object(digests, digest)
    record = dict(name=p.get("name", "custom"), params={kk: v for kk, v in p.items() if kk != "name"},
                  world_size=P, plan_s=plan_s, cp_s=cp_s, ring_s=ring_s, comm_s=comm_s, compute_s=compute_s,
                  overlap_fraction=overlap, overlap_fraction_events=overlap_events,
                  exposed_transfer_s=statistics.median(exposed) if exposed else None, phases=res.timings,
                  failed_total=res.failed_total, fell_back=res.fell_back, capacity=res.capacity, samples_fetched=cp.samples_fetched,
                  repeat_stable=stable, cp_digests=digests)
    if profiles:
        record["profile"] = profiles
    if me == 0:
        pipeline_s = min(pipe_s)
        want_digests = [result_digest(want, sh.query_rows[o]) for o in range(P)]
        record.update(pipeline_s=pipeline_s, pipeline_s_before_after=pipe_s, pipeline_digests=want_digests,
                      speedup=pipeline_s / cp_s if cp_s > 0 else None,
                      bitwise_equal=bool(want_digests == digests and stable),
                      stage_set={s: getattr(cp.pipeline.stages_for_kind(call.dts.kind), s).name
                                 for s in ("threshold", "filter", "check", "select", "recover")})
    return record


def report(result: dict):
    """(the JSON result with the target checks, a text summary) from rank 0's record."""
    P = result["world_size"]
    lines = [f"CP HyTopK bench: family={result['family']} world_size={P} backend={result['backend']} "
             f"devices={result['devices']}"]
    ok = True
    for r in result["problems"]:
        target = target_speedup(r["name"], r["params"], P)
        r["target_speedup"] = target
        r["meets_speedup_target"] = None if target is None else bool(r["speedup"] >= target)
        r["meets_overlap_target"] = None if (P < 2 or r["overlap_fraction"] is None) else \
            bool(r["overlap_fraction"] >= TARGET_OVERLAP)
        r["meets_overlap_target_events"] = None if (P < 2 or r.get("overlap_fraction_events") is None) else \
            bool(r["overlap_fraction_events"] >= TARGET_OVERLAP)
        ok &= r["bitwise_equal"]
        ov = "-" if r["overlap_fraction"] is None else f"{r['overlap_fraction']:.2f}"
        if r.get("overlap_fraction_events") is not None:
            ov += f", by events {r['overlap_fraction_events']:.2f}"
        pp = r["params"]
        lines.append(f"  {r['name']}: n={pp['n']} L={pp['L']} H={pp['H']} D={pp['D']} k={pp['k']} "
                     f"{pp['layout']}/{pp['sharding']} {pp['dtype']}")
        lines.append(f"    single-GPU pipeline {r['pipeline_s'] * 1e3:9.2f} ms | CP call {r['cp_s'] * 1e3:9.2f} ms "
                     f"| speed-up {r['speedup']:.2f}x" + (f" (target {target}x)" if target else ""))
        lines.append(f"    filter ring {r['ring_s'] * 1e3:8.2f} ms (filter alone {r['compute_s'] * 1e3:8.2f}, "
                     f"transfers alone {r['comm_s'] * 1e3:7.2f}, overlap {ov}) | failed {r['failed_total']} "
                     f"fell_back {r['fell_back']} | bit-identical to the pipeline: {r['bitwise_equal']}")
    result["target_overlap"] = TARGET_OVERLAP
    result["bitwise_equal"] = bool(ok)
    lines.append(f"results bit-identical to the single-GPU pipeline on every problem: {ok}")
    return result, "\n".join(lines)
