"""The staged backward's hand-over, three builds in alternating rounds (from the repository root;
OUT=dir): the shipped one (16-slot units, one 4 KiB buffer per consumer, mbarriers), named
(HYTOPK_ATTWB_NAMED_HANDOVER=1: the same units on named barriers), unit8 (HYTOPK_ATTWB_UNIT8=1:
8-slot units written by one stmatrix per warp, two buffers per consumer, named barriers, one storer
warp per buffer), named_stmatrix (named, each unit written by two stmatrix per warp,
HYTOPK_ATTWB_STMATRIX=1) and kring (HYTOPK_ATTWB_KRING=1: whole m-tile units in the tile's own K
stage once the dQ MMAs have read it, two buffers per consumer, named barriers), with the direct path and the forward; dq and the deterministic dk bit for bit
against the shipped build, the atomic dk's largest difference. Run 9 of results/h200-2026-12-03-s8
found the hand-over (15.6 ms) and the consumers' unit stores (8.9 ms) to be the staged kernel's cost.
Every build compiles without wgmma serialisation (tests/test_compile_check.py::
test_staged_probe_builds_are_not_serialised). 128 heads, n 8192, L 65536, k 2048."""
import json, os, shutil, sys, tempfile, time
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


def build(*defines):
    d = Path(tempfile.mkdtemp(prefix="probe_build_"))
    shutil.copytree("kernels_cuda", d, dirs_exist_ok=True)
    f = d / "attend_wgmma_bwd.cu"
    f.write_text("".join(f"#define {x} 1\n" for x in defines) + f.read_text())
    return d


ALL = {"mbarriers": (), "named": ("HYTOPK_ATTWB_NAMED_HANDOVER",), "unit8": ("HYTOPK_ATTWB_UNIT8",),
       "named_stmatrix": ("HYTOPK_ATTWB_NAMED_HANDOVER", "HYTOPK_ATTWB_STMATRIX"), "kring": ("HYTOPK_ATTWB_KRING",)}
# PROBE_BUILDS: a comma-separated subset (run 2: mbarriers,named,unit8; run 3: mbarriers,named,named_stmatrix;
# run 4: mbarriers,named,kring)
BUILDS = {b: (build(*ALL[b]) if ALL[b] else None)
          for b in os.environ.get("PROBE_BUILDS", "mbarriers,named,unit8,named_stmatrix").split(",")}


def bwd(writes, det, kdir=None):
    def f():
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if kdir:
            os.environ["HYTOPK_KERNEL_DIR"] = str(kdir)
        AWB.WRITES = writes
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


check = {}
for det in (False, True):
    tag = "det" if det else "atomic"
    m = [cp.asarray(x) for x in bwd("staged", det)()[:2]]
    check[f"{tag}_dk_max_abs"] = float(cp.abs(m[1]).max())
    for b, kdir in BUILDS.items():
        if kdir is None:
            continue
        nb = [cp.asarray(x) for x in bwd("staged", det, kdir)()[:2]]
        check[f"{b}_{tag}_dq_bit_identical"] = bool(cp.array_equal(m[0], nb[0]))
        check[f"{b}_{tag}_dk_bit_identical"] = bool(cp.array_equal(m[1], nb[1]))
        check[f"{b}_{tag}_dk_max_abs_diff"] = float(cp.abs(m[1] - nb[1]).max())
print("check", check, flush=True)
fns = {}
for b, kdir in BUILDS.items():
    fns[f"backward wgmma_atomic staged, {b}"] = bwd("staged", False, kdir)
fns["backward wgmma_atomic direct"] = bwd("direct", False)
for b, kdir in BUILDS.items():
    fns[f"backward wgmma staged, {b} (deterministic)"] = bwd("staged", True, kdir)
fns["forward wgmma3"] = lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)
rows = alternate(fns, rounds=5, calls=3)
AWB.WRITES = "staged"
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name.startswith("backward"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_units.json").write_text(json.dumps(res, indent=1))
