"""The split backward (WRITES = "split": a first pass writes P / dS in bf16, a second computes dK/dV
of all 128 heads at once, keys as the MMA's M) against the shipped staged kernel, with the forward,
in alternating rounds (from the repository root; OUT=dir). Also the split's two passes alone, and
the atomics' and deterministic modes. dq bit for bit, dk's largest differences. 128 heads, n 8192,
L 65536, k 2048."""
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

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()


V4 = Path(tempfile.mkdtemp(prefix="probe_split_v4_"))      # the probe build HYTOPK_ATTWB_DKV_V4=1
shutil.copytree("kernels_cuda", V4, dirs_exist_ok=True)
(V4 / "attend_wgmma_bwd.cu").write_text("#define HYTOPK_ATTWB_DKV_V4 1\n" + (V4 / "attend_wgmma_bwd.cu").read_text())


def bwd(det, writes, overlap=False, v4=False):
    def f():
        AWB.WRITES, AWB.SPLIT_OVERLAP = writes, overlap
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if v4:
            os.environ["HYTOPK_KERNEL_DIR"] = str(V4)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.SPLIT_OVERLAP = "staged", False
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


check = {}
for det in (False, True):
    tag = "det" if det else "atomic"
    m = [cp.asarray(x) for x in bwd(det, "staged")()[:2]]
    s = [cp.asarray(x) for x in bwd(det, "split")()[:2]]
    check[f"{tag}_dq_bit_identical"] = bool(cp.array_equal(m[0], s[0]))
    check[f"{tag}_dk_max_abs_diff"] = float(cp.abs(m[1] - s[1]).max())
    check[f"{tag}_dk_max_abs"] = float(cp.abs(m[1]).max())
for tag, f in (("overlap", bwd(False, "split", overlap=True)), ("v4", bwd(False, "split", v4=True)),
               ("v4_overlap", bwd(False, "split", overlap=True, v4=True)), ("v4_det", bwd(True, "split", v4=True))):
    s = [cp.asarray(x) for x in f()[:2]]
    m = [cp.asarray(x) for x in bwd(tag == "v4_det", "split")()[:2]]
    check[f"{tag}_dq_bit_identical"] = bool(cp.array_equal(m[0], s[0]))
    check[f"{tag}_dk_max_abs_diff_vs_split"] = float(cp.abs(m[1] - s[1]).max())
d1, d2 = [cp.asarray(x) for x in bwd(True, "split")()[:2]], [cp.asarray(x) for x in bwd(True, "split")()[:2]]
check["det_split_reproducible"] = bool(cp.array_equal(d1[1], d2[1]) and cp.array_equal(d1[0], d2[0]))
print("check", check, flush=True)

# the first pass alone: the second's launches replaced by nothing (the rest of the op as in "split")
_fn = AWB._fn


def first_only(det):
    f = bwd(det, "split")
    def g():
        AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name.startswith("hytopk_attend_bwd_dkv") else _fn(name, *a, **kw)
        try:
            return f()
        finally:
            AWB._fn = _fn
    return g


fns = {"backward wgmma_atomic staged (shipped)": bwd(False, "staged"),
       "backward wgmma_atomic split": bwd(False, "split"),
       "backward wgmma_atomic split, first pass only": first_only(False),
       "backward wgmma_atomic split, overlapped": bwd(False, "split", overlap=True),
       "backward wgmma_atomic split, v4": bwd(False, "split", v4=True),
       "backward wgmma_atomic split, v4, overlapped": bwd(False, "split", overlap=True, v4=True),
       "backward wgmma split (deterministic), v4": bwd(True, "split", v4=True),
       "backward wgmma staged (shipped, deterministic)": bwd(True, "staged"),
       "backward wgmma split (deterministic)": bwd(True, "split"),
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
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_split.json").write_text(json.dumps(res, indent=1))
