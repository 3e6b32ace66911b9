"""The split backward's second pass written through the TMA's bulk operations (DKV_BULK: rows staged
per consumer warp, then cp.reduce.async.bulk .add.f32 / cp.async.bulk) against its 8-byte writes
from the accumulators, and against the staged one-pass kernel (the atomics' shipped path), with the
forward, in alternating rounds (from the repository root; OUT=dir). Checks: dq bit for bit, the
deterministic dk the same bits either way, the atomics' dk close. 128 heads, n 8192, L 65536, k 2048."""
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
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
_fn = AWB._fn


def bwd(det, writes, bulk=None, first_only=False):
    def f():
        AWB.WRITES, AWB.DKV_BULK = writes, bulk
        if first_only:      # the second pass's launches replaced by nothing
            AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name.startswith("hytopk_attend_bwd_dkv") \
                else _fn(name, *a, **kw)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.DKV_BULK, AWB._fn = "auto", None, _fn
    return f


check = {}
for det in (False, True):
    tag = "det" if det else "atomic"
    st = [cp.asarray(x) for x in bwd(det, "staged")()[:2]]
    r = [cp.asarray(x) for x in bwd(det, "split", bulk=False)()[:2]]
    b = [cp.asarray(x) for x in bwd(det, "split", bulk=True)()[:2]]
    check[f"{tag}_dq_bit_identical"] = bool(cp.array_equal(st[0], b[0]) and cp.array_equal(r[0], b[0]))
    check[f"{tag}_dk_bulk_vs_direct_bit_identical"] = bool(cp.array_equal(r[1], b[1]))
    check[f"{tag}_dk_bulk_vs_direct_max_abs_diff"] = float(cp.abs(r[1] - b[1]).max())
    check[f"{tag}_dk_bulk_vs_staged_max_abs_diff"] = float(cp.abs(st[1] - b[1]).max())
    check[f"{tag}_dk_max_abs"] = float(cp.abs(st[1]).max())
d1, d2 = [cp.asarray(x) for x in bwd(True, "split", bulk=True)()[:2]], [cp.asarray(x) for x in bwd(True, "split", bulk=True)()[:2]]
check["det_bulk_reproducible"] = bool(cp.array_equal(d1[1], d2[1]) and cp.array_equal(d1[0], d2[0]))
print("check", check, flush=True)

fns = {"backward wgmma_atomic staged (shipped)": bwd(False, "staged"),
       "backward wgmma_atomic split, dkv direct": bwd(False, "split", bulk=False),
       "backward wgmma_atomic split, dkv bulk": bwd(False, "split", bulk=True),
       "backward wgmma_atomic split, first pass only": bwd(False, "split", first_only=True),
       "backward wgmma split (deterministic), dkv direct": bwd(True, "split", bulk=False),
       "backward wgmma split (deterministic), dkv bulk": bwd(True, "split", bulk=True),
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
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_dkv_bulk.json").write_text(json.dumps(res, indent=1))
