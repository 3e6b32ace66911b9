// Stages 1-4: score the M evenly spaced samples of each query's context and
// take the r-th best as the threshold T (one block per query).
#include "hytopk_common.cuh"

namespace hytopk {
constexpr int MAX_SAMPLES = 8192;
}
using namespace hytopk;

// smem: Src::SMEM_FLOATS floats | MAX_SAMPLES sample keys | RADIX + 4 words
template <class Src>
__global__ void __launch_bounds__(BLOCK, 1)
hytopk_threshold(const void* p0, const void* p1, const void* p2, long long L, int n,
                 const int* __restrict__ lo, const int* __restrict__ hi,
                 const int* __restrict__ M, const int* __restrict__ r, u32* __restrict__ T) {
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x;
    if (t >= n) return;
    const int Mt = M[t];
    const long long a = lo[t], c = (long long)hi[t] - a;
    if (Mt <= 0 || c <= 0) {                     // no sampling: NaN lets every key through
        if (threadIdx.x == 0) T[t] = 0x7fc00000u;
        return;
    }
    const Src src = Src::from(p0, p1, p2, L);
    float* q_s = reinterpret_cast<float*>(smem);
    u32* keys_s = smem + Src::SMEM_FLOATS;
    u32* hist = keys_s + MAX_SAMPLES;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(hist + RADIX);
    src.stage(t, q_s);
    const int m = min(Mt, MAX_SAMPLES);
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
        const long long p = a + ((long long)j * c) / Mt;     // 64-bit, as the contract says
        keys_s[j] = order_key_bits(src.score_bits(t, p, q_s));
    }
    __syncthreads();
    const u32 rank = (u32)min(max(r[t], 1), m);
    auto sample_key = [&](long long j, u32* out) { *out = keys_s[j]; return true; };
    const u32 kstar = block_radix_select<true>(sample_key, m, rank, hist, sc);
    const u32 need = sc->remaining;
    // The need-th sample (in position order) whose key is K*: its value is T.
    if (threadIdx.x < 32) {
        u32 seen = 0u;
        for (int base = 0; base < m; base += 32) {
            const int j = base + (int)lane_id();
            const bool match = j < m && keys_s[j] == kstar;
            const u32 mask = __ballot_sync(0xffffffffu, match);
            if (seen + __popc(mask) >= need) {
                if (match && seen + __popc(mask & lanes_below_mask()) + 1u == need) {
                    const long long p = a + ((long long)j * c) / Mt;
                    T[t] = src.score_bits(t, p, q_s);
                }
                break;
            }
            seen += __popc(mask);
        }
    }
}

// The sample positions p_j = lo + (j * c) // M of every query (64-bit, as the
// contract says) as an [n, m_max] int32 matrix; slots j >= M[t] get -1.
// grid: (n, ceil(m_max / BLOCK)).
extern "C" __global__ void __launch_bounds__(BLOCK)
hytopk_sample_positions(int n, int m_max, const int* __restrict__ lo, const int* __restrict__ hi,
                        const int* __restrict__ M, int* __restrict__ pos) {
    const int t = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (t >= n || j >= m_max) return;
    const int Mt = M[t];
    const long long a = lo[t], c = (long long)hi[t] - a;
    pos[(long long)t * m_max + j] = j < Mt ? (int)(a + ((long long)j * c) / Mt) : -1;
}
