"""Prefill benchmark of a transformers DSA indexer: patched with HyTopK vs unpatched (issue 17).

    python -m workbench.torch.integrations.bench_prefill --json results/bench_prefill.json     # H200
    python -m workbench.torch.integrations.bench_prefill --quick --json /tmp/smoke.json        # smoke run

One indexer layer of a random-initialised model (``tiny_model`` with the real indexer sizes:
H = 64 (DeepSeek-V3.2, ``DeepseekV32Indexer``) or 32 (GLM-5, ``GlmMoeDsaIndexer``), D = 128,
k = 2048, RoPE slice 64; the model width kept small, hidden = q_lora_rank = 512, bf16 with the
weights projection in float32 as transformers loads it) runs the prefill of one sequence of
32K and 128K tokens, as the attention layer calls it: ``indexer(hidden, q_resid, (cos, sin),
causal bool mask [1, S, S])``. Per case, side by side in one run (CUDA events, warm-up, median;
peak memory above the inputs from torch.cuda.max_memory_allocated):

 unpatched          transformers' own forward: [1, S, H, S] float32 head scores, [1, S, S] table,
                    torch.topk. Skipped (status "oom-estimated") when its estimated peak does not
                    fit the free memory, "oom" when it fails anyway; the estimate is recorded.
 unpatched_chunked  the same math over query chunks (<= --chunk-gib of head scores per chunk):
                    what a memory-conscious user would write; the time reference when the
                    unpatched forward cannot run.
 patched            ``workbench.torch.integrations.transformers.patch``: HyTopK, no score table.

It also checks, on a sample of queries, that the patched selection equals the chunked one
wherever the k-th score is not tied. ``--quick``: one small case (4096 tokens, H = 64 on a GPU;
512 tokens, H = 8, D = 32, k = 64 on the CPU, where the patched path is the NumPy reference).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from importlib import metadata
from pathlib import Path

import torch

from . import transformers as I

GIB = 2 ** 30


def case_config(model_type: str, H: int, tokens: int, quick_cpu: bool = False) -> dict:
    if quick_cpu:
        return dict(num_hidden_layers=1, hidden_size=64, q_lora_rank=64, index_n_heads=H, index_head_dim=32,
                    index_topk=64, qk_rope_head_dim=16, max_position_embeddings=max(4096, tokens))
    return dict(num_hidden_layers=1, hidden_size=512, q_lora_rank=512, index_n_heads=H, index_head_dim=128,
                index_topk=2048, qk_rope_head_dim=64, max_position_embeddings=max(4096, tokens))


def build(model_type: str, H: int, tokens: int, device, dtype, quick_cpu=False, seed=0):
    """(model, indexer, inputs tuple) of one case: hidden, q_resid, (cos, sin), causal bool mask."""
    model = I.tiny_model(model_type, seed=seed, dtype=dtype, **case_config(model_type, H, tokens, quick_cpu))
    model = model.to(device)
    (_, ix), = I.find_indexers(model)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    cfg = ix.config
    hidden = torch.randn(1, tokens, cfg.hidden_size, generator=g).to(device, dtype)
    q_resid = torch.randn(1, tokens, cfg.q_lora_rank, generator=g).to(device, dtype)
    with torch.no_grad():
        pe = I.rotary_for(ix).to(device)(hidden, torch.arange(tokens, device=device)[None])
    mask = torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril_()[None]
    return model, ix, (hidden, q_resid, pe, mask)


def unpatched_estimate_bytes(ix, S: int) -> int:
    """Peak of transformers' forward beyond its inputs: float32 q and keys, the [S, H, T] head
    scores and their ReLU copy, the [S, T] table and its masked copy, topk's output."""
    H, D, k = ix.n_heads, ix.head_dim, ix.index_topk
    return 4 * S * H * D + 4 * S * D + 2 * 4 * S * H * S + 2 * 4 * S * S + 12 * S * k


@torch.no_grad()
def unpatched_chunked(ix, hidden, q_resid, pe, mask, chunk_bytes: int):
    """transformers' indexer math, query chunk by query chunk (same q, keys, weights)."""
    q, k, w = I.indexer_inputs(ix, hidden, q_resid, pe)       # w: n_heads**-0.5 * softmax_scale folded in
    _, S, H, _ = q.shape
    T = k.shape[1]
    kk = min(ix.index_topk, T)
    kf = k[0].float()
    out = torch.empty((1, S, kk), dtype=torch.int32, device=q.device)
    step = max(1, chunk_bytes // (4 * H * T))
    for a in range(0, S, step):
        b = min(S, a + step)
        sc = torch.relu(torch.matmul(q[0, a:b].float(), kf.T))                 # [c, H, T]
        idx = torch.matmul(w[0, a:b, None, :], sc)[:, 0]                         # [c, T]
        idx = idx.masked_fill(~mask[0, a:b], float("-inf"))
        out[0, a:b] = idx.topk(kk, dim=-1).indices.to(torch.int32)
    return out


def _measure(fn, device, warmup: int, reps: int) -> dict:
    cuda = device.type == "cuda"
    out = None
    for _ in range(warmup):
        out = fn()
        del out
    times, peak = [], 0
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            torch.cuda.synchronize(device)
            times.append(a.elapsed_time(b))
            peak = max(peak, torch.cuda.max_memory_allocated(device) - base)
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    res = {"status": "ok", "median_ms": statistics.median(times), "times_ms": times,
           "peak_gib_above_inputs": peak / GIB if cuda else None}
    return res, out


def _run(fn, device, warmup, reps):
    try:
        return _measure(fn, device, warmup, reps)
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {"status": "oom", "detail": str(e).splitlines()[0][:200]}, None


@torch.no_grad()
def agreement(ix, inputs, got, want, samples: int = 64) -> dict:
    """On sampled queries with more than k visible keys: do the two selections differ only where
    the float64 scores tie with the k-th (relative 1e-5)?"""
    hidden, q_resid, pe, mask = inputs
    q, k, w = I.indexer_inputs(ix, hidden, q_resid, pe)
    S, kk = q.shape[1], got.shape[-1]
    rows = torch.linspace(min(S - 1, kk), S - 1, steps=min(samples, max(1, S - kk))).long().unique()
    s = torch.einsum("rhd,td->rht", q[0, rows].double(), k[0].double()).clamp(min=0)
    s = torch.einsum("rht,rh->rt", s, w[0, rows].double()).masked_fill(~mask[0, rows], float("-inf"))
    kth = s.sort(dim=1, descending=True).values[:, kk - 1:kk]
    tol = 1e-5 * s.masked_fill(~mask[0, rows], 0).abs().amax(1, keepdim=True).clamp(min=1)
    sel = lambda x: torch.zeros_like(s, dtype=torch.bool).scatter_(1, x[0, rows].long(), True) & mask[0, rows]
    differ = sel(got) ^ sel(want)
    outside = differ & ((s - kth).abs() > tol)
    return {"queries": int(rows.numel()), "queries_differing": int(differ.any(1).sum()),
            "differ_only_inside_ties": not bool(outside.any())}


def run_case(model_type, H, tokens, device, dtype, warmup, reps, chunk_gib, quick_cpu=False) -> dict:
    model, ix, inputs = build(model_type, H, tokens, device, dtype, quick_cpu)
    hidden, q_resid, pe, mask = inputs
    est = unpatched_estimate_bytes(ix, tokens)
    row = {"model_type": model_type, "indexer": type(ix).__name__, "tokens": tokens, "H": H, "D": ix.head_dim,
           "k": ix.index_topk, "hidden_size": ix.config.hidden_size, "dtype": str(dtype).replace("torch.", ""),
           "unpatched_estimated_gib": est / GIB, "impls": {}}
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    call = lambda: ix(hidden, q_resid, pe, mask, None)
    want = None
    if free is not None and est > 0.9 * free:
        row["impls"]["unpatched"] = {"status": "oom-estimated",
                                     "detail": f"needs about {est / GIB:.1f} GiB, {free / GIB:.1f} GiB free"}
    else:
        row["impls"]["unpatched"], want = _run(call, device, warmup, reps)
    row["impls"]["unpatched_chunked"], chunked = _run(
        lambda: unpatched_chunked(ix, hidden, q_resid, pe, mask, int(chunk_gib * GIB)), device, warmup, reps)
    with I.patched(model):
        row["impls"]["patched"], got = _run(call, device, warmup, reps)
        row["patch_state"] = I.state(model)
    ref = want if want is not None else chunked
    if got is not None and ref is not None:
        row["agreement_vs_" + ("unpatched" if want is not None else "unpatched_chunked")] = \
            agreement(ix, inputs, got, ref)
    p = row["impls"]["patched"]
    for name in ("unpatched", "unpatched_chunked"):
        u = row["impls"][name]
        if p.get("status") == "ok" and u.get("status") == "ok":
            row[f"speedup_vs_{name}"] = u["median_ms"] / p["median_ms"]
            if p.get("peak_gib_above_inputs"):
                row[f"memory_ratio_vs_{name}"] = u["peak_gib_above_inputs"] / p["peak_gib_above_inputs"]
    if p.get("status") == "ok" and p.get("peak_gib_above_inputs"):
        row["memory_ratio_vs_unpatched_estimate"] = (est / GIB) / p["peak_gib_above_inputs"]
    return row


def _version(pkg):
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--quick", action="store_true", help="one small case: a smoke run")
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 32],
                    help="64: DeepSeek-V3.2's indexer, 32: GLM-5's (glm_moe_dsa)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-gib", type=float, default=4.0, help="head scores per chunk of unpatched_chunked")
    ap.add_argument("--backend", choices=["cupy", "numba", "torch"],
                    help="HYTOPK_TORCH_BACKEND for the patched select (default: the dispatch's choice)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if args.backend:
        os.environ["HYTOPK_TORCH_BACKEND"] = args.backend
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    tokens, heads = args.tokens, args.heads
    if args.quick:
        tokens, heads = ([512], [8]) if cpu else ([4096], [64])
        args.warmup, args.reps = (0, 1) if cpu else (1, 2)
    dtype = torch.float32 if cpu else torch.bfloat16
    from workbench.torch import dispatch
    report = {
        "what": "prefill of one transformers DSA indexer layer: patched with HyTopK vs unpatched",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if not cpu else "cpu",
        "versions": {p: _version(p) for p in ("torch", "transformers", "cupy-cuda13x", "numba-cuda", "numpy")},
        "kernels": dispatch.report() if not cpu else "cpu reference",
        "quick": bool(args.quick),
        "results": [],
    }
    for H in heads:
        model_type = "glm_moe_dsa" if H == 32 else "deepseek_v32"
        for S in tokens:
            row = run_case(model_type, H, S, device, dtype, args.warmup, args.reps, args.chunk_gib, quick_cpu=cpu)
            report["results"].append(row)
            if not cpu:
                torch.cuda.empty_cache()                # the case's model and inputs are gone: free the pool
            print(json.dumps({k: v for k, v in row.items() if k != "patch_state"}), flush=True)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
