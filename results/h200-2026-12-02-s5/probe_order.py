"""Run 4's probe (run from the repository root; OUT=dir): does the order of a block's key list
matter? The pair kernels' union lists are sorted by key (the union build scans a bitmap), the
one-query bench lists are random. One run, n 8192, L 65536, k 2048, bf16 out; the pair kernels
here on a union built once (its build time not inside, unlike the bench), its slots:
- sorted (as built), shuffled (a random permutation within each row's count), interleaved (tile t
  of a row with T tiles holds its slots t, t + T, t + 2T, ...: every tile spans the key range);
- wgmma3 (one query) on the bench's random lists and on the same lists sorted per query;
- the kernels' own interleave (attend_forward_wgmma3(..., interleave=True): the same slot order as
  the interleaved union above, made in the kernel), and the pair kernels with the build inside."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import timed, mla_inputs, gemm_tflops
from workbench.families.cupy import attend_wgmma3 as AW3, attend_wgmma2 as AW2, attend as CA

n, L, k = 8192, 65536, 2048
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
       "torch": torch.__version__, "gemm_tflops": gemm_tflops(), "n": n, "L": L, "k": k, "rows": {}}


def row(name, fn):
    t = timed(fn, reps=7)
    res["rows"][name] = t
    print(f"{name:44s} {t['median_ms']:8.3f} ms", flush=True)


def orders(lst, mult, lens):
    """{name: (lst, mult, lens)}: the union's slots sorted, shuffled, interleaved."""
    P, W = lst.shape
    col = cp.arange(W)[None, :]
    r = cp.random.default_rng(1).random((P, W))
    r[col >= lens[:, None]] = 2.0
    perm = cp.argsort(r, axis=1)
    out = {"sorted": (lst, mult, lens),
           "shuffled": (cp.ascontiguousarray(cp.take_along_axis(lst, perm, 1)),
                        cp.ascontiguousarray(cp.take_along_axis(mult, perm[:, :, None], 1)), lens)}
    nt = (lens + 63) // 64                                   # tiles per row
    pos = col                                                # position p = 64 t + j holds slot t + nt j
    slot = (pos // 64)[...] + nt[:, None] * (pos % 64)
    ok = (pos < 64 * nt[:, None]) & (slot < lens[:, None])
    src = cp.where(ok, slot, 0)
    il = cp.where(ok, cp.take_along_axis(lst, src, 1), -1).astype(cp.int32)
    im = cp.where(ok[:, :, None], cp.take_along_axis(mult, src[:, :, None], 1), 0).astype(cp.int32)
    out["interleaved"] = (cp.ascontiguousarray(il), cp.ascontiguousarray(im), (64 * nt).astype(cp.int32))
    return out


for H in (16, 8):
    q, kv, idx = mla_inputs(n, H, L, k)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    row(f"H{H} wgmma3 random lists", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None))
    isorted = torch.sort(idx, dim=1).values.contiguous()
    row(f"H{H} wgmma3 sorted lists", lambda: AW3.attend_forward_wgmma3(q, kk, vv, isorted, None))
    row(f"H{H} wgmma3 sorted lists, interleave", lambda: AW3.attend_forward_wgmma3(q, kk, vv, isorted, None, interleave=True))
    row(f"H{H} wgmma3 random lists, interleave", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, interleave=True))
    row(f"H{H} wgmma3p (build inside)", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2))
    row(f"H{H} wgmma3p interleave (build inside)", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, interleave=True))
    row(f"H{H} wgmma2sp (build inside)", lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True, qpt=2))
    ic = cp.from_dlpack(idx)
    res["rows"][f"H{H} union build"] = timed(lambda: CA.pair_union(ic, L))
    ref = None
    for name, u in orders(*CA.pair_union(ic, L)).items():
        AW3.pair_union = AW2.pair_union = (lambda u: lambda *a, **kw: u)(u)
        row(f"H{H} wgmma3p union {name} (build excluded)", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2))
        row(f"H{H} wgmma2sp union {name} (build excluded)", lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True, qpt=2))
        if name == "sorted":
            row(f"H{H} wgmma3p union sorted, interleave (build excluded)",
                lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, interleave=True))
        out = torch.from_dlpack(AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2, out_dtype="float32")[0])
        if ref is None:
            ref = out
        res["rows"][f"H{H} wgmma3p union {name} (build excluded)"]["max_abs_vs_sorted"] = float((out - ref).abs().max())
    AW3.pair_union = AW2.pair_union = CA.pair_union
Path(os.environ.get("OUT", "/tmp"), "probe_order.json").write_text(json.dumps(res, indent=1))
