// Selection over a given score table at memory speed (issue 21). Src is
// hytopk::TableSource (float32) or hytopk::TableBf16Source (bf16 bits, widened
// exactly to float32); rows are read with 16-byte vector loads.
//   hytopk_table_filter  stage 5 on a table: a persistent, streaming filter with
//                        warp-aggregated appends (one atomic per warp per tile)
//   hytopk_table_topk    the exact top-k of whole table rows (recovery, fallback,
//                        backend.topk): 11-bit MSB-first histograms of the order
//                        keys, stopping as soon as the k-th key's bin fits in
//                        shared memory; one collecting read; the exact select of
//                        block_keep_top among the collected bin; a bitonic sort.
//   hytopk_table_topk_listed  the same over a device-side list of rows (the v2 fallback)
//   hytopk_table_ranges_ok    the torch op's device-side check of lo / hi
#include "hytopk_table.cuh"
using namespace hytopk;

namespace hytopk {

constexpr int FILTER_U = 4;          // vectors per thread per tile of the filter
constexpr int TOPK_BLOCK = 512;      // threads of hytopk_table_topk
constexpr int TOPK_ELEMS = 8;        // elements per thread per step of its row reads (2 float32 / 1 bf16 vectors)

// Shared memory of hytopk_table_topk in u32 words: 2048-bin histogram, scalars,
// next_pow2(k) (u64 word, u32 bits) sort slots, cap (position, bits) collected entries.
__host__ __device__ constexpr long long table_topk_smem_words(int k, int cap) {
    return 2048 + 12 + 3LL * next_pow2(k) + 2LL * cap;
}

// hytopk_table_topk mode bits
constexpr int TOPK_ROWS = 1, TOPK_FAILED = 2, TOPK_SAMPLED = 4, TOPK_PLAIN_ATOMICS = 8;
constexpr int SAMPLE_BATCH = 8;      // sample loads in flight per thread

struct TopkScalars {
    u32 digit, before, equal;
    int ndef, ncand, chunk_hits;
    u32 pad[2];
};

}  // namespace hytopk

// Stage 5 on a table. grid: persistent (a few blocks per SM), striding over the
// n * tiles_per_row tiles of blockDim.x * FILTER_U vectors; tile j of row t covers
// its context's vectors from j * tile on (tiles past the context are skipped).
// count must be zeroed; count[t] is the true number of candidates; only slots
// < capacity are written.
template <class Src>
__global__ void __launch_bounds__(BLOCK, 4)
hytopk_table_filter(const void* __restrict__ table, long long L, int n, const int* __restrict__ lo,
                    const int* __restrict__ hi, const u32* __restrict__ T, int capacity, long long tiles_per_row,
                    int aligned, int* __restrict__ cand_idx, u32* __restrict__ cand_val, int* __restrict__ count) {
    constexpr int P = TableVec<Src>::PER_VEC;
    const long long total = (long long)n * L;
    const long long ntiles = (long long)n * tiles_per_row;
    const long long tile_vecs = (long long)blockDim.x * FILTER_U;
    for (long long tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {    // uniform over the block
        const int t = (int)(tile / tiles_per_row);
        const long long j = tile - (long long)t * tiles_per_row;
        const long long row0 = (long long)t * L;
        const long long a = min(max((long long)lo[t], 0LL), L);        // clamped: never a read outside the row
        const long long g_lo = row0 + a, g_hi = row0 + min(max((long long)hi[t], a), L);
        if (g_lo >= g_hi) continue;
        const long long v_end = (g_hi + P - 1) / P;
        const long long va = g_lo / P + j * tile_vecs;
        if (va >= v_end) continue;
        const u32 tkey = order_key_bits(T[t]);
        VecTile<Src, FILTER_U, true> tl;
        tl.load(table, total, aligned, va + threadIdx.x, blockDim.x, v_end, g_lo, g_hi);
        int mine = 0;
#pragma unroll
        for (int u = 0; u < FILTER_U; ++u)
#pragma unroll
            for (int e = 0; e < P; ++e) mine += (tl.in(u, e, g_lo, g_hi) && order_key_bits(tl.bits[u][e]) >= tkey);
        int slot = warp_reserve(mine, count + t);
        if (mine) {
            const long long out = (long long)t * capacity;
#pragma unroll
            for (int u = 0; u < FILTER_U; ++u)
#pragma unroll
                for (int e = 0; e < P; ++e) {
                    if (tl.in(u, e, g_lo, g_hi) && order_key_bits(tl.bits[u][e]) >= tkey) {
                        if (slot < capacity) {                   // never write at or past capacity
                            cand_idx[out + slot] = (int)(tl.g0[u] + e - row0);
                            cand_val[out + slot] = tl.bits[u][e];
                        }
                        ++slot;
                    }
                }
        }
    }
}

namespace {
struct BinEntries {
    const u32* p;
    const u32* v;
    __device__ __forceinline__ u32 pos(long long i) const { return p[i]; }
    __device__ __forceinline__ u32 bits(long long i) const { return v[i]; }
};
}

// Exact top-k (rank order, CONTRACT.md §2) of whole table rows, one block per row.
// mode bits:
//   TOPK_ROWS     rows[j] lists the rows (output row j); else row j = j for j < nrows
//   TOPK_FAILED   a row t with failed[t] == 0 is skipped (its output left untouched):
//                 the device-side recovery after a check
//   TOPK_SAMPLED  HyTopK fused into one read: the threshold of CONTRACT.md §3.1-3.4 from
//                 the row's own samples (M, r computed here as the contract says), one
//                 collecting read of the keys >= key(T) into shared memory, the exact
//                 select among them; a row whose count is < k or > cap takes the
//                 histogram path below instead (the answer is the same either way).
//                 count_out[t] gets the true candidate count (0 where c <= k).
//   TOPK_PLAIN_ATOMICS  histograms with one shared atomic per entry instead of one per
//                 distinct digit per warp (__match_any_sync): the faster of the two
//                 depends on how concentrated the digits are
// cap: collected entries that fit in shared memory (>= MAX_SAMPLES / 2 for TOPK_SAMPLED).
// grid: nrows blocks of TOPK_BLOCK threads; smem: table_topk_smem_words(k, cap).
// (The body is table_topk_row, output row j = blockIdx.x; hytopk_table_topk_listed runs the
// same body over a device-side list of rows.)
template <class Src>
__device__ __forceinline__ void table_topk_row(const int j, u32* smem, const void* __restrict__ table, long long L,
                                               int n, const int* __restrict__ rows, int nrows,
                                               const unsigned char* __restrict__ failed, int mode,
                                               const int* __restrict__ lo, const int* __restrict__ hi, int k, int cap,
                                               int aligned, double oversample, int* __restrict__ count_out,
                                               int* __restrict__ idx, float* __restrict__ val) {
    constexpr int P = TableVec<Src>::PER_VEC;
    constexpr int TOPK_U = TOPK_ELEMS / P;
    constexpr int FUSED_STEP_U = 2 * TOPK_U;
    if (j >= nrows) return;
    const int t = (mode & TOPK_ROWS) ? rows[j] : j;
    if (t < 0 || t >= n) return;
    if ((mode & TOPK_FAILED) && failed[t] == 0) return;
    const bool plain = (mode & TOPK_PLAIN_ATOMICS) != 0;
    u32* hist = smem;
    TopkScalars* ts = reinterpret_cast<TopkScalars*>(smem + 2048);
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(smem + 2048 + 8);
    const int KP = next_pow2(k);
    u64* word = reinterpret_cast<u64*>(smem + 2048 + 12);          // 2060 words: 8-byte aligned
    u32* wbits = reinterpret_cast<u32*>(word + KP);
    u32* cpos = wbits + KP;
    u32* cbits = cpos + cap;

    const long long total = (long long)n * L;
    const long long row0 = (long long)t * L;
    const long long a = min(max((long long)lo[t], 0LL), L);            // clamped: never a read outside the row
    const long long c = min(max((long long)hi[t], a), L) - a;
    const long long g_lo = row0 + a, g_hi = row0 + a + c;
    const long long v_begin = g_lo / P, v_end = (g_hi + P - 1) / P;
    const long long step = (long long)blockDim.x * TOPK_U;
    int* out_idx = idx + (long long)j * k;
    float* out_val = val + (long long)j * k;
    const u32 lane = lane_id();

    int kept = 0;
    bool done = false;
    if (c <= k) {                                   // the whole context, sorted
        for (long long i = threadIdx.x; i < c; i += blockDim.x) {
            const u32 b = TableVec<Src>::bits_at(table, g_lo + i);
            word[i] = ((u64)order_key_bits(b) << 32) | (u64)(~(u32)(a + i));
            wbits[i] = b;
        }
        kept = (int)c;
        done = true;
        if ((mode & TOPK_SAMPLED) && threadIdx.x == 0) count_out[t] = (int)c;
        __syncthreads();
    } else if (mode & TOPK_SAMPLED) {
        // 0. CONTRACT.md §3.1-3.3: M samples at a + (j * c) // M, rank r (float64, that order).
        const long long Ml = min(c, min(max(c / SAMPLE_STRIDE, (long long)MIN_SAMPLES), (long long)MAX_SAMPLES));
        const int M = (int)Ml;
        double rd = ceil(((oversample * (double)k) * (double)Ml) / (double)c);
        rd = fmin((double)Ml, rd);
        const u32 r = (u32)max(1LL, min(Ml, (long long)fmax(rd, 1.0)));
        u32* skeys = cpos;                          // M <= 2 * cap words: cpos, then cbits
        for (int q0 = 0; q0 < M; q0 += SAMPLE_BATCH * TOPK_BLOCK) {   // a batch of loads in flight per thread
            u32 sb[SAMPLE_BATCH];
#pragma unroll
            for (int i = 0; i < SAMPLE_BATCH; ++i) {
                const int q = q0 + i * TOPK_BLOCK + (int)threadIdx.x;
                sb[i] = q < M ? TableVec<Src>::bits_at(table, g_lo + ((long long)q * c) / Ml) : 0u;
            }
#pragma unroll
            for (int i = 0; i < SAMPLE_BATCH; ++i) {
                const int q = q0 + i * TOPK_BLOCK + (int)threadIdx.x;
                if (q < M) skeys[q] = order_key_bits(sb[i]);
            }
        }
        __syncthreads();
        auto sample_key = [&](long long q, u32* out) { *out = skeys[q]; return true; };
        const u32 tkey = block_radix_select<true, true>(sample_key, M, r, hist, sc);
        // 3.5: one read, every key >= key(T) to shared memory (the true count, slots < cap)
        if (threadIdx.x == 0) ts->ncand = 0;
        __syncthreads();
        for (long long vs = v_begin; vs < v_end; vs += FUSED_STEP_U * blockDim.x) {
            VecTile<Src, FUSED_STEP_U, false> tl;        // twice the loads in flight: this is the one read
            tl.load(table, total, aligned, vs + threadIdx.x, blockDim.x, v_end, g_lo, g_hi);
            int mine = 0;
#pragma unroll
            for (int u = 0; u < FUSED_STEP_U; ++u)
#pragma unroll
                for (int e = 0; e < P; ++e) mine += (tl.in(u, e, g_lo, g_hi) && order_key_bits(tl.bits[u][e]) >= tkey);
            int slot = warp_reserve(mine, &ts->ncand);
            if (mine) {
#pragma unroll
                for (int u = 0; u < FUSED_STEP_U; ++u)
#pragma unroll
                    for (int e = 0; e < P; ++e) {
                        if (tl.in(u, e, g_lo, g_hi) && order_key_bits(tl.bits[u][e]) >= tkey) {
                            if (slot < cap) { cpos[slot] = (u32)(tl.g0[u] + e - row0); cbits[slot] = tl.bits[u][e]; }
                            ++slot;
                        }
                    }
            }
        }
        __syncthreads();
        const int cnt = ts->ncand;
        if (threadIdx.x == 0) count_out[t] = cnt;
        if (cnt >= k && cnt <= cap) {               // 3.6 passed: 3.8, the exact select among them
            __syncthreads();
            const BinEntries be = {cpos, cbits};
            auto put = [&](int slot, u32 key, u32 pos, u32 v) {
                if (slot < k) { word[slot] = ((u64)key << 32) | (u64)(~pos); wbits[slot] = v; }
            };
            kept = min(k, block_keep_top<true>(be, cnt, k, hist, sc, put));
            done = true;
        }
        __syncthreads();
    }
    if (!done) {
        // 1. MSB-first histograms (11, 11, 10 bits) of the keys still matching the prefix;
        //    stop once the k-th key's bin holds at most cap entries.
        u32 prefix = 0u, mask = 0u, rem = (u32)k, equal = 0u;
        for (int level = 0; level < 3; ++level) {
            const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
            const u32 dmask = level < 2 ? 0x7ffu : 0x3ffu;
            const int nb = (int)dmask + 1;
            for (int b = threadIdx.x; b < nb; b += blockDim.x) hist[b] = 0u;
            __syncthreads();
            for (long long vs = v_begin; vs < v_end; vs += step) {            // uniform over the block
                VecTile<Src, TOPK_U, false> tl;
                tl.load(table, total, aligned, vs + threadIdx.x, blockDim.x, v_end, g_lo, g_hi);
#pragma unroll
                for (int u = 0; u < TOPK_U; ++u)
#pragma unroll
                    for (int e = 0; e < P; ++e) {
                        const u32 key = order_key_bits(tl.bits[u][e]);
                        const bool act = tl.in(u, e, g_lo, g_hi) && (key & mask) == prefix;
                        const u32 d = act ? (key >> shift) & dmask : 0xffffffffu;
                        if (plain) {
                            if (act) atomicAdd(&hist[d], 1u);
                        } else {                                            // one shared atomic per digit per warp
                            const u32 peers = __match_any_sync(0xffffffffu, d);
                            if (act && (peers & lanes_below_mask()) == 0u) atomicAdd(&hist[d], (u32)__popc(peers));
                        }
                    }
            }
            __syncthreads();
            if (threadIdx.x < 32) {                 // lane l owns the nb/32 digits ranked l*per .. (best first)
                const int per = nb / 32;
                u32 own = 0u;
                for (int q = 0; q < per; ++q) own += hist[nb - 1 - (int)lane * per - q];
                u32 incl = own;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const u32 y = __shfl_up_sync(0xffffffffu, incl, off);
                    if (lane >= (u32)off) incl += y;
                }
                const u32 found = __ballot_sync(0xffffffffu, incl >= rem);
                if (lane == (found ? (u32)(__ffs(found) - 1) : 31u)) {
                    u32 before = incl - own, hd = 0u;
                    int digit = 0;
                    for (int q = 0; q < per; ++q) {
                        digit = nb - 1 - (int)lane * per - q;
                        hd = hist[digit];
                        if (before + hd >= rem) break;
                        before += hd;
                    }
                    ts->digit = (u32)digit;
                    ts->before = before;
                    ts->equal = hd;
                }
            }
            __syncthreads();
            rem -= ts->before;
            prefix |= ts->digit << shift;
            mask |= dmask << shift;
            equal = ts->equal;
            __syncthreads();                        // ts and hist are rewritten below
            if (equal <= (u32)cap) break;
        }
        // Here: #{key & mask > prefix} = k - rem (all kept), #{key & mask == prefix} = equal >= rem.
        const bool collect = equal <= (u32)cap;
        // 2. More ties at the k-th key than fit (mask is then all bits: key == prefix is K*):
        //    the rem lowest positions among them, by an in-order scan that stops at the chunk
        //    holding the rem-th tie and a position select inside that chunk.
        u32 pstar = 0xffffffffu;
        if (!collect) {
            if (threadIdx.x == 0) ts->chunk_hits = 0;
            __syncthreads();
            u32 seen = 0u;
            for (long long vs = v_begin; vs < v_end; vs += step) {
                VecTile<Src, TOPK_U, false> tl;
                tl.load(table, total, aligned, vs + threadIdx.x, blockDim.x, v_end, g_lo, g_hi);
                int mine = 0;
#pragma unroll
                for (int u = 0; u < TOPK_U; ++u)
#pragma unroll
                    for (int e = 0; e < P; ++e) mine += (tl.in(u, e, g_lo, g_hi) && order_key_bits(tl.bits[u][e]) == prefix);
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, off);
                if (lane == 0u && mine) atomicAdd(&ts->chunk_hits, mine);
                __syncthreads();
                const u32 hits = (u32)ts->chunk_hits;
                __syncthreads();
                if (threadIdx.x == 0) ts->chunk_hits = 0;
                if (seen + hits >= rem) {            // uniform: the rem-th tie lies in this chunk
                    const long long cg0 = vs * P;
                    const long long cm = min(step * P, v_end * P - cg0);
                    auto tie_pos = [&](long long i, u32* outp) {
                        const long long g = cg0 + i;
                        if (g < g_lo || g >= g_hi) return false;
                        if (order_key_bits(TableVec<Src>::bits_at(table, g)) != prefix) return false;
                        *outp = (u32)(g - row0);
                        return true;
                    };
                    __syncthreads();
                    pstar = block_radix_select<false, true>(tie_pos, cm, rem - seen, hist, sc);
                    break;
                }
                seen += hits;
                __syncthreads();
            }
            __syncthreads();
        }
        // 3. One collecting read: every key above the prefix is kept (slots 0 .. k-rem-1);
        //    the prefix's bin goes to shared memory (collect) or, past cap, its ties up to pstar.
        if (threadIdx.x == 0) { ts->ndef = 0; ts->ncand = 0; }
        __syncthreads();
        for (long long vs = v_begin; vs < v_end; vs += step) {
            VecTile<Src, TOPK_U, false> tl;
            tl.load(table, total, aligned, vs + threadIdx.x, blockDim.x, v_end, g_lo, g_hi);
            int mdef = 0, mcand = 0;
#pragma unroll
            for (int u = 0; u < TOPK_U; ++u)
#pragma unroll
                for (int e = 0; e < P; ++e) {
                    const u32 key = order_key_bits(tl.bits[u][e]);
                    const bool in = tl.in(u, e, g_lo, g_hi);
                    const u32 pos = (u32)(tl.g0[u] + e - row0);
                    mdef += in && ((key & mask) > prefix || (!collect && key == prefix && pos <= pstar));
                    mcand += in && collect && (key & mask) == prefix;
                }
            int sdef = warp_reserve(mdef, &ts->ndef);
            int scand = warp_reserve(mcand, &ts->ncand);
            if (mdef | mcand) {
#pragma unroll
                for (int u = 0; u < TOPK_U; ++u)
#pragma unroll
                    for (int e = 0; e < P; ++e) {
                        const u32 b = tl.bits[u][e];
                        const u32 key = order_key_bits(b);
                        if (!tl.in(u, e, g_lo, g_hi)) continue;
                        const u32 pos = (u32)(tl.g0[u] + e - row0);
                        if ((key & mask) > prefix || (!collect && key == prefix && pos <= pstar)) {
                            if (sdef < k) { word[sdef] = ((u64)key << 32) | (u64)(~pos); wbits[sdef] = b; }
                            ++sdef;
                        } else if (collect && (key & mask) == prefix) {
                            if (scand < cap) { cpos[scand] = pos; cbits[scand] = b; }
                            ++scand;
                        }
                    }
            }
        }
        __syncthreads();
        const int ndef = min(ts->ndef, k);
        kept = ndef;
        if (collect) {                              // 4. the rem best of the collected bin
            const int m = min(ts->ncand, cap);
            __syncthreads();
            const BinEntries be = {cpos, cbits};
            auto put = [&](int slot, u32 key, u32 pos, u32 v) {
                if (ndef + slot < k) { word[ndef + slot] = ((u64)key << 32) | (u64)(~pos); wbits[ndef + slot] = v; }
            };
            kept = min(k, ndef + block_keep_top<true>(be, m, (int)(k - ndef), hist, sc, put));
        }
        __syncthreads();
    }
    block_bitonic_sort_desc(word, wbits, kept);
    write_row(word, wbits, kept, k, out_idx, out_val);
}

template <class Src>
__global__ void __launch_bounds__(TOPK_BLOCK, 2)
hytopk_table_topk(const void* __restrict__ table, long long L, int n, const int* __restrict__ rows, int nrows,
                  const unsigned char* __restrict__ failed, int mode, const int* __restrict__ lo,
                  const int* __restrict__ hi, int k, int cap, int aligned, double oversample,
                  int* __restrict__ count_out, int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    table_topk_row<Src>(blockIdx.x, smem, table, L, n, rows, nrows, failed, mode, lo, hi, k, cap, aligned, oversample,
                        count_out, idx, val);
}

// The exact top-k (histogram path, plain atomics) of the rows listed in rows[0 .. *nlisted),
// each written to its own output row t (idx / val are [n, k]): the fallback of the v2 table
// kernels, launched on a small grid that strides over the list, so that a call whose rows all
// passed costs one short launch instead of n blocks of ~110 KB of shared memory that exit at
// once. grid: any (2 per SM); smem: table_topk_smem_words(k, cap).
template <class Src>
__global__ void __launch_bounds__(TOPK_BLOCK, 2)
hytopk_table_topk_listed(const void* __restrict__ table, long long L, int n, const int* __restrict__ rows,
                         const int* __restrict__ nlisted, const int* __restrict__ lo, const int* __restrict__ hi, int k,
                         int cap, int aligned, int* __restrict__ idx, float* __restrict__ val) {
    extern __shared__ __align__(16) u32 smem[];
    const int nr = min(*nlisted, n);
    for (int jj = blockIdx.x; jj < nr; jj += gridDim.x) {            // uniform over the block
        table_topk_row<Src>(rows[jj], smem, table, L, n, rows, n, nullptr, TOPK_PLAIN_ATOMICS, lo, hi, k, cap,
                            aligned, 3.0, nullptr, idx, val);
        __syncthreads();                            // the next row rewrites the shared memory
    }
}

// The torch op's check of its contexts with no host copy (workbench/torch/table_topk.py): *ok = 1
// when 0 <= lo[t] <= hi[t] <= L for every row t < n, else 0 (torch._assert_async reads it). One
// block: two launches in a CUDA graph where the same check in torch ops took seven (~10 us of the
// op at 4096 x 131072).
extern "C" __global__ void __launch_bounds__(1024)
hytopk_table_ranges_ok(const int* __restrict__ lo, const int* __restrict__ hi, int n, long long L,
                       unsigned char* __restrict__ ok) {
    __shared__ int nbad;                            // threads that saw a bad row
    if (threadIdx.x == 0) nbad = 0;
    __syncthreads();
    int bad = 0;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const int a = lo[t], b = hi[t];
        bad |= (a < 0 || a > b || (long long)b > L) ? 1 : 0;
    }
    if (bad) atomicAdd(&nbad, 1);
    __syncthreads();
    if (threadIdx.x == 0) *ok = nbad ? 0 : 1;
}
