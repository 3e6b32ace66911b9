// The table path of issue 21 at memory speed (second design, beside table_topk.cu's).
// Src is hytopk::TableSource (float32) or hytopk::TableBf16Source (bf16 bits widened
// exactly to float32). What the first design lost and these kernels change:
//   - the filter test is two unsigned range compares on raw bits (KeyAtLeast), and steps
//     wholly inside a context skip every bounds check: the old filter spent ~35 integer
//     operations per element (64-bit bounds, order key) and was issue-bound;
//   - no global atomic on the critical path: one block per (row, piece) appends to a
//     shared-memory stage with shared atomics and takes its slots in the row's buffer with
//     one global atomic at the end (then a coalesced copy);
//   - the threshold keeps all of a thread's sample loads in flight at once;
//   - the selects rank the k kept without sorting (block_select_fast, hytopk_select_fast.cuh:
//     one histogram over the key range, a scatter into bins, ranks inside the bins); fast = 0
//     or a row it cannot take: key select, position select, register bitonic sort (sort_desc_v2).
//   hytopk_table_threshold       stages 1-4 on a table: the r-th best of M samples
//   hytopk_table_filter_pieces   stage 5 on a table: the streaming filter
//   hytopk_table_fused           HyTopK in one kernel per row: samples, threshold, one
//                                streaming read into shared memory, exact select; rows whose
//                                count is < k or > cap are listed for hytopk_table_topk_listed
//                                (table_topk.cu), launched right after on the device
//   hytopk_select_smem           stage 8 with each row's candidates read once into shared memory
#include "hytopk_select_fast.cuh"
using namespace hytopk;

namespace hytopk {
constexpr int STREAM_BLOCK = 256;        // threads of the filter
// vectors per thread per step of the filter: 64 (float32, 16 elements) / 48 (bf16, 24 elements)
// bytes in flight; at <= 40 registers six blocks (1536 threads) fit an SM: 96 / 72 KiB in flight
// per SM (table_v2.py STREAM_U)
template <class Src> struct StreamU { static constexpr int U = TableVec<Src>::PER_VEC == 4 ? 4 : 3; };
constexpr int STREAM_MIN_BLOCKS = 6;
constexpr int SAMPLE_BLOCK = 512;        // threads of the threshold and the fused kernel
constexpr int SAMPLE_PER = MAX_SAMPLES / SAMPLE_BLOCK;   // every sample load of a thread in flight at once

// Sort slots of the v2 selects: sort_desc_v2 pads to at least one word per thread.
__host__ __device__ constexpr int sort_slots_v2(int k) { return next_pow2(k) > SAMPLE_BLOCK ? next_pow2(k) : SAMPLE_BLOCK; }

// Shared memory of hytopk_table_fused in u32 words: 256-bin histogram, select scalars (4),
// candidate counter + pad (2), sort_slots_v2(k) (u64 word, u32 bits) sort slots, cap (position,
// bits) candidates; the samples (<= MAX_SAMPLES keys) use the candidate area first.
__host__ __device__ constexpr long long table_fused_smem_words(int k, int cap) {
    return RADIX + 6 + 3LL * sort_slots_v2(k) + 2LL * cap;
}

// The filter's sink: a shared-memory stage of stage_cap entries; entries past it go straight
// to the row's buffer by a warp-aggregated global reservation (a rare path: a piece with more
// candidates than its stage, e.g. a plateau at the threshold).
struct StagedSink {
    u32* pos;
    u32* bits;
    int* staged;             // shared counter
    int stage_cap;
    int* count;              // &count[t], global
    int capacity;
    int* out_idx;            // row t's buffers
    u32* out_val;
    int slot, gslot;
    __device__ __forceinline__ void reserve(int mine) {
        slot = warp_reserve(mine, staged);
        gslot = warp_reserve(min(max(slot + mine - stage_cap, 0), mine), count);
    }
    __device__ __forceinline__ void put(u32 p, u32 b) {
        if (slot < stage_cap) {
            pos[slot] = p;
            bits[slot] = b;
        } else {
            if (gslot < capacity) { out_idx[gslot] = (int)p; out_val[gslot] = b; }   // never at or past capacity
            ++gslot;
        }
        ++slot;
    }
};
}  // namespace hytopk

// Stages 1-4 on a table, one block of SAMPLE_BLOCK threads per row: the M[t] samples of
// CONTRACT.md §3.2 (at most MAX_SAMPLES read), the r[t]-th best key by the block radix select.
// T[t] is that key's canonical score (bits_of_key: only the key matters, §3.4); NaN for an
// empty context or M <= 0. lo/hi are clamped into [0, L] (never a read outside the row).
// zero_count / zero_one (may be null): count[t] = 0 and *zero_one = 0 for the launches that
// follow (a planned call's filter counts and check counter: two memsets fewer).
template <class Src>
__global__ void __launch_bounds__(SAMPLE_BLOCK)
hytopk_table_threshold(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                       const int* __restrict__ hi, const int* __restrict__ M, const int* __restrict__ r,
                       u32* __restrict__ T, int* __restrict__ zero_count, int* __restrict__ zero_one) {
    __shared__ u32 keys[MAX_SAMPLES];
    __shared__ u32 hist[RADIX];
    __shared__ SelectScalars sc;
    const int t = blockIdx.x;
    if (t >= n) return;
    if (threadIdx.x == 0 && zero_count != nullptr) zero_count[t] = 0;
    if (threadIdx.x == 0 && t == 0 && zero_one != nullptr) *zero_one = 0;
    const long long a = min(max((long long)lo[t], 0LL), L);
    const long long c = min(max((long long)hi[t], a), L) - a;
    const int Mt = M[t];
    if (Mt <= 0 || c <= 0) {
        if (threadIdx.x == 0) T[t] = 0x7fc00000u;
        return;
    }
    const int m = min(Mt, (int)MAX_SAMPLES);
    gather_sample_keys<Src, SAMPLE_PER>(table, (long long)t * L + a, c, Mt, m, keys);
    __syncthreads();
    const u32 rank = (u32)min(max(r[t], 1), m);
    auto sample_key = [&](long long j, u32* out) { *out = keys[j]; return true; };
    const u32 kstar = block_radix_select_keys<true>(sample_key, m, rank, hist, &sc);
    if (threadIdx.x == 0) T[t] = bits_of_key(kstar);
}

// Stage 5 on a table. grid: n * pieces blocks of STREAM_BLOCK threads; block t * pieces + j
// streams vectors [j * piece_vecs, (j + 1) * piece_vecs) of row t's context (counted from the
// vector holding its first element; pieces past the context return at once). count must be
// zeroed; count[t] ends as the true number of candidates; only slots < capacity are written.
// ahead: how many steps ahead of its loads the block has the L2 prefetch (0: none).
// smem: 2 * stage_cap + 2 words.
template <class Src>
__global__ void __launch_bounds__(STREAM_BLOCK, STREAM_MIN_BLOCKS)
hytopk_table_filter_pieces(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                           const int* __restrict__ hi, const u32* __restrict__ T, int capacity, int pieces,
                           long long piece_vecs, int stage_cap, int aligned, int ahead, int* __restrict__ cand_idx,
                           u32* __restrict__ cand_val, int* __restrict__ count) {
    constexpr int P = TableVec<Src>::PER_VEC;
    extern __shared__ __align__(16) u32 smem[];
    const long long blk = blockIdx.x;
    const int t = (int)(blk / pieces);
    if (t >= n) return;
    const long long j = blk - (long long)t * pieces;
    const long long row0 = (long long)t * L;
    const long long a = min(max((long long)lo[t], 0LL), L);            // clamped: never a read outside the row
    const long long c = min(max((long long)hi[t], a), L) - a;
    if (c <= 0) return;
    const long long v_row = (row0 + a) / P, v_row_end = (row0 + a + c + P - 1) / P;
    const long long v_first = v_row + j * piece_vecs;
    const long long v_stop = min(v_row_end, v_first + piece_vecs);
    if (v_first >= v_stop) return;                                    // uniform over the block
    int* staged = reinterpret_cast<int*>(smem);
    int* base = staged + 1;
    u32* spos = smem + 2;
    u32* sbits = spos + stage_cap;
    if (threadIdx.x == 0) *staged = 0;
    __syncthreads();
    const long long out = (long long)t * capacity;
    StagedSink sink = {spos, sbits, staged, stage_cap, count + t, capacity, cand_idx + out, cand_val + out, 0, 0};
    stream_row<Src, StreamU<Src>::U>(table, (long long)n * L, aligned, row0, a, c, v_first, v_stop,
                              KeyAtLeast::of(T[t]), sink, ahead);
    __syncthreads();
    const int m = min(*staged, stage_cap);
    if (m == 0) return;                                               // uniform
    if (threadIdx.x == 0) *base = atomicAdd(count + t, m);
    __syncthreads();
    const int b0 = *base;
    for (int i = threadIdx.x; i < m && b0 + i < capacity; i += blockDim.x) {   // coalesced, never past capacity
        cand_idx[out + b0 + i] = (int)spos[i];
        cand_val[out + b0 + i] = sbits[i];
    }
}

// HyTopK over a table, one block of THREADS threads per row (grid: n blocks; smem:
// table_fused_smem_words(k, cap) words; cap >= MAX_SAMPLES / 2). A context of c <= k is
// returned whole, sorted. Else: M and r as CONTRACT.md §3.1/3.3 say (float64, that order),
// the r-th best sample key K*, one streaming read of the row collecting every key >= K* into
// shared memory (count_out[t] = the true count, §3.5), and when k <= count <= cap the exact
// select writes the row (fast: block_select_fast first; else or when it declines: key select,
// position select among the ties, bitonic sort).
// A row whose count is < k or > cap is appended to flagged[0 .. *nflagged) (*nflagged zeroed
// before) and its output left for hytopk_table_topk_listed.
// ahead > 0: the L2 prefetches the row's first `ahead` steps before the samples are read (they
// arrive while T is selected) and stays `ahead` steps ahead of the read.
template <class Src, int THREADS>
__device__ __forceinline__ void table_fused_body(u32* smem, const void* __restrict__ table, long long L, int n,
                                                 const int* __restrict__ lo, const int* __restrict__ hi, int k,
                                                 int cap, int aligned, int ahead, double oversample, int fast,
                                                 int* __restrict__ count_out, int* __restrict__ flagged,
                                                 int* __restrict__ nflagged, int* __restrict__ idx,
                                                 float* __restrict__ val) {
    constexpr int P = TableVec<Src>::PER_VEC;
    constexpr int U = P == 4 ? 4 : 2;             // 64 / 32 bytes in flight per thread: 64 registers, no spill
    constexpr bool PF = P == 4;                   // float32: + the L2 prefetch (bf16: it would spill)
    // sample loads in flight per thread: all of them at >= 512 threads, at most 16 (registers)
    constexpr int PER = MAX_SAMPLES / THREADS < 16 ? MAX_SAMPLES / THREADS : 16;
    const int t = blockIdx.x;
    if (t >= n) return;
    u32* hist = smem;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(smem + RADIX);
    int* ncand = reinterpret_cast<int*>(smem + RADIX + 4);
    const int KW = sort_slots_v2(k);
    u64* word = reinterpret_cast<u64*>(smem + RADIX + 6);      // 262 words: 8-byte aligned
    u32* wbits = reinterpret_cast<u32*>(word + KW);
    u32* cpos = wbits + KW;
    u32* cbits = cpos + cap;

    const long long row0 = (long long)t * L;
    const long long a = min(max((long long)lo[t], 0LL), L);            // clamped: never a read outside the row
    const long long c = min(max((long long)hi[t], a), L) - a;
    int* out_idx = idx + (long long)t * k;
    float* out_val = val + (long long)t * k;

    if (c <= k) {                                   // the whole context, sorted (nothing sampled)
        for (long long i = threadIdx.x; i < c; i += blockDim.x) {
            const u32 b = TableVec<Src>::bits_at(table, row0 + a + i);
            word[i] = ((u64)order_key_bits(b) << 32) | (u64)(~(u32)(a + i));
            wbits[i] = b;
        }
        if (threadIdx.x == 0) count_out[t] = (int)c;
        __syncthreads();
        sort_desc_v2(word, wbits, (int)c);
        write_row(word, wbits, (int)c, k, out_idx, out_val);
    } else {
        if (PF && ahead > 0 && aligned && threadIdx.x == 0)     // the row's head, fetched while T is selected
            prefetch_vectors(table, (row0 + a) / P, (long long)ahead * U * blockDim.x, (row0 + a + c + P - 1) / P,
                             (long long)n * L / P);
        // CONTRACT.md §3.1-3.3: M samples at a + (j * c) // M, rank r (float64, that order).
        const long long Ml = min(c, min(max(c / SAMPLE_STRIDE, MIN_SAMPLES), MAX_SAMPLES));
        double rd = ceil(((oversample * (double)k) * (double)Ml) / (double)c);
        rd = fmin((double)Ml, rd);
        const u32 r = (u32)max(1LL, min(Ml, (long long)fmax(rd, 1.0)));
        u32* skeys = cpos;                          // M <= 2 * cap words: cpos, then cbits
        gather_sample_keys<Src, PER>(table, row0 + a, c, Ml, (int)Ml, skeys);
        __syncthreads();
        auto sample_key = [&](long long q, u32* out) { *out = skeys[q]; return true; };
        const u32 kstar = block_radix_select_keys<true>(sample_key, Ml, r, hist, sc);
        if (threadIdx.x == 0) *ncand = 0;
        __syncthreads();                            // the samples are dead: the candidates overwrite them
        SmemSink sink = {cpos, cbits, ncand, cap, 0};
        const long long P_ = P;
        stream_row<Src, U, SmemSink, PF>(table, (long long)n * L, aligned, row0, a, c, (row0 + a) / P_,
                           (row0 + a + c + P_ - 1) / P_, KeyAtLeast::of(bits_of_key(kstar)), sink, ahead);
        __syncthreads();
        const int cnt = *ncand;
        const bool ok = cnt >= k && cnt <= cap;     // CONTRACT.md §3.6 against the shared-memory cap
        if (threadIdx.x == 0) {
            count_out[t] = cnt;
            if (!ok) flagged[atomicAdd(nflagged, 1)] = t;     // < n slots: one per row at most
        }
        if (!ok) return;                            // uniform: hytopk_table_topk_listed writes this row
        const SmemEntries ce = {cpos, cbits};
        __syncthreads();                            // every *ncand read: the fast select's scratch covers it
        select_row_best<(FAST_NB_MAX / THREADS > 0 ? FAST_NB_MAX / THREADS : 1)>(
            ce, cnt, k, fast, hist, sc, word, wbits, RADIX + 6 + 3LL * KW, out_idx, out_val);
    }
}


// The shipped configuration: 512 threads, two blocks per SM (64 registers).
template <class Src>
__global__ void __launch_bounds__(SAMPLE_BLOCK, 2)
hytopk_table_fused(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                   const int* __restrict__ hi, int k, int cap, int aligned, int ahead, double oversample, int fast,
                   int* __restrict__ count_out, int* __restrict__ flagged, int* __restrict__ nflagged,
                   int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_fused_body<Src, SAMPLE_BLOCK>(smem, table, L, n, lo, hi, k, cap, aligned, ahead, oversample, fast,
                                        count_out, flagged, nflagged, idx, val);
}

// The same kernel at THREADS threads and MINB blocks per SM (table_v2.py FUSED_CONFIGS, the
// bench's --fused-sweep): more, smaller blocks keep an SM's read going while one of them selects.
template <class Src, int THREADS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
hytopk_table_fused_cfg(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                       const int* __restrict__ hi, int k, int cap, int aligned, int ahead, double oversample,
                       int fast, int* __restrict__ count_out, int* __restrict__ flagged,
                       int* __restrict__ nflagged, int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_fused_body<Src, THREADS>(smem, table, L, n, lo, hi, k, cap, aligned, ahead, oversample, fast, count_out,
                                   flagged, nflagged, idx, val);
}

// Stage 8 with the candidates in shared memory (select_smem_rows, hytopk_select_fast.cuh): each
// row's m = min(count, capacity) stored candidates are read once, coalesced, into shared memory
// when m <= cap (else selected from global memory, as hytopk_select_bitonic does); fast:
// block_select_fast (a histogram over the key range, ranks inside the bins: no sort), else or
// when it declines the key select, position select among the ties and register bitonic sort.
// grid: n blocks of SAMPLE_BLOCK threads; smem: select_smem_words(k, cap) words.
extern "C" __global__ void __launch_bounds__(SAMPLE_BLOCK, 2)
hytopk_select_smem(int n, const int* __restrict__ cand_idx, const u32* __restrict__ cand_val,
                   const int* __restrict__ count, int capacity, int k, int cap, int* __restrict__ idx,
                   float* __restrict__ val, int fast) {
    extern __shared__ __align__(16) u32 smem[];
    select_smem_rows(smem, n, cand_idx, cand_val, count, capacity, k, cap, fast, idx, val);
}
