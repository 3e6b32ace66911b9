"""Where the sparse-attention op's time goes (issue 18): the op's forward alone, forward + backward
(deterministic and atomic), each against dsa.py's gather + einsum, and torch.profiler's per-kernel
table of one deterministic forward + backward, for the MHA layout of the DSA layer and MLA.

    python scripts/probe_attention_split.py --json results/probe_attention_split.json [--layouts mha,mla]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import workbench.torch  # noqa: E402,F401  (registers torch.ops.hytopk)
from bench_attention import selection, timed  # noqa: E402
from workbench.torch.dsa import gather_einsum  # noqa: E402

SHAPES = {"mha": dict(n=1024, H=16, d=128, L=16384), "mla": dict(n=256, H=16, d=576, L=16384)}


def inputs(layout, n, H, d, L, k):
    g = torch.Generator(device="cuda").manual_seed(2)
    idx = selection(n, L, k, seed=2)
    q = torch.randn(n, H, d, device="cuda", generator=g).bfloat16().requires_grad_()
    if layout == "mla":
        kv = torch.randn(L, d, device="cuda", generator=g).bfloat16().requires_grad_()
        return q, (kv, None, 512), idx
    K = torch.randn(L, H, d, device="cuda", generator=g).bfloat16().requires_grad_()
    V = torch.randn(L, H, d, device="cuda", generator=g).bfloat16().requires_grad_()
    return q, (K, V, -1), idx


def probe(layout, k=2048):
    s = SHAPES[layout]
    q, (kv, v, dv), idx = inputs(layout, k=k, **s)
    op = lambda det: torch.ops.hytopk.sparse_attention(q, kv, v, idx, dv, None, det)[0]

    def fwd_bwd(fn):
        def run():
            fn().float().sum().backward()
        return run

    rows = {"shape": dict(s, k=k)}
    with torch.no_grad():
        rows["forward"] = timed(lambda: op(True), reps=5)
    rows["fwd_bwd_deterministic"] = timed(fwd_bwd(lambda: op(True)), reps=3)
    rows["fwd_bwd_atomic"] = timed(fwd_bwd(lambda: op(False)), reps=3)
    if layout == "mha":
        rows["gather_einsum_fwd_bwd"] = timed(fwd_bwd(lambda: gather_einsum(q, kv, v, idx)[0]), reps=3)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fwd_bwd(lambda: op(True))()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    rows["profile_deterministic"] = table
    for key, r in rows.items():
        if isinstance(r, dict) and "median_ms" in r:
            print(f"{layout} {key:<24} {r['median_ms']:9.3f} ms", flush=True)
    print(table, flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--layouts", default="mha,mla")
    args = ap.parse_args(argv)
    res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "torch": torch.__version__}
    for layout in args.layouts.split(","):
        res[layout] = probe(layout)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
