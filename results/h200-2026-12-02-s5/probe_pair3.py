"""Run 3's probe (run from the repository root; OUT=dir): attend_wgmma3 after run 2 (the query-pair
kernel's count loads moved a pair ahead of the copies; the L2 prefetch a kernel argument), one run,
n 8192, L 65536, k 2048, bf16 out, the union build inside the pair kernels' time: wgmma3 (one query)
and wgmma3p (a pair) at prefetch 0 / 1 / 2 pairs ahead, wgmma2sp, at 16 and 8 heads; the pair
kernels on partners sharing 100 % of their keys (union k); wgmma3 at 128 heads at prefetch 0 / 1."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from bench_attention import timed, mla_inputs, selection, gemm_tflops
from workbench.families.cupy import attend_wgmma3 as AW3, attend_wgmma2 as AW2

n, L, k = 8192, 65536, 2048
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
       "torch": torch.__version__, "gemm_tflops": gemm_tflops(), "n": n, "L": L, "k": k, "rows": {}}


def row(name, fn, ref=None):
    t = timed(fn, reps=7)
    got = torch.from_dlpack(fn()[0].view("int16")).view(torch.bfloat16).float()
    if ref is not None:
        t["max_abs_vs_first_row"] = float((got - ref).abs().max())
    res["rows"][name] = t
    print(f"{name:40s} {t['median_ms']:8.3f} ms" + (f"  (max |diff| {t['max_abs_vs_first_row']:.1e})" if ref is not None else ""), flush=True)
    return got


for H in (16, 8):
    q, kv, idx = mla_inputs(n, H, L, k)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    ref = row(f"H{H} wgmma3 prefetch 0", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, prefetch=0))
    for pf in (1, 2):
        row(f"H{H} wgmma3 prefetch {pf}", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, prefetch=pf), ref)
    row(f"H{H} wgmma2sp", lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True, qpt=2), ref)
    for pf in (0, 1, 2):
        row(f"H{H} wgmma3p prefetch {pf}", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, prefetch=pf), ref)
    if H == 16:
        i2 = selection(n, L, k, share=1.0)
        row(f"H{H} share 1.0 wgmma3 prefetch 1", lambda: AW3.attend_forward_wgmma3(q, kk, vv, i2, None, prefetch=1))
        row(f"H{H} share 1.0 wgmma2sp", lambda: AW2.attend_forward_wgmma2(q, kk, vv, i2, None, swz=True, qpt=2))
        for pf in (0, 1):
            row(f"H{H} share 1.0 wgmma3p prefetch {pf}", lambda: AW3.attend_forward_wgmma3(q, kk, vv, i2, None, qpt=2, prefetch=pf))
q, kv, idx = mla_inputs(n, 128, L, k)
kk, vv = kv[:, None, :], kv[:, None, :512]
ref = row("H128 wgmma3 prefetch 0", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, prefetch=0))
row("H128 wgmma3 prefetch 1", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, prefetch=1), ref)
Path(os.environ.get("OUT", "/tmp"), "probe_pair3.json").write_text(json.dumps(res, indent=1))
