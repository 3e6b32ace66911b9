// Stage 6: the check and compaction of the failed rows (overflow: count >
// capacity; underflow: count < k; only queries with c > k were sampled).
#include "hytopk_common.cuh"
using namespace hytopk;

// rows gets the failed query numbers in arbitrary order; *nfailed must be zeroed.
extern "C" __global__ void __launch_bounds__(BLOCK, 1)
hytopk_check(int n, const int* __restrict__ count, const int* __restrict__ lo, const int* __restrict__ hi,
             int k, int capacity, unsigned char* __restrict__ failed, int* __restrict__ rows,
             int* __restrict__ nfailed) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n_round = ((long long)n + 31) / 32 * 32;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n_round; t += stride) {
        bool f = false;
        if (t < n) {
            const long long c = (long long)hi[t] - lo[t];
            f = c > k && (count[t] > capacity || count[t] < k);
            failed[t] = f ? 1 : 0;
        }
        const int slot = warp_append_slot(f, nfailed);
        if (f && slot < n) rows[slot] = (int)t;
    }
}
