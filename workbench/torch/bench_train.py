"""Training-step benchmark of the indexer's share of a DSA layer (issue 6).

    python -m workbench.torch.bench_train --preset dsv32-128k --json results/bench_train.json

Three ways to train the indexer, timed side by side in one run, each as
forward + backward of one checkpointed step (backward includes recomputation):

 (a) plain PyTorch, what a user would write: chunked bf16 q.k GEMM, ReLU,
     float32 head-weighted sum, context mask, torch.topk per chunk (no grad);
     the selected scores are recomputed under autograd by gathering the k keys;
     torch.utils.checkpoint (full recomputation: scoring + topk run again).
 (b) HyTopK (torch.ops.hytopk.select + replay_scores), full recomputation.
 (c) HyTopK with selection replay (checkpoint_with_replay): selection once.
 (c-det) as (c) with the deterministic keys-gradient reduction.

Each step ends in the indexer KL loss against a fixed detached target
(softmax of a per-key bias at the selected keys). CUDA events, warm-up, median;
peak memory above the inputs from torch.cuda.max_memory_allocated.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from ..harness.timing import Timing
from ..progress import Progress
from . import dispatch, ops  # noqa: F401
from .ops import indexer_kl_loss, selected_kl
from .replay import checkpoint_with_replay

PRESETS = {
    "dsv32-32k": dict(n=4096, L=32768, H=64, D=128, k=2048, dtype="bfloat16"),
    "dsv32-128k": dict(n=4096, L=131072, H=64, D=128, k=2048, dtype="bfloat16"),
    "tiny": dict(n=64, L=1024, H=4, D=16, k=32, dtype="float32"),     # CPU smoke test
}
GPU_PRESETS = ("dsv32-32k", "dsv32-128k")       # the default on a GPU; refused on a CPU without --force
DENSE_BUDGET = 1 << 30      # elements of the [chunk, H, L] dots tensor in (a)


def make_inputs(n, L, H, D, k, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (torch.randn(n, H, D, generator=g) / D ** 0.5).to(device, dt).requires_grad_()
    w = torch.rand(n, H, generator=g).to(device, dt).requires_grad_()
    keys = torch.randn(L, D, generator=g).to(device, dt).requires_grad_()
    hi = torch.arange(L - n + 1, L + 1, dtype=torch.int32).clamp(0, L).to(device)    # causal tail
    lo = torch.zeros_like(hi)
    bias = torch.randn(L, generator=g).to(device)
    return q, w, keys, lo, hi, bias


def target_of(bias, idx):
    """A detached stand-in for the main attention's distribution at the selected keys."""
    valid = idx >= 0
    logits = bias[idx.clamp(min=0).long()].masked_fill(~valid, float("-inf"))
    return torch.softmax(logits, dim=1).masked_fill(~valid, 0.0).nan_to_num(0.0)


def plain_topk(q, w, keys, lo, hi, k):
    """(a)'s selection: dense chunked scores and torch.topk, no gradient."""
    n, H, D = q.shape
    L = keys.shape[0]
    idx = torch.empty((n, k), dtype=torch.int32, device=q.device)
    pos = torch.arange(L, device=q.device)
    step = max(1, DENSE_BUDGET // (H * L))
    with torch.no_grad():
        for s in range(0, n, step):
            e = min(n, s + step)
            dots = torch.matmul(q[s:e].reshape(-1, D), keys.T).view(e - s, H, L)    # bf16 GEMM
            sc = torch.bmm(w[s:e].float()[:, None, :], torch.relu_(dots).float())[:, 0]
            inside = (pos[None] >= lo[s:e, None]) & (pos[None] < hi[s:e, None])
            sc = sc.masked_fill(~inside, float("-inf"))
            v, i = torch.topk(sc, min(k, L), dim=1)
            idx[s:e] = torch.where(torch.isneginf(v), -1, i).to(torch.int32)
    return idx


def plain_rescore(q, w, keys, idx):
    """(a)'s differentiable scores at the selected keys, in plain autograd."""
    ks = keys[idx.clamp(min=0).long()]                                   # [n, k, D]
    dots = torch.einsum("nhd,nkd->nkh", q, ks)
    s = torch.einsum("nkh,nh->nk", torch.relu(dots).float(), w.float())
    return s.masked_fill(idx < 0, float("-inf"))


def step_plain(q, w, keys, lo, hi, bias, k):
    idx = plain_topk(q, w, keys, lo, hi, k)
    return selected_kl(plain_rescore(q, w, keys, idx), idx, target_of(bias, idx))


def step_hytopk(q, w, keys, lo, hi, bias, k, deterministic=False):
    idx, _ = torch.ops.hytopk.select(q.detach(), w.detach(), keys.detach(), lo, hi, k, None, 3.0, 64)
    return indexer_kl_loss(q, w, keys, idx, target_of(bias, idx), deterministic=deterministic)


def _full(fn, *args):
    return checkpoint(fn, *args, use_reentrant=False)


CASES = {
    "a_plain_torch_full_recompute": lambda *a: _full(step_plain, *a),
    "b_hytopk_full_recompute": lambda *a: _full(step_hytopk, *a),
    "c_hytopk_selection_replay": lambda *a: checkpoint_with_replay(step_hytopk, *a),
    "c_det_hytopk_replay_deterministic_keys_grad":
        lambda *a: checkpoint_with_replay(step_hytopk, *a, True),
    "b_det_hytopk_full_recompute_deterministic_keys_grad": lambda *a: _full(step_hytopk, *a, True),
}


def _time_case(fn, inputs, k, warmup, reps, device, progress=None):
    q, w, keys, lo, hi, bias = inputs
    tick = progress or (lambda label: None)
    cuda = device.type == "cuda"

    def once():
        for x in (q, w, keys):
            x.grad = None
        loss = fn(q, w, keys, lo, hi, bias, k)
        loss.backward()
        return loss

    for i in range(warmup):
        tick(f"warm-up {i + 1}/{warmup}")
        once()
    times = []
    peak = None
    for r in range(reps):
        tick(f"repeat {r + 1}/{reps}")
        if cuda:
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = once()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
            peak = max(peak or 0, torch.cuda.max_memory_allocated(device) - base)
        else:
            t0 = time.perf_counter()
            loss = once()
            times.append((time.perf_counter() - t0) * 1e3)
    grads = [x.grad.detach().clone() for x in (q, w, keys)]
    return {"median_ms": statistics.median(times), "times_ms": times, "spread": Timing.of(times).spread(),
            "peak_mem_gib_above_inputs": None if peak is None else peak / 2**30,
            "loss": float(loss.detach())}, grads


def _version(pkg):
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def run_preset(name, device, warmup=2, reps=5):
    p = PRESETS[name]
    inputs = make_inputs(device=device, **p)
    out, grads = {}, {}
    with Progress(len(CASES), f"bench_train {name}") as prog:      # a bar on a terminal, lines in a log
        for case, fn in CASES.items():
            out[case], grads[case] = _time_case(fn, inputs, p["k"], warmup, reps, device,
                                                lambda label: prog.tick(f"{case}: {label}"))
            prog.advance(f"{case} done")
    a, b, c = (out[x]["median_ms"] for x in ("a_plain_torch_full_recompute", "b_hytopk_full_recompute",
                                             "c_hytopk_selection_replay"))
    # bitwise only in the deterministic keys-gradient mode (the default index_add_ uses atomics)
    same = all(torch.equal(x, y) for x, y in zip(grads["b_det_hytopk_full_recompute_deterministic_keys_grad"],
                                                  grads["c_det_hytopk_replay_deterministic_keys_grad"]))
    return {"preset": name, "shape": p, "cases": out,
            "ratio_c_vs_a": a / c, "ratio_b_vs_a": a / b, "ratio_c_vs_b": b / c,
            "deterministic_keys_grad_cost": out["c_det_hytopk_replay_deterministic_keys_grad"]["median_ms"] / c,
            "replay_grads_equal_full_recompute_grads_bitwise_deterministic": same}


def cpu_presets(asked, device, force=False):
    """The presets to run. On a CPU the GPU shapes (4096 queries x 32K-128K keys) take hours:
    without --force, an explicit one is refused at once (exit 2) and the default is 'tiny'."""
    if device.type == "cuda":
        return asked or list(GPU_PRESETS)
    gpu = [p for p in asked or () if p in GPU_PRESETS]
    if gpu and not force:
        print(f"bench_train: preset(s) {gpu} are GPU shapes ({', '.join(_shape(p) for p in gpu)}) and take hours "
              f"on this CPU. Run --preset tiny here (the CPU smoke test), run on a GPU, or add --force.",
              file=sys.stderr, flush=True)
        raise SystemExit(2)
    if not asked:
        print("bench_train: no GPU here: running the 'tiny' preset (the GPU presets: --device cuda on a GPU)",
              file=sys.stderr, flush=True)
        return ["tiny"]
    return asked


def _shape(name):
    p = PRESETS[name]
    return f"n={p['n']} L={p['L']} H={p['H']}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS),
                    help="repeatable; default dsv32-32k and dsv32-128k on a GPU, tiny on a CPU")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--force", action="store_true", help="run a GPU preset on a CPU anyway (hours)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    presets = cpu_presets(args.preset, device, args.force)
    report = {
        "what": "indexer share of one DSA training step: forward + recomputation + backward",
        "baseline_a": "plain PyTorch: chunked bf16 GEMM scores, ReLU, fp32 head sum, torch.topk per chunk; "
                      "gather-rescore under autograd; torch.utils.checkpoint full recomputation",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "cupy": _version("cupy-cuda13x"),
                     "numba-cuda": _version("numba-cuda"), "numpy": _version("numpy")},
        "kernels": {p: dispatch.report({x: PRESETS[p][x] for x in ("L", "H", "D", "k")}) for p in presets}
                   if device.type == "cuda" else "cpu reference",
        "results": [run_preset(p, device, args.warmup, args.reps) for p in presets],
    }
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
