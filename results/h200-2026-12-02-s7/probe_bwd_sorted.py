"""Run 3's probe (from the repository root; OUT=dir): are the backward's dK/dV atomics slow because
dkv [L, 576] float (151 MB at L 65536) does not fit the H200's L2, so that each query's keys, in
random (HyTopK's rank) order, update rows far apart? The wgmma backward (version 4, atomics) and
forward (wgmma3) with each query's selection in rank order (random keys) and sorted by key (the
blocks running at once then sweep the key range together: their rows stay in L2), at L 65536 and
8192 (dkv 19 MB: in L2 either way); plus the sort itself. 128 heads, n 8192, k 2048."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3

n, H, k = 8192, 128, 2048
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "n": n, "H": H, "k": k, "by_L": {}}
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
for L in (65536, 8192):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    srt = torch.sort(idx, dim=1).values.contiguous()
    fns = {}
    for name, ix in (("rank order", idx), ("sorted", srt)):
        out, lse = CA.attend_forward(q, kk, vv, ix, None)
        fns[f"backward, {name}"] = (lambda ix=ix, out=out, lse=lse:
                                    CA.attend_backward(dout, q, kk, vv, ix, out, lse, None, deterministic=False, version=4))
        fns[f"forward wgmma3, {name}"] = lambda ix=ix: AW3.attend_forward_wgmma3(q, kk, vv, ix, None)
    fns["torch.sort(idx, dim=1)"] = lambda: torch.sort(idx, dim=1)
    rows = alternate(fns, rounds=5, calls=3)
    for name, r in rows.items():
        if "median_ms" in r and not name.startswith("torch"):
            fl = bwd_flops(n, H, k) if name.startswith("backward") else fwd_flops(n, H, k)
            r["tflops"] = fl / (r["median_ms"] * 1e-3) / 1e12
        print(L, name, json.dumps(r), flush=True)
    for o in ("rank order", "sorted"):
        b, f = rows[f"backward, {o}"].get("tflops"), rows[f"forward wgmma3, {o}"].get("tflops")
        if b and f:
            rows[f"backward / forward rate, {o}"] = b / f
            print(L, o, "backward / forward rate", round(b / f, 3), flush=True)
    res["by_L"][str(L)] = rows
    del q, kv, idx, srt
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_sorted.json").write_text(json.dumps(res, indent=1))
