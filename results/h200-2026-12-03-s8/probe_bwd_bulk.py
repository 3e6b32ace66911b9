"""Run 3's probe (from the repository root; OUT=dir): the bulk write path of the wgmma backward
(WRITES = "bulk": the consumers hand 8-slot x 64-column dK/dV units to the producer warpgroup through
two shared-memory buffers each, and the producer has the TMA write each slot's 256 bytes,
cp.reduce.async.bulk .add.f32 / cp.async.bulk) against the staged (the producer's threads write 16
bytes at a time) and direct (the consumers write) paths, atomics and deterministic part rows, with
the forward (wgmma3) in the same alternating rounds. 128 heads, n 8192, L 65536, k 2048
(bench_attention's backward shape). Also: the three paths' dq bit for bit, their dk's largest
difference (the same adds in another order), the deterministic dk bit for bit."""
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
PATHS = ("direct", "staged", "bulk")


def bwd(writes, det):
    def f():
        AWB.WRITES = writes
        return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
    return f


check = {}
for det in (False, True):
    got = {w: [cp.asarray(x) for x in bwd(w, det)()[:2]] for w in PATHS}
    dq0, dk0 = got["direct"]
    for w in PATHS[1:]:
        tag = f"{w}_{'det' if det else 'atomic'}"
        check[tag + "_dq_bit_identical"] = bool(cp.array_equal(dq0, got[w][0]))
        if det:
            check[tag + "_dk_bit_identical"] = bool(cp.array_equal(dk0, got[w][1]))
        else:
            check[tag + "_dk_max_abs_diff"] = float(cp.abs(dk0 - got[w][1]).max())
    check[f"dk_max_abs_{'det' if det else 'atomic'}"] = float(cp.abs(dk0).max())
    del got
print("check", check, flush=True)
fns = {f"backward wgmma_atomic {w}": bwd(w, False) for w in PATHS}
fns.update({f"backward wgmma {w} (deterministic)": bwd(w, True) for w in PATHS})
fns["forward wgmma3"] = lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)
rows = alternate(fns, rounds=5, calls=3)
AWB.WRITES = "bulk"
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name.startswith("backward"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_bulk.json").write_text(json.dumps(res, indent=1))
