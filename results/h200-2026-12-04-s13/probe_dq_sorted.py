"""The split with the dq pass (the default at 128 heads) over each query's slots sorted by key
(SORT_SLOTS; from the repository root, OUT=dir). Runs 2-3 of this folder: on the two-pass split,
sorted slots made the second pass ~2 ms faster and the first ~1 ms slower. Alternating rounds, 128
heads, n 8192, k 2048, the bench's selection, L 65536 and 131072: the whole backward as given and
sorted (atomics, deterministic), each pass alone on the selection as given and sorted beforehand,
the sort alone, the forward; then the sorted deterministic bits against the given path on the
pre-sorted selection."""
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

n, H, k = 8192, 128, 2048
_fn = AWB._fn
PASSES = {"first": ("hytopk_attend_bwd_sp",), "second": ("hytopk_attend_bwd_dkv",), "third": ("hytopk_attend_bwd_dqp",)}


def bwd(c, det, sort, sel=None, only=None):
    q, kk, vv, idx, out, lse, dout = c
    sel = idx if sel is None else sel

    def f():
        AWB.WRITES, AWB.SORT_SLOTS = "split", sort
        if only:
            AWB._fn = lambda name, *a, **kw: _fn(name, *a, **kw) if name.startswith(PASSES[only]) else (lambda *x, **y: None)
        try:
            return CA.attend_backward(dout, q, kk, vv, sel, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.SORT_SLOTS, AWB._fn = "auto", None, _fn
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "k": k, "dq_pass": AWB.INST.ATTEND_WGMMA_BWD_DQ_PASS,
       "selection": "scripts/bench_attention.py:selection (adjacent queries share 90 %)", "runs": {}}
for L in (65536, 131072):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    c = (q, kk, vv, idx, out, lse, dout)
    srt = torch.sort(idx, dim=1).values.contiguous()
    ic = cp.asarray(idx)
    fns = {"split atomics": bwd(c, False, False), "split atomics, sorted": bwd(c, False, True),
           "split deterministic": bwd(c, True, False), "split deterministic, sorted": bwd(c, True, True)}
    for p in PASSES:
        fns[f"{p} pass only, given"] = bwd(c, False, False, only=p)
        fns[f"{p} pass only, pre-sorted"] = bwd(c, False, False, sel=srt, only=p)
    fns["sort only"] = lambda: AWB.sorted_slots(ic, n, k)
    fns["forward wgmma3"] = lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)
    rows = alternate(fns, rounds=7, calls=3)
    f_ms = rows.get("forward wgmma3", {}).get("median_ms")
    for name, r in rows.items():
        if "median_ms" in r and name.startswith("split"):
            r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            if f_ms:
                r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
        print(L, name, json.dumps(r), flush=True)
    res["runs"][str(L)] = rows
    if L == 65536:
        a, b = bwd(c, True, True)(), bwd(c, True, False, sel=srt)()
        res["check_65536"] = {"det_dq_dk_same_bits_as_presorted": all(
            bool(cp.array_equal(cp.asarray(x).view(cp.int32), cp.asarray(y).view(cp.int32))) for x, y in zip(a[:2], b[:2]))}
        print("check", json.dumps(res["check_65536"]), flush=True)
        del a, b
    del c, q, kv, idx, out, lse, dout, srt, ic, kk, vv
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), "probe_dq_sorted.json").write_text(json.dumps(res, indent=1))
