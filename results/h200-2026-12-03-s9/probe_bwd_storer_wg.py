"""The staged backward with a fourth warpgroup of storers (from the repository root; OUT=dir): the
probe build HYTOPK_ATTWB_STORER_WG=1 (512 threads, setmaxnreg 40 / 208 / 56: the producer only
gathers, warpgroup 3 drains the units on the same named barriers, the slot keys from a 4-tile ring)
against the shipped staged kernel (the producer gathers and drains), with the forward, in
alternating rounds; dq and the deterministic dk bit for bit, the atomic dk's largest difference.
The question (run 6's ncu): do the consumers wait at their free sync because the storers, which
are also the producer, fall behind? The build compiles without wgmma serialisation (nvcc -Xptxas
-v on the CPU: 128 registers, 4 bytes spilled). 128 heads, n 8192, L 65536, k 2048."""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import alternate, mla_inputs, bwd_flops, fwd_flops
from workbench import instantiations as INST
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma3 as AW3
from workbench.families.cupy import attend_wgmma_bwd as AWB

SW = Path(tempfile.mkdtemp(prefix="probe_storer_wg_"))
shutil.copytree("kernels_cuda", SW, dirs_exist_ok=True)
f = SW / "attend_wgmma_bwd.cu"
f.write_text("#define HYTOPK_ATTWB_STORER_WG 1\n" + f.read_text())

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
THREADS, ROLES, SMEM = INST.ATTEND_WGMMA_BWD_THREADS, INST.attend_wgmma_bwd_roles, INST.attend_wgmma_bwd_smem


def bwd(det, storer_wg=False):
    def f():
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if storer_wg:       # the launch the build needs: 512 threads, its roles, the key ring's 512 B
            os.environ["HYTOPK_KERNEL_DIR"] = str(SW)
            INST.ATTEND_WGMMA_BWD_THREADS = 512
            INST.attend_wgmma_bwd_roles = lambda w: ((128, 40), (256, 208), (128, 56))
            INST.attend_wgmma_bwd_smem = lambda w: SMEM(w) + 512
        try:
            return CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=det, version=4)
        finally:
            INST.ATTEND_WGMMA_BWD_THREADS, INST.attend_wgmma_bwd_roles, INST.attend_wgmma_bwd_smem = THREADS, ROLES, SMEM
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


AWB.WRITES = "staged"
check = {}
for det in (False, True):
    tag = "det" if det else "atomic"
    m = [cp.asarray(x) for x in bwd(det)()[:2]]
    s = [cp.asarray(x) for x in bwd(det, True)()[:2]]
    check[f"{tag}_dq_bit_identical"] = bool(cp.array_equal(m[0], s[0]))
    check[f"{tag}_dk_bit_identical"] = bool(cp.array_equal(m[1], s[1]))
    check[f"{tag}_dk_max_abs_diff"] = float(cp.abs(m[1] - s[1]).max())
    check[f"{tag}_dk_max_abs"] = float(cp.abs(m[1]).max())
print("check", check, flush=True)
fns = {"backward wgmma_atomic staged (shipped)": bwd(False),
       "backward wgmma_atomic staged, storer warpgroup": bwd(False, True),
       "backward wgmma staged (shipped, deterministic)": bwd(True),
       "backward wgmma staged, storer warpgroup (deterministic)": bwd(True, True),
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
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_storer_wg.json").write_text(json.dumps(res, indent=1))
