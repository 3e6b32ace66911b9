"""The split backward's first pass over sorted slots, each query pair from its own tile on (from the
repository root, OUT=dir). Run 2 of this folder: with each query's slots sorted by key the second
pass gained ~2 ms but the first lost ~1.1 and the sort took 0.78 (1024 threads a block). Here the
first pass visits each query pair's tiles from a tile of its own (ROTATE_TILES: the blocks running at
once no longer sweep the sorted keys in step), the sort with 256 threads a block. Alternating rounds,
128 heads, n 8192, k 2048, the bench's selection, at L 65536 and 131072:
  split atomics / deterministic            SORT_SLOTS, ROTATE_TILES as named
  first pass only, ...                     the second pass's launches dropped
  sort only, T threads                     hytopk_attend_sort_slots alone
  forward wgmma3                           the op's forward, for the ratio"""
import json, os, sys, time
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
_fn = AWB._fn


def bwd(c, det, sort, sel=None, first_only=False, rotate=None):
    q, kk, vv, idx, out, lse, dout = c
    sel = idx if sel is None else sel

    def f():
        AWB.WRITES, AWB.SORT_SLOTS, AWB.ROTATE_TILES = "split", sort, rotate
        if first_only:
            AWB._fn = lambda name, *a, **kw: (lambda *x, **y: None) if name.startswith("hytopk_attend_bwd_dkv") \
                else _fn(name, *a, **kw)
        try:
            return CA.attend_backward(dout, q, kk, vv, sel, out, lse, None, deterministic=det, version=4)
        finally:
            AWB.WRITES, AWB.SORT_SLOTS, AWB.ROTATE_TILES, AWB._fn = "auto", None, None, _fn
    return f


res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "numpy": np.__version__, "n": n, "H": H, "k": k, "dkv_bulk": AWB.DKV_BULK,
       "selection": "scripts/bench_attention.py:selection (adjacent queries share 90 %)", "runs": {}}
for L in (65536, 131072):
    q, kv, idx = mla_inputs(n, H, L, k, seed=1)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    out, lse = CA.attend_forward(q, kk, vv, idx, None)
    dout = torch.randn(n, H, 512, device="cuda").bfloat16()
    c = (q, kk, vv, idx, out, lse, dout)
    srt = torch.sort(idx, dim=1).values.contiguous()
    ic = cp.asarray(idx)
    def sort_only(threads):
        def f():
            AWB.SORT_THREADS = threads
            try:
                return AWB.sorted_slots(ic, n, k)
            finally:
                AWB.SORT_THREADS = 256
        return f
    fns = {"split atomics": bwd(c, False, False), "split atomics, sorted, not rotated": bwd(c, False, True, rotate=False),
           "split atomics, sorted, rotated": bwd(c, False, True), "split atomics, rotated": bwd(c, False, False, rotate=True),
           "split deterministic": bwd(c, True, False), "split deterministic, sorted, rotated": bwd(c, True, True),
           "first pass only, given": bwd(c, False, False, first_only=True),
           "first pass only, pre-sorted": bwd(c, False, False, sel=srt, first_only=True),
           "first pass only, pre-sorted, rotated": bwd(c, False, False, sel=srt, first_only=True, rotate=True),
           "sort only, 256 threads": sort_only(256), "sort only, 1024 threads": sort_only(1024),
           "forward wgmma3": lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None)}
    rows = alternate(fns, rounds=7, calls=3)
    f_ms = rows.get("forward wgmma3", {}).get("median_ms")
    for name, r in rows.items():
        if "median_ms" in r and name.startswith("split"):
            r["tflops"] = bwd_flops(n, H, k) / (r["median_ms"] * 1e-3) / 1e12
            if f_ms:
                r["vs_forward_rate"] = r["tflops"] / (fwd_flops(n, H, k) / (f_ms * 1e-3) / 1e12)
        print(L, name, json.dumps(r), flush=True)
    res["runs"][str(L)] = rows
    if L == 65536:                    # the sorted path = the given path on the selection sorted beforehand
        a, b = bwd(c, True, True)(), bwd(c, True, False, sel=srt, rotate=True)()
        res["check_65536"] = {"det_dq_dk_same_bits_as_presorted": all(
            bool(cp.array_equal(cp.asarray(x).view(cp.int32), cp.asarray(y).view(cp.int32))) for x, y in zip(a[:2], b[:2]))}
        print("check", json.dumps(res["check_65536"]), flush=True)
        del a, b
    del c, q, kv, idx, out, lse, dout, srt, ic, kk, vv
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "/tmp"), "probe_rotate.json").write_text(json.dumps(res, indent=1))
