"""Run 5's probe (from the repository root; OUT=dir): the staged wgmma backward (STAGED_WRITES: the
consumers hand each 16-slot x 64-column dK/dV unit to the producer warpgroup through shared memory,
which writes it 16 bytes at a time, so the consumers no longer stall on the float atomics) against
the direct one, atomics and deterministic part rows, and the forward (wgmma3) in alternating rounds.
128 heads, n 8192, L 65536, k 2048 (bench_attention's backward shape)."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
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


def bwd(staged, det, pair=False):
    def f():
        AWB.STAGED_WRITES, AWB.PAIR_SUM = staged, pair
        CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
    return f


# the staged atomics' dk next to the direct ones' (the same adds in another order)
outs = {}
for s in (False, True, "pair"):
    AWB.STAGED_WRITES, AWB.PAIR_SUM = bool(s), s == "pair"
    outs[s] = CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
AWB.STAGED_WRITES, AWB.PAIR_SUM = False, False
dk0, dk1 = cp.asarray(outs[False][1]), cp.asarray(outs[True][1])       # (CuPy arrays)
check = {"dq_bit_identical": bool(cp.array_equal(cp.asarray(outs[False][0]), cp.asarray(outs[True][0]))),
         "dk_max_abs_diff": float(cp.abs(dk0 - dk1).max()), "dk_max_abs": float(cp.abs(dk0).max()),
         "pair_dq_bit_identical": bool(cp.array_equal(cp.asarray(outs[False][0]), cp.asarray(outs["pair"][0]))),
         "pair_dk_max_abs_diff": float(cp.abs(dk0 - cp.asarray(outs["pair"][1])).max())}
print("check", check, flush=True)
fns = {"backward wgmma_atomic": bwd(False, False), "backward wgmma_atomic_staged": bwd(True, False),
       "backward wgmma_atomic_staged_pair": bwd(True, False, True),
       "backward wgmma (deterministic)": bwd(False, True), "backward wgmma_staged (deterministic)": bwd(True, True),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
rows = alternate(fns, rounds=5, calls=3)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name.startswith("backward"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_staged.json").write_text(json.dumps(res, indent=1))
