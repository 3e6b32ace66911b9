"""The split backward's second pass with three consumer warpgroups (the probe build
HYTOPK_ATTWB_DKV_CONSUMERS=3: 512 threads, setmaxnreg 40 / 152) against the default two, and the
staged kernel, with the forward, in alternating rounds (from the repository root; OUT=dir). The
deterministic bits of both builds compared. 128 heads, n 8192, L 65536, k 2048."""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench import instantiations as INST
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

C3 = Path(tempfile.mkdtemp(prefix="probe_split_c3_"))
shutil.copytree("kernels_cuda", C3, dirs_exist_ok=True)
(C3 / "attend_wgmma_bwd.cu").write_text("#define HYTOPK_ATTWB_DKV_CONSUMERS 3\n" + (C3 / "attend_wgmma_bwd.cu").read_text())

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
THREADS, ROLES = INST.ATTEND_WGMMA_BWD_DKV_THREADS, INST.ATTEND_WGMMA_BWD_DKV_ROLES


def bwd(det, writes, c3=False):
    def f():
        AWB.WRITES = writes
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if c3:
            os.environ["HYTOPK_KERNEL_DIR"] = str(C3)
            INST.ATTEND_WGMMA_BWD_DKV_THREADS, INST.ATTEND_WGMMA_BWD_DKV_ROLES = 512, ((128, 40), (384, 152))
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES = "auto"
            INST.ATTEND_WGMMA_BWD_DKV_THREADS, INST.ATTEND_WGMMA_BWD_DKV_ROLES = THREADS, ROLES
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


check = {}
for det in (False, True):
    tag = "det" if det else "atomic"
    m = [cp.asarray(x) for x in bwd(det, "split")()[:2]]
    s = [cp.asarray(x) for x in bwd(det, "split", True)()[:2]]
    check[f"{tag}_dq_bit_identical"] = bool(cp.array_equal(m[0], s[0]))
    check[f"{tag}_dk_bit_identical"] = bool(cp.array_equal(m[1], s[1]))
    check[f"{tag}_dk_max_abs_diff"] = float(cp.abs(m[1] - s[1]).max())
print("check", check, flush=True)
fns = {"backward wgmma_atomic staged": bwd(False, "staged"),
       "backward wgmma_atomic split": bwd(False, "split"),
       "backward wgmma_atomic split, three consumers": bwd(False, "split", True),
       "backward wgmma staged (deterministic)": bwd(True, "staged"),
       "backward wgmma split (deterministic)": bwd(True, "split"),
       "backward wgmma split, three consumers (deterministic)": bwd(True, "split", True),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
rows = alternate(fns, rounds=5, calls=3)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name.startswith("backward"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_split_c3.json").write_text(json.dumps(res, indent=1))
