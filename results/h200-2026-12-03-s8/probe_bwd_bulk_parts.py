"""Run 4's probe (from the repository root; OUT=dir): where does the bulk write path's time go (run
3: 67.4 ms against the staged path's 50.6, though run 2's bulk reductions alone beat red.v4)? The
atomic wgmma backward with WRITES "bulk" and "staged", beside copies built from patched kernels
($HYTOPK_KERNEL_DIR), timing only (their dK/dV are wrong):
  bulk, no operations      the storer warps take each unit and free it, issuing nothing (the
                           hand-over's cost)
  bulk, no read wait       the buffer freed right after the issue (the TMA may read a refilled
                           buffer: the values race, the addresses do not): is the read wait, i.e.
                           the operations in flight per buffer, the limit?
  staged, no writes        the staged storers load each unit and free it, writing nothing
128 heads, n 8192, L 65536, k 2048, alternating rounds."""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
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

PATCHES = {"bulk_noops": ("                if (key >= 0) {                       // masked slot (or past kk): not written",
                          "                if (false) {"),
           "bulk_nowait": ("                bulk_wait_read<0>();\n", ""),
           "staged_nowrites": ("                if (kx[r] < 0) continue;              // masked slot (or past kk): not written",
                               "                continue;")}
dirs = {}
for name, (a, b) in PATCHES.items():
    d = Path(tempfile.mkdtemp(prefix=f"probe_{name}_"))
    shutil.copytree("kernels_cuda", d, dirs_exist_ok=True)
    f = d / "attend_wgmma_bwd.cu"
    src = f.read_text()
    assert src.count(a) == 1, name
    f.write_text(src.replace(a, b))
    dirs[name] = str(d)


def bwd(writes, kdir=None):
    def f():
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if kdir:
            os.environ["HYTOPK_KERNEL_DIR"] = kdir
        AWB.WRITES = writes
        try:
            CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


fns = {"atomic staged": bwd("staged"), "atomic bulk": bwd("bulk"),
       "bulk, no operations": bwd("bulk", dirs["bulk_noops"]), "bulk, no read wait": bwd("bulk", dirs["bulk_nowait"]),
       "staged, no writes": bwd("staged", dirs["staged_nowrites"]),
       "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
rows = alternate(fns, rounds=5, calls=3)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "n": n, "H": H, "L": L, "k": k, "rows": rows}
f_ms = rows.get("forward wgmma3", {}).get("median_ms")
for name, r in rows.items():
    if "median_ms" in r and name != "forward wgmma3":
        r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
        if f_ms:
            r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
    print(name, json.dumps(r), flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_bulk_parts.json").write_text(json.dumps(res, indent=1))
