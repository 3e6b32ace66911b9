// Device-side helpers with no host sync: the recovery slots of each fixed-size chunk and the
// scatter of their results (CUDA-graph capture), and context parallel's candidate append.
#include "hytopk_common.cuh"
using namespace hytopk;

// Device-side recovery (no host sync: CUDA-graph capture). slots[j] = the query that
// slot j of recovery chunk `chunk` (S slots each) recovers, or -1: while at most
// max_failed queries failed, the failed ones (rows[0 .. *nfailed)); when more failed,
// every query (CONTRACT.md §3.7's fallback), chunk * S + j. *fell_back gets the decision.
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_recovery_slots(int n, const int* __restrict__ nfailed, const int* __restrict__ rows, int max_failed,
                      int chunk, int S, int* __restrict__ slots, unsigned char* __restrict__ fell_back) {
    const int nf = *nfailed;
    const bool all = nf > max_failed;
    if (chunk == 0 && blockIdx.x == 0 && threadIdx.x == 0 && fell_back) *fell_back = all ? 1 : 0;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < S; j += gridDim.x * blockDim.x) {
        const long long e = (long long)chunk * S + j;
        slots[j] = all ? (e < n ? (int)e : -1) : (e < nf ? rows[e] : -1);
    }
}

// dst_idx/val[slots[j]] = src_idx/val[j] (k entries) for the slots that hold a query.
// grid: (S, ceil(k / BLOCK)).
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_scatter_slots(const int* __restrict__ slots, int S, int k, const int* __restrict__ src_idx,
                     const float* __restrict__ src_val, int* __restrict__ dst_idx, float* __restrict__ dst_val) {
    const int j = blockIdx.x;
    if (j >= S) return;
    const int t = slots[j];
    if (t < 0) return;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < k; i += gridDim.y * blockDim.x) {
        dst_idx[(long long)t * k + i] = src_idx[(long long)j * k + i];
        dst_val[(long long)t * k + i] = src_val[(long long)j * k + i];
    }
}

// Context parallel: append one shard piece's filter output to a query's running candidate
// buffer (cp.py _Appender) in one launch, reading only the entries the piece stored.
// Row t: m = min(count[t], src_width, dst_width - stored[t]) entries of src (positions
// shifted by `offset`, -1 kept) go to dst slots stored[t] ..; stored[t] += m, total[t] +=
// count[t] (the true count: overflow stays visible to the check). dst rows are dst_stride
// apart (>= dst_width). One block per row: the row's counters have a single writer.
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_append_rows(int n, int src_width, const int* __restrict__ src_idx, const float* __restrict__ src_val,
                   const int* __restrict__ count, int offset, int dst_width, int dst_stride,
                   int* __restrict__ dst_idx, float* __restrict__ dst_val, long long* __restrict__ stored,
                   long long* __restrict__ total) {
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long c = max(count[t], 0);
    const long long s = min(max(stored[t], 0LL), (long long)dst_width);
    const long long m = min(min(c, (long long)src_width), (long long)dst_width - s);
    const int* si = src_idx + (long long)t * src_width;
    const float* sv = src_val + (long long)t * src_width;
    int* di = dst_idx + (long long)t * dst_stride + s;
    float* dv = dst_val + (long long)t * dst_stride + s;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
        const int p = si[i];
        di[i] = p >= 0 ? p + offset : p;
        dv[i] = sv[i];
    }
    __syncthreads();                                         // every thread has read stored[t]
    if (threadIdx.x == 0) {
        stored[t] = s + m;
        total[t] += c;
    }
}
