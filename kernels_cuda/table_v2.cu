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

// Sort slots of the v2 selects: sort_desc_v2 pads to at least one word per thread of the block.
__host__ __device__ constexpr int sort_slots_v2(int k, int threads = SAMPLE_BLOCK) {
    return next_pow2(k) > threads ? next_pow2(k) : threads;
}

// Shared memory of hytopk_table_fused in u32 words: 256-bin histogram, select scalars (4),
// candidate counter + pad (2), sort_slots_v2(k) (u64 word, u32 bits) sort slots, cap (position,
// bits) candidates; the samples (<= MAX_SAMPLES keys) use the candidate area first.
__host__ __device__ constexpr long long table_fused_smem_words(int k, int cap, int threads = SAMPLE_BLOCK) {
    return RADIX + 6 + 3LL * sort_slots_v2(k, threads) + 2LL * cap;
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

namespace hytopk {
// The fused kernels' shared memory (table_fused_smem_words): 256-bin histogram, select scalars,
// candidate counter + a spare counter, the sort slots (u64 words, then u32 bits), cap
// (position, bits) candidates.
struct FusedSmem {
    u32* hist;
    SelectScalars* sc;
    int* ncand;
    int* nspare;
    u64* word;
    u32* wbits;
    u32* cpos;
    u32* cbits;
    int KW;
    __device__ __forceinline__ static FusedSmem of(u32* smem, int k, int cap, int threads) {
        FusedSmem f;
        f.hist = smem;
        f.sc = reinterpret_cast<SelectScalars*>(smem + RADIX);
        f.ncand = reinterpret_cast<int*>(smem + RADIX + 4);
        f.nspare = f.ncand + 1;
        f.KW = sort_slots_v2(k, threads);
        f.word = reinterpret_cast<u64*>(smem + RADIX + 6);      // 262 words: 8-byte aligned
        f.wbits = reinterpret_cast<u32*>(f.word + f.KW);
        f.cpos = f.wbits + f.KW;
        f.cbits = f.cpos + cap;
        return f;
    }
};

// CONTRACT.md §3.1-3.3: M samples at a + (j * c) // M, rank r (float64, that order).
struct SamplePlan {
    long long M;
    u32 r;
    __device__ __forceinline__ static SamplePlan of(long long c, int k, double oversample) {
        SamplePlan p;
        p.M = min(c, min(max(c / SAMPLE_STRIDE, MIN_SAMPLES), MAX_SAMPLES));
        double rd = ceil(((oversample * (double)k) * (double)p.M) / (double)c);
        rd = fmin((double)p.M, rd);
        p.r = (u32)max(1LL, min(p.M, (long long)fmax(rd, 1.0)));
        return p;
    }
};

// A context of c <= k: returned whole, sorted (nothing sampled).
template <class Src>
__device__ __forceinline__ void fused_whole_row(const FusedSmem& f, const void* __restrict__ table, int t,
                                                long long row0, long long a, long long c, int k,
                                                int* __restrict__ count_out, int* out_idx, float* out_val) {
    for (long long i = threadIdx.x; i < c; i += blockDim.x) {
        const u32 b = TableVec<Src>::bits_at(table, row0 + a + i);
        f.word[i] = ((u64)order_key_bits(b) << 32) | (u64)(~(u32)(a + i));
        f.wbits[i] = b;
    }
    if (threadIdx.x == 0) count_out[t] = (int)c;
    __syncthreads();
    sort_desc_v2(f.word, f.wbits, (int)c);
    write_row(f.word, f.wbits, (int)c, k, out_idx, out_val);
}

// The cnt candidates (every key >= the contract's K*) in cpos/cbits: count_out[t] = cnt, then the
// check of CONTRACT.md §3.6 against the shared-memory cap (a failing row is listed in flagged for
// hytopk_table_topk_listed), else the exact select writes the row.
template <int THREADS>
__device__ __forceinline__ void fused_finish(const FusedSmem& f, int t, int cnt, int k, int cap, int fast,
                                             int* __restrict__ count_out, int* __restrict__ flagged,
                                             int* __restrict__ nflagged, int* out_idx, float* out_val) {
    const bool ok = cnt >= k && cnt <= cap;
    if (threadIdx.x == 0) {
        count_out[t] = cnt;
        if (!ok) flagged[atomicAdd(nflagged, 1)] = t;     // < n slots: one per row at most
    }
    if (!ok) return;                            // uniform: hytopk_table_topk_listed writes this row
    const SmemEntries ce = {f.cpos, f.cbits};
    __syncthreads();                            // every *ncand read: the fast select's scratch covers it
    select_row_best<(FAST_NB_MAX / THREADS > 0 ? FAST_NB_MAX / THREADS : 1)>(
        ce, cnt, k, fast, f.hist, f.sc, f.word, f.wbits, RADIX + 6 + 3LL * f.KW, out_idx, out_val);
}

// Register budget of the fused streams: 64 / 32 bytes in flight per thread (64 registers, no
// spill); the L2 prefetch for float32 only (bf16: it would spill).
template <class Src> struct FusedStream {
    static constexpr int P = TableVec<Src>::PER_VEC;
    static constexpr int U = P == 4 ? 4 : 2;
    static constexpr bool PF = P == 4;
};

// The row's head to the L2 (ahead steps), fetched while a threshold is selected.
template <class Src>
__device__ __forceinline__ void fused_head_prefetch(const void* table, long long L, int n, long long row0,
                                                    long long a, long long c, int aligned, int ahead) {
    using S = FusedStream<Src>;
    constexpr int P = S::P;
    if (S::PF && ahead > 0 && aligned && threadIdx.x == 0)
        prefetch_vectors(table, (row0 + a) / P, (long long)ahead * S::U * blockDim.x, (row0 + a + c + P - 1) / P,
                         (long long)n * L / P);
}

// K* of a row: the r-th best key of the contract's M samples (read into f.cpos: the candidates
// overwrite them next).
template <class Src, int PER>
__device__ __forceinline__ u32 fused_sample_key(const FusedSmem& f, const void* __restrict__ table, long long g_a,
                                                long long c, const SamplePlan& sp) {
    u32* skeys = f.cpos;                        // M <= 2 * cap words: cpos, then cbits
    gather_sample_keys<Src, PER>(table, g_a, c, sp.M, (int)sp.M, skeys);
    __syncthreads();
    auto sample_key = [&](long long q, u32* out) { *out = skeys[q]; return true; };
    return block_radix_select_keys<true>(sample_key, sp.M, sp.r, f.hist, f.sc);
}

// One streaming read of the row collecting every key >= key into shared memory (up to cap);
// returns the true count.
template <class Src>
__device__ __forceinline__ int fused_collect(const FusedSmem& f, const void* __restrict__ table, long long L, int n,
                                             long long row0, long long a, long long c, int cap, int aligned,
                                             int ahead, u32 key) {
    using S = FusedStream<Src>;
    constexpr long long P = S::P;
    if (threadIdx.x == 0) *f.ncand = 0;
    __syncthreads();                            // the samples are dead: the candidates overwrite them
    SmemSink sink = {f.cpos, f.cbits, f.ncand, cap, 0};
    stream_row<Src, S::U, SmemSink, S::PF>(table, (long long)n * L, aligned, row0, a, c, (row0 + a) / P,
                                           (row0 + a + c + P - 1) / P, KeyAtLeast::of(bits_of_key(key)), sink,
                                           ahead);
    __syncthreads();
    return *f.ncand;
}

// The two-read row of hytopk_table_fused: the contract's M samples, K* = their r-th best key, one
// streaming read collecting every key >= K* into shared memory, fused_finish.
template <class Src, int THREADS>
__device__ __forceinline__ void fused_sampled_row(const FusedSmem& f, const void* __restrict__ table, long long L,
                                                  int n, int t, long long row0, long long a, long long c, int k,
                                                  int cap, int aligned, int ahead, double oversample, int fast,
                                                  bool head_prefetch, int* __restrict__ count_out,
                                                  int* __restrict__ flagged, int* __restrict__ nflagged,
                                                  int* out_idx, float* out_val) {
    // sample loads in flight per thread: all of them at >= 512 threads, at most 16 (registers)
    constexpr int PER = MAX_SAMPLES / THREADS < 16 ? MAX_SAMPLES / THREADS : 16;
    if (head_prefetch) fused_head_prefetch<Src>(table, L, n, row0, a, c, aligned, ahead);
    const SamplePlan sp = SamplePlan::of(c, k, oversample);
    const u32 kstar = fused_sample_key<Src, PER>(f, table, row0 + a, c, sp);
    const int cnt = fused_collect<Src>(f, table, L, n, row0, a, c, cap, aligned, ahead, kstar);
    fused_finish<THREADS>(f, t, cnt, k, cap, fast, count_out, flagged, nflagged, out_idx, out_val);
}
}  // namespace hytopk

// HyTopK over a table, one block of THREADS threads per row (grid: n blocks; smem:
// table_fused_smem_words(k, cap, THREADS) words; cap >= MAX_SAMPLES / 2). A context of c <= k is
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
    const int t = blockIdx.x;
    if (t >= n) return;
    const FusedSmem f = FusedSmem::of(smem, k, cap, THREADS);
    const long long row0 = (long long)t * L;
    const long long a = min(max((long long)lo[t], 0LL), L);            // clamped: never a read outside the row
    const long long c = min(max((long long)hi[t], a), L) - a;
    int* out_idx = idx + (long long)t * k;
    float* out_val = val + (long long)t * k;
    if (c <= k)
        fused_whole_row<Src>(f, table, t, row0, a, c, k, count_out, out_idx, out_val);
    else
        fused_sampled_row<Src, THREADS>(f, table, L, n, t, row0, a, c, k, cap, aligned, ahead, oversample, fast, true,
                                        count_out, flagged, nflagged, out_idx, out_val);
}

namespace hytopk {
constexpr int PRE_SAMPLES = 1024;        // the one-read kernel's pre-sample (a subset of the contract's samples)

// T0 of the one-read row: the rank0-th best key of `pre` of the contract's samples, j = q * M // pre
// (every load of a thread in flight).
template <class Src, int THREADS>
__device__ __forceinline__ u32 fused_pre_threshold(const FusedSmem& f, const void* __restrict__ table, long long g_a,
                                                   long long c, long long M, int pre, u32 rank0) {
    constexpr int PPER = PRE_SAMPLES / THREADS > 0 ? PRE_SAMPLES / THREADS : 1;
    const int tid = (int)threadIdx.x;
    u32* pkeys = f.cpos;
    for (int q0 = 0; q0 < pre; q0 += PPER * THREADS) {
        u32 b[PPER];
#pragma unroll
        for (int i = 0; i < PPER; ++i) {
            const long long q = q0 + i * THREADS + tid;
            b[i] = q < pre ? TableVec<Src>::bits_at(table, g_a + (q * M / pre) * c / M) : 0u;
        }
#pragma unroll
        for (int i = 0; i < PPER; ++i)
            if (q0 + i * THREADS + tid < pre) pkeys[q0 + i * THREADS + tid] = order_key_bits(b[i]);
    }
    __syncthreads();
    auto pre_key = [&](long long q, u32* out) { *out = pkeys[q]; return true; };
    return block_radix_select_keys<true>(pre_key, pre, rank0, f.hist, f.sc);
}

// After the one-read stream collected every key >= T0 (true count cnt0): when cnt0 <= cap, the
// collected at the contract's sample positions are exactly the samples with key >= T0; when there
// are >= r of them, K* (their r-th best) >= T0 and every key >= K* is in the collection: those are
// compacted in place, counted and finished (fused_finish). Else false (uniform): the caller reads
// the row again with K*.
template <int THREADS>
__device__ __forceinline__ bool fused_one_read_finish(const FusedSmem& f, int t, long long a, long long c,
                                                      long long M, u32 r, int cnt0, int k, int cap, int fast,
                                                      int* __restrict__ count_out, int* __restrict__ flagged,
                                                      int* __restrict__ nflagged, int* out_idx, float* out_val) {
    if (cnt0 > cap) return false;               // the collection overflowed
    const int tid = (int)threadIdx.x;
    // sample positions x = floor(j c / M): j = ceil(x M / c) (a float64 estimate corrected exactly;
    // x M < 2^44) with j c < (x + 1) M. Their keys -> the sort slots (3 KW words).
    u32* skeys = reinterpret_cast<u32*>(f.word);
    const int SW = 3 * f.KW;
    const double inv_c = 1.0 / (double)c;
    const int round0 = (cnt0 + THREADS - 1) / THREADS * THREADS;
    for (int i = tid; i < round0; i += THREADS) {
        bool is = false;
        u32 key = 0u;
        if (i < cnt0) {
            const long long num = ((long long)f.cpos[i] - a) * M;
            long long j = (long long)((double)num * inv_c);
            while (j * c < num) ++j;
            while (j > 0 && (j - 1) * c >= num) --j;
            is = j < M && j * c < num + M;
            key = order_key_bits(f.cbits[i]);
        }
        const int slot = warp_append_slot(is, f.nspare);
        if (is && slot < SW) skeys[slot] = key;
    }
    __syncthreads();
    const int s0 = *f.nspare;
    if (s0 < (int)r || s0 > SW) return false;   // K* < T0 (or too many samples kept)
    auto skey = [&](long long q, u32* out) { *out = skeys[q]; return true; };
    const u32 kstar = block_radix_select_keys<true>(skey, s0, r, f.hist, f.sc);
    if (tid == 0) *f.ncand = 0;                 // every cnt0 read: barriers in the select
    // keep key >= K*, compacted in place one chunk of THREADS at a time: a chunk's kept land below
    // its end, and each chunk is read before anything is written over it (the barrier)
    for (int base = 0; base < cnt0; base += THREADS) {
        const int i = base + tid;
        u32 p = 0u, b = 0u;
        bool keep = false;
        if (i < cnt0) {
            p = f.cpos[i];
            b = f.cbits[i];
            keep = order_key_bits(b) >= kstar;
        }
        __syncthreads();
        const int slot = warp_append_slot(keep, f.ncand);
        if (keep) { f.cpos[slot] = p; f.cbits[slot] = b; }
    }
    __syncthreads();
#ifdef HYTOPK_EMU_ONE_READ_HOOK
    HYTOPK_EMU_ONE_READ_HOOK(t);                // the CPU emulation counts the rows read once
#endif
    fused_finish<THREADS>(f, t, *f.ncand, k, cap, fast, count_out, flagged, nflagged, out_idx, out_val);
    return true;
}
}  // namespace hytopk

// hytopk_table_fused's rows reading the table once (issue 21 at 128K keys; perf_notes "The
// table path reading each row once"): the same outputs, counts and listed rows, bit for bit.
// A row reads once when its plan leaves room: pre = min(PRE_SAMPLES, M / 2) >= 64 and, with
// fh = min(cap / c, 3 KW / M) and f0 = (r / M + fh) / 2, the margin (fh - r / M) / 2 >= z sqrt(f0 (1 - f0)
// / pre) standard deviations of T0's fraction (z < 0: always). Then T0 = the ceil(f0 pre)-th best of
// pre of the contract's samples: halfway between r / M (a T0 above the contract's K* misses
// candidates) and fh (a looser one overflows the collection or the sample slots); one stream collects every key >= T0 and
// fused_one_read_finish ends the row. Else, or when it cannot: the two-read row of
// hytopk_table_fused (the contract's samples, K*, a stream collecting key >= K*). One stream in
// the code, run once or twice (the registers of one).
template <class Src, int THREADS>
__device__ __forceinline__ void table_fused1_body(u32* smem, const void* __restrict__ table, long long L, int n,
                                                  const int* __restrict__ lo, const int* __restrict__ hi, int k,
                                                  int cap, int aligned, int ahead, double oversample, int fast,
                                                  double z, int* __restrict__ count_out, int* __restrict__ flagged,
                                                  int* __restrict__ nflagged, int* __restrict__ idx,
                                                  float* __restrict__ val) {
    constexpr int PER = MAX_SAMPLES / THREADS < 16 ? MAX_SAMPLES / THREADS : 16;
    const int t = blockIdx.x;
    if (t >= n) return;
    const FusedSmem f = FusedSmem::of(smem, k, cap, THREADS);
    const long long row0 = (long long)t * L;
    const long long a = min(max((long long)lo[t], 0LL), L);            // clamped: never a read outside the row
    const long long c = min(max((long long)hi[t], a), L) - a;
    if (c <= k) {
        fused_whole_row<Src>(f, table, t, row0, a, c, k, count_out, idx + (long long)t * k, val + (long long)t * k);
        return;
    }
    fused_head_prefetch<Src>(table, L, n, row0, a, c, aligned, ahead);
    const SamplePlan sp = SamplePlan::of(c, k, oversample);
    const int pre = (int)min((long long)PRE_SAMPLES, sp.M / 2);
    // upper end: the collection's cap, and the sort slots that take the collected samples' keys
    const double fl = (double)sp.r / (double)sp.M, fh = fmin((double)cap / (double)c, 3.0 * f.KW / (double)sp.M);
    const double f0 = 0.5 * (fl + fh);
    bool once = pre >= 64 && (z < 0.0 || 0.5 * (fh - fl) >= z * sqrt(fmax(f0 * (1.0 - f0), 0.0) / pre));
    for (;;) {                                  // at most twice: T0 (once), then K*
        u32 key;
        if (once) {
            key = fused_pre_threshold<Src, THREADS>(f, table, row0 + a, c, sp.M, pre,
                                                    (u32)fmin((double)pre, fmax(1.0, ceil(f0 * (double)pre))));
            if (threadIdx.x == 0) *f.nspare = 0;
        } else {
            key = fused_sample_key<Src, PER>(f, table, row0 + a, c, sp);
        }
        const int cnt = fused_collect<Src>(f, table, L, n, row0, a, c, cap, aligned, ahead, key);
        if (!once) {
            fused_finish<THREADS>(f, t, cnt, k, cap, fast, count_out, flagged, nflagged, idx + (long long)t * k,
                                  val + (long long)t * k);
            return;
        }
        if (fused_one_read_finish<THREADS>(f, t, a, c, sp.M, sp.r, cnt, k, cap, fast, count_out, flagged, nflagged,
                                           idx + (long long)t * k, val + (long long)t * k))
            return;
        __syncthreads();                        // every read of the collection is done: the samples overwrite it
        once = false;
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

// The one-read fused kernel (table_fused1_body) at THREADS threads and MINB blocks per SM
// (table_v2.py FUSED_ONE_READ, instantiations.FUSED1_CONFIGS); same shared memory as
// hytopk_table_fused; z: table_v2.py FUSED_ONE_READ_Z.
template <class Src, int THREADS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
hytopk_table_fused1(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                    const int* __restrict__ hi, int k, int cap, int aligned, int ahead, double oversample, int fast,
                    double z, int* __restrict__ count_out, int* __restrict__ flagged, int* __restrict__ nflagged,
                    int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_fused1_body<Src, THREADS>(smem, table, L, n, lo, hi, k, cap, aligned, ahead, oversample, fast, z, count_out,
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
