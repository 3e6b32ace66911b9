"""Run 5's probe (from the repository root; OUT=dir): run 4's bulk kernel had its consumers' wgmma
serialised by ptxas (C7511: the consumers' fence.proxy.async between a wgmma's issue and its wait).
Timing only, from patched copies of the kernel ($HYTOPK_KERNEL_DIR): the fence moved to the storer
warp, after its mbarrier wait and before its bulk operations (no C7511; the PTX memory model asks for
the fence in the writing threads, so this is a measurement, not a fix), with and without the bulk
operations, beside the committed bulk and staged paths. 128 heads, n 8192, L 65536, k 2048,
alternating rounds."""
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

MOVE = [("            fence_proxy_async();                      // these stores -> the bulk operations' reads (async proxy)\n", ""), ("            mbar_wait_or_trap(base + UFULL_OFF + 8 * ub, nu & 1u);\n", "            mbar_wait_or_trap(base + UFULL_OFF + 8 * ub, nu & 1u);\n" + "            fence_proxy_async();\n")]
NOOPS = ("                if (key >= 0) {                       // masked slot (or past kk): not written",
         "                if (false) {")
PATCHES = {"bulk_storer_fence": MOVE, "bulk_storer_fence_noops": MOVE + [NOOPS]}
dirs = {}
for name, edits in PATCHES.items():
    d = Path(tempfile.mkdtemp(prefix=f"probe_{name}_"))
    shutil.copytree("kernels_cuda", d, dirs_exist_ok=True)
    f = d / "attend_wgmma_bwd.cu"
    src = f.read_text()
    for a, b in edits:
        assert src.count(a) == 1, (name, a)
        src = src.replace(a, b)
    f.write_text(src)
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
       "atomic bulk, storer fence": bwd("bulk", dirs["bulk_storer_fence"]),
       "bulk, storer fence, no operations": bwd("bulk", dirs["bulk_storer_fence_noops"]),
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
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_bulk_fence.json").write_text(json.dumps(res, indent=1))
