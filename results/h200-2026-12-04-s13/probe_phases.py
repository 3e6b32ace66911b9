"""The split atomics' second pass in key-range phases (DKV_PHASES; from the repository root, OUT=dir).
Each query's slots are sorted by key (hytopk_attend_sort_slots), then the second pass runs phase
after phase, each writing the dkv rows of L / phases keys: the rows its running blocks add into
fit in the L2 (50 MB) instead of spanning all of dkv (151 MB at L 65536). Alternating rounds,
128 heads, n 8192, k 2048, the bench's selection (adjacent queries share 90 % of their keys):
  split atomics, phases P   the whole backward (sort + both passes) with P key ranges (1: as before)
  phases 1, slots pre-sorted  one phase on a selection sorted beforehand: the sorted order's own effect
  sort only               hytopk_attend_sort_slots alone
  split deterministic     the deterministic mode (one phase, the selection's order: unchanged)
  forward wgmma3          the op's forward, for the ratio
at L 65536, 131072 and 8192; then, at L 65536, dq of 4 phases against one phase on the pre-sorted
selection (bits) and their dk (largest difference). At L 65536 also the first pass as before
(HYTOPK_ATTWB_PDS_SERIAL: tile t's S / dP issued only after tile t-1's dQ MMAs retired; a patched
copy of kernels_cuda defining it) against the committed one (S / dP queued behind them), whole
and as the first pass alone (the second pass's launches dropped)."""
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

n, H, k = 8192, 128, 2048
SERIAL = Path(tempfile.mkdtemp(prefix="probe_pds_serial_"))
shutil.copytree("kernels_cuda", SERIAL, dirs_exist_ok=True)
_src = (SERIAL / "attend_wgmma_bwd.cu").read_text()
(SERIAL / "attend_wgmma_bwd.cu").write_text("#define HYTOPK_ATTWB_PDS_SERIAL\n" + _src)
_fn = AWB._fn


def case(L):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    return q, kk, vv, idx, out, lse, dout


def bwd(c, phases, det=False, presorted=None, serial=False, first_only=False):
    q, kk, vv, idx, out, lse, dout = c
    sel = idx if presorted is None else presorted

    def f():
        AWB.WRITES, AWB.DKV_PHASES = "split", phases
        if first_only:
            AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name.startswith("hytopk_attend_bwd_dkv") \
                else _fn(name, *a, **kw)
        old = os.environ.pop("HYTOPK_KERNEL_DIR", None)
        if serial:
            os.environ["HYTOPK_KERNEL_DIR"] = str(SERIAL)
        try:
            return CA.attend_backward(dout, q, kk, vv, sel, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.DKV_PHASES, AWB._fn = "auto", None, _fn
            os.environ.pop("HYTOPK_KERNEL_DIR", None)
            if old is not None:
                os.environ["HYTOPK_KERNEL_DIR"] = old
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "k": k, "dkv_bulk": AWB.DKV_BULK,
       "selection": "scripts/bench_attention.py:selection (adjacent queries share 90 %)", "runs": {}}
for L, plist in ((65536, (1, 2, 3, 4, 6, 8)), (131072, (1, 4, 8, 16)), (8192, (1, 2))):
    c = case(L)
    srt = torch.sort(c[3], dim=1).values.contiguous()
    fns = {f"split atomics, phases {p}": bwd(c, p) for p in plist}
    fns["phases 1, slots pre-sorted"] = bwd(c, 1, presorted=srt)
    fns["sort only"] = lambda: AWB.sorted_slots(c[3], n, k)
    if L == 65536:
        fns["split deterministic"] = bwd(c, None, det=True)
        for p in (1, 4):
            fns[f"split atomics, phases {p}, serial first pass"] = bwd(c, p, serial=True)
        fns["first pass only"] = bwd(c, 1, first_only=True)
        fns["first pass only, serial"] = bwd(c, 1, first_only=True, serial=True)
    fns["forward wgmma3"] = lambda: AW3.attend_forward_wgmma3(c[0], c[1], c[2], c[3], None)
    rows = alternate(fns, rounds=5, calls=3)
    f_ms = rows.get("forward wgmma3", {}).get("median_ms")
    for name, r in rows.items():
        if "median_ms" in r and name.startswith(("split", "phases")):
            r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            if f_ms:
                r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
        print(L, name, json.dumps(r), flush=True)
    res["runs"][str(L)] = rows
    if L == 65536:
        got, one = bwd(c, 4)(), bwd(c, 1, presorted=srt)()
        a, b = cp.asarray(got[1]), cp.asarray(one[1])
        ser = bwd(c, 4, serial=True)()
        res["check_65536_serial"] = {"dq_same_bits": bool(cp.array_equal(cp.asarray(got[0]).view(cp.int32),
                                                                         cp.asarray(ser[0]).view(cp.int32)))}
        del ser
        res["check_65536"] = {"dq_same_bits_as_one_phase_presorted": bool(cp.array_equal(cp.asarray(got[0]).view(cp.int32),
                                                                                        cp.asarray(one[0]).view(cp.int32))),
                              "dk_max_abs_diff": float(cp.abs(a - b).max()), "dk_max_abs": float(cp.abs(b).max())}
        print("check", json.dumps(res["check_65536"]), json.dumps(res["check_65536_serial"]), flush=True)
        del got, one, a, b
    del c, srt
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), "probe_phases.json").write_text(json.dumps(res, indent=1))
