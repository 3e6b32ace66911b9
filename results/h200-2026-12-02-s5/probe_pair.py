"""Run 2's probe (commit ca5d39f's kernels: HYTOPK_ATTW3_PREFETCH was a macro then; run from the repository root; OUT=dir): why a query pair per block gains less
than the key tiles it saves at 8 / 16 heads. One run, n 8192, L 65536, k 2048, bf16 out, union
build inside the pair kernels' time:
- `wgmma3` (one query per block) on the bench's selection (queries 2p, 2p+1 share ~90 % of their
  keys) with partners adjacent (blocks 2p, 2p+1 run together: the second's gathers can hit the
  rows the first just pulled into L2) and with the same queries reordered so partners are n/2
  apart (no partner in flight): the difference is what the one-query kernel already gets from L2;
- the pair kernels `wgmma2sp`, `wgmma3p`, and `wgmma3p` with a producer L2 prefetch of the rows
  one or two pairs ahead (HYTOPK_ATTW3_PREFETCH, a scratch copy of kernels_cuda);
- selections sharing 0 % and 100 % of the partner's keys (the pair's union 2k and k)."""
import json, os, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from bench_attention import timed, mla_inputs, selection, gemm_tflops
from workbench.families.cupy import attend_wgmma3 as AW3, attend_wgmma2 as AW2
from workbench.families.cupy import attend as CA

n, L, k = 8192, 65536, 2048
res = {"gpu": torch.cuda.get_device_name(), "date": __import__("time").strftime("%Y-%m-%d %H:%M:%S %Z"),
       "torch": torch.__version__, "gemm_tflops": gemm_tflops(), "n": n, "L": L, "k": k, "rows": {}}


def kernel_dir(prefetch):
    """A scratch kernels_cuda with HYTOPK_ATTW3_PREFETCH defined (None: the committed one)."""
    if prefetch is None:
        os.environ.pop("HYTOPK_KERNEL_DIR", None)
        return
    d = Path(tempfile.mkdtemp()) / "k"
    shutil.copytree("kernels_cuda", d)
    f = d / "attend_wgmma3.cu"
    f.write_text(f"#define HYTOPK_ATTW3_PREFETCH {prefetch}\n" + f.read_text())
    os.environ["HYTOPK_KERNEL_DIR"] = str(d)


def row(name, fn, ref=None):
    t = timed(fn, reps=7)
    out = fn()[0]
    got = torch.from_dlpack(out.view("int16")).view(torch.bfloat16).float()
    if ref is not None:
        err = float((got - ref).abs().max())
        t["max_abs_vs_first_row"] = err
    res["rows"][name] = t
    print(f"{name:44s} {t['median_ms']:8.3f} ms" + (f"  (max |diff| vs wgmma3 {t['max_abs_vs_first_row']:.1e})" if ref is not None else ""), flush=True)
    return got


for H in (16, 8):
    q, kv, idx = mla_inputs(n, H, L, k)
    kk, vv = kv[:, None, :], kv[:, None, :512]
    one = lambda qq, ii: (lambda: AW3.attend_forward_wgmma3(qq, kk, vv, ii, None))
    ref = row(f"H{H} wgmma3 partners adjacent", one(q, idx))
    perm = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)]).cuda()     # partners n/2 apart
    qp, ip = q[perm].contiguous(), idx[perm].contiguous()
    row(f"H{H} wgmma3 partners n/2 apart", one(qp, ip))
    row(f"H{H} wgmma2sp", lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True, qpt=2), ref)
    row(f"H{H} wgmma3p", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2), ref)
    import cupy as cp
    res["rows"][f"H{H} union build only"] = timed(lambda: CA.pair_union(cp.from_dlpack(idx), L))
    for pf in (1, 2):
        kernel_dir(pf)
        row(f"H{H} wgmma3p prefetch {pf} pair ahead", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None, qpt=2), ref)
        if H == 16:
            row(f"H{H} wgmma3 prefetch {pf} pair ahead", one(q, idx), ref)
        kernel_dir(None)
    if H == 16:
        for share in (0.0, 1.0):
            i2 = selection(n, L, k, share=share)
            row(f"H{H} share {share} wgmma3", one(q, i2))
            row(f"H{H} share {share} wgmma3p", lambda: AW3.attend_forward_wgmma3(q, kk, vv, i2, None, qpt=2))
            row(f"H{H} share {share} wgmma2sp", lambda: AW2.attend_forward_wgmma2(q, kk, vv, i2, None, swz=True, qpt=2))
q, kv, idx = mla_inputs(n, 128, L, k)
kk, vv = kv[:, None, :], kv[:, None, :512]
ref = row("H128 wgmma3", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None))
kernel_dir(2)
row("H128 wgmma3 prefetch 2 pairs ahead", lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None), ref)
kernel_dir(None)
Path(os.environ.get("OUT", "/tmp"), "probe_pair.json").write_text(json.dumps(res, indent=1))
