"""The dq pass's second (dK/dV) and third (dq) passes side by side (from the repository root, OUT=dir).
Alternating rounds, 128 heads, n 8192, k 2048, the bench's selection, atomics unless said:
  default          the two kernels one after the other (hytopk_attend_bwd_dkv, then _dqp)
  DKV_DQ (3,)      one launch of hytopk_attend_bwd_dkv_dq, a query's dK/dV and dq blocks alternating
  DKV_DQ (7,)      the same, part-major (every query's third 0, then third 1, ...)
  DKV_DQ (5, 6)    the two passes part-major, one after the other
  DKV_DQ (5, 2)    dK/dV part-major, dq as given;  (1, 6): dq part-major
  SIDE_STREAM      the third pass on a second stream beside the second ("same" / "high" priority)
  one chunk        the default with an 8 GiB scratch (all 8192 queries' P / dS at once; default 4 GiB)
PROBE_RUN=2: the default, DKV_DQ (3,) and RING (lag, slots): the three passes in one launch of
hytopk_attend_bwd_ring, P / dS in ring slots (no second + third only rows for the ring).
PROBE_RUN=3 (the ring the default, DKV_DQ / SIDE_STREAM removed after run 2: commit 26f99d0 has them):
the three launches against rings around the default 32 / 128, L 65536.
each as the whole backward and as its second + third passes alone (the first pass skipped, pds as the
last full run left it); the deterministic mode of the default and DKV_DQ (3,) / (5, 6); the forward;
then at L 65536 every variant's deterministic dq / dk against the default's bits."""
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
RUN = int(os.environ.get("PROBE_RUN", "1"))
if RUN == 1:
    VARIANTS = {"default": {}, "fused": {"DKV_DQ": (3,)}, "fused part-major": {"DKV_DQ": (7,)},
                "part-major": {"DKV_DQ": (5, 6)}, "dkv part-major": {"DKV_DQ": (5, 2)}, "dq part-major": {"DKV_DQ": (1, 6)},
                "side same": {"SIDE_STREAM": "same"}, "side high": {"SIDE_STREAM": "high"},
                "default, one chunk": {"scratch_bytes": 8 << 30}}
    DET = ("default", "fused", "part-major")
else:                       # run 2: the ring (all three passes in one launch), lag / slots
    VARIANTS = {"default": {}, "fused": {"DKV_DQ": (3,)}, "ring 8/32": {"RING": (8, 32)}, "ring 16/64": {"RING": (16, 64)},
                "ring 32/128": {"RING": (32, 128)}, "ring 64/192": {"RING": (64, 192)}, "ring 128/320": {"RING": (128, 320)}}
    DET = ("default", "fused", "ring 32/128")
if RUN == 3:                # run 3 (the ring the default): lags and slots around 32 / 128, L 65536
    VARIANTS = {"three launches": {"RING": False}, "ring 24/96": {"RING": (24, 96)}, "ring 32/64": {"RING": (32, 64)},
                "ring 32/128 (default)": {}, "ring 48/128": {"RING": (48, 128)}, "ring 48/192": {"RING": (48, 192)},
                "ring 96/256": {"RING": (96, 256)}}
    DET = ("three launches", "ring 32/128 (default)")


def bwd(c, det, knobs, skip_first=False):
    q, kk, vv, idx, out, lse, dout = c

    def f():
        AWB.WRITES = "split"
        for key, val in knobs.items():
            if key != "scratch_bytes":
                setattr(AWB, key, val)
        if skip_first:
            AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name == "hytopk_attend_bwd_sp" else _fn(name, *a, **kw)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4,
                                      scratch_bytes=knobs.get("scratch_bytes"))
        finally:
            AWB.WRITES, AWB.DKV_DQ, AWB.SIDE_STREAM, AWB.RING, AWB._fn = "auto", None, None, None, _fn
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "k": k, "dq_pass": AWB.INST.ATTEND_WGMMA_BWD_DQ_PASS,
       "selection": "scripts/bench_attention.py:selection (adjacent queries share 90 %)", "runs": {}}
for L in ((65536,) if RUN == 3 else (65536, 131072)):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    c = (q, kk, vv, idx, out, lse, dout)
    if L == 65536:
        base = [cp.asarray(x).view(cp.int32) for x in bwd(c, True, {})()[:2]]
        same = {}
        for name, knobs in VARIANTS.items():
            got = bwd(c, True, knobs)()[:2]
            same[name] = [bool(cp.array_equal(cp.asarray(x).view(cp.int32), y)) for x, y in zip(got, base)]
            del got
        res["check_65536_det_dq_dk_same_bits_as_default"] = same
        print("check", json.dumps(same), flush=True)
        del base
    fns = {}
    for name, knobs in VARIANTS.items():
        fns[f"{name}"] = bwd(c, False, knobs)
    for name, knobs in VARIANTS.items():
        if RUN < 3 and "RING" not in knobs:
            fns[f"{name}, second + third only"] = bwd(c, False, knobs, skip_first=True)
    for name in DET:
        fns[f"{name}, deterministic"] = bwd(c, True, VARIANTS[name])
    fns["forward wgmma3"] = lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)
    rows = alternate(fns, rounds=7, calls=3)
    f_ms = rows.get("forward wgmma3", {}).get("median_ms")
    for name, r in rows.items():
        if "median_ms" in r and "only" not in name and name != "forward wgmma3":
            r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            if f_ms:
                r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
        print(L, name, json.dumps(r), flush=True)
    res["runs"][str(L)] = rows
    del c, q, kv, idx, out, lse, dout, kk, vv
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), f"run{RUN}-probe_dkv_dq.json").write_text(json.dumps(res, indent=1))
