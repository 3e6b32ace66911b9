// Stage 8: exact top-k over each query's stored candidates (one block per
// query): key select, position select among the ties at K*, radix sort.
#include "hytopk_common.cuh"
#include "hytopk_select_fast.cuh"
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

// ------------------------------------------------------------------ stage 8, candidates read once (issue 14)
// hytopk_select_bitonic reads the candidates from global memory in every radix pass (4 key passes,
// the tie pass, the compaction), one dependent load per thread and iteration, and sorts the k kept
// words with 66 block-wide bitonic steps through shared memory. Here the candidates' order keys are
// read once, many loads in flight, into shared memory; the radix passes run there; positions and
// bits are read from global memory only for the ties at K* and the kept entries; the bitonic sort
// runs its strides below 32 E in registers and warp shuffles (thread tid holds slots E tid .. E tid +
// E - 1) and only the strides >= 32 E through shared memory (6 barriers for k = 2048, E = 8).
// The kept set and its order are the same function of the stored entries: bitwise hytopk_select.
namespace {
constexpr int SEL_THREADS = 256;
constexpr int SEL_BATCH = 8;           // global loads in flight per thread

__device__ __forceinline__ u64 shfl_xor_u64(u64 x, int m) {
    const u32 lo = __shfl_xor_sync(0xffffffffu, (u32)x, m), hi = __shfl_xor_sync(0xffffffffu, (u32)(x >> 32), m);
    return ((u64)hi << 32) | lo;
}

// The bitonic steps of block size `size` with strides s_top .. 1 (s_top < 32 E) on the thread's
// E slots E tid + r: strides below E inside the thread, the others by a shuffle with lane ^ s / E.
template <int E>
__device__ __forceinline__ void bitonic_local(u64 (&w)[E], u32 (&b)[E], int size, int s_top) {
    const int i0 = E * (int)threadIdx.x;
    constexpr int LOG_E = E >= 16 ? 4 : E >= 8 ? 3 : E >= 4 ? 2 : E >= 2 ? 1 : 0;
    static_assert((1 << LOG_E) == E && E <= 16, "E: 1, 2, 4, 8 or 16 slots per thread");
#pragma unroll
    for (int ls = 4 + LOG_E; ls >= 0; --ls) {
        const int s = 1 << ls;
        if (s > s_top) continue;
        if (s >= E) {
#pragma unroll
            for (int r = 0; r < E; ++r) {
                const u64 pw = shfl_xor_u64(w[r], s / E);
                const u32 pb = __shfl_xor_sync(0xffffffffu, b[r], s / E);
                const int i = i0 + r;
                const bool take_max = ((i & s) == 0) == ((i & size) == 0);   // lower slot of a descending pair
                if (take_max ? pw > w[r] : pw < w[r]) { w[r] = pw; b[r] = pb; }
            }
        } else {
#pragma unroll
            for (int r = 0; r < E; ++r) {
                if (r & s) continue;
                const bool desc = ((i0 + r) & size) == 0;
                if (desc ? w[r] < w[r | s] : w[r] > w[r | s]) {
                    const u64 tw = w[r]; w[r] = w[r | s]; w[r | s] = tw;
                    const u32 tb = b[r]; b[r] = b[r | s]; b[r | s] = tb;
                }
            }
        }
    }
}

template <int E>
__device__ __forceinline__ void load_slots(const u64* sw, const u32* sb, u64 (&w)[E], u32 (&b)[E]) {
#pragma unroll
    for (int r = 0; r < E; ++r) { w[r] = sw[E * threadIdx.x + r]; b[r] = sb[E * threadIdx.x + r]; }
}
template <int E>
__device__ __forceinline__ void store_slots(u64* sw, u32* sb, const u64 (&w)[E], const u32 (&b)[E]) {
#pragma unroll
    for (int r = 0; r < E; ++r) { sw[E * threadIdx.x + r] = w[r]; sb[E * threadIdx.x + r] = b[r]; }
}

// Sorts the P = E * SEL_THREADS words sw (bits sb ride along) descending. Ends with a barrier.
template <int E>
__device__ void block_bitonic_sort_regs(u64* sw, u32* sb) {
    constexpr int P = E * SEL_THREADS, LOCAL = 32 * E;        // sizes up to LOCAL: no shared memory step
    u64 w[E];
    u32 b[E];
    load_slots<E>(sw, sb, w, b);
    for (int size = 2; size <= min(P, LOCAL); size <<= 1) bitonic_local<E>(w, b, size, size >> 1);
    store_slots<E>(sw, sb, w, b);
    __syncthreads();
    for (int size = 2 * LOCAL; size <= P; size <<= 1) {
        for (int s = size >> 1; s >= LOCAL; s >>= 1) {
            for (int q = threadIdx.x; q < P / 2; q += SEL_THREADS) {
                const int a = 2 * q - (q & (s - 1)), c = a + s;
                const bool desc = (a & size) == 0;
                const u64 wa = sw[a], wc = sw[c];
                if (desc ? wa < wc : wa > wc) {
                    sw[a] = wc; sw[c] = wa;
                    const u32 t = sb[a]; sb[a] = sb[c]; sb[c] = t;
                }
            }
            __syncthreads();
        }
        load_slots<E>(sw, sb, w, b);
        bitonic_local<E>(w, b, size, LOCAL >> 1);
        store_slots<E>(sw, sb, w, b);
        __syncthreads();
    }
}

// smem (u32 words): RADIX histogram, 4 scalars, capacity keys (rounded up to even), then
// P = E * SEL_THREADS u64 words and P u32 bits.
template <int E>
__device__ void select_smem_body(int n, const int* __restrict__ cand_idx, const u32* __restrict__ cand_val,
                                 const int* __restrict__ count, int capacity, int k, int* __restrict__ idx,
                                 float* __restrict__ val) {
    constexpr int P = E * SEL_THREADS;
    extern __shared__ __align__(16) u32 smem[];
    const int t = blockIdx.x, tid = (int)threadIdx.x;
    if (t >= n) return;
    u32* hist = smem;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(smem + RADIX);
    u32* keys = smem + RADIX + 4;
    u64* sw = reinterpret_cast<u64*>(keys + ((capacity + 1) & ~1));
    u32* sb = reinterpret_cast<u32*>(sw + P);
    const long long row = (long long)t * capacity;
    const int m = min(max(count[t], 0), capacity);
    const u32* vrow = cand_val + row;
    const int* irow = cand_idx + row;
    for (int base = 0; base < m; base += SEL_THREADS * SEL_BATCH) {   // every key once, SEL_BATCH loads in flight
        u32 v[SEL_BATCH];
#pragma unroll
        for (int q = 0; q < SEL_BATCH; ++q) {
            const int i = base + q * SEL_THREADS + tid;
            v[q] = i < m ? __ldcg(vrow + i) : 0u;
        }
#pragma unroll
        for (int q = 0; q < SEL_BATCH; ++q) {
            const int i = base + q * SEL_THREADS + tid;
            if (i < m) keys[i] = order_key_bits(v[q]);
        }
    }
    __syncthreads();
    u32 kstar = 0u, pstar = 0xffffffffu;                       // m <= k: everything is kept
    if (m > k) {
        auto key_of = [&](long long i, u32* out) { *out = keys[i]; return true; };
        kstar = block_radix_select<true, true>(key_of, m, (u32)k, hist, sc);
        const u32 need = sc->remaining;
        if (need < sc->equal) {                                // too many ties at K*: the lowest positions
            __syncthreads();
            auto tie_pos = [&](long long i, u32* out) {
                if (keys[i] != kstar) return false;
                *out = (u32)irow[i];
                return true;
            };
            pstar = block_radix_select<false, true>(tie_pos, m, need, hist, sc);
        }
    }
    __syncthreads();
    if (tid == 0) sc->kept = 0u;
    __syncthreads();
    const int m_round = (m + SEL_THREADS - 1) / SEL_THREADS * SEL_THREADS;
    for (int base = 0; base < m_round; base += SEL_THREADS * SEL_BATCH) {
        u32 key[SEL_BATCH], v[SEL_BATCH];
        int pos[SEL_BATCH];
#pragma unroll
        for (int q = 0; q < SEL_BATCH; ++q) {                  // position and bits of the candidates >= K* only
            const int i = base + q * SEL_THREADS + tid;
            key[q] = i < m ? keys[i] : 0u;
            const bool maybe = i < m && key[q] >= kstar;
            pos[q] = maybe ? irow[i] : 0;
            v[q] = maybe ? vrow[i] : 0u;
        }
#pragma unroll
        for (int q = 0; q < SEL_BATCH; ++q) {
            const int i = base + q * SEL_THREADS + tid;
            if (base + q * SEL_THREADS >= m_round) break;      // warp-uniform: m_round is a multiple of the block
            const bool keep = i < m && (key[q] > kstar || (key[q] == kstar && (u32)pos[q] <= pstar));
            const int slot = warp_append_slot(keep, reinterpret_cast<int*>(&sc->kept));
            if (keep && slot < P) {                            // slot < k <= P always holds; never write past it
                sw[slot] = ((u64)key[q] << 32) | (u64)(~(u32)pos[q]);
                sb[slot] = v[q];
            }
        }
    }
    __syncthreads();
    const int kept = min((int)sc->kept, min(k, P));
    for (int i = kept + tid; i < P; i += SEL_THREADS) { sw[i] = 0ull; sb[i] = 0u; }   // pads sort last
    __syncthreads();
    block_bitonic_sort_regs<E>(sw, sb);
    write_row(sw, sb, kept, k, idx + (long long)t * k, val + (long long)t * k);
}
}  // namespace

// grid: n blocks of SEL_THREADS = 256; E = max(next_pow2(k), 256) / 256 (k <= 4096);
// smem: 4 * (RADIX + 4 + even(capacity)) + 12 * 256 E bytes.
#define HYTOPK_SELECT_SMEM(E)                                                                                   \
    extern "C" __global__ void __launch_bounds__(SEL_THREADS, 2) hytopk_select_smem_e##E(                     \
        int n, const int* __restrict__ cand_idx, const u32* __restrict__ cand_val, const int* __restrict__ count, \
        int capacity, int k, int* __restrict__ idx, float* __restrict__ val) {                                 \
        select_smem_body<E>(n, cand_idx, cand_val, count, capacity, k, idx, val);                             \
    }
HYTOPK_SELECT_SMEM(1)
HYTOPK_SELECT_SMEM(2)
HYTOPK_SELECT_SMEM(4)
HYTOPK_SELECT_SMEM(8)
HYTOPK_SELECT_SMEM(16)

// ------------------------------------------------------------------ stage 8 without a sort (issues 14, 21)
// select_smem_rows (hytopk_select_fast.cuh), the body of table_v2.cu's hytopk_select_smem: the
// candidates read once into shared memory (4 loads of each kind in flight per thread), then
// block_select_fast (the key range's histogram, a scatter into bins, ranks inside the bins: no
// radix passes, no bitonic sort); rows it declines (ranking past FAST_RANK_WORK per rank) and
// rows with more than cap candidates take the key select + register sort. Bitwise hytopk_select.
// grid: n blocks of FAST_SELECT_THREADS; smem: select_smem_words(k, cap) words.
constexpr int FAST_SELECT_THREADS = 512;
// (512, 2): its shared memory at k 2048 / cap 8192 (~91 KB) fits two blocks per SM anyway; without the
// bound ptxas aimed at three and spilled once the select became two steps (stage, rank)
extern "C" __global__ void __launch_bounds__(FAST_SELECT_THREADS, 2)
hytopk_select_fast(int n, const int* __restrict__ cand_idx, const u32* __restrict__ cand_val,
                   const int* __restrict__ count, int capacity, int k, int cap, int* __restrict__ idx,
                   float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    select_smem_rows(smem, n, cand_idx, cand_val, count, capacity, k, cap, 1, idx, val);
}
