"""The fastest exact top-k over a score table on this machine, for the dense + top-k baseline:
torch.topk, or the radix top-k of kernels_cuda/table_topk.cu (workbench.families.cupy.table)
where CuPy runs, whichever is faster on the run's own first table (timed with CUDA events).
Both return the k best values of each row's context; torch.topk breaks ties its own way, the
radix top-k by the contract (CONTRACT.md §2)."""
from __future__ import annotations

import statistics

import torch


def torch_topk(tab, lo, hi, k):
    val, idx = torch.topk(tab, k, dim=1)
    return idx, val


def radix_topk(tab, lo, hi, k):
    from ..families.cupy.table import table_topk
    idx, val = table_topk(tab, lo, hi, k, host_check=False)
    return torch.from_dlpack(idx).long(), torch.from_dlpack(val)


def candidates(device) -> dict:
    out = {"torch.topk": torch_topk}
    if torch.device(device).type == "cuda":
        try:
            from ..families.cupy._launch import gpu_status
            if gpu_status()[0]:
                out["cupy table_topk (radix)"] = radix_topk
        except Exception:           # no CuPy here: torch.topk only
            pass
    return out


def _time_ms(fn, args, repeats=3):
    fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def fastest(tab, lo, hi, k) -> tuple[str, object]:
    """(name, fn(tab, lo, hi, k) -> (idx, val)) of the fastest candidate on this table.
    lo/hi: int device tensors of tab's rows; k <= tab.shape[1] for torch.topk."""
    cands = candidates(tab.device)
    if len(cands) == 1 or k > tab.shape[1]:
        return "torch.topk", torch_topk
    times = {}
    for name, fn in cands.items():
        try:
            times[name] = _time_ms(fn, (tab, lo, hi, k))
        except Exception:           # a candidate that cannot run here (k too large for its buffers, ...)
            continue
    name = min(times, key=times.get) if times else "torch.topk"
    return name, cands[name]
