"""Run 1's probe (from the repository root; OUT=dir): would a backward that issues half its dK/dV
atomics (the two head blocks of a query summing their dK/dV in a 2-block cluster before one of them
adds it to dkv) reach the target of 0.6 x the forward rate? The wgmma backward (version 4, atomics)
timed beside two copies of it built from a patched copy of kernels_cuda/ ($HYTOPK_KERNEL_DIR):
  half   blocks of head block 1 skip their dK/dV writes (the atomics of one head block per query)
  none   no block writes dK/dV (the MMAs, softmax and dQ alone)
Both give wrong dK/dV: timing only. 128 heads, n 8192, L 65536, k 2048, alternating rounds."""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from bench_attention import alternate, mla_inputs, bwd_flops
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()

HOOKS = ("auto store_m = [&](const float (&acc)[16], int mi) {", "auto store_m8 = [&](const float (&acc)[8]) {")
dirs = {}
for name, skip in (("half", "(blockIdx.x & 1u) != 0u"), ("none", "true")):
    d = Path(tempfile.mkdtemp(prefix=f"probe_{name}_"))
    shutil.copytree("kernels_cuda", d, dirs_exist_ok=True)
    f = d / "attend_wgmma_bwd.cu"
    src = f.read_text()
    for h in HOOKS:
        assert src.count(h) == 1, h
        src = src.replace(h, h + f" if ({skip}) return;")
    f.write_text(src)
    dirs[name] = str(d)


def bwd(kdir):
    def f():
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if kdir:
            os.environ["HYTOPK_KERNEL_DIR"] = kdir
        try:
            CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


fns = {"backward wgmma_atomic": bwd(None), "half the atomics": bwd(dirs["half"]), "no dK/dV writes": bwd(dirs["none"]),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
rows = alternate(fns, rounds=5, calls=3)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "n": n, "H": H, "L": L, "k": k, "rows": rows}
from bench_attention import fwd_flops
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name != "forward wgmma3":
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_half.json").write_text(json.dumps(res, indent=1))
