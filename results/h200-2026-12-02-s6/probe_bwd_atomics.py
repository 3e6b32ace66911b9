"""Run 5's probe (from the repository root; OUT=dir): how much of the wgmma backward's time
(attend_backward version 4, atomics: 128 heads, n 8192, L 65536, k 2048) its dK/dV float atomics
alone take. A kernel that only does the backward's atomics, with no MMA: per block (query, head
block of 64) and 32-key tile, 576 x 32 atomicAdd into dkv [L, 576], 72 per thread:
  fragment   the backward's pattern: a warp's instruction covers 4 slots' rows x 8 adjacent columns
  coalesced  32 adjacent columns of one row per warp instruction
each timed in alternating rounds (scripts/bench_attention.alternate) with the backward itself."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import alternate, mla_inputs, bwd_flops
from workbench.families.cupy import attend as CA

SRC = r'''
extern "C" __global__ void atomics_fragment(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    const int t = blockIdx.x / nhb, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32)
        for (int sb = 0; sb < 4; ++sb)
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + 8 * sb + 2 * tig + e;
                const int key = j < kk ? __ldg(lst + j) : -1;
                if (key < 0 || key >= L) continue;
                float* row = dkv + (long long)key * 576 + 8 * warp + g8;
#pragma unroll
                for (int m = 0; m < 9; ++m) atomicAdd(row + 64 * m, 1.0f);
            }
}
extern "C" __global__ void atomics_coalesced(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    const int t = blockIdx.x / nhb, tid = threadIdx.x;
    const int* lst = idx + (long long)t * kk;
    for (int j = 0; j < kk; ++j) {
        const int key = __ldg(lst + j);
        if (key < 0 || key >= L) continue;
        float* row = dkv + (long long)key * 576;
        for (int c = tid; c < 576; c += 256) atomicAdd(row + c, 1.0f);
    }
}
'''
mod = cp.RawModule(code=SRC)
n, H, L, k = 8192, 128, 65536, 2048
nhb = H // 64
q, kv, idx = mla_inputs(n, H, L, k, seed=1)
kk, vv = kv[:, None, :], kv[:, None, :512]
out, lse = CA.attend_forward(q, kk, vv, idx, None)
dout = torch.randn(n, H, 512, device="cuda").bfloat16()
ic = cp.from_dlpack(idx)
dkv = cp.zeros((L, 576), cp.float32)
fns = {"backward wgmma_atomic": lambda: CA.attend_backward(dout, q, kk, vv, idx, out, lse, None, deterministic=False, version=4)}
for name in ("fragment", "coalesced"):
    f = mod.get_function(f"atomics_{name}")
    fns[f"atomics only, {name}"] = (lambda f=f: f((n * nhb,), (256,), (ic, cp.int32(k), cp.int32(nhb), cp.int64(L), dkv)))
rows = alternate(fns, rounds=5, calls=3)
atomics = n * nhb * k * 576
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "atomics": atomics, "rows": rows}
for name, r in rows.items():
    if "median_ms" in r:
        r["g_atomics_per_s"] = atomics / (r["median_ms"] * 1e-3) / 1e9
        print(f"{name:26s} {r['median_ms']:8.3f} ms  ({r['g_atomics_per_s']:.0f} G atomics/s if it did all {atomics / 1e9:.1f} G)", flush=True)
b = rows.get("backward wgmma_atomic", {}).get("median_ms")
if b:
    res["backward_tflops"] = bwd_flops(n, H, k) / (b * 1e-3) / 1e12
    for name in ("fragment", "coalesced"):
        a = rows.get(f"atomics only, {name}", {}).get("median_ms")
        if a:
            res[f"atomics_{name}_share_of_backward"] = a / b
            print(f"atomics only ({name}) / backward: {a / b:.2f}", flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bwd_atomics.json").write_text(json.dumps(res, indent=1))
