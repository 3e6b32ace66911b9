// Block-wide radix helpers (8-bit digits), all bitwise deterministic:
//   block_radix_select  MSB-first histogram select of the rank-th largest or
//                       smallest 32-bit value among the active entries
//   block_radix_sort    stable LSD sort of (key desc, position asc)
//   block_exact_topk    the exact top-k of a set of (position, score) entries:
//                       key select, position select for the ties, radix sort
//   block_exact_topk_bitonic
//                       the same selection (FAST select: warp-aggregated
//                       histograms, warp-parallel digit search), then a bitonic
//                       sort of the k kept entries on the 64-bit (key, ~position)
// Histograms count with shared atomics; counts do not depend on the order the
// atomics land in, and every scatter is a stable function of the input, so the
// output is the same bytes on every run.
#pragma once
#include "hytopk_order.cuh"

namespace hytopk {

constexpr int RADIX = 256;

// Shared scratch of the select: histogram + a few broadcast scalars.
struct SelectScalars {
    u32 prefix;      // digits fixed so far
    u32 remaining;   // rank still to go inside the current prefix
    u32 equal;       // entries equal to the final value
    u32 kept;        // compaction counter
};

// One level's digit by the first warp (threads 0 .. 31 call it; lane l owns the 8 digits ranked
// 8l .. 8l+7, best first when LARGEST): the first digit in rank order whose inclusive count reaches
// rem; sc->remaining = rem - the counts before it, sc->prefix = prefix | digit << shift, sc->equal =
// its count.
template <bool LARGEST>
__device__ __forceinline__ void radix_level_digit_warp(const u32* hist, u32 rem, u32 prefix, int shift,
                                                       SelectScalars* sc) {
    const u32 l = lane_id();
    u32 h[8], own = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        h[j] = hist[LARGEST ? RADIX - 1 - (int)(8u * l) - j : (int)(8u * l) + j];
        own += h[j];
    }
    u32 incl = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, incl, off);
        if (l >= (u32)off) incl += y;
    }
    const u32 found = __ballot_sync(0xffffffffu, incl >= rem);
    if (l == (found ? (u32)(__ffs(found) - 1) : 31u)) {
        u32 before = incl - own, hd = 0u;
        int digit = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            digit = LARGEST ? RADIX - 1 - (int)(8u * l) - j : (int)(8u * l) + j;
            hd = h[j];
            if (before + hd >= rem) break;
            before += hd;
        }
        sc->remaining = rem - before;
        sc->prefix = prefix | ((u32)digit << shift);
        sc->equal = hd;
    }
}

// The rank-th (1-based) largest (LARGEST) or smallest value among the entries
// i in [0, m) for which get(i, &v) returns true. Returns the value; on return
// sc->remaining = rank - #{strictly better values}, sc->equal = #{== value}.
// Every thread of the block must call it. FAST: one shared atomic per distinct
// digit per warp (__match_any_sync; the top digits of the best keys are nearly
// all equal, so plain atomics serialise) and a warp-parallel digit search
// instead of thread 0 walking 256 bins. Same result either way.
template <bool LARGEST, bool FAST = false, class Get>
__device__ u32 block_radix_select(const Get& get, long long m, u32 rank, u32* hist, SelectScalars* sc) {
    if (threadIdx.x == 0) { sc->prefix = 0u; sc->remaining = rank; }
    u32 mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < RADIX; b += blockDim.x) hist[b] = 0u;
        __syncthreads();
        const u32 prefix = sc->prefix;
        const u32 rem = sc->remaining;       // read before the barrier below; written only after it
        if (FAST) {
            const long long m_round = (m + blockDim.x - 1) / blockDim.x * blockDim.x;
            for (long long i = threadIdx.x; i < m_round; i += blockDim.x) {
                u32 v = 0u;
                const bool act = i < m && get(i, &v) && (v & mask) == prefix;
                const u32 d = act ? (v >> shift) & 0xffu : 0x100u;
                const u32 peers = __match_any_sync(0xffffffffu, d);
                if (act && (peers & lanes_below_mask()) == 0u) atomicAdd(&hist[d], (u32)__popc(peers));
            }
        } else {
            for (long long i = threadIdx.x; i < m; i += blockDim.x) {
                u32 v;
                if (get(i, &v) && (v & mask) == prefix) atomicAdd(&hist[(v >> shift) & 0xffu], 1u);
            }
        }
        __syncthreads();
        if (FAST) {
            if (threadIdx.x < 32) radix_level_digit_warp<LARGEST>(hist, rem, prefix, shift, sc);
        } else if (threadIdx.x == 0) {
            u32 before = 0u;
            int digit = LARGEST ? RADIX - 1 : 0;
            for (int j = 0; j < RADIX; ++j) {           // best digit first
                digit = LARGEST ? RADIX - 1 - j : j;
                if (before + hist[digit] >= rem) break;
                before += hist[digit];
            }
            sc->remaining = rem - before;
            sc->prefix = prefix | ((u32)digit << shift);
            sc->equal = hist[digit];
        }
        mask |= 0xffu << shift;
        __syncthreads();
    }
    return sc->prefix;
}

// T of a sampled threshold: the rank-th best (1-based, clamped to [1, m]) of m sample bits in
// shared memory, written as the need-th sample in position order among those with the selected
// key (the contract's T is a value; only its key matters, this picks one deterministically).
// Every thread of the block calls it; one warp writes *T.
template <bool FAST = false>
__device__ __forceinline__ void write_rth_sample(const u32* bits, int m, int r, u32* hist, SelectScalars* sc,
                                                 u32* T) {
    const u32 rank = (u32)min(max(r, 1), m);
    auto sample_key = [&](long long j, u32* out) { *out = order_key_bits(bits[j]); return true; };
    const u32 kstar = block_radix_select<true, FAST>(sample_key, m, rank, hist, sc);
    const u32 need = sc->remaining;
    if (threadIdx.x < 32) {
        u32 seen = 0u;
        for (int base = 0; base < m; base += 32) {
            const int j = base + (int)lane_id();
            const bool match = j < m && order_key_bits(bits[j]) == kstar;
            const u32 mask = __ballot_sync(0xffffffffu, match);
            if (seen + __popc(mask) >= need) {
                if (match && seen + __popc(mask & lanes_below_mask()) + 1u == need) *T = bits[j];
                break;
            }
            seen += __popc(mask);
        }
    }
}

// Sort buffers for up to k kept entries: `a` is filled by the caller, `b` is
// the ping-pong partner. Kept as separate pointers (no arrays indexed at run
// time) so nothing lands in local memory.
struct SortBuffers {
    u32 *key_a, *pos_a, *val_a;
    u32 *key_b, *pos_b, *val_b;
};

// Shared memory layout of block_exact_topk, in u32 words.
__host__ __device__ constexpr long long exact_topk_smem_words(int k, int warps) {
    return RADIX + 4 + (long long)warps * RADIX + 6LL * k;
}

// Stable LSD radix sort of cnt entries into rank order: ascending position
// digits first, then ascending digits of ~key. A pass whose digit is the same
// for every entry is skipped (it would not move anything). On return the
// sorted entries are in the `a` buffers (pointers swapped as needed).
template <int WARPS>
__device__ void block_radix_sort(SortBuffers& b, int cnt, u32* hist, u32* warp_cnt) {
    for (int pass = 0; pass < 8; ++pass) {
        const int shift = (pass & 3) * 8;
        const bool by_pos = pass < 4;
        const u32* word = by_pos ? b.pos_a : b.key_a;
        const u32 flip = by_pos ? 0u : 0xffffffffu;
        for (int j = threadIdx.x; j < RADIX; j += blockDim.x) hist[j] = 0u;
        __syncthreads();
        for (int i = threadIdx.x; i < cnt; i += blockDim.x) atomicAdd(&hist[((word[i] ^ flip) >> shift) & 0xffu], 1u);
        __syncthreads();
        const bool trivial = cnt == 0 || hist[((word[0] ^ flip) >> shift) & 0xffu] == (u32)cnt;
        __syncthreads();
        if (trivial) continue;
        if (threadIdx.x == 0) {                          // exclusive scan -> bucket bases
            u32 run = 0u;
            for (int j = 0; j < RADIX; ++j) { const u32 h = hist[j]; hist[j] = run; run += h; }
        }
        __syncthreads();
        const int warp = threadIdx.x >> 5;
        for (int t0 = 0; t0 < cnt; t0 += blockDim.x) {
            for (int j = threadIdx.x; j < WARPS * RADIX; j += blockDim.x) warp_cnt[j] = 0u;
            __syncthreads();
            const int i = t0 + threadIdx.x;
            const bool valid = i < cnt;
            const u32 dg = valid ? ((word[i] ^ flip) >> shift) & 0xffu : 0x100u;
            const u32 peers = __match_any_sync(0xffffffffu, dg);
            const u32 rank = __popc(peers & lanes_below_mask());
            if (valid && rank == 0u) warp_cnt[warp * RADIX + dg] = __popc(peers);
            __syncthreads();
            if (valid) {
                u32 off = hist[dg] + rank;
                for (int w = 0; w < warp; ++w) off += warp_cnt[w * RADIX + dg];
                b.key_b[off] = b.key_a[i];
                b.pos_b[off] = b.pos_a[i];
                b.val_b[off] = b.val_a[i];
            }
            __syncthreads();
            for (int j = threadIdx.x; j < RADIX; j += blockDim.x) {
                u32 add = 0u;
                for (int w = 0; w < WARPS; ++w) add += warp_cnt[w * RADIX + j];
                hist[j] += add;
            }
            __syncthreads();
        }
        u32* tmp;
        tmp = b.key_a; b.key_a = b.key_b; b.key_b = tmp;
        tmp = b.pos_a; b.pos_a = b.pos_b; b.pos_b = tmp;
        tmp = b.val_a; b.val_a = b.val_b; b.val_b = tmp;
    }
}

// The top-k selection shared by both exact top-k routines: the k best of m
// entries given by e.pos(i) (distinct, >= 0) and e.bits(i) (float32 score bits)
// handed to put(slot, key, pos, bits), slots 0 .. kept-1 in arbitrary order.
// Returns kept = min(m, k) (the same value in every thread).
template <bool FAST, class Entries, class Put>
__device__ int block_keep_top(const Entries& e, long long m, int k, u32* hist, SelectScalars* sc, const Put& put) {
    if (m <= k) {                                        // everything is kept
        for (int i = threadIdx.x; i < (int)m; i += blockDim.x) {
            const u32 v = e.bits(i);
            put(i, order_key_bits(v), e.pos(i), v);
        }
        return (int)m;
    }
    auto key_of = [&](long long i, u32* out) { *out = order_key_bits(e.bits(i)); return true; };
    const u32 kstar = block_radix_select<true, FAST>(key_of, m, (u32)k, hist, sc);
    const u32 need = sc->remaining;
    u32 pstar = 0xffffffffu;                             // keep every tie unless too many
    if (need < sc->equal) {
        __syncthreads();
        auto tie_pos = [&](long long i, u32* out) {
            if (order_key_bits(e.bits(i)) != kstar) return false;
            *out = e.pos(i);
            return true;
        };
        pstar = block_radix_select<false, FAST>(tie_pos, m, need, hist, sc);
    }
    __syncthreads();
    if (threadIdx.x == 0) sc->kept = 0u;
    __syncthreads();
    // Compaction order is arbitrary (atomics); the sort afterwards makes it irrelevant.
    const long long m_round = (m + blockDim.x - 1) / blockDim.x * blockDim.x;
    for (long long i = threadIdx.x; i < m_round; i += blockDim.x) {
        u32 v = 0u, key = 0u;
        bool keep = false;
        if (i < m) {
            v = e.bits(i);
            key = order_key_bits(v);
            keep = key > kstar || (key == kstar && e.pos(i) <= pstar);
        }
        const int slot = warp_append_slot(keep, reinterpret_cast<int*>(&sc->kept));
        if (keep && slot < k) put(slot, key, e.pos(i), v);   // slot < k always holds; never write past it
    }
    __syncthreads();
    return min((int)sc->kept, k);
}

// Exact top-k (rank order) of m entries given by e.pos(i) (distinct, >= 0) and
// e.bits(i) (float32 score bits). Writes k slots of out_idx/out_val; slots past
// min(m, k) get -1 / -inf. smem holds exact_topk_smem_words(k, WARPS) words.
// blockDim.x must be WARPS * 32. Every thread of the block must call it.
template <int WARPS, class Entries>
__device__ void block_exact_topk(const Entries& e, long long m, int k, int* out_idx, float* out_val, u32* smem) {
    u32* hist = smem;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(smem + RADIX);
    u32* warp_cnt = smem + RADIX + 4;
    u32* bufs = warp_cnt + WARPS * RADIX;
    SortBuffers b = {bufs, bufs + k, bufs + 2 * k, bufs + 3 * k, bufs + 4 * k, bufs + 5 * k};
    auto put = [&](int slot, u32 key, u32 pos, u32 v) { b.key_a[slot] = key; b.pos_a[slot] = pos; b.val_a[slot] = v; };
    const int kept = block_keep_top<false>(e, m, k, hist, sc, put);
    __syncthreads();
    block_radix_sort<WARPS>(b, kept, hist, warp_cnt);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        if (j < kept) {
            out_idx[j] = (int)b.pos_a[j];
            out_val[j] = __uint_as_float(b.val_a[j]);
        } else {
            out_idx[j] = -1;
            out_val[j] = __uint_as_float(0xff800000u);
        }
    }
}

__host__ __device__ constexpr int next_pow2(int x) {
    int p = 1;
    while (p < x) p <<= 1;
    return p;
}

// Sorts word[0 .. cnt) descending (bits[] rides along) by a bitonic network over
// next_pow2(cnt) slots: slots cnt .. next_pow2(cnt) - 1 are padded with word 0, which
// sorts last, so both arrays need next_pow2(cnt) slots. Words must be distinct where
// the order matters (rank-order words (key << 32 | ~position) are). Block-wide; ends
// with a barrier.
__device__ void block_bitonic_sort_desc(u64* word, u32* bits, int cnt) {
    const int P = next_pow2(max(cnt, 1));
    for (int i = cnt + (int)threadIdx.x; i < P; i += blockDim.x) { word[i] = 0ull; bits[i] = 0u; }   // pads sort last
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
                const int a = 2 * i - (i & (stride - 1)), b = a + stride;
                const bool desc = (a & size) == 0;
                const u64 wa = word[a], wb = word[b];
                if (desc ? wa < wb : wa > wb) {
                    word[a] = wb; word[b] = wa;
                    const u32 t = bits[a]; bits[a] = bits[b]; bits[b] = t;
                }
            }
            __syncthreads();
        }
    }
}

// Shared memory of block_exact_topk_bitonic, in u32 words: histogram, scalars,
// then next_pow2(k) (u64 sort key, u32 score bits) pairs.
__host__ __device__ constexpr long long bitonic_topk_smem_words(int k) {
    return RADIX + 4 + 3LL * next_pow2(k);
}

// block_exact_topk with the FAST select and a bitonic sort: the kept entries
// become 64-bit words (key << 32 | ~position), all distinct, so sorting them
// descending is exactly rank order (key desc, position asc); the score bits
// ride along (they keep -0.0 and NaN payloads, which the key folds).
// Same output as block_exact_topk, bit for bit.
template <class Entries>
__device__ void block_exact_topk_bitonic(const Entries& e, long long m, int k, int* out_idx, float* out_val,
                                         u32* smem) {
    u32* hist = smem;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(smem + RADIX);
    u64* word = reinterpret_cast<u64*>(smem + RADIX + 4);      // (RADIX + 4) * 4 bytes: 8-byte aligned
    u32* bits = reinterpret_cast<u32*>(word + next_pow2(k));
    auto put = [&](int slot, u32 key, u32 pos, u32 v) { word[slot] = ((u64)key << 32) | (u64)(~pos); bits[slot] = v; };
    const int kept = block_keep_top<true>(e, m, k, hist, sc, put);
    block_bitonic_sort_desc(word, bits, kept);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        if (j < kept) {
            out_idx[j] = (int)~(u32)word[j];
            out_val[j] = __uint_as_float(bits[j]);
        } else {
            out_idx[j] = -1;
            out_val[j] = __uint_as_float(0xff800000u);
        }
    }
}

}  // namespace hytopk
