"""Run 9's probe (runs 6-8 trapped: a fifth variant, a patch inside a comment, storers left waiting) (from the repository root; OUT=dir): what in the staged hand-over costs the
consumers ~19 ms (run 4: the staged kernel with no dK/dV writes 40.3 ms, with no hand-over at all
21.6 ms in results/h200-2026-12-02-s7)? The atomic staged backward (WRITES "staged"; its kernel is
the same at commits 42917df and after cd2ef35) beside patched copies ($HYTOPK_KERNEL_DIR), timing
only (wrong dK/dV):
  no writes          the storers take each unit and free it, writing nothing (run 4's, without
                     its wgmma serialisation: every variant here compiles without C7511)
  stores only        the consumers write the units into shared memory, no barrier either way; the
                     storers drain nothing
  no hand-over       store_m / store_m8 return at once (the dKV MMAs still run), the storers drain
                     nothing
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

WAIT = "            mbar_wait_or_trap(base + UFREE_OFF + 8 * cc, (nu & 1u) ^ 1u);"
ARRIVE = "            if ((wl & 31) == 0) mbar_arrive(base + UFULL_OFF + 8 * cc);"
DRAIN = "        auto drain = [&](int tile, int j) {"
# (a skip ptxas cannot prove: a plain `continue` made it serialise the consumers' wgmma, C7511, and
# run 4's "staged, no writes" ran so)
NOWRITE = ("                if (kx[r] < 0) continue;              // masked slot (or past kk): not written",
           "                if (kx[r] < 0 || v[r].x != 0x7fc00001u) continue;")
HOOKS = ("auto store_m = [&](const float (&acc)[16], int mi) {", "auto store_m8 = [&](const float (&acc)[8]) {")
# (a variant without the consumers' free wait alone deadlocked on the H200: a unit's full barrier
# completes twice before the storers look, so they wait for a phase that has passed)
PATCHES = {"no_writes": [NOWRITE],
           "stores_only": [(WAIT, ""), (ARRIVE, ""), (DRAIN, DRAIN + " if (tile >= 0) return;")],
           "no_handover": [(h, h + " if (true) return;") for h in HOOKS] + [(DRAIN, DRAIN + " if (tile >= 0) return;")]}
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


def bwd(kdir=None):
    def f():
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if kdir:
            os.environ["HYTOPK_KERNEL_DIR"] = kdir
        AWB.WRITES = "staged"
        try:
            CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)
        finally:
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


fns = {"atomic staged": bwd()}
fns.update({name.replace("_", " "): bwd(d) for name, d in dirs.items()})
fns["forward wgmma3"] = lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)
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
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_handover.json").write_text(json.dumps(res, indent=1))
