"""Run 5's probe (run from the repository root; OUT=dir): the forwards of runs 1-4 again, timed in
alternating rounds so that clock ramps and the pauses of kernel compiles fall on every variant
alike (runs 2-4 showed 5-10 % between back-to-back rows of the same kernel, the first row slowest).
Every variant is compiled and run for ~0.3 s first; then ROUNDS rounds, each timing CALLS calls of
every variant in turn (CUDA events); the figure is the median over rounds of the per-call mean.
n 8192, L 65536, k 2048, bf16 out, pair kernels with their union build inside (as the bench)."""
import json, os, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, "scripts")
import torch
from bench_attention import mla_inputs, fwd_flops
from workbench.families.cupy import attend_wgmma3 as AW3, attend_wgmma2 as AW2

n, L, k = 8192, 65536, 2048
ROUNDS, CALLS = 9, 5
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
       "torch": torch.__version__, "n": n, "L": L, "k": k, "rounds": ROUNDS, "calls": CALLS, "groups": {}}


def alternate(fns):
    for f in fns.values():                   # compile, then ~0.3 s of work each
        f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            f()
            torch.cuda.synchronize()
    per = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, f in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(CALLS):
                f()
            b.record()
            b.synchronize()
            per[name].append(a.elapsed_time(b) / CALLS)
    return {name: {"median_ms": float(np.median(v)), "min_ms": float(np.min(v)), "max_ms": float(np.max(v))}
            for name, v in per.items()}


x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for H in (16, 8, 128):
    q, kv, idx = mla_inputs(n, H, L, k)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    fns = {"wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None),
           "wgmma3 interleave": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, interleave=True)}
    if H <= 32:
        fns.update({"wgmma2s": lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True),
                    "wgmma2sp": lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True, qpt=2),
                    "wgmma3p": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2),
                    "wgmma3p interleave": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, interleave=True)})
    else:
        fns.update({"wgmma2s": lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True),
                    "bf16 GEMM 8192^3": lambda: (torch.mm(x, y),)})
    rows = alternate(fns)
    for name, r in rows.items():
        if name.startswith("bf16 GEMM"):
            r["tflops"] = 2 * 8192 ** 3 / (r["median_ms"] * 1e-3) / 1e12
        else:
            r["tflops"] = fwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        print(f"H{H:<4} {name:22s} {r['median_ms']:8.3f} ms (min {r['min_ms']:.3f}, max {r['max_ms']:.3f})  {r['tflops']:6.1f} TFLOP/s", flush=True)
    if H <= 32:
        one = min(("wgmma3", "wgmma3 interleave", "wgmma2s"), key=lambda m: rows[m]["median_ms"])
        two = min(("wgmma2sp", "wgmma3p", "wgmma3p interleave"), key=lambda m: rows[m]["median_ms"])
        rows["best_pair_vs_best_one"] = {"one": one, "pair": two, "ratio": rows[one]["median_ms"] / rows[two]["median_ms"]}
        print(f"H{H:<4} best pair ({two}) vs best one ({one}): {rows['best_pair_vs_best_one']['ratio']:.2f}x", flush=True)
    else:
        g = rows["bf16 GEMM 8192^3"]["tflops"]
        for m in ("wgmma3", "wgmma3 interleave", "wgmma2s"):
            rows[m]["of_gemm"] = rows[m]["tflops"] / g
            print(f"H{H:<4} {m} {rows[m]['of_gemm']:.3f} of the alternating GEMM", flush=True)
    res["groups"][str(H)] = rows
Path(os.environ.get("OUT", "/tmp"), "probe_ab.json").write_text(json.dumps(res, indent=1))
