"""The first passes published by cp.async.mbarrier.arrive (the producer never waits for its copies)
and gathering with the L2::256B hint, against d6fd682's (each tile waited for before the next is
issued, no hint) and d6fd682's with the hint only, from the repository root;
OUT=dir. head_kernels/attend_wgmma_bwd.cu is d6fd682's file (not committed: git show
d6fd682:kernels_cuda/attend_wgmma_bwd.cu), run from a copy of kernels_cuda/ with it in place. First
the same bits (dq, deterministic dk) at n 64; then alternating rounds at 128 heads, n 8192, L 65536,
k 2048: the split as at d6fd682, with the new first pass, with the dq pass; first passes alone."""
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

HEAD = Path(tempfile.gettempdir()) / "probe_noinc_head"
if HEAD.exists():
    shutil.rmtree(HEAD)
shutil.copytree("kernels_cuda", HEAD)
shutil.copy(Path(__file__).parent / "head_kernels" / "attend_wgmma_bwd.cu", HEAD / "attend_wgmma_bwd.cu")
# d6fd682's first pass with the L2::256B hint on its gather only
HEADPF = Path(tempfile.gettempdir()) / "probe_noinc_head_l2pf"
if HEADPF.exists():
    shutil.rmtree(HEADPF)
shutil.copytree(HEAD, HEADPF)
_src = (HEADPF / "attend_wgmma_bwd.cu").read_text()
_cp = "if (c < DQK / 8) cp_async16(dst + (u32)(g * QG + c * 128), src + (ok ? c * 8 : 0), ok);"
assert _src.count(_cp) == 1
(HEADPF / "attend_wgmma_bwd.cu").write_text(_src.replace(_cp, _cp.replace("cp_async16(", "cp_async16_l2pf(")))
_fn = AWB._fn
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "checks": [], "runs": {}}


def case(n, H, L, k, seed=1):
    q, kv, idx = mla_inputs(n, H, L, k, seed=seed)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    g = torch.Generator(device="cuda").manual_seed(seed + 7)
    return q, kk, vv, idx, out, lse, torch.randn(n, H, 512, device="cuda", generator=g).bfloat16()


def bwd(c, det, dq_pass=False, head=False, only=None):
    """head: False, True (d6fd682's file) or "l2pf" (d6fd682's with the L2::256B hint on the gather)."""
    q, kk, vv, idx, out, lse, dout = c

    def f():
        AWB.WRITES, AWB.DQ_PASS = "split", dq_pass
        if only:
            keep = {"first": ("hytopk_attend_bwd_pds", "hytopk_attend_bwd_sp"), "third": ("hytopk_attend_bwd_dq<",)}[only]
            AWB._fn = lambda name, *a, **kw: _fn(name, *a, **kw) if name.startswith(keep) else (lambda *x, **y: None)
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if head:
            os.environ["HYTOPK_KERNEL_DIR"] = str(HEADPF if head == "l2pf" else HEAD)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.DQ_PASS, AWB._fn = "auto", None, _fn
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


def t(x):
    return None if x is None else torch.as_tensor(x, device="cuda").float().contiguous()


for H, n, L in ((128, 64, 65536), (16, 40, 4096)):
    c = case(n, H, L, 2048, seed=H)
    for det in (True, False):
        ref = [t(x) for x in bwd(c, det, head=True)()]
        for label, kw in (("new first pass", {}), ("dq pass", {"dq_pass": True})):
            got = [t(x) for x in bwd(c, det, **kw)()]
            row = {"H": H, "n": n, "deterministic": det, "what": label}
            for name, x, y in zip(("dq", "dk"), got, ref):
                row[name + "_same_bits"] = bool(torch.equal(x.view(torch.int32), y.view(torch.int32)))
                row[name + "_max_rel"] = float((x - y).abs().max() / max(float(y.abs().max()), 1e-30))
            print(json.dumps(row), flush=True)
            res["checks"].append(row)
    del c
    torch.cuda.empty_cache()

n, H, L, k = 8192, 128, 65536, 2048
c = case(n, H, L, k)
fns = {"split atomics (d6fd682)": bwd(c, False, head=True), "split atomics": bwd(c, False),
       "split atomics, dq pass": bwd(c, False, dq_pass=True),
       "split deterministic (d6fd682)": bwd(c, True, head=True), "split deterministic": bwd(c, True),
       "split deterministic, dq pass": bwd(c, True, dq_pass=True),
       "split atomics (d6fd682 + L2::256B)": bwd(c, False, head="l2pf"),
       "first pass (d6fd682)": bwd(c, False, head=True, only="first"), "first pass": bwd(c, False, only="first"),
       "first pass (d6fd682 + L2::256B)": bwd(c, False, head="l2pf", only="first"),
       "first pass of the dq pass (sp)": bwd(c, False, dq_pass=True, only="first"),
       "third pass (dq)": bwd(c, False, dq_pass=True, only="third"),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(c[0], c[1], c[2], c[3], None)}
rows = alternate(fns, rounds=5, calls=3)
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name.startswith("split"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
res["runs"]["128 heads, n 8192, L 65536, k 2048"] = rows
Path(os.environ.get("OUT", "/tmp"), "probe_noinc.json").write_text(json.dumps(res, indent=1))
