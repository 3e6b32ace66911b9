// Dense scoring (the baseline): the whole [n, L] table, -inf outside each
// query's context, with the shared scoring routine.
#include "hytopk_common.cuh"
using namespace hytopk;

// grid: (n, ceil(L / chunk)); smem: Src::SMEM_FLOATS floats.
template <class Src>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_dense(const void* p0, const void* p1, const void* p2, long long L, int n,
             const int* __restrict__ lo, const int* __restrict__ hi, int chunk, u32* __restrict__ out) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long s0 = (long long)blockIdx.y * chunk;
    const long long s1 = min(L, s0 + chunk);
    if (s0 >= s1) return;
    const long long a = lo[t], b = hi[t];
    const Src src = Src::from(p0, p1, p2, L);
    float* q_s = reinterpret_cast<float*>(smem);
    src.stage(t, q_s);
    for (long long s = s0 + threadIdx.x; s < s1; s += blockDim.x)
        out[(long long)t * L + s] = (s >= a && s < b) ? src.score_bits(t, s, q_s) : 0xff800000u;
}
