"""Run 10's probe (from the repository root; OUT=dir): run 4's probe (probe_atomic_width.py) with the
staged backward's pattern added:
  unit_v4       red.global.add.v4.f32, 2 rows x 256 contiguous bytes per warp instruction (the
                staged kernel's 16-slot x 64-column units)
Run 4's description follows. The backward's dK/dV float atomics are not
slowed by DRAM (run 3: sorted keys and an L2-resident dkv change nothing), so is the limit the
number of float elements the L2 adds, or the number of atomic instructions / requests? The same
19.3 G float additions as the backward (128 heads = 2 head blocks of 64, n 8192, L 65536, k 2048:
per block, its query's 2048 rows x 576 columns of dkv) issued as
  fragment      scalar, the backward's pattern (4 rows x 8 adjacent columns per warp instruction)
  coalesced     scalar, 32 adjacent columns of one row per warp instruction
  coalesced_v2  red.global.add.v2.f32: 64 adjacent columns per warp instruction
  coalesced_v4  red.global.add.v4.f32: 128 adjacent columns per warp instruction
  fragment_v4   red.global.add.v4.f32, 8 rows x 4 adjacent 16 B pieces per warp instruction (the
                backward's VEC pattern after its lane transpose)
no MMA; alternating rounds."""
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import cupy as cp
import torch
from bench_attention import alternate, mla_inputs

SRC = r'''
__device__ __forceinline__ void red2(float* p, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void red4(float* p, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ float* row_of(const int* lst, int j, int kk, long long L, float* dkv) {
    const int key = j < kk ? __ldg(lst + j) : -1;
    return (key < 0 || key >= L) ? nullptr : dkv + (long long)key * 576;
}
// 256 threads; per 32-slot tile every (slot, column) once
extern "C" __global__ void fragment(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    const int t = blockIdx.x / nhb, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32)
        for (int sb = 0; sb < 4; ++sb)
            for (int e = 0; e < 2; ++e) {
                float* row = row_of(lst, j0 + 8 * sb + 2 * tig + e, kk, L, dkv);
                if (!row) continue;
                row += 8 * warp + g8;
#pragma unroll
                for (int m = 0; m < 9; ++m) atomicAdd(row + 64 * m, 1.0f);
            }
}
extern "C" __global__ void fragment_v4(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    // a warp instruction: 8 slots (g8) x 4 pieces of 4 columns (tig); a thread: 18 pieces per slot
    const int t = blockIdx.x / nhb, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
    const int* lst = idx + (long long)t * kk;
    for (int j0 = 0; j0 < kk; j0 += 32)
        for (int sb = 0; sb < 4; ++sb) {
            float* row = row_of(lst, j0 + 8 * sb + g8, kk, L, dkv);
            if (!row) continue;
            row += 16 * warp + 4 * tig;             // 8 warps x 16 columns = 128; 4.5 passes of 128 -> 576
#pragma unroll
            for (int m = 0; m < 4; ++m) red4(row + 128 * m, 1.f, 1.f, 1.f, 1.f);
            if (warp < 4) red4(row + 512, 1.f, 1.f, 1.f, 1.f);
        }
}
extern "C" __global__ void unit_v4(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    // 256 threads: unit row tid >> 4 (16 slots), piece tid & 15 (64 columns); per 32-slot tile, 9 column
    // blocks x 2 slot halves
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
extern "C" __global__ void coalesced(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    const int t = blockIdx.x / nhb, tid = threadIdx.x;
    const int* lst = idx + (long long)t * kk;
    for (int j = 0; j < kk; ++j) {
        float* row = row_of(lst, j, kk, L, dkv);
        if (!row) continue;
        for (int c = tid; c < 576; c += 256) atomicAdd(row + c, 1.0f);
    }
}
extern "C" __global__ void coalesced_v2(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    const int t = blockIdx.x / nhb, tid = threadIdx.x;
    const int* lst = idx + (long long)t * kk;
    for (int j = 0; j < kk; ++j) {
        float* row = row_of(lst, j, kk, L, dkv);
        if (!row) continue;
        for (int c = 2 * tid; c < 576; c += 512) red2(row + c, 1.f, 1.f);
    }
}
extern "C" __global__ void coalesced_v4(const int* __restrict__ idx, int kk, int nhb, long long L, float* dkv) {
    // 144 threads' pieces per row: two rows per pass of 256 threads (the last 32 idle)
    const int t = blockIdx.x / nhb, tid = threadIdx.x, half = tid / 144, c = 4 * (tid % 144);
    const int* lst = idx + (long long)t * kk;
    if (tid >= 288) return;
    for (int j = half; j < kk; j += 2) {
        float* row = row_of(lst, j, kk, L, dkv);
        if (!row) continue;
        red4(row + c, 1.f, 1.f, 1.f, 1.f);
    }
}
'''
mod = cp.RawModule(code=SRC, options=("-arch=sm_90a",))
n, H, L, k = 8192, 128, 65536, 2048
nhb = H // 64
_, _, idx = mla_inputs(n, 64, L, k, seed=1)
ic = cp.from_dlpack(idx)
dkv = cp.zeros((L, 576), cp.float32)
fns = {}
for name in ("fragment", "coalesced_v4", "fragment_v4", "unit_v4"):
    f = mod.get_function(name)
    thr = 320 if name == "coalesced_v4" else 256
    fns[name] = (lambda f=f, thr=thr: f((n * nhb,), (thr,), (ic, cp.int32(k), cp.int32(nhb), cp.int64(L), dkv)))
# each kernel adds 1.0 to every (key, column) of every slot: check the sums agree (one call each)
ref = None
for name, f in fns.items():
    dkv.fill(0)
    f()
    s = float(dkv.sum())
    ref = s if ref is None else ref
    print(name, "sum", s, "OK" if s == ref else "MISMATCH", flush=True)
rows = alternate(fns, rounds=5, calls=3)
atomics = n * nhb * k * 576
res = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
       "cupy": cp.__version__, "n": n, "H": H, "L": L, "k": k, "float_additions": atomics, "rows": rows}
for name, r in rows.items():
    if "median_ms" in r:
        r["g_float_adds_per_s"] = atomics / (r["median_ms"] * 1e-3) / 1e9
        print(f"{name:14s} {r['median_ms']:8.3f} ms  {r['g_float_adds_per_s']:.0f} G float adds/s", flush=True)
Path(os.environ.get("OUT", "/tmp"), "probe_atomic_unit.json").write_text(json.dumps(res, indent=1))
