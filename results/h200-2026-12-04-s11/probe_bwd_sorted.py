"""Does the order of a query's selected keys matter to the split backward (from the repository root;
OUT=dir)? The second pass adds each (query, slot) row into dkv [65536, 576] float (151 MB, three
times the L2); with each query's 2048 keys in ascending order the blocks running at once sweep the
rows together, so more of their reductions may hit the L2. The same selection as given (random
order) and sorted per query, alternating rounds, 128 heads, n 8192, L 65536, k 2048, atomics and
deterministic, with the forward on each."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
idx_sorted = torch.sort(idx, dim=1).values.contiguous()
kk, vv = kv[:, None, :], kv[:, None, :512]
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
fw = {tag: CA.attend_forward(q, kk, vv, ix, None) for tag, ix in (("given", idx), ("sorted", idx_sorted))}


def bwd(tag, det, writes="split"):
    ix = idx if tag == "given" else idx_sorted
    out, lse = fw[tag]

    def f():
        AWB.WRITES = writes
        try:
            return CA.attend_backward(dout, q, kk, vv, ix, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES = "auto"
    return f


a = [cp.asarray(x) for x in bwd("given", True)()[:2]]
b = [cp.asarray(x) for x in bwd("sorted", True)()[:2]]
check = {"det_dq_max_abs_diff": float(cp.abs(a[0] - b[0]).max()), "det_dk_max_abs_diff": float(cp.abs(a[1] - b[1]).max()),
         "dk_max_abs": float(cp.abs(a[1]).max()), "dq_max_abs": float(cp.abs(a[0]).max())}
print("check", check, flush=True)
fns = {}
for tag in ("given", "sorted"):
    fns[f"backward split atomics, {tag}"] = bwd(tag, False)
    fns[f"backward split deterministic, {tag}"] = bwd(tag, True)
    fns[f"backward staged atomics, {tag}"] = bwd(tag, False, "staged")
    ix = idx if tag == "given" else idx_sorted
    fns[f"forward wgmma3, {tag}"] = (lambda ix: lambda: AW3.attend_forward_wgmma3(q, kk, vv, ix, None))(ix)
rows = alternate(fns, rounds=5, calls=3)
for name, r in rows.items():
    f_ms = rows.get("forward wgmma3, " + name.split(", ")[-1], {}).get("median_ms")
    if "median_ms" in r and name.startswith("backward"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_sorted.json").write_text(json.dumps(res, indent=1))
