"""The GPU kernels of one call, by name (torch.profiler over CUPTI): where a call's time goes,
for the benchmarks' --profile options."""
from __future__ import annotations


def kernel_profile(fn):
    """GPU kernels of one call (torch.profiler / CUPTI): time and count per kernel name, the
    summed kernel time and the call's span, so launch gaps and overlap show."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = {}
    for e in kernels:
        d = per.setdefault(e.name[:80], [0.0, 0])
        d[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        d[1] += 1
    span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) if kernels else 0
    top = sorted(per.items(), key=lambda kv: -kv[1][0])[:25]
    return {"span_us": span, "kernel_us_sum": sum(v[0] for v in per.values()), "launches": len(kernels),
            "kernels": {k: {"us": v[0], "count": v[1]} for k, v in top}}
