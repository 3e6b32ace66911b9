// Selection replay: rescore only the k saved positions of each query
// (O(n k H D)); -inf where idx = -1 (or out of range).
#include "hytopk_common.cuh"
using namespace hytopk;

// grid: (n, ceil(k / chunk)); smem: Src::SMEM_FLOATS floats.
template <class Src>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_replay(const void* p0, const void* p1, const void* p2, long long L, int n,
              const int* __restrict__ idx, int k, int chunk, u32* __restrict__ out) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const int j0 = blockIdx.y * chunk;
    const int j1 = min(k, j0 + chunk);
    if (j0 >= j1) return;
    const Src src = Src::from(p0, p1, p2, L);
    float* q_s = reinterpret_cast<float*>(smem);
    src.stage(t, q_s);
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const long long s = idx[(long long)t * k + j];
        out[(long long)t * k + j] = (s >= 0 && s < L) ? src.score_bits(t, s, q_s) : 0xff800000u;
    }
}
