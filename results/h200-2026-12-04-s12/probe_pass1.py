"""Where the split backward's first pass (hytopk_attend_bwd_pds) spends its 22-23 ms (from the
repository root; OUT=dir). Patched copies of attend_wgmma_bwd.cu, each without one piece of the
first pass (wrong dq / P / dS: timing only; each checked free of wgmma serialisation by the compile
check before the run); the first pass alone (the second pass's launches replaced by nothing),
alternating rounds, 128 heads, n 8192, k 2048, L 65536 (and the shipped one at L 8192: kv in L2):
  nogather   the producer issues no cp.async (the consumers multiply whatever the stage holds)
  nopds      consumer 0 does not store P / dS to the scratch
  nodq       no dQ MMAs
  nosdp      no S / dP MMAs (S = dP = 0)
  nomma      neither (the gather, softmax, exchange and P / dS stores only)
  idle       the consumers only wait for each tile and release it (the gather alone)
  compute    nogather + nopds (the MMAs, softmax and exchange only)"""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
P = {
    "nogather": ("if (c < DQK / 8) cp_async16(dst + (u32)(g * QG + c * 128), src + (ok ? c * 8 : 0), ok);",
                 "if (c < DQK / 8) { (void)dst; (void)src; }"),
    "nopds": ("if (PDS) put_pds(it, p, d);", "(void)0;"),
    "nodq": ("wgmma_m64n144k16_bf16_tb(dqa[j], a, b, 1);", "(void)a; (void)b;"),
    "nosdp": ("wgmma_m64n32k16_bf16(sd, pad ? z : a + (u64)(16 * ks), pad ? z : bk + (u64)(16 * ks), ks > 0);",
              "(void)pad; (void)a; (void)bk; (void)z;"),
    "sdzero": ("float sd[16];", "float sd[16] = {};"),
    "idle": ("mbar_wait_or_trap(full0 + 8 * st, (u32)((it >> 1) & 1));",
             "mbar_wait_or_trap(full0 + 8 * st, (u32)((it >> 1) & 1));\n"
             "            if (PDS) { __syncwarp(); if (lane == 0) mbar_arrive(empty0 + 8 * st); continue; }"),
}
VARIANTS = {"nogather": ["nogather"], "nopds": ["nopds"], "nodq": ["nodq"], "nosdp": ["nosdp", "sdzero"],
            "nomma": ["nosdp", "sdzero", "nodq"], "idle": ["idle"], "compute": ["nogather", "nopds"]}


def patched(tag):
    d = Path(tempfile.gettempdir()) / f"probe_pass1_{tag}"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree("kernels_cuda", d)
    src = (d / "attend_wgmma_bwd.cu").read_text()
    for p in VARIANTS[tag]:
        old, new = P[p]
        assert src.find(old) >= 0 and src.find(old) < src.find("namespace dkv"), (tag, p)   # the first pass's code
        src = src.replace(old, new, 1)
    (d / "attend_wgmma_bwd.cu").write_text(src)
    return d


if __name__ == "__main__" and sys.argv[1:] == ["--dirs"]:      # for the compile check: print the copies
    print(" ".join(str(patched(t)) for t in VARIANTS))
    sys.exit(0)

import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, H, k = 8192, 128, 2048
_fn = AWB._fn
DIRS = {t: patched(t) for t in VARIANTS}


def case(L):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    return q, kk, vv, idx, out, lse, dout


def bwd(c, first_only=True, tag=None):
    q, kk, vv, idx, out, lse, dout = c

    def f():
        AWB.WRITES = "split"
        if first_only:
            AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name.startswith("hytopk_attend_bwd_dkv") \
                else _fn(name, *a, **kw)
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if tag:
            os.environ["HYTOPK_KERNEL_DIR"] = str(DIRS[tag])
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            AWB.WRITES, AWB._fn = "auto", _fn
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "k": k, "runs": {}}
for L in (65536, 8192):
    c = case(L)
    fns = {"split (both passes)": bwd(c, first_only=False), "first pass": bwd(c),
           "forward wgmma3": lambda: AW3.attend_forward_wgmma3(c[0], c[1], c[2], c[3], None)}
    if L == 65536:
        fns.update({f"first pass, {t}": bwd(c, tag=t) for t in VARIANTS})
    rows = alternate(fns, rounds=5, calls=3)
    for name, r in rows.items():
        print(L, name, json.dumps(r), flush=True)
    res["runs"][str(L)] = rows
    del c
    torch.cuda.empty_cache()
Path(os.environ.get("OUT", "/tmp"), "probe_pass1.json").write_text(json.dumps(res, indent=1))
