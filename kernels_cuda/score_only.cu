// The benchmark floor: the same scoring code over every context, nothing
// written but a checksum (the wrapping sum of the order keys, an integer sum,
// so it is deterministic).
#include "hytopk_common.cuh"
using namespace hytopk;

// grid: (n, ceil(L / chunk)); smem: Src::SMEM_FLOATS floats. *checksum must be zeroed.
template <class Src>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_score_only(const void* p0, const void* p1, const void* p2, long long L, int n,
                  const int* __restrict__ lo, const int* __restrict__ hi, int chunk,
                  unsigned long long* __restrict__ checksum) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long s0 = (long long)lo[t] + (long long)blockIdx.y * chunk;
    const long long s1 = min((long long)hi[t], s0 + chunk);
    if (s0 >= s1) return;
    const Src src = Src::from(p0, p1, p2, L);
    float* q_s = reinterpret_cast<float*>(smem);
    src.stage(t, q_s);
    u64 sum = 0ull;
    for (long long s = s0 + threadIdx.x; s < s1; s += blockDim.x)
        sum += order_key_bits(src.score_bits(t, s, q_s));
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane_id() == 0 && sum) atomicAdd(checksum, sum);
}
