"""Where the named hand-over's time goes (from the repository root; OUT=dir): the shipped staged
backward (named barriers, the default since this folder's runs) against a patched copy whose storers
load and hand back every unit but write nothing (their red / st behind a key test no key passes,
through opaque_u32: the loads stay), with the forward, in alternating rounds. The patched copy is
checked free of wgmma serialisation (C7511) here before it runs: a serialised copy would time the
serialisation. 128 heads, n 8192, L 65536, k 2048."""
import json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench import compile_check as CC
from workbench import instantiations as INST
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

WRITE = "                if (ATOMIC) red_add_v4(p, a, b, c, d);\n                else st_global_v4(p, a, b, c, d);\n"
NOWRITE = ("                if (opaque_u32((u32)kx[r]) == 0xfffffff9u) {   // (never)\n"
           "                    if (ATOMIC) red_add_v4(p, a, b, c, d);\n"
           "                    else st_global_v4(p, a, b, c, d);\n"
           "                }\n")


def patched():
    d = Path(tempfile.mkdtemp(prefix="probe_nowrites_"))
    shutil.copytree("kernels_cuda", d, dirs_exist_ok=True)
    f = d / "attend_wgmma_bwd.cu"
    src = f.read_text()
    assert src.count(WRITE) == 1
    f.write_text(src.replace(WRITE, NOWRITE))
    nvcc = CC.find_nvcc()
    serial = None
    if nvcc:
        ok, log = CC.run_nvcc(nvcc, f, [INST.attend_wgmma_bwd_name(True, writes="staged")], "90", Path(tempfile.mkdtemp()))
        assert ok, log[-2000:]
        serial = [r.wgmma_serialized for r in CC.parse_ptxas(log)]
        assert serial == [""], serial
    return d, serial


NOW, serial = patched()
n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()


def bwd(kdir=None):
    def f():
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if kdir:
            os.environ["HYTOPK_KERNEL_DIR"] = str(kdir)
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


AWB.WRITES = "staged"
dk = cp.asarray(bwd(NOW)()[1])
check = {"nowrites_dk_all_zero": bool((dk == 0).all()), "nowrites_serialised": serial}
print("check", check, flush=True)
fns = {"backward wgmma_atomic staged (named, shipped)": bwd(),
       "backward wgmma_atomic staged, hand-over but no writes (patched)": bwd(NOW),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
rows = alternate(fns, rounds=5, calls=3)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "check": check, "rows": rows}
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name.startswith("backward"):
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_named_parts.json").write_text(json.dumps(res, indent=1))
