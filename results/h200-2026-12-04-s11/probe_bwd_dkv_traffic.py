"""Which of the second pass's traffic sets its pace (from the repository root; OUT=dir)? Patched
copies of attend_wgmma_bwd.cu (wrong dk, timing only; each checked free of wgmma serialisation by
the compile check before the run), the bulk split path, alternating rounds, 128 heads, n 8192,
L 65536, k 2048, atomics:
  no P / dS loads        the producer arrives on a stage's full barrier without copying the [P | dS]
                         blocks: the 24 GiB the three column thirds of each query read
  P / dS loads by one third only   only the first column third's blocks copy them: the traffic a
                         3-CTA cluster multicasting each block would leave (less its delivery)
  no reductions          the bulk reductions not issued: the MMAs, stores to shared memory and loads
The shipped split and its first pass alone beside them."""
import json, os, shutil, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "scripts")
LOAD = """                mbar_expect_tx(full0 + 8 * s, 2 * BLOCK);
                bulk_g2s(sp, blocks + (long long)T * 2 * HPAD * KT, BLOCK, full0 + 8 * s);
                bulk_g2s(sp + TILE, blocks + ((long long)T * 2 + 1) * HPAD * KT, BLOCK, full0 + 8 * s);
"""
RED = "if (ATOMIC) bulk_s2g_add_f32(row, stg + (u32)(lane * dkv::ROW_PITCH), COLS * 4);"
PATCHES = {"noload": (LOAD, "                mbar_arrive(full0 + 8 * s);\n"),
           "part0": (LOAD, "                if (part == 0) {\n" + LOAD + "                } else mbar_arrive(full0 + 8 * s);\n"),
           "nored": (RED, "if (ATOMIC) (void)row;")}


def patched(tag):
    d = Path(tempfile.gettempdir()) / f"probe_dkv_traffic_{tag}"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree("kernels_cuda", d)
    old, new = PATCHES[tag]
    src = (d / "attend_wgmma_bwd.cu").read_text()
    assert src.count(old) == 1, tag
    (d / "attend_wgmma_bwd.cu").write_text(src.replace(old, new))
    return d


if __name__ == "__main__" and sys.argv[1:] == ["--dirs"]:      # for the compile check: print the copies
    print(" ".join(str(patched(t)) for t in PATCHES))
    sys.exit(0)

import cupy as cp
import numpy as np
import torch
from bench_attention import alternate, mla_inputs
from workbench.families.cupy import attend as CA
from workbench.families.cupy import attend_wgmma_bwd as AWB

n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
_fn = AWB._fn
DIRS = {t: patched(t) for t in PATCHES}


def bwd(tag=None, first_only=False):
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


fns = {"split bulk (shipped)": bwd(), "no P / dS loads": bwd("noload"), "P / dS loads by one third only": bwd("part0"),
       "no reductions": bwd("nored"), "first pass only": bwd(first_only=True)}
rows = alternate(fns, rounds=5, calls=3)
for name, r in rows.items():
    print(name, json.dumps(r), flush=True)
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "L": L, "k": k, "rows": rows}
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_dkv_traffic.json").write_text(json.dumps(res, indent=1))
