// THE lightning-indexer scoring routine (SIMT, FFMA) and the two score sources.
//   I[t, s] = sum_h w[t,h] * max(0, dot(q[t,h], keys[s]))
// Dense, filter, recovery, replay, threshold and score-only kernels all call
// indexer_score(), so their scores agree bit for bit.
#pragma once
#include "hytopk_order.cuh"

namespace hytopk {

// Input element types: float32, or bf16 carried as its 16 raw bits (no
// cuda_bf16.h needed; the conversion to float is exact).
typedef unsigned short bf16_bits;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16_bits x) { return __uint_as_float(((u32)x) << 16); }

// Fixed summation order: d ascending inside each head, heads ascending.
// q_s/w_s are the query's rows staged in shared memory as float.
template <int H, int D, typename T>
__device__ __forceinline__ float indexer_score(const float* __restrict__ q_s,
                                               const float* __restrict__ w_s,
                                               const T* __restrict__ key) {
    constexpr int C = (D % 8 == 0) ? 8 : ((D % 4 == 0) ? 4 : 1);
    float dot[H];
#pragma unroll
    for (int h = 0; h < H; ++h) dot[h] = 0.0f;
#pragma unroll 1
    for (int d0 = 0; d0 < D; d0 += C) {
        float kv[C];
#pragma unroll
        for (int j = 0; j < C; ++j) kv[j] = to_float(key[d0 + j]);
#pragma unroll
        for (int h = 0; h < H; ++h) {
#pragma unroll
            for (int j = 0; j < C; ++j) dot[h] = fmaf(q_s[h * D + d0 + j], kv[j], dot[h]);
        }
    }
    float acc = 0.0f;
#pragma unroll
    for (int h = 0; h < H; ++h) acc = fmaf(w_s[h], fmaxf(dot[h], 0.0f), acc);
    return acc + 0.0f;     // -0.0 -> +0.0
}

// Every kernel takes a source as (p0, p1, p2, L) raw pointers plus L and
// rebuilds it with Src::from(): table -> (scores, -, -), indexer -> (q, w, keys).

// Table source: a given [n, L] float32 table, read as raw bits (subnormals and
// NaN payloads pass through untouched).
struct TableSource {
    static constexpr int SMEM_FLOATS = 0;
    const u32* scores;
    long long L;
    __device__ static TableSource from(const void* p0, const void*, const void*, long long L) {
        TableSource s = {static_cast<const u32*>(p0), L};
        return s;
    }
    __device__ __forceinline__ void stage(int, float*) const {}
    __device__ __forceinline__ u32 score_bits(int t, long long s, const float*) const {
        return scores[(long long)t * L + s];
    }
};

// bf16 table source: a given [n, L] bf16 table (raw 16-bit patterns), each score
// widened exactly to float32 bits (bits << 16: NaN stays NaN, -0.0 stays -0.0).
struct TableBf16Source {
    static constexpr int SMEM_FLOATS = 0;
    const bf16_bits* scores;
    long long L;
    __device__ static TableBf16Source from(const void* p0, const void*, const void*, long long L) {
        TableBf16Source s = {static_cast<const bf16_bits*>(p0), L};
        return s;
    }
    __device__ __forceinline__ void stage(int, float*) const {}
    __device__ __forceinline__ u32 score_bits(int t, long long s, const float*) const {
        return ((u32)scores[(long long)t * L + s]) << 16;
    }
};

// Indexer source: scores computed on the fly from q[n,H,D], w[n,H], keys[L,D].
// stage() copies query t's q and w into shared memory (block-wide, ends with
// a barrier); every thread of the block must call it.
template <int H_, int D_, typename T>
struct IndexerSource {
    static constexpr int H = H_;
    static constexpr int D = D_;
    static constexpr int SMEM_FLOATS = H_ * D_ + H_;
    const T* q;
    const T* w;
    const T* keys;
    long long L;
    __device__ static IndexerSource from(const void* p0, const void* p1, const void* p2, long long L) {
        IndexerSource s = {static_cast<const T*>(p0), static_cast<const T*>(p1), static_cast<const T*>(p2), L};
        return s;
    }
    __device__ __forceinline__ void stage(int t, float* smem) const {
        const T* qt = q + (long long)t * H * D;
        for (int i = threadIdx.x; i < H * D; i += blockDim.x) smem[i] = to_float(qt[i]);
        for (int i = threadIdx.x; i < H; i += blockDim.x) smem[H * D + i] = to_float(w[(long long)t * H + i]);
        __syncthreads();
    }
    __device__ __forceinline__ u32 score_bits(int, long long s, const float* smem) const {
        return __float_as_uint(indexer_score<H, D, T>(smem, smem + H * D, keys + s * D));
    }
};

}  // namespace hytopk
