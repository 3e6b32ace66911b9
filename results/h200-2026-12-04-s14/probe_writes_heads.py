"""Which write path the backward's "auto" should take per head count (from the repository root, OUT=dir):
staged against split (at 65-128 heads the split takes the dq pass and the ring), atomics and
deterministic, alternating rounds, n 8192, k 2048, L 65536, the bench's selection, 16 / 32 / 64 / 100 /
128 heads. Run 6 of this folder measured, at 16 heads, staged 22.81 ms against split 29.27 (atomics)
and 42.15 against 45.33 (deterministic)."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, k, L = 8192, 2048, 65536


def bwd(c, det, writes):
    q, kk, vv, idx, out, lse, dout = c

    def f():
        AWB.WRITES = writes
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES = "auto"
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "k": k, "L": L, "ring": AWB.INST.ATTEND_WGMMA_BWD_RING,
       "runs": {}}
for H in (16, 32, 64, 100, 128):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    c = (q, kk, vv, idx, out, lse, dout)
    fns = {f"{w}, {'deterministic' if d else 'atomics'}": bwd(c, d, w) for d in (False, True) for w in ("staged", "split")}
    rows = alternate(fns, rounds=5, calls=2)
    for name, r in rows.items():
        print(H, name, json.dumps(r), flush=True)
    res["runs"][str(H)] = rows
    del c, q, kv, idx, out, lse, dout, kk, vv
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), "run7-probe_writes_heads.json").write_text(json.dumps(res, indent=1))
