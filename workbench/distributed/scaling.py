"""A scaling model of context-parallel HyTopK (issue 16): predicted speed-up over the single-GPU
pipeline on P GPUs, from measured inputs.

    python -m workbench.distributed.scaling                       # defaults (placeholders marked)
    python -m workbench.distributed.scaling --bench results/cp_bench_cupy_ws2.json   # measured inputs

Problem: n_rank queries per rank (n = P n_rank in total), L keys in total, causal contexts of
strided queries (sharding.causal_ranges), zigzag sharding, one key row of ``row_bytes`` bytes
(bf16: 2 D; fp8: D + 4 for its scale). docs/CP_SCALING.md derives the formulas; in short:

    pairs         W = sum_i hi_i                    (query, key) pairs scored, whole problem
    single GPU    T1 = W / rate + n (t_thr + t_sel)
    per rank      compute per ring step  c = W / (P^2 rate) + pieces * t_piece
                  transfer per ring step m = alpha + (L / P) row_bytes / bw
                  ring  = c + (P - 1) max(c, m)
                  TP    = n_rank (t_thr + t_sel) + fetch + ring
                  fetch = min(L, n_rank M) (P - 1) / P row_bytes / bw     (sampled keys, all-to-all)
    speed-up      TP / T1 inverted: T1 / TP

Every input is a parameter (`Inputs`). Defaults come from `from_bench` (the committed 2-GPU bench
JSON) where a run measured them; figures no run has measured yet carry ``PLACEHOLDER`` in their
source note and the report says so.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace

import numpy as np

PLACEHOLDER = "PLACEHOLDER (not measured yet)"


@dataclass(frozen=True)
class Inputs:
    """Measured rates and times (seconds, bytes/s, pairs/s); ``sources`` says where each came from."""
    rate: float = 2.0e10              # filter: (query, key) pairs scored per second on one GPU (H=64, D=128, bf16)
    t_thr: float = 2.0e-6             # threshold per query (its sampled keys scored + r-th best), seconds
    t_sel: float = 2.0e-6             # check + select (+ recovery share) per query, seconds
    t_piece: float = 5.0e-4           # fixed cost per filtered shard piece (launch, candidate append), seconds
    bw: float = 3.0e11                # ring bandwidth per link inside a node, bytes/s (NVLink)
    bw_inter: float = 4.0e10          # per-GPU bandwidth between nodes, bytes/s (InfiniBand)
    alpha: float = 2.0e-5             # latency of one ring step (NCCL P2P launch + sync), seconds
    gpus_per_node: int = 8
    sources: dict = field(default_factory=lambda: {k: PLACEHOLDER for k in (
        "rate", "t_thr", "t_sel", "t_piece", "bw", "bw_inter", "alpha")})

    def placeholders(self) -> list:
        return sorted(k for k, v in self.sources.items() if v == PLACEHOLDER)


def causal_pairs(n: int, L: int) -> int:
    """Pairs scored by causal contexts of n strided queries over L keys (sharding.causal_ranges)."""
    if n == 0:
        return 0
    i = np.arange(1, n + 1, dtype=np.int64)
    return int(np.maximum((i * L) // n, 1).sum())


def num_samples_avg(L: int) -> int:
    """The sample count of a context of L keys (reference.num_samples): a bound on a query's M."""
    import reference as R
    return int(R.num_samples(L))


def predict(P: int, n_rank: int, L: int, row_bytes: int, inp: Inputs, *, M: int | None = None,
            pieces_per_step: int = 2) -> dict:
    """The model's times (seconds) and speed-up for P ranks (P = 1: the single-GPU pipeline)."""
    if P < 1 or n_rank < 0 or L < 1 or row_bytes < 1:
        raise ValueError(f"arguments: need P >= 1, n_rank >= 0, L >= 1, row_bytes >= 1; got {P}, {n_rank}, {L}, "
                         f"{row_bytes}")
    n = P * n_rank
    W = causal_pairs(n, L)
    M = num_samples_avg(L) if M is None else int(M)
    single = W / inp.rate + n * (inp.t_thr + inp.t_sel)
    if P == 1:
        return dict(P=1, n=n, L=L, pairs=W, single_s=single, cp_s=single, speedup=1.0, ring_s=W / inp.rate,
                    compute_step_s=W / inp.rate, comm_step_s=0.0, fetch_s=0.0, overlap=None, efficiency=1.0)
    bw = inp.bw if P <= inp.gpus_per_node else min(inp.bw, inp.bw_inter)
    c = W / (P * P * inp.rate) + pieces_per_step * inp.t_piece
    m = inp.alpha + (L / P) * row_bytes / bw
    ring = c + (P - 1) * max(c, m)
    fetch = min(L, n_rank * M) * (P - 1) / P * row_bytes / bw
    cp = n_rank * (inp.t_thr + inp.t_sel) + fetch + ring
    return dict(P=P, n=n, L=L, pairs=W, single_s=single, cp_s=cp, speedup=single / cp, ring_s=ring,
                compute_step_s=c, comm_step_s=m, fetch_s=fetch, overlap=min(1.0, c / m),
                efficiency=single / cp / P)


def from_bench(record: dict, problem: str = "causal1m-bf16", base: Inputs | None = None) -> Inputs:
    """Inputs measured by a committed bench JSON (bench.report's result) where it has them:
    rate (filter alone), bw (transfers alone), t_thr and t_sel (CP phases per local query)."""
    base = base or Inputs()
    runs = [r for r in record.get("problems", []) if r.get("name") == problem]
    if not runs:
        raise ValueError(f"argument 'record': no problem {problem!r} in the bench JSON "
                         f"(has {[r.get('name') for r in record.get('problems', [])]})")
    r = runs[0]
    p, P = r["params"], int(r["world_size"])
    n, L = int(p["n"]), int(p["L"])
    n_rank = n // P
    row = 2 * int(p["D"]) if p["dtype"] == "bfloat16" else int(p["D"]) + 4 if p["dtype"] == "fp8" else 4 * int(p["D"])
    got, src = {}, dict(base.sources)
    tag = f"bench {problem} on {P} GPUs ({record.get('date', '?')})"
    if r.get("compute_s"):
        got["rate"] = causal_pairs(n, L) / P / float(r["compute_s"]) if p["layout"] == "causal" else \
            n_rank * L / float(r["compute_s"])
    if r.get("comm_s") and P > 1:
        got["bw"] = (P - 1) * (L / P) * row / float(r["comm_s"])
    ph = r.get("phases") or {}
    if ph.get("threshold_s") and n_rank:
        got["t_thr"] = float(ph["threshold_s"]) / n_rank
    if ph.get("select_recover_s") and n_rank:
        got["t_sel"] = float(ph["select_recover_s"]) / n_rank
    for k in got:
        src[k] = tag
    return replace(base, sources=src, **got)


SETTINGS = (
    ("4 x H200, causal zigzag 1M, n=8192/rank, bf16", 4, 8192, 1 << 20, 256),
    ("8 x H200, causal zigzag 1M, n=8192/rank, bf16", 8, 8192, 1 << 20, 256),
    ("512 GPUs (article), 1M tokens, n=8192/GPU, bf16", 512, 8192, 1 << 20, 256),
)


def report(inp: Inputs, settings=SETTINGS) -> str:
    lines = ["CP HyTopK scaling model (workbench/distributed/scaling.py, docs/CP_SCALING.md)"]
    for k in ("rate", "t_thr", "t_sel", "t_piece", "bw", "bw_inter", "alpha"):
        lines.append(f"  {k:9s} = {getattr(inp, k):.4g}   [{inp.sources.get(k, PLACEHOLDER)}]")
    for name, P, n_rank, L, row in settings:
        r = predict(P, n_rank, L, row, inp)
        lines.append(f"  {name}: speed-up {r['speedup']:.2f}x of {P} (efficiency {r['efficiency']:.2f}); "
                     f"step compute {r['compute_step_s'] * 1e3:.3f} ms vs transfer {r['comm_step_s'] * 1e3:.3f} ms")
    if inp.placeholders():
        lines.append(f"  NOTE: placeholders in use ({', '.join(inp.placeholders())}): not predictions until measured")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.distributed.scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=None, help="a bench JSON (python -m workbench.distributed bench --json)")
    ap.add_argument("--problem", default="causal1m-bf16")
    args = ap.parse_args(argv)
    inp = Inputs()
    if args.bench:
        with open(args.bench) as f:
            inp = from_bench(json.load(f), args.problem)
    print(report(inp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
