// Stage 7: recovery of failed queries. Indexer source: materialise just those
// rows (rows x c floats) with the shared scoring routine, then select. Table
// source: select straight from the table rows. The select is the exact block
// top-k of the select stage, over (lo + i, row[i]).
#include "hytopk_common.cuh"
using namespace hytopk;

namespace {
struct RowEntries {
    const u32* row;     // score bits of positions lo, lo + 1, ...
    u32 lo;
    __device__ __forceinline__ u32 pos(long long i) const { return lo + (u32)i; }
    __device__ __forceinline__ u32 bits(long long i) const { return row[i]; }
};
}

// buf[j, s - lo[rows[j]]] = score of (rows[j], s) for s in the context.
// grid: (nrows, ceil(stride / chunk)); smem: Src::SMEM_FLOATS floats.
template <class Src>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_score_rows(const void* p0, const void* p1, const void* p2, long long L,
                  const int* __restrict__ rows, int nrows, const int* __restrict__ lo,
                  const int* __restrict__ hi, int chunk, u32* __restrict__ buf, long long stride) {
    extern __shared__ __align__(16) u32 smem[];
    const int j = blockIdx.x;
    if (j >= nrows) return;
    const int t = rows[j];
    if (t < 0) return;                                        // an empty recovery slot
    const long long a = lo[t];
    const long long c = min((long long)hi[t] - a, stride);   // never past the row's buffer
    const long long i0 = (long long)blockIdx.y * chunk;
    const long long i1 = min(c, i0 + chunk);
    if (i0 >= i1) return;
    const Src src = Src::from(p0, p1, p2, L);
    float* q_s = reinterpret_cast<float*>(smem);
    src.stage(t, q_s);
    for (long long i = i0 + threadIdx.x; i < i1; i += blockDim.x)
        buf[(long long)j * stride + i] = src.score_bits(t, a + i, q_s);
}

// Exact top-k of each listed query's whole context. by_query = 1: the rows of
// `base` are indexed by query and start at position 0 (a score table);
// by_query = 0: row j of `base` holds query rows[j] from position lo on.
// grid: nrows blocks; smem: exact_topk_smem_words(k, WARPS) words.
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_select_rows(const u32* __restrict__ base, long long stride, int by_query,
                   const int* __restrict__ rows, int nrows, const int* __restrict__ lo,
                   const int* __restrict__ hi, int k, int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    const int j = blockIdx.x;
    if (j >= nrows) return;
    const int t = rows[j];
    if (t < 0) return;                          // an empty recovery slot: nothing to write
    const long long a = lo[t];
    long long c = (long long)hi[t] - a;
    const u32* row = by_query ? base + (long long)t * stride + a : base + (long long)j * stride;
    if (!by_query) c = min(c, stride);
    const RowEntries e = {row, (u32)a};
    block_exact_topk<WARPS>(e, c, k, idx + (long long)j * k, val + (long long)j * k, smem);
}

// hytopk_select_rows of by_query = 0 rows (row j of `base` holds query rows[j] from lo
// on), its result written to that query's row of the full outputs: idx/val[rows[j]]
// (the device-side recovery's fused scatter: one launch fewer per recovery chunk).
// grid: nrows blocks; smem: exact_topk_smem_words(k, WARPS) words.
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_select_rows_to(const u32* __restrict__ base, long long stride, const int* __restrict__ rows, int nrows,
                      const int* __restrict__ lo, const int* __restrict__ hi, int k, int* __restrict__ idx,
                      float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    const int j = blockIdx.x;
    if (j >= nrows) return;
    const int t = rows[j];
    if (t < 0) return;                          // an empty recovery slot: nothing to write
    const long long a = lo[t];
    const long long c = min((long long)hi[t] - a, stride);
    const RowEntries e = {base + (long long)j * stride, (u32)a};
    block_exact_topk<WARPS>(e, c, k, idx + (long long)t * k, val + (long long)t * k, smem);
}
