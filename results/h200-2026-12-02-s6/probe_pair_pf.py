"""Run 4's probe (from the repository root; OUT=dir): at 16 and 8 heads, the query-pair kernels
against the best one-query kernel in alternating rounds (scripts/bench_attention.alternate), with
version 3's L2 prefetch of later pairs' rows (prefetch 1, 2) and without: ncu of run 3 showed the
pair kernel waiting on its gathers 1.7x as long per tile as the one-query kernel (L2 hit 47 % vs
59 %: the one-query blocks of adjacent queries share their rows through L2, the pair loads them
once). n 8192, L 65536, k 2048, bf16 out, the union build inside the pair rows."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from bench_attention import alternate, mla_inputs, fwd_flops
from workbench.families.cupy import attend_wgmma3 as AW3, attend_wgmma2 as AW2

n, L, k = 8192, 65536, 2048
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
       "torch": torch.__version__, "n": n, "L": L, "k": k, "groups": {}}
for H in (16, 8):
    q, kv, idx = mla_inputs(n, H, L, k)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    fns = {"wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None),
           "wgmma2sp": lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True, qpt=2),
           "wgmma3p": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2),
           "wgmma3p prefetch 1": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, prefetch=1),
           "wgmma3p prefetch 2": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, prefetch=2),
           "wgmma3 prefetch 1": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, prefetch=1)}
    rows = alternate(fns)
    for name, r in rows.items():
        if "median_ms" in r:
            r["tflops"] = fwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            print(f"H{H:<3} {name:20s} {r['median_ms']:7.3f} ms (min {r['min_ms']:.3f}, max {r['max_ms']:.3f})", flush=True)
    ones = [m for m in ("wgmma3", "wgmma3 prefetch 1") if "median_ms" in rows.get(m, {})]
    twos = [m for m in ("wgmma2sp", "wgmma3p", "wgmma3p prefetch 1", "wgmma3p prefetch 2") if "median_ms" in rows.get(m, {})]
    one = min(ones, key=lambda m: rows[m]["median_ms"])
    two = min(twos, key=lambda m: rows[m]["median_ms"])
    rows["best_pair_vs_best_one"] = {"one": one, "pair": two, "ratio": rows[one]["median_ms"] / rows[two]["median_ms"]}
    print(f"H{H:<3} best pair ({two}) vs best one ({one}): {rows['best_pair_vs_best_one']['ratio']:.2f}x", flush=True)
    res["groups"][str(H)] = rows
Path(os.environ.get("OUT", "/tmp"), "probe_pair_pf.json").write_text(json.dumps(res, indent=1))
