// The exact select of the v2 kernels (issues 14 and 21): the k best of m candidates held in
// shared memory, written in rank order (key desc, position asc), and the select_smem body
// shared by table_v2.cu (hytopk_select_smem) and select.cu (hytopk_select_fast).
//
// Why a new select: ncu of hytopk_select_smem on the H200 (4096 x 131072 float32, k = 2048,
// ~3000-6000 candidates per row) counted 126K warp instructions per row, ~75K of them in the
// 2048-entry register bitonic sort (35 shuffle stages of 68 instructions per warp, 10
// shared-memory stages with 4-8-way bank conflicts) and ~20K in the four 8-bit radix passes.
// block_select_fast sorts nothing:
//   1. the key range [kmin, kmax] of the m keys (block min/max, or the caller's SelectHint:
//      keys above its kmax share the best bin);
//   2. one histogram of (key - kmin) >> s over NB bins (NB up to 2048, s so the range fits):
//      bins are monotone in the key, equal keys share a bin;
//   3. a block scan in rank order (best bin first) gives each bin's first rank and the bin r*
//      holding rank k; every candidate of the bins up to r* is scattered to its bin's slice of
//      a stage (a shared atomic on the bin's cursor);
//   4. each staged candidate's rank = its bin's first rank + the members of its bin that beat
//      it (key, then position): written straight to the output when < k.
// Cost ~ m (histogram, scatter) + sum over the kept bins of size^2 (randn float32 rows: ~14-30
// per bin near the threshold; bf16 rows at 128K keys: one bf16 value per bin, ~80 ties each).
// Ranking work above FAST_RANK_WORK per kept rank (plateaus, ties of 1M-key bf16 rows, outliers
// that stretch the range) or too little scratch: it returns false having written nothing, and the
// caller runs select_row_v2 (key select, position select among the ties, register sort). Same
// output bit for bit: both write the k best by (key desc, position asc), then -1 / -inf.
#pragma once
#include "hytopk_table.cuh"

namespace hytopk {

constexpr int FAST_BIN_MAX = 64;      // stage room past k the bins are sized for (a larger bin r* needs the room left)
// most comparisons of the ranking per kept rank (sum of the kept bins' size^2 / kk): past it the
// fallback is cheaper. 128: 4.5x the ranking of randn float32 rows; the bf16 rows of 128K keys
// (bins of ~80 equal keys; the fallback took 1.27 ms per 4096 rows, the fast select 0.28 on float32)
constexpr int FAST_RANK_WORK = 128;
constexpr int FAST_NB_MAX = 2048;     // most bins of the histogram
constexpr int FAST_RED = 64;          // scratch words for the block reductions and scalars

struct SmemEntries {
    const u32* p;
    const u32* v;
    __device__ __forceinline__ u32 pos(long long i) const { return p[i]; }
    __device__ __forceinline__ u32 bits(long long i) const { return v[i]; }
};

// The exact top-k of m entries (block_keep_top_v2: the key select, the position select among
// the ties at K*), sorted by sort_desc_v2, to one output row. word / wbits: sort_slots_v2(k) slots.
template <class Entries>
__device__ void select_row_v2(const Entries& e, long long m, int k, u32* hist, SelectScalars* sc, u64* word,
                              u32* wbits, int* out_idx, float* out_val) {
    auto put = [&](int slot, u32 key, u32 pos, u32 v) {
        if (slot < k) { word[slot] = ((u64)key << 32) | (u64)(~pos); wbits[slot] = v; }
    };
    const int kept = min(k, block_keep_top_v2(e, m, k, hist, sc, put));
    __syncthreads();
    sort_desc_v2(word, wbits, kept);
    write_row(word, wbits, kept, k, out_idx, out_val);
}

// Bins the scratch holds next to a stage of k + FAST_BIN_MAX entries: a power of two in
// [32, FAST_NB_MAX], 0 if even 32 do not fit.
__host__ __device__ constexpr int fast_select_bins(int k, long long words) {
    long long nb = words - FAST_RED - 2LL * (k + FAST_BIN_MAX);
    int p = FAST_NB_MAX;
    while (p >= 32 && p > nb) p >>= 1;
    return p >= 32 ? p : 0;
}

// What steps 1-4 of block_select_fast leave for step 5 beside the scratch (bins: each bin's end
// rank; stage: (key, entry index) of the kept bins' candidates, by bin): the bins' key map
// (bin = NB - 1 - ((key - kmin) >> s)), the staged count and the ranks written (kk = min(k, m)).
// The scratch's words in use: fast_stage_words.
struct FastStage {
    u32 kmin;
    int s, NB, staged, kk;
    __device__ __forceinline__ int bin_of(u32 key) const { return NB - 1 - (int)min((key - kmin) >> s, (u32)(NB - 1)); }
};

// A caller's bounds on the entries' keys for block_select_fast (on: skip its key-range pass):
// every key >= kmin (exactly: a key below it would be misranked), and kmax where the bins end:
// keys above it share the best bin (clamped), so a kmax below the true maximum narrows the bins
// of the dense keys near kmin (the fused kernel: its threshold key and the best sample key, about
// L / M keys above it).
struct SelectHint {
    u32 kmin = 0u, kmax = 0u;
    bool on = false;
};
__host__ __device__ constexpr long long fast_stage_words(int NB, int staged) { return (long long)NB + FAST_RED + 2LL * staged; }

// Steps 1-4 of block_select_fast: false (nothing written, scratch free again) when ranking would
// cost more than FAST_RANK_WORK per rank, or too little scratch; else the staged scratch and *st
// (every thread).
template <int PBMAX, class Entries>
__device__ __forceinline__ bool block_select_fast_stage(const Entries& e, int m, int k, u32* scratch, long long words,
                                                        FastStage& st, const SelectHint& hint = SelectHint()) {
    const int tid = (int)threadIdx.x, B = (int)blockDim.x, nw = B >> 5, w = tid >> 5;
    const int NB = min(fast_select_bins(k, words), PBMAX * B);
    if (NB == 0 || k <= 0) return false;                    // uniform
    u32* bins = scratch;                                    // by rank-order bin r = NB - 1 - digit
    u32* red = scratch + NB;                                // [0, 32): warp minima / sums, [32, 64): maxima, scalars
    uint2* stage = reinterpret_cast<uint2*>(scratch + NB + FAST_RED);   // (key, entry index)
    unsigned long long* work = reinterpret_cast<unsigned long long*>(scratch + NB + 36);   // 8-byte aligned: NB even
    const int kk = min(k, m);                               // ranks written: 0 .. kk - 1
    int log_nb = 0;
    while ((1 << log_nb) < NB) ++log_nb;

    // 1. key range (the hint's, else a pass over the keys); bins zeroed meanwhile
    u32 lo = hint.kmin, hi = max(hint.kmax, hint.kmin);
    if (!hint.on) {                                         // uniform
        lo = 0xffffffffu;
        hi = 0u;
        for (int i = tid; i < m; i += B) {
            const u32 key = order_key_bits(e.bits(i));
            lo = min(lo, key);
            hi = max(hi, key);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, off));
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, off));
        }
        if ((tid & 31) == 0) { red[w] = lo; red[32 + w] = hi; }
    }
    for (int b = tid; b < NB; b += B) bins[b] = 0u;
    __syncthreads();
    if (!hint.on) {
        lo = 0xffffffffu;
        hi = 0u;
        for (int q = 0; q < nw; ++q) { lo = min(lo, red[q]); hi = max(hi, red[32 + q]); }
    }
    const u32 kmin = lo;
    const u32 range = m > 0 ? hi - kmin : 0u;
    const int nbits = range == 0u ? 0 : 32 - __clz(range);
    const int s = max(0, nbits - log_nb);                   // (key - kmin) >> s < NB up to hi; past it clamped
    auto bin_of = [&](u32 key) { return NB - 1 - (int)min((key - kmin) >> s, (u32)(NB - 1)); };

    // 2. histogram
    for (int i = tid; i < m; i += B) atomicAdd(&bins[bin_of(order_key_bits(e.bits(i)))], 1u);
    __syncthreads();                                        // the reductions' red[] reads are done too

    // 3. scan in rank order: thread tid owns bins [tid PB, tid PB + PB) (tid < NB / PB)
    const int PB = max(1, NB / B), owners = NB / PB;
    u32 h[PBMAX], own = 0u;
#pragma unroll
    for (int q = 0; q < PBMAX; ++q) {
        h[q] = (q < PB && tid < owners) ? bins[tid * PB + q] : 0u;
        own += h[q];
    }
    u32 incl = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, incl, off);
        if ((tid & 31) >= off) incl += y;
    }
    if ((tid & 31) == 31) red[w] = incl;
    if (tid == 0) { red[33] = 0u; red[34] = 0u; *work = 0ull; }   // r*, staged, the ranking's comparisons
    __syncthreads();
    u32 before = incl - own;
    for (int q = 0; q < w; ++q) before += red[q];
    unsigned long long my_work = 0ull;
#pragma unroll
    for (int q = 0; q < PBMAX; ++q) {
        if (q < PB && tid < owners) {
            const int r = tid * PB + q;
            if (before < (u32)kk) my_work += (unsigned long long)h[q] * h[q];   // a kept bin: size^2 comparisons
            if (before < (u32)kk && before + h[q] >= (u32)kk) { red[33] = (u32)r; red[34] = before + h[q]; }
            bins[r] = before;                               // the bin's cursor: its first rank
            before += h[q];
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) my_work += __shfl_xor_sync(0xffffffffu, my_work, off);
    if ((tid & 31) == 0 && my_work) atomicAdd(work, my_work);   // one shared atomic per warp, not per thread
    __syncthreads();
    const bool give_up = *work > (unsigned long long)FAST_RANK_WORK * (unsigned long long)kk;
    const int rstar = (int)red[33];
    const int staged = kk > 0 ? (int)red[34] : 0;
    if (give_up || fast_stage_words(NB, staged) > words) {   // uniform: nothing written yet
        __syncthreads();                                    // every read of the scratch is done
        return false;
    }

    // 4. scatter the candidates of bins 0 .. r* to their bins' slices of the stage
    if (kk > 0) {
        for (int i = tid; i < m; i += B) {
            const u32 key = order_key_bits(e.bits(i));
            const int r = bin_of(key);
            if (r <= rstar) {
                const u32 slot = atomicAdd(&bins[r], 1u);
                stage[slot] = make_uint2(key, (u32)i);
            }
        }
    }
    __syncthreads();
    st.kmin = kmin;
    st.s = s;
    st.NB = NB;
    st.staged = staged;
    st.kk = kk;
    return true;
}

// Step 5 of block_select_fast for the staged entries [j0, j1) (any part of them, so blocks can
// share the ranking): rank inside the bin = the bin's first rank + its members that beat the entry
// (key, then position); ranks < kk to out_idx / out_val. scratch: as block_select_fast_stage left it
// (or a copy of its fast_stage_words); e: the entries it staged. No barrier.
template <class Entries>
__device__ __forceinline__ void block_select_fast_rank(const Entries& e, const u32* scratch, const FastStage& st, int j0,
                                                       int j1, int* out_idx, float* out_val) {
    const u32* bins = scratch;
    const uint2* stage = reinterpret_cast<const uint2*>(scratch + st.NB + FAST_RED);
    const int kk = st.kk;
    // [first, end) = [cursor of bin r - 1 (its end) or 0, cursor of bin r)
    for (int j = j0 + (int)threadIdx.x; j < j1; j += (int)blockDim.x) {
        const uint2 me = stage[j];
        const int r = st.bin_of(me.x);
        const int first = r > 0 ? (int)bins[r - 1] : 0, end = (int)bins[r];
        const u32 mypos = e.pos(me.y);
        int rank = first;
        for (int l = first; l < end; ++l) {
            const uint2 o = stage[l];
            if (o.x > me.x) ++rank;
            else if (o.x == me.x && l != j) {
                const u32 op = e.pos(o.y);
                rank += (op < mypos || (op == mypos && o.y < me.y)) ? 1 : 0;   // entry index: a total order
            }
        }
        if (rank < kk) {
            out_idx[rank] = (int)mypos;
            out_val[rank] = __uint_as_float(e.bits(me.y));
        }
    }
}

// -1 / -inf in ranks [kk, k) of an output row (block-wide, no barrier).
__device__ __forceinline__ void pad_row(int kk, int k, int* out_idx, float* out_val) {
    for (int i = kk + (int)threadIdx.x; i < k; i += (int)blockDim.x) {
        out_idx[i] = -1;
        out_val[i] = __uint_as_float(0xff800000u);
    }
}

// The k best of the m entries e (pos, bits in shared memory; positions distinct) to out_idx /
// out_val in rank order, -1 / -inf past min(m, k). scratch: `words` u32 words of shared memory
// (8-byte aligned, not aliasing e), free on entry and on return. Block-wide, every thread calls
// it; returns the same value in every thread: false when it wrote nothing (a bin above
// FAST_RANK_WORK comparisons per rank, or too little scratch): then the caller selects another way.
// PBMAX: most bins per thread (FAST_NB_MAX / blockDim.x).
template <int PBMAX, class Entries>
__device__ __forceinline__ bool block_select_fast(const Entries& e, int m, int k, u32* scratch, long long words, int* out_idx,
                                  float* out_val, const SelectHint& hint = SelectHint()) {
    FastStage st;
    if (!block_select_fast_stage<PBMAX>(e, m, k, scratch, words, st, hint)) return false;
#ifdef HYTOPK_SELECT_STAGED_HOOK
    HYTOPK_SELECT_STAGED_HOOK();                            // a probe build's timestamp (table_v2.cu)
#endif
    block_select_fast_rank(e, scratch, st, 0, st.staged, out_idx, out_val);
    pad_row(st.kk, k, out_idx, out_val);
    __syncthreads();                                        // the scratch is free again
    return true;
}

// select_row_v2, by block_select_fast first when fast (scratch: `words` words from hist on,
// covering hist, sc and word / wbits).
template <int PBMAX, class Entries>
__device__ __forceinline__ void select_row_best(const Entries& e, int m, int k, int fast, u32* hist, SelectScalars* sc, u64* word,
                                u32* wbits, long long words, int* out_idx, float* out_val,
                                const SelectHint& hint = SelectHint()) {
    if (fast && block_select_fast<PBMAX>(e, m, k, hist, words, out_idx, out_val, hint)) return;
    select_row_v2(e, m, k, hist, sc, word, wbits, out_idx, out_val);
}

// Shared memory of select_smem_rows in u32 words: histogram, scalars, sort slots, cap
// (position, bits) candidates.
__host__ __device__ constexpr long long select_smem_words(int k, int cap) {
    return RADIX + 4 + 3LL * (next_pow2(k) > 512 ? next_pow2(k) : 512) + 2LL * cap;
}

struct GlobalEntries {
    const int* idx;
    const u32* val;
    __device__ __forceinline__ u32 pos(long long i) const { return (u32)idx[i]; }
    __device__ __forceinline__ u32 bits(long long i) const { return val[i]; }
};

// Stage 8 for one row t per block (blockDim.x a power of two, 32 .. 512; 512: all FAST_NB_MAX bins): its m = min(count,
// capacity) stored candidates read once, coalesced (4 loads of each kind in flight per thread),
// into shared memory when m <= cap, then select_row_best; m > cap: select_row_v2 from global
// memory. smem: select_smem_words(k, cap) words (sort slots: max(next_pow2(k), 512)).
__device__ __forceinline__ void select_smem_rows(u32* smem, int n, const int* __restrict__ cand_idx,
                                                 const u32* __restrict__ cand_val, const int* __restrict__ count,
                                                 int capacity, int k, int cap, int fast, int* __restrict__ idx,
                                                 float* __restrict__ val) {
    constexpr int BATCH = 4;
    const int t = blockIdx.x, B = (int)blockDim.x;
    if (t >= n) return;
    const long long row = (long long)t * capacity;
    const int m = min(max(count[t], 0), capacity);
    int* out_idx = idx + (long long)t * k;
    float* out_val = val + (long long)t * k;
    u32* hist = smem;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(smem + RADIX);
    const int KW = max(next_pow2(k), 512);
    u64* word = reinterpret_cast<u64*>(smem + RADIX + 4);      // 260 words: 8-byte aligned
    u32* wbits = reinterpret_cast<u32*>(word + KW);
    if (m <= cap) {                                 // uniform over the block
        u32* spos = wbits + KW;
        u32* sbits = spos + cap;
        for (int base = 0; base < m; base += BATCH * B) {
            int pi[BATCH];
            u32 pv[BATCH];
#pragma unroll
            for (int q = 0; q < BATCH; ++q) {
                const int i = base + q * B + (int)threadIdx.x;
                pi[q] = i < m ? cand_idx[row + i] : 0;
                pv[q] = i < m ? cand_val[row + i] : 0u;
            }
#pragma unroll
            for (int q = 0; q < BATCH; ++q) {
                const int i = base + q * B + (int)threadIdx.x;
                if (i < m) { spos[i] = (u32)pi[q]; sbits[i] = pv[q]; }
            }
        }
        __syncthreads();
        const SmemEntries e = {spos, sbits};
        select_row_best<FAST_NB_MAX / 512>(e, m, k, fast, hist, sc, word, wbits, RADIX + 4 + 3LL * KW, out_idx,
                                           out_val);
    } else {
        const GlobalEntries e = {cand_idx + row, cand_val + row};
        select_row_v2(e, m, k, hist, sc, word, wbits, out_idx, out_val);
    }
}

}  // namespace hytopk
