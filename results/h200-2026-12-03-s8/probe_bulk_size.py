"""Run 2's probe (from the repository root; OUT=dir): run 1 (probe_bulk_reduce.py) found whole-row
(2304 B) bulk reductions faster than 256 B ones (27.5 ms against 39.3 for the same 19.3 G float
additions). Is it the bytes per operation or the issuing? One block per SM (200 KiB of shared
memory, as the backward), every (slot, piece) of a 32-slot tile one bulk reduction of P bytes
(P = 256, 512, 768, 1152, 2304: pieces of a 576-float row), issued round-robin by the lanes of
W warps (W = 1, 4); at most 8 groups unread per thread."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import alternate, mla_inputs

SRC = r'''
__device__ __forceinline__ void bulk_add(float* g, unsigned s, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(g), "r"(s), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 8;" ::: "memory");
}
extern "C" __global__ void pieces(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv, int pbytes, int nw) {
    extern __shared__ __align__(128) float sm[];
    for (int i = threadIdx.x; i < 576; i += blockDim.x) sm[i] = 1.0f;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const unsigned s = (unsigned)__cvta_generic_to_shared(sm);
    const int t = blockIdx.x / nhb, me = threadIdx.x, np = 2304 / pbytes, nthr = 32 * nw;
    if (me >= nthr) return;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32)
        for (int it = me; it < 32 * np; it += nthr) {
            const int slot = it / np, pc = it % np;
            const int key = j0 + slot < kk ? __ldg(lst + j0 + slot) : -1;
            if (key >= 0 && key < L) bulk_add(dkv + (long long)key * 576 + pc * (pbytes / 4), s + pc * pbytes, pbytes);
        }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
'''
mod = cp.RawModule(code=SRC, options=("-arch=sm_90a",))
n, H, L, k = 8192, 128, 65536, 2048
nhb = H // 64
_, _, idx = mla_inputs(n, 64, L, k, seed=1)
ic = cp.from_dlpack(idx)
dkv = cp.zeros((L, 576), cp.float32)
BIG = 200 * 1024
f = mod.get_function("pieces")
f.max_dynamic_shared_size_bytes = BIG
fns = {}
for nw in (1, 4):
    for pb in (256, 512, 768, 1152, 2304):
        fns[f"p{pb}_w{nw}"] = (lambda pb=pb, nw=nw: f((n * nhb,), (128,), (ic, cp.int32(k), cp.int32(nhb), cp.int64(L), dkv,
                                                                          cp.int32(pb), cp.int32(nw)), shared_mem=BIG))
ref, ok = None, True
for name, g in fns.items():
    dkv.fill(0)
    g()
    s = float(dkv.sum())
    ref = s if ref is None else ref
    ok &= s == ref
    print(name, "sum", s, "OK" if s == ref else "MISMATCH", flush=True)
rows = alternate(fns, rounds=3, calls=2, warm_s=0.3)
adds = n * nhb * k * 576
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "float_additions": adds, "sums_agree": ok, "rows": rows}
for name, r in rows.items():
    if "median_ms" in r:
        r["g_float_adds_per_s"] = adds / (r["median_ms"] * 1e-3) / 1e9
        print(f"{name:12s} {r['median_ms']:8.3f} ms  {r['g_float_adds_per_s']:.0f} G float adds/s", flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bulk_size.json").write_text(json.dumps(res, indent=1))
