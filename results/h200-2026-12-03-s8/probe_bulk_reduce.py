"""Run 1's probe (from the repository root; OUT=dir): can the TMA's bulk reductions
(cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32, shared -> global, the adds done at L2)
add the backward's dK/dV faster than the SM's red.global.add.v4.f32? The same 19.3 G float additions
as the backward (128 heads = 2 head blocks of 64, n 8192, L 65536, k 2048: per block, its query's 2048
rows x 576 columns of dkv), no MMA, alternating rounds:
  unit_v4          red.global.add.v4.f32 by 256 threads, the staged kernel's 16-slot x 64-column
                   units (run 10 of results/h200-2026-12-02-s7: 36.05 ms)
  bulk_unit        bulk reductions of 256 B (one slot's 64 columns), 16 per unit, one per lane of
                   lanes 0-15; 8 warps issue, several blocks per SM
  bulk_unit_1cta   the same with one block per SM (200 KiB of shared memory, as the backward) and
                   only warps 0-1 issuing (the backward's two storer warps per consumer pair)
  bulk_row_1cta    one 2304 B bulk reduction per slot (the whole row), warp 0 issues, one block per SM
Each issuing thread commits a group per operation and keeps at most 8 groups unread
(cp.async.bulk.wait_group.read), as a kernel reusing its buffer would."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import alternate, mla_inputs

SRC = r'''
__device__ __forceinline__ void red4(float* p, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void bulk_add(float* g, unsigned s, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(g), "r"(s), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 8;" ::: "memory");
}
__device__ __forceinline__ void bulk_drain() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ float* row_of(const int* lst, int j, int kk, long long L, float* dkv) {
    const int key = j < kk ? __ldg(lst + j) : -1;
    return (key < 0 || key >= L) ? nullptr : dkv + (long long)key * 576;
}
// ones in the first 2304 B of shared memory, visible to the async proxy
__device__ __forceinline__ unsigned fill_ones(float* sm) {
    for (int i = threadIdx.x; i < 576; i += blockDim.x) sm[i] = 1.0f;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    return (unsigned)__cvta_generic_to_shared(sm);
}
extern "C" __global__ void unit_v4(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    const int t = blockIdx.x / nhb, tid = threadIdx.x, ls = tid >> 4, pc = tid & 15;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32)
        for (int hs = 0; hs < 2; ++hs) {
            float* row = row_of(lst, j0 + 16 * hs + ls, kk, L, dkv);
            if (!row) continue;
#pragma unroll
            for (int m = 0; m < 9; ++m) red4(row + 64 * m + 4 * pc, 1.f, 1.f, 1.f, 1.f);
        }
}
// units u = 0..17 of a 32-slot tile (9 column blocks x 2 slot halves); warps w < nw issue units w, w + nw, ...
__device__ __forceinline__ void bulk_units(const int* idx, int kk, int nhb, long long L, float* dkv, int nw) {
    extern __shared__ __align__(128) float sm[];
    const unsigned s = fill_ones(sm);
    const int t = blockIdx.x / nhb, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= nw || lane >= 16) return;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32)
        for (int u = warp; u < 18; u += nw) {
            float* row = row_of(lst, j0 + 16 * (u & 1) + lane, kk, L, dkv);
            if (row) bulk_add(row + 64 * (u >> 1), s, 256);
        }
    bulk_drain();
}
extern "C" __global__ void bulk_unit(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    bulk_units(idx, kk, nhb, L, dkv, 8);
}
extern "C" __global__ void bulk_unit_1cta(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    bulk_units(idx, kk, nhb, L, dkv, 2);
}
extern "C" __global__ void bulk_row_1cta(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    extern __shared__ __align__(128) float sm[];
    const unsigned s = fill_ones(sm);
    const int t = blockIdx.x / nhb, lane = threadIdx.x & 31;
    if (threadIdx.x >= 32) return;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32) {
        float* row = row_of(lst, j0 + lane, kk, L, dkv);
        if (row) bulk_add(row, s, 2304);
    }
    bulk_drain();
}
'''
mod = cp.RawModule(code=SRC, options=("-arch=sm_90a",))
n, H, L, k = 8192, 128, 65536, 2048
nhb = H // 64
_, _, idx = mla_inputs(n, 64, L, k, seed=1)
ic = cp.from_dlpack(idx)
dkv = cp.zeros((L, 576), cp.float32)
BIG = 200 * 1024
fns = {}
for name, smem in (("unit_v4", 0), ("bulk_unit", 4096), ("bulk_unit_1cta", BIG), ("bulk_row_1cta", BIG)):
    f = mod.get_function(name)
    if smem > 48 * 1024:
        f.max_dynamic_shared_size_bytes = smem
    fns[name] = (lambda f=f, smem=smem: f((n * nhb,), (256,), (ic, cp.int32(k), cp.int32(nhb), cp.int64(L), dkv),
                                          shared_mem=smem))
# each kernel adds 1.0 to every (key, column) of every slot: the sums must agree (one call each)
ref, ok = None, True
for name, f in fns.items():
    dkv.fill(0)
    f()
    s = float(dkv.sum())
    ref = s if ref is None else ref
    ok &= s == ref
    print(name, "sum", s, "OK" if s == ref else "MISMATCH", flush=True)
rows = alternate(fns, rounds=5, calls=3)
adds = n * nhb * k * 576
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "float_additions": adds, "sums_agree": ok, "rows": rows}
for name, r in rows.items():
    if "median_ms" in r:
        r["g_float_adds_per_s"] = adds / (r["median_ms"] * 1e-3) / 1e9
        print(f"{name:16s} {r['median_ms']:8.3f} ms  {r['g_float_adds_per_s']:.0f} G float adds/s", flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_bulk_reduce.json").write_text(json.dumps(res, indent=1))
