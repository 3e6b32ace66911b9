// Stage 5 (SIMT): fused score-and-filter. Each block scores one chunk of one
// query's context on chip, compares every score's key with the threshold's key
// and appends passing (position, score) pairs to the query's buffer. count[t]
// is the true number of candidates; only slots < capacity are written.
#include "hytopk_common.cuh"
using namespace hytopk;

// grid: (n, ceil(L / chunk)); smem: Src::SMEM_FLOATS floats. count must be zeroed.
template <class Src>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_filter(const void* p0, const void* p1, const void* p2, long long L, int n,
              const int* __restrict__ lo, const int* __restrict__ hi, const u32* __restrict__ T,
              int capacity, int chunk, int* __restrict__ cand_idx, u32* __restrict__ cand_val,
              int* __restrict__ count) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const long long s0 = (long long)lo[t] + (long long)blockIdx.y * chunk;
    const long long s1 = min((long long)hi[t], s0 + chunk);
    if (s0 >= s1) return;
    const Src src = Src::from(p0, p1, p2, L);
    float* q_s = reinterpret_cast<float*>(smem);
    src.stage(t, q_s);
    const u32 tkey = order_key_bits(T[t]);
    const long long row = (long long)t * capacity;
    for (long long base = s0; base < s1; base += blockDim.x) {   // whole warps iterate together
        const long long s = base + threadIdx.x;
        const bool in = s < s1;
        const u32 bits = in ? src.score_bits(t, s, q_s) : 0u;
        const bool pass = in && order_key_bits(bits) >= tkey;
        const int slot = warp_append_slot(pass, count + t);
        if (pass && slot < capacity) {
            cand_idx[row + slot] = (int)s;
            cand_val[row + slot] = bits;
        }
    }
}
