"""Training under context parallel equals training on one process (issue 15).

Every rank builds the same DSAttention and inputs from a seed, runs the whole sequence on one
process (the reference: torch.ops.hytopk.select), then its own zigzag token shard through
CPDSAttention, and compares: the selected global indices (exactly), the outputs, the summed
losses, the all-reduced parameter gradients and its rows of the input gradient (to float
tolerance: the sums run in another order); and how often the selection ran (checkpoint "replay":
once per step, never in the recomputation; "full": again in backward).

    python -m workbench.distributed train --backend gloo --world-size 2      # CPU, reference family
    python -m workbench.distributed train --backend nccl --world-size 2      # 2 GPUs, CuPy family
"""
from __future__ import annotations

import time

import numpy as np

CASES = (("none", False), ("full", False), ("replay", False), ("replay", True))
SHAPE = dict(dim=32, heads=2, head_dim=8, index_heads=2, index_dim=8, k=16)
TOKENS = 200                 # not a multiple of 2P: uneven zigzag chunks


def _close(a, b, rtol=2e-4, atol=2e-5) -> bool:
    import torch
    return bool(torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol))


def run_case(mode: str, fp8: bool, family: str | None, device, tokens: int = TOKENS) -> dict:
    import torch
    import torch.distributed as dist

    from ..torch.dsa import DSAttention
    from ..torch.ops import CALLS
    from .dsa import CPDSAttention
    from .sharding import make_sharding

    me, P = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(15)
    layer = DSAttention(SHAPE["dim"], heads=SHAPE["heads"], head_dim=SHAPE["head_dim"],
                        index_heads=SHAPE["index_heads"], index_dim=SHAPE["index_dim"], k=SHAPE["k"],
                        checkpoint=mode, fp8=fp8).to(device)
    g = torch.Generator().manual_seed(16)
    x = torch.randn(tokens, SHAPE["dim"], generator=g).to(device)
    r = torch.randn(tokens, SHAPE["dim"], generator=g).to(device)

    x1 = x.clone().requires_grad_()
    o1 = layer(x1)
    ((o1.out * r).sum() + o1.indexer_loss).backward()
    grads1 = {k: p.grad.detach().clone() for k, p in layer.named_parameters() if p.grad is not None}
    layer.zero_grad(set_to_none=True)

    variants = None
    if device.type == "cuda":           # the single-process op's kernels (dispatch), so the selections agree
        from ..torch import dispatch
        b = dispatch.cuda_backend("select", {"L": tokens, "H": SHAPE["index_heads"], "D": SHAPE["index_dim"],
                                             "k": SHAPE["k"], "dtype": "float8_e4m3fn" if fp8 else "float32"})
        family, variants = ("cupy", None) if b is None else (b.name, b.chosen)
    sh = make_sharding("zigzag", tokens, tokens, P)
    rows = torch.as_tensor(sh.query_rows[me], device=device)
    cp_layer = CPDSAttention(layer, sh, family=family, variants=variants)
    x2 = x[rows].clone().requires_grad_()
    before = CALLS["cp_select"]
    o2 = cp_layer(x2)
    loss2 = (o2.out * r[rows]).sum() + o2.indexer_loss
    loss2.backward()
    calls = CALLS["cp_select"] - before
    total = o2.indexer_loss.detach().clone()
    dist.all_reduce(total)
    problems = []
    if not torch.equal(o2.idx, o1.idx[rows]):
        problems.append(f"idx differs in {int((o2.idx != o1.idx[rows]).any(1).sum())} rows")
    if not _close(o2.out, o1.out[rows]):
        problems.append("out differs")
    if not _close(total, o1.indexer_loss.detach()):
        problems.append(f"indexer loss {float(total)} != {float(o1.indexer_loss)}")
    if not _close(x2.grad, x1.grad[rows]):
        problems.append("grad of x differs")
    for k, p in layer.named_parameters():
        g2 = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g2)
        if not _close(g2, grads1.get(k, torch.zeros_like(p))):
            problems.append(f"grad of {k} differs (max abs diff {float((g2 - grads1[k]).abs().max()):.3g})")
    want_calls = 2 if mode == "full" else 1
    if calls != want_calls:
        problems.append(f"cp_select ran {calls} times in one step (expected {want_calls})")
    if len(grads1) < 5:
        problems.append(f"only {len(grads1)} parameters got gradients")
    return dict(case=f"{mode}{'/fp8' if fp8 else ''}", rank=me, ok=not problems, problems=problems,
                selections=calls)


def run_worker(family: str | None = None) -> list:
    """Every case on this rank (collective)."""
    from .comm import default_device
    device = default_device()
    out = []
    for mode, fp8 in CASES:
        t0 = time.perf_counter()
        rec = run_case(mode, fp8, family, device)
        rec["seconds"] = round(time.perf_counter() - t0, 3)
        out.append(rec)
    return out


def summarize(records: list, world_size: int, backend: str) -> tuple[bool, str]:
    lines = [f"DSA training under context parallel: backend={backend} world_size={world_size}"]
    ok = bool(records)
    for r in sorted(records, key=lambda r: (r["case"], r["rank"])):
        ok &= r["ok"]
        lines.append(f"  {r['case']:12s} rank {r['rank']}: selections {r['selections']}  "
                     f"{'PASS' if r['ok'] else 'FAIL'}")
        lines += [f"    - {p}" for p in r["problems"]]
    n = len({r['case'] for r in records})
    lines.append(f"{'PASS' if ok else 'FAIL'}: {n} training cases equal to the single-process layer "
                 f"on every rank" if ok else "FAIL: training under CP differs from the single-process layer")
    return ok, "\n".join(lines)


__all__ = ["run_worker", "run_case", "summarize", "CASES", "np"]
