"""A probe for the next session (from the repository root; OUT=dir; not run in this one, whose
device time ran out): the staged backward with its unit hand-over on named barriers
(HYTOPK_ATTWB_NAMED_HANDOVER=1: bar.arrive / bar.sync between a consumer's 128 threads and its two
storer warps) against the shipped mbarrier hand-over and the direct path, with the forward, in
alternating rounds; dq and the deterministic dk bit for bit. Run 9 found the hand-over's round trips
to be the staged kernel's cost (48.2 ms with no writes, 23.8 with no hand-over). The named build's
kernels compile unserialised (no C7511: tests/test_compile_check.py::
test_named_handover_build_is_not_serialised). 128 heads, n 8192, L 65536, k 2048."""
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

NAMED = Path(tempfile.mkdtemp(prefix="probe_named_"))
shutil.copytree("kernels_cuda", NAMED, dirs_exist_ok=True)
f = NAMED / "attend_wgmma_bwd.cu"
f.write_text("#define HYTOPK_ATTWB_NAMED_HANDOVER 1\n" + f.read_text())


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
    nb = [cp.asarray(x) for x in bwd("staged", det, NAMED)()[:2]]
    check[f"{tag}_dq_bit_identical"] = bool(cp.array_equal(m[0], nb[0]))
    check[f"{tag}_dk_max_abs_diff"] = float(cp.abs(m[1] - nb[1]).max())
    check[f"{tag}_dk_max_abs"] = float(cp.abs(m[1]).max())
print("check", check, flush=True)
fns = {"backward wgmma_atomic staged, named barriers": bwd("staged", False, NAMED),
       "backward wgmma_atomic staged, mbarriers": bwd("staged", False),
       "backward wgmma_atomic direct": bwd("direct", False),
       "backward wgmma staged, named barriers (deterministic)": bwd("staged", True, NAMED),
       "backward wgmma staged, mbarriers (deterministic)": bwd("staged", True),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
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
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_named.json").write_text(json.dumps(res, indent=1))
