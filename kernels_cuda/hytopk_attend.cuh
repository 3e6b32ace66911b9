// Sparse attention over selected keys (docs/CONTRACT.md §8): shared geometry and PTX helpers of
// the forward and backward kernels of attend.cu (bf16 mma.sync m16n8k16, f32 accumulate; sm_80+).
//
// A block (256 threads = 8 warps) owns ROWS = 16*MT MMA rows: QPT adjacent queries x HB heads of
// one kv head (GQA group / MLA's single latent head), padded with zero rows. Warp w works on
// m-tile mt = w / NSPLIT and split sp = w % NSPLIT: for the logits it takes SK = NK / NSPLIT of
// the tile's NK keys, for P.V (forward) or dQ (backward) a share of the output columns. Keys come
// in tiles of NK gathered rows (cp.async, double buffered): row kv[idx] goes global -> shared once
// per tile and serves every row of the block (MLA: as K and, its first DV columns, as V).
#pragma once
#include "hytopk_order.cuh"
#include "hytopk_cp_async.cuh"

namespace hytopk {
namespace attend {

typedef unsigned short bf16_t;     // bf16 bits

template <int MT_, int NK_, int DQK_, int DV_, int QPT_, bool SHARED_>
struct Shape {
    static constexpr int MT = MT_, NK = NK_, DQK = DQK_, DV = DV_, QPT = QPT_;
    static constexpr bool SHARED = SHARED_;          // V = the first DV columns of the K rows (MLA)
    static_assert(MT == 1 || MT == 2 || MT == 4, "attend: 16, 32 or 64 rows per block");
    static_assert(DQK % 16 == 0 && DV % 16 == 0, "attend: head dims must be multiples of 16 (pad)");
    static_assert(!SHARED || DV <= DQK, "attend: MLA's V is a prefix of the kv row");
    static_assert(QPT == 1 || QPT == 2, "attend: one or two queries per block");
    static constexpr int THREADS = 256, WARPS = 8;
    static constexpr int ROWS = 16 * MT;
    static constexpr int NSPLIT = WARPS / MT;         // warps sharing one m-tile
    static constexpr int SK = NK / NSPLIT;            // logit keys per warp
    static_assert(SK % 8 == 0 && NK % 16 == 0, "attend: NK must give every warp whole n8 tiles");
    static constexpr int SNT = SK / 8;
    static constexpr int QS = DQK + 8;                // smem row strides (bf16): 16-byte aligned rows
    static constexpr int VS = SHARED ? QS : DV + 8;
    static constexpr int OS = DV + 8;                 // dO rows (backward)
    static constexpr int PS = NK + 8;
    static constexpr int DVT = DV / 8, DQT = DQK / 8; // n8 tiles of the output columns
    static constexpr int VNT = (DVT + NSPLIT - 1) / NSPLIT;   // forward: O tiles per warp
    static constexpr int QNT = (DQT + NSPLIT - 1) / NSPLIT;   // backward: dQ tiles per warp
    // forward shared memory (bytes)
    static constexpr int Q_BYTES = ROWS * QS * 2;
    static constexpr int K_BYTES = NK * QS * 2;
    static constexpr int V_BYTES = SHARED ? 0 : NK * VS * 2;
    static constexpr int P_BYTES = ROWS * PS * 2;
    static constexpr int RED_BYTES = NSPLIT * ROWS * 4;
    static constexpr int MUL_BYTES = NK * QPT * 4;
    static constexpr int FWD_SMEM = Q_BYTES + 2 * K_BYTES + 2 * V_BYTES + P_BYTES + 2 * RED_BYTES + 2 * MUL_BYTES;
    // backward adds dO rows, a dS tile and the per-row lse / delta
    static constexpr int DO_BYTES = ROWS * OS * 2;
    static constexpr int BWD_SMEM = Q_BYTES + DO_BYTES + 2 * K_BYTES + 2 * V_BYTES + 2 * P_BYTES
                                    + 2 * ROWS * 4 + 2 * MUL_BYTES;
};

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_t(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats -> packed bf16x2 (round to nearest even), lo in the low half
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }   // NVRTC has no INFINITY
__device__ __forceinline__ float bf16_to_float(bf16_t b) { return __uint_as_float(((u32)b) << 16); }

// Offsets (bytes) of this lane's ldmatrix row address inside a 16x16 A tile of a row-major
// [row][col] array of stride `stride` elements: matrices (r0-7,c0-7) (r8-15,c0-7) (r0-7,c8-15) (r8-15,c8-15).
__device__ __forceinline__ u32 a_lane_off(int stride) {
    const int l = (int)lane_id(), lr = l & 7, lm = l >> 3;
    return (u32)(((lr + (lm & 1) * 8) * stride + (lm >> 1) * 8) * 2);
}
// x2 loads of B from a [n][k] array (non-trans: rows n, cols k 0-7 then 8-15)
__device__ __forceinline__ u32 bn_lane_off(int stride) {
    const int l = (int)lane_id(), lr = l & 7, lm = (l >> 3) & 1;
    return (u32)((lr * stride + lm * 8) * 2);
}
// x2.trans loads of B from a [k][n] array (rows k 0-7 then 8-15, cols n 0-7)
__device__ __forceinline__ u32 bk_lane_off(int stride) {
    const int l = (int)lane_id(), lr = l & 7, lm = (l >> 3) & 1;
    return (u32)(((lr + lm * 8) * stride) * 2);
}
// x4.trans loads of A (m = cols, k = rows) from a [k][m] array: matrices (m0-7,k0-7) (m8-15,k0-7)
// (m0-7,k8-15) (m8-15,k8-15) are the stored blocks (k0-7,m0-7) (k0-7,m8-15) (k8-15,m0-7) (k8-15,m8-15)
__device__ __forceinline__ u32 at_lane_off(int stride) {
    const int l = (int)lane_id(), lr = l & 7, lm = l >> 3;
    return (u32)(((lr + (lm >> 1) * 8) * stride + (lm & 1) * 8) * 2);
}

// gpu-scope acquire load / release store of a flag (the backward's head-block pairs)
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {      // same bits in all four lanes
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Gather one tile of NK keys (list slots j0 .. j0+NK-1 of `list`, length len) into shared memory:
// K rows (and V rows unless SHARED), and the slot multiplicity per query of the block (0 = masked:
// padding -1, an index outside [0, L), a slot past len, or a key this query did not select).
// The list entries of all this thread's copies are loaded first: the cp.async asm (a memory
// clobber) keeps each load behind the previous copy otherwise, one load latency per 16 bytes
// (the top stall of the forward in ncu); then the next tile's list (and mult) lines are
// prefetched into L1, so the next call's loads hit.
template <class S, int D, int STRIDE>
__device__ __forceinline__ void gather_rows(u32 dst, const int* __restrict__ list, int j0, int len, long long L,
                                            const bf16_t* __restrict__ src, long long ss) {
    constexpr int C = D / 8, TOTAL = S::NK * C, ITERS = (TOTAL + S::THREADS - 1) / S::THREADS;
    int key[ITERS];
#pragma unroll
    for (int u = 0; u < ITERS; ++u) {
        const int i = (int)threadIdx.x + u * S::THREADS;
        const int j = j0 + i / C;
        key[u] = (i < TOTAL && j < len) ? __ldg(list + j) : -1;
    }
#pragma unroll
    for (int u = 0; u < ITERS; ++u) {
        const int i = (int)threadIdx.x + u * S::THREADS;
        if (TOTAL % S::THREADS == 0 || i < TOTAL) {
            const int jj = i / C, c = i - jj * C;
            const long long s = key[u];
            const bool ok = s >= 0 && s < L;
            cp_async16(dst + (u32)((jj * STRIDE + c * 8) * 2), src + (ok ? s * ss + c * 8 : 0), ok);
        }
    }
}

template <class S>
__device__ __forceinline__ void gather_tile(u32 sk, u32 sv, float* smul, const int* __restrict__ list,
                                            const int* __restrict__ mult, int j0, int len, long long L,
                                            const bf16_t* __restrict__ k, long long ks, const bf16_t* __restrict__ v,
                                            long long vs) {
    gather_rows<S, S::DQK, S::QS>(sk, list, j0, len, L, k, ks);
    if (!S::SHARED) gather_rows<S, S::DV, S::VS>(sv, list, j0, len, L, v, vs);
    for (int jj = threadIdx.x; jj < S::NK; jj += S::THREADS) {
        const int j = j0 + jj;
        const long long s = j < len ? (long long)__ldg(list + j) : -1;
        const bool ok = s >= 0 && s < L;
#pragma unroll
        for (int i = 0; i < S::QPT; ++i)
            smul[jj * S::QPT + i] = !ok ? 0.0f : (mult ? (float)__ldg(mult + 2 * (long long)j + i) : 1.0f);
    }
    // next tile's list: NK ints (and 2 NK mult ints), one 128-byte line per thread
    constexpr int LLINES = S::NK / 32, MLINES = S::QPT == 2 ? S::NK / 16 : 0;
    const int tid = (int)threadIdx.x, jn = j0 + S::NK;
    if (tid < LLINES) {
        if (jn + tid * 32 < len) asm volatile("prefetch.global.L1 [%0];" ::"l"(list + jn + tid * 32));
    } else if (mult && tid < LLINES + MLINES) {
        const int m = tid - LLINES;
        if (jn + m * 16 < len) asm volatile("prefetch.global.L1 [%0];" ::"l"(mult + 2 * (long long)(jn + m * 16)));
    }
}

}  // namespace attend
}  // namespace hytopk
