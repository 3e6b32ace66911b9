// Stage 5 on tensor cores (bf16 indexer source only): the same fused
// score-and-filter as filter.cu, but the dots q[h] . keys[s] come from
// mma.sync m16n8k16 (bf16 x bf16 -> f32). Each warp scores tiles of 16 keys:
// A = 16 keys x 16 dims of keys (row-major), B = 16 dims x 8 heads of q (q is
// stored [h][d], i.e. B column-major). Its sums run in another order than the
// SIMT routine, so it is its own variant: bit-identical to it only when every
// product and partial sum is exact (the small-integer test inputs).
#include "hytopk_common.cuh"
using namespace hytopk;

namespace hytopk {
constexpr int MMA_TILES_PER_WARP = 16;   // 16-key tiles per warp per block
constexpr int MMA_CHUNK = WARPS * 16 * MMA_TILES_PER_WARP;

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
}  // namespace hytopk

// grid: (n, ceil(L / MMA_CHUNK)); smem: H * (D + 8) bf16 of q + H floats of w.
// keys, q, w are bf16 bits; keys must be 4-byte aligned. count must be zeroed.
template <int H, int D>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_filter_mma(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ w,
                  const bf16_bits* __restrict__ keys, long long L, int n,
                  const int* __restrict__ lo, const int* __restrict__ hi, const u32* __restrict__ T,
                  int capacity, int* __restrict__ cand_idx, u32* __restrict__ cand_val,
                  int* __restrict__ count) {
    static_assert(H % 8 == 0 && D % 16 == 0, "mma tiles need H % 8 == 0 and D % 16 == 0");
    constexpr int QS = D + 8;                      // padded row: conflict-free B loads
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long s0 = (long long)lo[t] + (long long)blockIdx.y * MMA_CHUNK;
    const long long s1 = min((long long)hi[t], s0 + MMA_CHUNK);
    if (s0 >= s1) return;

    bf16_bits* q_s = reinterpret_cast<bf16_bits*>(smem);
    float* w_s = reinterpret_cast<float*>(smem + H * QS / 2);
    for (int i = threadIdx.x; i < H * D; i += blockDim.x)
        q_s[(i / D) * QS + i % D] = q[(long long)t * H * D + i];
    for (int i = threadIdx.x; i < H; i += blockDim.x) w_s[i] = to_float(w[(long long)t * H + i]);
    __syncthreads();

    const u32 tkey = order_key_bits(T[t]);
    const long long row = (long long)t * capacity;
    const int warp = threadIdx.x >> 5;
    const int g = (int)lane_id() >> 2, tig = (int)lane_id() & 3;

    for (int tile = 0; tile < MMA_TILES_PER_WARP; ++tile) {
        const long long base = s0 + (long long)(tile * WARPS + warp) * 16;
        if (base >= s1) break;                     // warp-uniform
        const long long r0 = base + g, r1 = base + g + 8;
        const bool in0 = r0 < s1, in1 = r1 < s1;
        const u32* k0 = reinterpret_cast<const u32*>(keys + (in0 ? r0 : 0) * D);
        const u32* k1 = reinterpret_cast<const u32*>(keys + (in1 ? r1 : 0) * D);
        u32 a[D / 16][4];
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            const int col = ks * 8 + tig;          // in u32 words (2 bf16 each)
            a[ks][0] = in0 ? k0[col] : 0u;
            a[ks][1] = in1 ? k1[col] : 0u;
            a[ks][2] = in0 ? k0[col + 4] : 0u;
            a[ks][3] = in1 ? k1[col + 4] : 0u;
        }
        float p0 = 0.0f, p1 = 0.0f;                // partial scores of rows r0, r1
#pragma unroll 1
        for (int hb = 0; hb < H / 8; ++hb) {
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const u32* qrow = reinterpret_cast<const u32*>(q_s + (hb * 8 + g) * QS);
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks)
                mma_bf16_16816(c, a[ks], qrow[ks * 8 + tig], qrow[ks * 8 + tig + 4]);
            const float w0 = w_s[hb * 8 + 2 * tig], w1 = w_s[hb * 8 + 2 * tig + 1];
            p0 = fmaf(w0, fmaxf(c[0], 0.0f), p0);
            p0 = fmaf(w1, fmaxf(c[1], 0.0f), p0);
            p1 = fmaf(w0, fmaxf(c[2], 0.0f), p1);
            p1 = fmaf(w1, fmaxf(c[3], 0.0f), p1);
        }
        // Sum the 4 head groups of the quad; every lane of the quad gets the same bits.
        p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
        p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
        // lane tig 0 owns row r0, tig 1 owns row r1
        const bool mine = (tig == 0 && in0) || (tig == 1 && in1);
        const long long s = tig == 0 ? r0 : r1;
        const u32 bits = __float_as_uint((tig == 0 ? p0 : p1) + 0.0f);
        const bool pass = mine && order_key_bits(bits) >= tkey;
        const int slot = warp_append_slot(pass, count + t);
        if (pass && slot < capacity) {
            cand_idx[row + slot] = (int)s;
            cand_val[row + slot] = bits;
        }
    }
}
