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
// Probe builds (scripts/probe_fused_phases.py; both off in the shipped build):
// HYTOPK_FUSED_TRACE=1: each row t of hytopk_table_fused (one block a row) records the %globaltimer
// at its start (slot 0), samples in shared memory (1), threshold known (2), stream done (3), select
// staged (4: hytopk_select_fast.cuh's HYTOPK_SELECT_STAGED_HOOK) and end (5), its SM (6) and count
// (7) in hytopk_fused_trace[t * 8 + slot] (t < FUSED_TRACE_ROWS), read back by the host.
// HYTOPK_FUSED_STAGGER_NS=X: in the first wave (blockIdx < blocks an SM x SMs) the j-th block of each SM
// starts j X ns late, so that the blocks' fixed work (threshold, select) stops falling together.
#ifndef HYTOPK_FUSED_TRACE
#define HYTOPK_FUSED_TRACE 0
#endif
#ifndef HYTOPK_FUSED_STAGGER_NS
#define HYTOPK_FUSED_STAGGER_NS 0
#endif

__device__ __forceinline__ unsigned fused_nsmid() {     // SMs (an upper bound on their ids)
#if defined(HYTOPK_CPU_EMULATION)
    return 1u;
#else
    unsigned n;
    asm("mov.u32 %0, %%nsmid;" : "=r"(n));
    return n;
#endif
}
#if HYTOPK_FUSED_TRACE || HYTOPK_FUSED_STAGGER_NS
__device__ __forceinline__ unsigned long long fused_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned fused_smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
#endif
#if HYTOPK_FUSED_TRACE
constexpr int FUSED_TRACE_ROWS = 16384;
extern "C" __device__ unsigned long long hytopk_fused_trace[FUSED_TRACE_ROWS * 8];   // C name: read by name
__device__ __forceinline__ void fused_trace(int slot, unsigned long long v) {
    if (threadIdx.x == 0 && blockIdx.x < FUSED_TRACE_ROWS) hytopk_fused_trace[blockIdx.x * 8 + slot] = v;
}
#define HYTOPK_TRACE(slot, v) fused_trace(slot, v)
#define HYTOPK_SELECT_STAGED_HOOK() fused_trace(4, fused_now())
#else
#define HYTOPK_TRACE(slot, v) ((void)0)
#endif
#if HYTOPK_FUSED_STAGGER_NS
extern "C" __device__ unsigned hytopk_sm_arrivals[1024];
// The j-th block of an SM to arrive in the first wave (MINB blocks an SM) waits j x
// HYTOPK_FUSED_STAGGER_NS (the arrivals are consecutive on the SM's counter, whatever it held before).
__device__ __forceinline__ void fused_stagger(int minb) {
    if (blockIdx.x >= minb * fused_nsmid()) return;   // uniform
    if (threadIdx.x == 0) {
        const unsigned j = atomicAdd(&hytopk_sm_arrivals[fused_smid() & 1023u], 1u) % (unsigned)minb;
        const unsigned long long t0 = fused_now();
        while (fused_now() - t0 < j * (unsigned long long)HYTOPK_FUSED_STAGGER_NS) __nanosleep(500);
    }
    __syncthreads();
}
#endif
#include "hytopk_select_fast.cuh"
#include "hytopk_cluster.cuh"
using namespace hytopk;
using namespace hytopk::cl;

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

// The fused kernel's candidate cap at k = 2048, (512, 2) (table_v2.py cap_for(2048, 512, 2)): with it
// the stream's appends address the bits at an immediate offset from the positions
// (SmemSinkT<FUSED_FIXED_CAP>: ~5 instructions a stream position against ~8; any other cap takes the
// general sink, same results). HYTOPK_FUSED_FIXED=0 (the bench's "general" build): the general sink
// there too. At 4096 x 131072 float32, k = 2048 (H200 2026-12-01 s7): (512, 2) ran 0.631 ms with them
// against 0.640 without (run 4); (256, 3) with them at its own cap (6144) ran slower, 0.677 against
// 0.656 (run 1), for fewer instructions (~377 a warp step, ~186 of them the appends).
#ifndef HYTOPK_FUSED_FIXED
#define HYTOPK_FUSED_FIXED 1
#endif
constexpr int FUSED_FIXED_CAP = HYTOPK_FUSED_FIXED ? 10752 : 0;
constexpr int FUSED_FIXED_CAP_X3 = HYTOPK_FUSED_FIXED ? 6144 : 0;     // cap_for(2048, 512, 3): the short rows' launch
// HYTOPK_SELECT_HINT=0 (the bench's "nohint" build): the fused kernel's select finds its candidates'
// key range itself (fused_hint).
#ifndef HYTOPK_SELECT_HINT
#define HYTOPK_SELECT_HINT 1
#endif

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
    template <int U, int P>
    __device__ __forceinline__ void put_mask(u32 mask, int mine, int p0, int BP, const u32 (&b)[U][P]) {
        // the whole step in the stage: no per-element checks (float32: bf16's stream spills with it)
        if (P == 4 && slot + mine <= stage_cap) {
            put_unchecked<U, P>(mask, p0, BP, b, pos + slot, bits + slot);
            slot += mine;
        } else {
            put_mask_bits<U, P>(mask, p0, BP, b, [&](u32 p, u32 x) { put(p, x); });
        }
    }
};
}  // namespace hytopk

// Stages 1-4 on a table, one block of SAMPLE_BLOCK threads per row: the M[t] samples of
// CONTRACT.md §3.2 (at most MAX_SAMPLES read), the r[t]-th best key by the block radix select.
// T[t] is that key's canonical score (bits_of_key: only the key matters, §3.4); NaN for an
// empty context or M <= 0. lo/hi are clamped into [0, L] (never a read outside the row).
// zero_count / zero_one (may be null): count[t] = 0 and *zero_one = 0 for the launches that
// follow (a planned call's filter counts and check counter: two memsets fewer).
// runs != 0: the samples in runs of 64 bytes where runs_apply (gather_run_keys), else the contract's.
template <class Src>
__global__ void __launch_bounds__(SAMPLE_BLOCK)
hytopk_table_threshold(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                       const int* __restrict__ hi, const int* __restrict__ M, const int* __restrict__ r,
                       u32* __restrict__ T, int* __restrict__ zero_count, int* __restrict__ zero_one, int runs) {
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
    if (runs && runs_apply(c, Mt))
        gather_run_keys<Src, SAMPLE_PER>(table, (long long)t * L, a, c, Mt, m, keys);
    else
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

// CONTRACT.md §3.1-3.3: M samples at a + (j * c) // M, rank r (float64, that order); min_rank > 0
// (the table top-k's, not the contract's): r at least min(M, min_rank), so a small oversample keeps
// enough samples above T where the samples are sparse (reference.sample_plan's min_rank).
struct SamplePlan {
    long long M;
    u32 r;
    __device__ __forceinline__ static SamplePlan of(long long c, int k, double oversample, int min_rank = 0) {
        SamplePlan p;
        p.M = min(c, min(max(c / SAMPLE_STRIDE, MIN_SAMPLES), MAX_SAMPLES));
        double rd = ceil(((oversample * (double)k) * (double)p.M) / (double)c);
        rd = fmin((double)p.M, rd);
        p.r = (u32)max(1LL, min(p.M, (long long)fmax(rd, 1.0)));
        if (min_rank > 0) p.r = (u32)max((long long)p.r, min(p.M, (long long)min_rank));
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

// count_out[t] = cnt and the check of CONTRACT.md §3.6 against the shared-memory cap: a failing row
// is listed in flagged for hytopk_table_topk_listed (false, uniform).
__device__ __forceinline__ bool fused_check(int t, int cnt, int k, int cap, int* __restrict__ count_out,
                                            int* __restrict__ flagged, int* __restrict__ nflagged) {
    const bool ok = cnt >= k && cnt <= cap;
    if (threadIdx.x == 0) {
        count_out[t] = cnt;
        if (!ok) flagged[atomicAdd(nflagged, 1)] = t;     // < n slots: one per row at most
    }
    return ok;
}

// Most bins per thread of the fast select at THREADS threads.
template <int THREADS> struct FastBins { static constexpr int PB = FAST_NB_MAX / THREADS > 0 ? FAST_NB_MAX / THREADS : 1; };

// The cnt candidates (every key >= the contract's K*) in cpos/cbits: fused_check, then the exact
// select writes the row.
// hint: the candidates' key bounds (fused_sampled_row's), or none.
template <int THREADS>
__device__ __forceinline__ void fused_finish(const FusedSmem& f, int t, int cnt, int k, int cap, int fast,
                                             int* __restrict__ count_out, int* __restrict__ flagged,
                                             int* __restrict__ nflagged, int* out_idx, float* out_val,
                                             const SelectHint& hint = SelectHint()) {
    if (!fused_check(t, cnt, k, cap, count_out, flagged, nflagged)) return;   // uniform: the radix kernel writes it
    const SmemEntries ce = {f.cpos, f.cbits};
    __syncthreads();                            // every *ncand read: the fast select's scratch covers it
    select_row_best<FastBins<THREADS>::PB>(ce, cnt, k, fast, f.hist, f.sc, f.word, f.wbits, RADIX + 6 + 3LL * f.KW,
                                           out_idx, out_val, hint);
}

// The select's bounds on a row's candidates: each key >= kstar (the stream's test), and the best
// sample key (fused_gather_samples' per-warp maxima in f.wbits), about L / M keys below the row's
// best: bins over [kstar, that] are about half as wide near kstar as over the whole range, and the
// ranking's comparisons (the sum of the kept bins' squared sizes) about half. Read again from the
// sort slots here (untouched until the select's barrier, which comes after), not held in a register
// through the stream since fused_sample_key: ptxas spills the 80-register (256, 3) build then.
template <int THREADS>
__device__ __forceinline__ SelectHint fused_hint(const FusedSmem& f, u32 kstar) {
    SelectHint h;
    h.kmin = kstar;
    h.kmax = kstar;
#pragma unroll
    for (int q = 0; q < THREADS / 32; ++q) h.kmax = max(h.kmax, f.wbits[q]);
    h.on = HYTOPK_SELECT_HINT != 0;
    return h;
}

// Register budget of the fused streams: 128 / 32 bytes in flight per thread (64 registers, no
// spill); the L2 prefetch for float32 only (bf16: it would spill).
// HYTOPK_FUSED_U_F32: the float32 stream's vectors a thread per step (8: half the per-step work of
// 4 for the reservation and the loop, 0.668 against 0.700 ms at 4096 x 131072, H200 2026-12-01
// s6 run 3; the bench's --fused-sweep builds 4 too).
#ifndef HYTOPK_FUSED_U_F32
#define HYTOPK_FUSED_U_F32 8
#endif
// HYTOPK_FUSED_HEAD_AFTER_SAMPLES=1: a row's head prefetch is issued once its sample loads are in
// (fused_sample_key's after_gather), not before them: the samples' 256 runs do not queue behind it.
// HYTOPK_FUSED_FIRST_HEAD=X: the first wave's rows prefetch X x ahead steps of their head (while the
// first thresholds are selected, nothing else reads the DRAM).
#ifndef HYTOPK_FUSED_HEAD_AFTER_SAMPLES
#define HYTOPK_FUSED_HEAD_AFTER_SAMPLES 1
#endif
#ifndef HYTOPK_FUSED_FIRST_HEAD
#define HYTOPK_FUSED_FIRST_HEAD 1
#endif
// LANES: threads an SM (threads x blocks of the launch). Past 1024 (the short rows' (512, 3): at most
// 42 registers) the float32 stream takes 4 vectors a step (8 spill 580 bytes there) and its
// immediate-offset appends sit at that launch's cap, 6144.
template <class Src, int LANES = 1024> struct FusedStream {
    static constexpr int P = TableVec<Src>::PER_VEC;
    static constexpr bool WIDE = LANES <= 1024;
    static constexpr int U = P == 4 ? (WIDE ? HYTOPK_FUSED_U_F32 : 4) : 2;
    static constexpr bool PF = P == 4;
    static constexpr int FIXED_CAP = WIDE ? FUSED_FIXED_CAP : FUSED_FIXED_CAP_X3;
};

// The row's head to the L2 (ahead steps), fetched while a threshold is selected.
template <class Src, int LANES = 1024>
__device__ __forceinline__ void fused_head_prefetch(const void* table, long long L, int n, long long row0,
                                                    long long a, long long c, int aligned, int ahead) {
    using S = FusedStream<Src, LANES>;
    constexpr int P = S::P;
    if (S::PF && ahead > 0 && aligned && threadIdx.x == 0)
        prefetch_vectors(table, (row0 + a) / P, (long long)ahead * S::U * blockDim.x, (row0 + a + c + P - 1) / P,
                         (long long)n * L / P);
}

// The M samples of a row as keys (runs != 0: in runs where runs_apply). Not inlined: both gathers
// inlined into the 64-register fused kernels spill.
// wmax[w]: the best key warp w gathered (read by fused_sample_key and fused_hint).
template <class Src, int PER>
__device__ __noinline__ void fused_gather_samples(const void* __restrict__ table, long long row0, long long a,
                                                  long long c, long long M, int runs, u32* skeys, u32* wmax) {
    u32 best;
    if (runs && runs_apply(c, M))
        best = gather_run_keys<Src, PER>(table, row0, a, c, M, (int)M, skeys);
    else
        best = gather_sample_keys<Src, PER>(table, row0 + a, c, M, (int)M, skeys);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, off));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = best;
}

// K* of a row: the r-th best key of the contract's M samples (runs != 0: in runs where runs_apply)
// (read into f.cpos: the candidates overwrite them next); the radix select starts from the best
// sample's digit (HYTOPK_SELECT_HINT).
struct NoAfterGather {
    __device__ __forceinline__ void operator()() const {}
};
template <class Src, int PER, class AfterGather = NoAfterGather>
__device__ __forceinline__ u32 fused_sample_key(const FusedSmem& f, const void* __restrict__ table, long long row0,
                                                long long a, long long c, const SamplePlan& sp, int runs = 0,
                                                int coarse = 0, const AfterGather& after_gather = AfterGather()) {
    u32* skeys = f.cpos;                        // M <= 2 * cap words: cpos, then cbits
    fused_gather_samples<Src, PER>(table, row0, a, c, sp.M, runs, skeys, f.wbits);
    after_gather();
    __syncthreads();
    HYTOPK_TRACE(1, fused_now());
    auto sample_key = [&](long long q, u32* out) { *out = skeys[q]; return true; };
    u32 top = 0u;                               // the best sample key: the select's first digit
    for (int q = 0; q < (int)(blockDim.x >> 5); ++q) top = max(top, f.wbits[q]);
    return block_radix_select_keys<true>(sample_key, sp.M, sp.r, f.hist, f.sc, coarse, HYTOPK_SELECT_HINT ? top : 0u);
}

// One streaming read of the row collecting every key >= key into shared memory (up to cap);
// returns the true count.
template <class Src, int LANES = 1024>
__device__ __forceinline__ int fused_collect(const FusedSmem& f, const void* __restrict__ table, long long L, int n,
                                             long long row0, long long a, long long c, int cap, int aligned,
                                             int ahead, u32 key) {
    using S = FusedStream<Src, LANES>;
    constexpr long long P = S::P;
    if (threadIdx.x == 0) *f.ncand = 0;
    __syncthreads();                            // the samples are dead: the candidates overwrite them
    const KeyAtLeast pass = KeyAtLeast::of(bits_of_key(key));
    bool fixed = false;
    if constexpr (P == 4 && S::FIXED_CAP > 0) {   // float32, T > 0, the op's layout (the bits at a fixed distance)
        fixed = pass.single() && f.cbits == f.cpos + S::FIXED_CAP;
        if (fixed) {
            SmemSinkT<S::FIXED_CAP> sink = {f.cpos, f.cbits, f.ncand, cap, 0};
            stream_row_pass<Src, S::U, SmemSinkT<S::FIXED_CAP>, S::PF, true>(
                table, (long long)n * L, aligned, row0, a, c, (row0 + a) / P, (row0 + a + c + P - 1) / P, pass, sink,
                ahead);
        }
    }
    if (!fixed) {
        SmemSink sink = {f.cpos, f.cbits, f.ncand, cap, 0};
        stream_row<Src, S::U, SmemSink, S::PF>(table, (long long)n * L, aligned, row0, a, c, (row0 + a) / P,
                                               (row0 + a + c + P - 1) / P, pass, sink, ahead);
    }
    __syncthreads();
    return *f.ncand;
}

// The two-read row of hytopk_table_fused: the contract's M samples (runs != 0: in runs where
// runs_apply), K* = their r-th best key, one
// streaming read collecting every key >= K* into shared memory, fused_finish.
template <class Src, int THREADS, int MINB = 2>
__device__ __forceinline__ void fused_sampled_row(const FusedSmem& f, const void* __restrict__ table, long long L,
                                                  int n, int t, long long row0, long long a, long long c, int k,
                                                  int cap, int aligned, int ahead, double oversample, int fast,
                                                  int runs, int min_rank, int coarse, bool head_prefetch,
                                                  int* __restrict__ count_out,
                                                  int* __restrict__ flagged, int* __restrict__ nflagged,
                                                  int* out_idx, float* out_val) {
    // sample loads in flight per thread: all of them at >= 512 threads, at most 16 (registers)
    constexpr int PER = MAX_SAMPLES / THREADS < 16 ? MAX_SAMPLES / THREADS : 16;
    HYTOPK_TRACE(0, fused_now());               // probe builds only (HYTOPK_FUSED_TRACE)
    HYTOPK_TRACE(6, fused_smid());
    const SamplePlan sp = SamplePlan::of(c, k, oversample, min_rank);
    // the first wave's rows (no row streams yet) prefetch HYTOPK_FUSED_FIRST_HEAD x ahead steps
    const int head = HYTOPK_FUSED_FIRST_HEAD > 1 && (int)blockIdx.x < MINB * (int)fused_nsmid()
                         ? HYTOPK_FUSED_FIRST_HEAD * ahead : ahead;
    auto head_pf = [&]() {
        if (head_prefetch) fused_head_prefetch<Src, THREADS * MINB>(table, L, n, row0, a, c, aligned, head);
    };
    if (!HYTOPK_FUSED_HEAD_AFTER_SAMPLES) head_pf();
    const u32 kstar = fused_sample_key<Src, PER>(f, table, row0, a, c, sp, runs, coarse, [&]() {
        if (HYTOPK_FUSED_HEAD_AFTER_SAMPLES) head_pf();
    });
    HYTOPK_TRACE(2, fused_now());
    const int cnt = fused_collect<Src, THREADS * MINB>(f, table, L, n, row0, a, c, cap, aligned, ahead, kstar);
    HYTOPK_TRACE(3, fused_now());
    HYTOPK_TRACE(7, (u64)cnt);
    fused_finish<THREADS>(f, t, cnt, k, cap, fast, count_out, flagged, nflagged, out_idx, out_val,
                          fused_hint<THREADS>(f, kstar));
#if HYTOPK_FUSED_TRACE
    __syncthreads();
    HYTOPK_TRACE(5, fused_now());
#endif
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
// runs != 0: the samples in runs of 64 bytes where runs_apply (same M and r; count_out[t] is then
// the count above that threshold, not the contract's). min_rank > 0: r at least min(M, min_rank);
// coarse > 0: K* rounded down where the radix select's digit holds few samples (block_radix_select_keys;
// table_topk's plan, table.py TOPK_*: counts above that threshold, reference.coarse_key).
template <class Src, int THREADS, int MINB>
__device__ __forceinline__ void table_fused_body(u32* smem, const void* __restrict__ table, long long L, int n,
                                                 const int* __restrict__ lo, const int* __restrict__ hi, int k,
                                                 int cap, int aligned, int ahead, double oversample, int fast,
                                                 int runs, int min_rank, int coarse, int* __restrict__ count_out,
                                                 int* __restrict__ flagged, int* __restrict__ nflagged,
                                                 int* __restrict__ idx, float* __restrict__ val) {
    const int t = blockIdx.x;
    if (t >= n) return;
#if HYTOPK_FUSED_STAGGER_NS
    fused_stagger(MINB);
#endif
    const FusedSmem f = FusedSmem::of(smem, k, cap, THREADS);
    const long long row0 = (long long)t * L;
    const long long a = min(max((long long)lo[t], 0LL), L);            // clamped: never a read outside the row
    const long long c = min(max((long long)hi[t], a), L) - a;
    int* out_idx = idx + (long long)t * k;
    float* out_val = val + (long long)t * k;
    if (c <= k)
        fused_whole_row<Src>(f, table, t, row0, a, c, k, count_out, out_idx, out_val);
    else
        fused_sampled_row<Src, THREADS, MINB>(f, table, L, n, t, row0, a, c, k, cap, aligned, ahead, oversample, fast, runs,
                                        min_rank, coarse, true, count_out, flagged, nflagged, out_idx, out_val);
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
            key = fused_sample_key<Src, PER>(f, table, row0, a, c, sp);
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


// 512 threads, two blocks per SM (64 registers): the launch of long rows and bf16 tables; 128K-key float32
// rows take hytopk_table_fused_cfg<Src, 512, 3> (table_v2.py FUSED_SHORT).
template <class Src>
__global__ void __launch_bounds__(SAMPLE_BLOCK, 2)
hytopk_table_fused(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                   const int* __restrict__ hi, int k, int cap, int aligned, int ahead, double oversample, int fast,
                   int runs, int min_rank, int coarse, int* __restrict__ count_out, int* __restrict__ flagged,
                   int* __restrict__ nflagged,
                   int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_fused_body<Src, SAMPLE_BLOCK, 2>(smem, table, L, n, lo, hi, k, cap, aligned, ahead, oversample, fast, runs,
                                        min_rank, coarse, count_out, flagged, nflagged, idx, val);
}

// The same kernel at THREADS threads and MINB blocks per SM (table_v2.py FUSED_CONFIGS, the
// bench's --fused-sweep): more, smaller blocks keep an SM's read going while one of them selects.
template <class Src, int THREADS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB)
hytopk_table_fused_cfg(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                       const int* __restrict__ hi, int k, int cap, int aligned, int ahead, double oversample,
                       int fast, int runs, int min_rank, int coarse, int* __restrict__ count_out,
                       int* __restrict__ flagged,
                       int* __restrict__ nflagged, int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_fused_body<Src, THREADS, MINB>(smem, table, L, n, lo, hi, k, cap, aligned, ahead, oversample, fast, runs,
                                   min_rank, coarse, count_out, flagged, nflagged, idx, val);
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

namespace hytopk {
// ---- The cluster kernel: rows that fit the shared memory of a cluster, read once (issue 21) ----
// A row's context [a, a + c) is cut into C slices of S elements (S a multiple of P, so every slice
// starts at the same offset h0 inside a 16-byte vector); block q of the cluster holds slice q in a
// buffer whose element j is the table's element (row0 + a + q S) - h0 + j, copied by the bulk copy
// engine (whole vectors inside the table; the vector that reaches past the table's end and every
// element of a table whose base is not 16-byte aligned by ordinary loads).
struct ClusterRow {
    long long row0;
    int a, c, S, h0;
    // lo / hi read through volatile: the kernel re-reads a row's bounds where it needs them
    // instead of keeping them live across the select (registers: 1024 threads leave 64)
    __device__ __forceinline__ static ClusterRow of(int t, long long L, const int* lo, const int* hi, int C, int P) {
        ClusterRow g;
        g.row0 = (long long)t * L;
        const long long a = min(max((long long)*(volatile const int*)(lo + t), 0LL), L);   // clamped: never a read outside the row
        g.a = (int)a;
        g.c = (int)(min(max((long long)*(volatile const int*)(hi + t), a), L) - a);
        g.S = ((g.c + C - 1) / C + P - 1) / P * P;
        g.h0 = (int)((g.row0 + a) % P);
        return g;
    }
    __device__ __forceinline__ int len(int q) const { return min(max(c - q * S, 0), S); }
};

// Element g of the table to element j of a slice buffer (raw bits, the table's width).
template <class Src>
__device__ __forceinline__ void copy_elem(u32* buf, int j, const void* table, long long g) {
    if (TableVec<Src>::PER_VEC == 4) buf[j] = static_cast<const u32*>(table)[g];
    else reinterpret_cast<unsigned short*>(buf)[j] = static_cast<const unsigned short*>(table)[g];
}

// Slice q of row g to buf; exactly one arrival on bar by thread 0 (with the bytes of the bulk copy
// when there is one), whatever the path: a row's wait is always one phase of its buffer's mbarrier.
// use = false (c <= k: the row is not read here) or an empty slice: the arrival only. The ordinary
// loads (an unaligned table, or the vector past the table's end) are stored before this returns;
// the cluster barrier that follows publishes them.
template <class Src>
__device__ __forceinline__ void cluster_load_slice(const ClusterRow& g, int q, bool use, u32* buf, u64* bar,
                                                   const void* table, long long total, int aligned) {
    constexpr long long P = TableVec<Src>::PER_VEC;
    const int len = use ? g.len(q) : 0;
    const long long g_start = g.row0 + g.a + (long long)q * g.S, g_end = g_start + len;
    const long long v0 = (g_start - g.h0) / P, vend = (g_end + P - 1) / P;
    if (len > 0 && !aligned) {
        for (long long j = threadIdx.x; j < (vend - v0) * P; j += blockDim.x) {
            const long long e = v0 * P + j;
            if (e >= g_start && e < g_end) copy_elem<Src>(buf, (int)j, table, e);
        }
    }
    if (threadIdx.x != 0) return;
    if (len <= 0 || !aligned) {
        mbar_arrive_tx(bar, 0u);
        return;
    }
    const long long vb = min(vend, total / P);                         // whole vectors inside the table
    const u32 bytes = (u32)((vb - v0) * 16);
    mbar_arrive_tx(bar, bytes);
    if (bytes > 0u) bulk_load(buf, static_cast<const uint4*>(table) + v0, bytes, bar);
    for (long long e = vb * P; e < g_end; ++e) copy_elem<Src>(buf, (int)(e - v0 * P), table, e);   // past the table's end
}

// The contract's M samples of the row (p_j = a + (j c) // M) as order keys keys[0 .. M), read from
// the slices of every block of the cluster (distributed shared memory), PER loads in flight per thread.
template <class Src, int PER>
__device__ __forceinline__ void cluster_sample_keys(const ClusterRow& g, u32* buf, long long M, u32* keys) {
    const long long B = blockDim.x, c = g.c;
    const long long dq = (B * c) / M, dr = (B * c) % M;
    for (long long q0 = 0; q0 < M; q0 += PER * B) {
        const long long j0 = q0 + threadIdx.x;
        long long Q = (j0 * c) / M, R = (j0 * c) % M;
        u32 sb[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            sb[i] = 0u;
            if (j0 + i * B < M) {
                const u32 rel = (u32)Q, owner = rel / (u32)g.S;
                sb[i] = TableVec<Src>::bits_at(cluster_map(buf, owner), (long long)(rel - owner * (u32)g.S + g.h0));
            }
            Q += dq;
            R += dr;
            if (R >= M) { R -= M; ++Q; }
        }
#pragma unroll
        for (int i = 0; i < PER; ++i)
            if (j0 + i * B < M) keys[j0 + i * B] = order_key_bits(sb[i]);
    }
}

// Every key >= key(T) (tb: T's bits) of this block's slice to the sink, positions as row columns.
template <class Src>
__device__ __forceinline__ void cluster_filter_slice(const ClusterRow& g, int q, const u32* buf, u32 tb, SmemSink& sink) {
    constexpr int P = TableVec<Src>::PER_VEC;
    constexpr int U = 16 / P;                                         // 16 elements per thread per step
    const int len = g.len(q);
    if (len <= 0) return;                                             // uniform over the block
    const int nv = (g.h0 + len + P - 1) / P;
    const u32 col0 = (u32)(g.a + (long long)q * g.S - g.h0);          // column of buffer element 0
    const KeyAtLeast pass = KeyAtLeast::of(tb);
    const int B = (int)blockDim.x;
    for (int vs = 0; vs < nv; vs += U * B) {                          // uniform over the block
        u32 bits[U][P];
        u32 mask = 0u;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int v = vs + u * B + (int)threadIdx.x;
            if (v < nv) {
                TableVec<Src>::unpack(reinterpret_cast<const uint4*>(buf)[v], bits[u]);
#pragma unroll
                for (int e = 0; e < P; ++e) {
                    const int j = v * P + e;
                    mask |= (u32)((u32)(j - g.h0) < (u32)len && pass(bits[u][e])) << (u * P + e);
                }
            }
        }
        sink.reserve(__popc(mask));
        if (mask) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int e = 0; e < P; ++e)
                    if (mask & (1u << (u * P + e)))
                        sink.put(col0 + (u32)((vs + u * B + (int)threadIdx.x) * P + e), bits[u][e]);
        }
    }
}

// The cluster kernel's words between the slice buffers and hytopk_table_fused's layout.
struct ClusterHeader {
    u64 full[2];             // the slice buffers' mbarriers
    u32 tslot;               // K* of this row, from the leader (this block selects the last row)
    u32 bslot;               // this block's first slot in the leader's candidate area
    int recv;                // candidates of the row this block leads (remote atomics)
    int stg;                 // candidates staged here before the copy to the leader
    u32 mode;                // the last row's select, set by its leader: 0 done / nothing, 1 ranks to share, 2 the leader's
    u32 cnt;                 // its candidates
    FastStage st;            // mode 1: what block_select_fast_stage left beside the scratch
};
constexpr int CLUSTER_HEADER_WORDS = 16;
static_assert(sizeof(ClusterHeader) <= 4 * CLUSTER_HEADER_WORDS, "the cluster kernel's header");

// words u32 words from another block's shared memory (distributed) to this block's, both 16-byte
// aligned: 16-byte loads, four of a thread in flight (one round trip, not one per word).
__device__ __forceinline__ void cluster_copy_words(u32* dst, const u32* src, int words) {
    constexpr int D = 4;
    const int n4 = words >> 2, B = (int)blockDim.x;
    for (int i0 = 0; i0 < n4; i0 += D * B) {
        uint4 v[D];
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int i = i0 + d * B + (int)threadIdx.x;
            if (i < n4) v[d] = reinterpret_cast<const uint4*>(src)[i];
        }
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int i = i0 + d * B + (int)threadIdx.x;
            if (i < n4) reinterpret_cast<uint4*>(dst)[i] = v[d];
        }
    }
    for (int i = 4 * n4 + (int)threadIdx.x; i < words; i += B) dst[i] = src[i];
}

// Words of dynamic shared memory of hytopk_table_cluster: two slice buffers of buf_words words
// (a multiple of 4), the header, then hytopk_table_fused's layout.
__host__ __device__ constexpr long long table_cluster_smem_words(int k, int cap, int buf_words, int threads) {
    return 2LL * buf_words + CLUSTER_HEADER_WORDS + table_fused_smem_words(k, cap, threads);
}
}  // namespace hytopk

// HyTopK over a table whose rows fit the shared memory of a cluster of C blocks, each row read
// from global memory once (issue 21 at 128K keys; perf_notes "The cluster kernel"). A persistent
// grid of clusters: cluster i takes rows i, i + nclusters, ...; block q of a cluster holds slice q
// of the row (ClusterRow) in one of two buffers, the next row's slice being copied in while this
// one is worked on. Per row (iteration it, leader L = it % C, P = (it - 1) % C the last row's leader):
//   wait for the own slice; cluster barrier S1 (every slice present; the last row's candidates
//   complete in P); copy the next row's slice into the other buffer;
//   P: the last row's count and check (fused_check, as hytopk_table_fused: listed in flagged when it
//      fails), then SHARE: steps 1-4 of the sort-free select (block_select_fast_stage; its state in
//      P's header), else the whole select (fused_finish); or the whole last row (c <= k);
//   the others: the contract's M samples from the cluster's slices (distributed shared memory), K*
//      = their r-th best (every block the same; L also stores it in P's T slot);
//   zero the counters; cluster barrier S2; every block streams its slice (key >= K*): L into its
//   own candidate area, the others into their own area then one remote atomic in L's counter and
//   a copy into L's area (distributed shared memory; with SHARE, P straight into L's area);
//   SHARE: every block copies P's bins and stage and ranks 1/C of the staged entries
//   (block_select_fast_rank; P pads the row); a row the fast select declined: P's select_row_v2.
// So the one-block part of a row's select runs while the others select the next row's threshold.
// The cluster's last row is selected whole by P (no iteration follows to share it).
// Outputs, counts and listed rows: hytopk_table_fused's (its cap = this cap), bit for bit.
// skip_select = 1 (the bench's diagnostic, never exact): the leaders skip the last row's select and
// write nothing for it, so its time is the copies, thresholds, filters and barriers alone.
// grid: a multiple of C blocks; smem: table_cluster_smem_words(k, cap, buf_words, THREADS) words;
// buf_words >= (S + P) elements for every row's S (host: table_v2.py cluster_geometry); cap >=
// MAX_SAMPLES / 2 (the samples live in the candidate area).
template <class Src, int C, int THREADS, bool SHARE>
__device__ __forceinline__ void table_cluster_body(u32* smem, const void* __restrict__ table, long long L, int n,
                                                   const int* __restrict__ lo, const int* __restrict__ hi, int k,
                                                   int cap, int buf_words, int aligned, double oversample, int fast,
                                                   int skip_select, int* __restrict__ count_out, int* __restrict__ flagged,
                                                   int* __restrict__ nflagged, int* __restrict__ idx,
                                                   float* __restrict__ val) {
    static_assert(C >= 2, "the last row's leader must differ from this row's");
    constexpr int P = TableVec<Src>::PER_VEC;
    constexpr int PER = THREADS >= 1024 ? 4 : 8;                      // every sample load of a thread in flight (M = 4096)
    const int q = (int)cluster_rank();
    const int cid = (int)(blockIdx.x / C), ncl = (int)(gridDim.x / C);
    ClusterHeader* hd = reinterpret_cast<ClusterHeader*>(smem + 2LL * buf_words);
    u32* fsm = smem + 2LL * buf_words + CLUSTER_HEADER_WORDS;
    const long long total = (long long)n * L;
    if (threadIdx.x == 0) {
        mbar_init(&hd->full[0], 1u);
        mbar_init(&hd->full[1], 1u);
        hd->recv = 0;
        hd->stg = 0;
    }
    __syncthreads();
    if (cid < n) {
        const ClusterRow g0 = ClusterRow::of(cid, L, lo, hi, C, P);
        cluster_load_slice<Src>(g0, q, g0.c > k, smem, &hd->full[0], table, total, aligned);
    }
    for (int it = 0;; ++it) {
        const int t = cid + it * ncl;                                  // uniform over the cluster
        const bool valid = t < n;
        if (valid) mbar_wait(&hd->full[it & 1], (u32)(it >> 1) & 1u);
        cluster_sync();                                                // S1
        if (valid && t + ncl < n) {
            const ClusterRow gn = ClusterRow::of(t + ncl, L, lo, hi, C, P);
            cluster_load_slice<Src>(gn, q, gn.c > k, smem + (long long)((it & 1) ^ 1) * buf_words,
                                    &hd->full[(it & 1) ^ 1], table, total, aligned);
        }
        const int lead = it % C, prev = (it + C - 1) % C;
        u32 kstar = 0u;
        if (it > 0 && q == prev) {                                     // the last row, in its leader: up to its ranking
            const FusedSmem f = FusedSmem::of(fsm, k, cap, THREADS);
            const int tp = t - ncl;
            const ClusterRow gp = ClusterRow::of(tp, L, lo, hi, C, P);
            int* out_idx = idx + (long long)tp * k;
            float* out_val = val + (long long)tp * k;
            u32 mode = 0u;
            FastStage st;
            if (skip_select) {                                         // the bench's diagnostic: no output
            } else if (gp.c <= k) {
                fused_whole_row<Src>(f, table, tp, gp.row0, gp.a, gp.c, k, count_out, out_idx, out_val);
            } else if (!SHARE || !valid) {                             // all of it here (the cluster's last row)
                fused_finish<THREADS>(f, tp, hd->recv, k, cap, fast, count_out, flagged, nflagged, out_idx, out_val);
            } else if (fused_check(tp, hd->recv, k, cap, count_out, flagged, nflagged)) {
                const int cnt = hd->recv;
                const SmemEntries ce = {f.cpos, f.cbits};
                mode = fast && block_select_fast_stage<FastBins<THREADS>::PB>(ce, cnt, k, f.hist, RADIX + 6 + 3LL * f.KW,
                                                                              st) ? 1u : 2u;
            }
            if (SHARE && threadIdx.x == 0) {
                hd->mode = mode;
                hd->cnt = (u32)hd->recv;
                hd->st = st;
            }
        } else if (valid) {
            const ClusterRow g = ClusterRow::of(t, L, lo, hi, C, P);
            if (g.c > k) {
                const FusedSmem f = FusedSmem::of(fsm, k, cap, THREADS);
                const SamplePlan sp = SamplePlan::of(g.c, k, oversample);
                cluster_sample_keys<Src, PER>(g, smem + (long long)(it & 1) * buf_words, sp.M, f.cpos);
                __syncthreads();
                auto sample_key = [&](long long j, u32* out) { *out = f.cpos[j]; return true; };
                kstar = block_radix_select_keys<true>(sample_key, sp.M, sp.r, f.hist, f.sc);
                if (it > 0 && q == lead && threadIdx.x == 0) cluster_map(hd, (u32)prev)->tslot = kstar;
            }
        }
        if (!valid) return;                                            // uniform over the cluster
        __syncthreads();
        if (threadIdx.x == 0) {
            hd->recv = 0;
            hd->stg = 0;
        }
        cluster_sync();                                                // S2
        const bool leader = q == lead, last = it > 0 && q == prev;
        if (ClusterRow::of(t, L, lo, hi, C, P).c > k) {                // this row's filter
            const FusedSmem f = FusedSmem::of(fsm, k, cap, THREADS);
            const ClusterRow g = ClusterRow::of(t, L, lo, hi, C, P);
            if (last) kstar = hd->tslot;
            // the leader into its own area; with SHARE the last row's leader straight into the leader's
            // (its own area holds the last row's candidates until they are ranked); the others stage here
            SmemSink sink = {f.cpos, f.cbits, leader ? &hd->recv : &hd->stg, cap, 0};
            if (SHARE && last) sink = {cluster_map(f.cpos, (u32)lead), cluster_map(f.cbits, (u32)lead),
                              &cluster_map(hd, (u32)lead)->recv, cap, 0};
            cluster_filter_slice<Src>(g, q, smem + (long long)(it & 1) * buf_words, bits_of_key(kstar), sink);
            if (!leader && !(SHARE && last)) {
                __syncthreads();
                const int m = hd->stg;
                if (m > 0) {                                           // uniform
                    if (threadIdx.x == 0) hd->bslot = (u32)atomicAdd(&cluster_map(hd, (u32)lead)->recv, m);
                    __syncthreads();
                    const int base = (int)hd->bslot;
                    u32* rpos = cluster_map(f.cpos, (u32)lead);
                    u32* rbits = cluster_map(f.cbits, (u32)lead);
                    for (int i = threadIdx.x; i < min(m, cap) && base + i < cap; i += THREADS) {
                        rpos[base + i] = f.cpos[i];
                        rbits[base + i] = f.cbits[i];
                    }
                }
            }
        }
        if (SHARE && it > 0) {                                         // the last row's ranking, shared
            const FusedSmem f = FusedSmem::of(fsm, k, cap, THREADS);
            const ClusterHeader* ph = cluster_map(hd, (u32)prev);
            const u32 mode = ph->mode;
            const int tp = t - ncl;
            int* out_idx = idx + (long long)tp * k;
            float* out_val = val + (long long)tp * k;
            if (mode == 1u) {
                const FastStage st = ph->st;
                if (!last) {                                           // its scratch here: the bins, the stage
                    cluster_copy_words(f.hist, cluster_map(f.hist, (u32)prev), (int)fast_stage_words(st.NB, st.staged));
                    __syncthreads();
                }
                const int part = (q - prev + C) % C;
                const SmemEntries ce = {cluster_map(f.cpos, (u32)prev), cluster_map(f.cbits, (u32)prev)};
                block_select_fast_rank(ce, f.hist, st, (int)((long long)st.staged * part / C),
                                       (int)((long long)st.staged * (part + 1) / C), out_idx, out_val);
                if (last) pad_row(st.kk, k, out_idx, out_val);
            } else if (mode == 2u && last) {                           // the fast select declined: the leader's select
                const SmemEntries ce = {f.cpos, f.cbits};
                select_row_v2(ce, (long long)ph->cnt, k, f.hist, f.sc, f.word, f.wbits, out_idx, out_val);
            }
        }
    }
}

// The cluster kernel at C blocks per cluster and THREADS threads, SHARE: the ranking of each row's
// select shared by the cluster (table_v2.py FUSED_CLUSTER, CLUSTER_SIZE, CLUSTER_THREADS,
// CLUSTER_SHARE; instantiations.CLUSTER_CONFIGS): one block per SM (its shared memory).
template <class Src, int C, int THREADS, bool SHARE>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(THREADS, 1)
hytopk_table_cluster(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                     const int* __restrict__ hi, int k, int cap, int buf_words, int aligned, double oversample,
                     int fast, int skip_select, int* __restrict__ count_out, int* __restrict__ flagged,
                     int* __restrict__ nflagged, int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_cluster_body<Src, C, THREADS, SHARE>(smem, table, L, n, lo, hi, k, cap, buf_words, aligned, oversample, fast,
                                        skip_select, count_out, flagged, nflagged, idx, val);
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
