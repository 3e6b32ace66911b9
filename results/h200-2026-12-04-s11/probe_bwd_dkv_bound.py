"""What bounds the split backward's second pass through the TMA's bulk reductions (from the
repository root; OUT=dir)? Alternating rounds, 128 heads, n 8192, k 2048, atomics:
  split bulk              the shipped split path (DKV_BULK), both passes
  split bulk, no read wait  a patched copy whose warps refill their staging buffer without waiting for
                          the TMA to have read it (its dk is wrong: timing only): what the one
                          8-row buffer per warp costs against a double buffer
  first pass only         the second pass's launches replaced by nothing
  staged                  the one-pass kernel (the atomics' other path)
each at L 65536 (dkv 151 MB, three times the L2) and L 8192 (dkv 19 MB, inside the L2): whether the
reductions' misses to HBM set the pace."""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, H, k = 8192, 128, 2048
WAIT = "if (lane < 8) bulk_wait_read<0>();"
NW = Path(tempfile.mkdtemp(prefix="probe_dkv_noreadwait_"))
shutil.copytree("kernels_cuda", NW, dirs_exist_ok=True)
src = (NW / "attend_wgmma_bwd.cu").read_text()
assert src.count(WAIT) == 1
(NW / "attend_wgmma_bwd.cu").write_text(src.replace(WAIT, "(void)0;"))
_fn = AWB._fn


def case(L):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    return q, kk, vv, idx, out, lse, dout


def bwd(c, writes, first_only=False, patched=False):
    q, kk, vv, idx, out, lse, dout = c

    def f():
        AWB.WRITES = writes
        if first_only:
            AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name.startswith("hytopk_attend_bwd_dkv") \
                else _fn(name, *a, **kw)
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if patched:
            os.environ["HYTOPK_KERNEL_DIR"] = str(NW)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            AWB.WRITES, AWB._fn = "auto", _fn
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "k": k, "dkv_bulk": AWB.DKV_BULK, "runs": {}}
for L in (65536, 8192):
    c = case(L)
    fns = {"split bulk": bwd(c, "split"), "split bulk, no read wait (wrong dk, timing only)": bwd(c, "split", patched=True),
           "first pass only": bwd(c, "split", first_only=True), "staged": bwd(c, "staged"),
           "forward wgmma3": lambda: AW3.attend_forward_wgmma3(c[0], c[1], c[2], c[3], None)}
    rows = alternate(fns, rounds=5, calls=3)
    f_ms = rows.get("forward wgmma3", {}).get("median_ms")
    for name, r in rows.items():
        if "median_ms" in r and name != "forward wgmma3":
            r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            if f_ms:
                r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
        print(L, name, json.dumps(r), flush=True)
    res["runs"][str(L)] = rows
    del c
    torch.cuda.empty_cache()
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_dkv_bound.json").write_text(json.dumps(res, indent=1))
