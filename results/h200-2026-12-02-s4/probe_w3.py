"""Run 3's probe (run from the repository root): wgmma3 under extra #defines of a scratch copy of
kernels_cuda (HYTOPK_KERNEL_DIR), same run, against wgmma2s. The macros lived in c0709d4's
attend_wgmma3.cu plus an uncommitted edit: NO_PREFETCH dropped the producer's
cp.async.bulk.prefetch.L2 of the next pair's rows; EVICT_LAST gave the copies and the prefetch an
L2::evict_last policy (createpolicy.fractional); EARLY_P0 moved warpgroup 0's wait for its own
P.V after the P_0 stores. None helped (README), all were removed; this file is the record."""
import json, os, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from bench_attention import timed, mla_inputs, gemm_tflops
from workbench.families.cupy import attend_wgmma3 as AW3, attend_wgmma2 as AW2
from workbench.torch.attention import torch_forward
n, H, L, k = 8192, 128, 65536, 2048
q, kv, idx = mla_inputs(n, H, L, k)
kk, vv = kv[:, None, :], kv[:, None, :512]
flops = 2 * n * H * k * (576 + 512)
gemm = gemm_tflops()
res = {"gpu": torch.cuda.get_device_name(), "gemm_tflops": gemm, "rows": {}}
ref, _ = torch_forward(q[:64], kk, vv, idx[:64], 576 ** -0.5)
def row(name, fn):
    t = timed(fn, reps=7)
    out = fn()[0]
    err = float((torch.from_dlpack(out[:64].view("int16")).view(torch.bfloat16).float() - ref).abs().max())
    tf = flops / t["median_ms"] / 1e9
    res["rows"][name] = {**t, "tflops": tf, "of_gemm": tf / gemm, "max_err": err}
    print(f"{name:24s} {t['median_ms']:8.3f} ms {tf:7.1f} TFLOP/s {tf/gemm:5.3f} of GEMM  err {err:.2e}", flush=True)
row("wgmma2s", lambda: AW2.attend_forward_wgmma2(q, kk, vv, idx, None, swz=True))
for tag in ["", "HYTOPK_ATTW3_NO_PREFETCH", "HYTOPK_ATTW3_EVICT_LAST", "HYTOPK_ATTW3_EARLY_P0", "HYTOPK_ATTW3_EARLY_P0 HYTOPK_ATTW3_EVICT_LAST", " "]:
    d = Path(tempfile.mkdtemp())
    shutil.copytree("kernels_cuda", d / "k")
    f = d / "k" / "attend_wgmma3.cu"
    f.write_text("".join(f"#define {m} 1\n" for m in tag.split()) + f.read_text())
    os.environ["HYTOPK_KERNEL_DIR"] = str(d / "k")
    row("wgmma3 " + (tag.replace("HYTOPK_ATTW3_", "") if tag.strip() else "base" + tag), lambda: AW3.attend_forward_wgmma3(q, kk, vv, idx, None))
os.environ.pop("HYTOPK_KERNEL_DIR")
Path(os.environ.get("OUT", "/tmp"), "probe_w3.json").write_text(json.dumps(res, indent=1))
