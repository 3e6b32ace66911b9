// Stage 8: exact top-k over each query's stored candidates (one block per
// query): key select, position select among the ties at K*, radix sort.
#include "hytopk_common.cuh"
using namespace hytopk;

namespace {
struct CandidateEntries {
    const int* idx;
    const u32* val;
    __device__ __forceinline__ u32 pos(long long i) const { return (u32)idx[i]; }
    __device__ __forceinline__ u32 bits(long long i) const { return val[i]; }
};
}

// grid: n blocks; smem: exact_topk_smem_words(k, WARPS) words.
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_select(int n, const int* __restrict__ cand_idx, const u32* __restrict__ cand_val,
              const int* __restrict__ count, int capacity, int k, int* __restrict__ idx,
              float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long row = (long long)t * capacity;
    const long long m = min(max(count[t], 0), capacity);
    const CandidateEntries e = {cand_idx + row, cand_val + row};
    block_exact_topk<WARPS>(e, m, k, idx + (long long)t * k, val + (long long)t * k, smem);
}

// The same selection with the FAST radix select and a bitonic final sort
// (hytopk_radix.cuh). grid: n blocks; smem: bitonic_topk_smem_words(k) words.
extern "C" __global__ void __launch_bounds__(BLOCK)
hytopk_select_bitonic(int n, const int* __restrict__ cand_idx, const u32* __restrict__ cand_val,
                      const int* __restrict__ count, int capacity, int k, int* __restrict__ idx,
                      float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long row = (long long)t * capacity;
    const long long m = min(max(count[t], 0), capacity);
    const CandidateEntries e = {cand_idx + row, cand_val + row};
    block_exact_topk_bitonic(e, m, k, idx + (long long)t * k, val + (long long)t * k, smem);
}
