"""The split backward with a dq pass whose gathers land in the 128-byte swizzle (AWB.DQ_PASS; from
the repository root, OUT=dir), against the two-pass split. results/h200-2026-12-04-s12 measured the
dq pass with core-matrix gathers (one L2 request per 16 bytes): its first pass 18.9-21.5 ms, its
third 11.7-12.3. First the same bits where they must be (dq, the deterministic dk) at 128 and 100
heads (two head blocks: the dq pass takes only those); then alternating rounds at 128 heads, n 8192,
k 2048, L 65536 and 131072: both splits (atomics, deterministic), each one's first pass alone, the dq
pass's third alone, and the forward (for the ratio)."""
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

_fn = AWB._fn
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "checks": [], "runs": {}}


def case(n, H, L, k, seed=1):
    q, kv, idx = mla_inputs(n, H, L, k, seed=seed)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    g = torch.Generator(device="cuda").manual_seed(seed + 7)
    dout = torch.randn(n, H, 512, device="cuda", generator=g).bfloat16()
    return q, kk, vv, idx, out, lse, dout


def bwd(c, det, dq_pass, only=None):
    """only: None (every pass), "first" (the first pass alone), "third" (the dq pass's third alone)."""
    q, kk, vv, idx, out, lse, dout = c

    def f():
        AWB.WRITES, AWB.DQ_PASS = "split", dq_pass
        if only:
            keep = {"first": ("hytopk_attend_bwd_pds", "hytopk_attend_bwd_sp"), "third": ("hytopk_attend_bwd_dq",)}[only]
            AWB._fn = lambda name, *a, **kw: _fn(name, *a, **kw) if name.startswith(keep) else (lambda *x, **y: None)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.DQ_PASS, AWB._fn = "auto", None, _fn
    return f


def bits(x):
    x = torch.as_tensor(x, device="cuda") if not isinstance(x, torch.Tensor) else x
    return x.float().contiguous().view(torch.int32)


for H, n, L in ((128, 64, 65536), (100, 48, 4096)):
    c = case(n, H, L, 2048, seed=H)
    for det in (True, False):
        a = bwd(c, det, False)()
        b = bwd(c, det, True)()
        ra = [None if x is None else torch.as_tensor(x, device="cuda") for x in a]
        rb = [None if x is None else torch.as_tensor(x, device="cuda") for x in b]
        row = {"H": H, "n": n, "L": L, "deterministic": det}
        for name, x, y in zip(("dq", "dk", "dv"), ra, rb):
            if x is None or y is None:
                continue
            x, y = x.float(), y.float()
            row[name + "_same_bits"] = bool(torch.equal(bits(x), bits(y)))
            row[name + "_max_rel"] = float((x - y).abs().max() / max(float(y.abs().max()), 1e-30))
            row[name + "_finite"] = bool(torch.isfinite(y).all())
        if det:
            again = [None if x is None else torch.as_tensor(x, device="cuda") for x in bwd(c, det, True)()]
            row["deterministic_repeat_same_bits"] = all(torch.equal(bits(x), bits(y)) for x, y in zip(rb, again) if x is not None)
        print(json.dumps(row), flush=True)
        res["checks"].append(row)
    del c
    torch.cuda.empty_cache()

n, H, k = 8192, 128, 2048
for L in (65536, 131072):
    c = case(n, H, L, k)
    fns = {"split atomics": bwd(c, False, False), "split atomics, dq pass": bwd(c, False, True),
           "split deterministic": bwd(c, True, False), "split deterministic, dq pass": bwd(c, True, True),
           "first pass (pds)": bwd(c, False, False, "first"), "first pass (sp, dq pass)": bwd(c, False, True, "first"),
           "third pass (dq)": bwd(c, False, True, "third"),
           "forward wgmma3": lambda: AW3.attend_forward_wgmma3(c[0], c[1], c[2], c[3], None)}
    rows = alternate(fns, rounds=7, calls=3)
    f_ms = rows.get("forward wgmma3", {}).get("median_ms")
    for name, r in rows.items():
        if "median_ms" in r and name != "forward wgmma3" and not name.startswith(("first", "third")):
            r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            if f_ms:
                r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
        print(L, name, json.dumps(r), flush=True)
    res["runs"][f"128 heads, n 8192, L {L}, k 2048"] = rows
    del c
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), "probe_dq_pass_swizzled.json").write_text(json.dumps(res, indent=1))
