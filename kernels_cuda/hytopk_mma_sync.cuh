// THE mma_sync core: tensor-core tiles scored by mma.sync (bf16 in, f32 accumulate), shared by the
// mma_sync filter, dense, recovery, replay and score-only kernels (mma_sync.cu), so
// their scores agree bit for bit.
//
// A block scores a tile of QPB queries x NTILE keys: MMA rows are the QPB*H
// (query, head) rows of q (A, row-major [row][d]); MMA columns are keys (B,
// "col" layout = keys[s][d] as stored). Keys go global -> shared with cp.async
// (double buffered), fragments come from shared memory with ldmatrix, products
// from mma.sync m16n8k16. Every warp owns all H rows of ONE query and KW keys,
// so the head reduction never leaves the warp.
//
// Fixed arithmetic of one score (independent of where the key sits in a tile,
// which warp or block computes it, and of NT): dot(q[t,h], key) = the mma
// chain over d-steps of 16, ascending, from 0; lane (g, tig) sums
// w[h] * max(0, dot) over its heads h = 16*mt + g, then 16*mt + g + 8, mt
// ascending (fmaf); the 8 lane partials are summed by an xor butterfly over
// lane bits 2, 3, 4 (commutative adds: every lane ends with the same bits);
// finally + 0.0f turns -0.0 into +0.0.
#pragma once
#include "hytopk_order.cuh"
#include "hytopk_score.cuh"
#include "hytopk_cp_async.cuh"
#include "hytopk_key_runs.cuh"

namespace hytopk {
namespace mma_sync {

// Compile-time tile geometry for H heads of dim D (256 threads = 8 warps).
template <int H_, int D_>
struct Shape {
    static constexpr int H = H_;
    static constexpr int D = D_;
    static_assert(H == 16 || H == 32 || H == 64, "mma_sync core: H must be 16, 32 or 64 (pad heads with zeros)");
    static_assert(D % 16 == 0 && D >= 16 && D <= 256, "mma_sync core: D must be a multiple of 16 in [16, 256]");
    static constexpr int THREADS = 256;
    static constexpr int WARPS = 8;
    static constexpr int QPB = (256 / H < 8) ? 256 / H : 8;   // queries per block: 4 (H=64), 8 (32, 16)
    static constexpr int WQ = WARPS / QPB;                    // warps per query (split the keys)
    static constexpr int KW = 2048 / H;                       // keys per warp: H*KW/32 = 64 accumulators
    static constexpr int NT = KW / 8;                         // n8 tiles per warp
    static constexpr int MT = H / 16;                         // m16 tiles per warp (one query's heads)
    static constexpr int NTILE = WQ * KW;                     // keys per block tile
    static constexpr int MROWS = QPB * H;                     // MMA rows per block
    static constexpr int RS = D + 8;                          // smem row stride (bf16): conflict-free ldmatrix
    static constexpr int KSTEPS = D / 16;
    static constexpr int CHUNKS = D / 8;                      // 16-byte pieces per row
    static constexpr int STAGES = 2;
    static constexpr int Q_BYTES = MROWS * RS * 2;
    static constexpr int TILE_BYTES = NTILE * RS * 2;
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * TILE_BYTES;
    static constexpr int TILES_PER_BLOCK = 2048 / NTILE;      // keys per block: 2048
    // replay: every warp scores RKW gathered keys of its own query per pass
    static constexpr int RKW = 16;
    static constexpr int RNT = RKW / 8;
    static constexpr int RJT = WQ * RKW;                      // keys per query per pass
    static constexpr int R_PASSES = 8;                        // passes per block (grid.y splits k)
    static constexpr int R_SMEM_BYTES = Q_BYTES + WARPS * RKW * RS * 2;
    static_assert(NT % 2 == 0 && RNT % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
    static_assert(QPB * WQ == WARPS, "warps must tile the queries exactly");
};

// ------------------------------------------------------------------ PTX helpers
// smem_addr, cp_async16, cp_async_commit, cp_async_wait: hytopk_cp_async.cuh

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ------------------------------------------------------------------ the core
// Scores of one warp's query against NT*8 keys in shared memory.
//   qa: smem address of the query's first head row (H rows, stride RS)
//   ka: smem address of the first key row (NT*8 rows, stride RS)
//   wv: this lane's weights, wv[2mt] = w[16mt + g], wv[2mt+1] = w[16mt + g + 8]
// Out: p[nt][j] = score of key nt*8 + 2*tig + j (same bits in all 8 lanes of a tig).
template <class S, int NT>
__device__ __forceinline__ void warp_scores(u32 qa, u32 ka, const float (&wv)[2 * S::MT], float (&p)[NT][2]) {
    constexpr int MT = S::MT, RS = S::RS;
    const int lane = (int)lane_id();
    const int lr = lane & 7, lm = lane >> 3;
    // ldmatrix.x4 row addresses: lane l feeds row (l & 7) of matrix (l >> 3).
    // A matrices: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3
    const u32 a_off = (u32)(((lr + (lm & 1) * 8) * RS + (lm >> 1) * 8) * 2);
    // B matrices: (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15)
    //           = b0, b1 of n-tile 2np, then b0, b1 of n-tile 2np+1
    const u32 b_off = (u32)((((lm >> 1) * 8 + lr) * RS + (lm & 1) * 8) * 2);
    float c[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[mt][nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < S::KSTEPS; ++ks) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], qa + a_off + (u32)((mt * 16 * RS + ks * 16) * 2));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 b[4];
            ldsm_x4(b, ka + b_off + (u32)((np * 16 * RS + ks * 16) * 2));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma16816(c[mt][2 * np], a[mt], b[0], b[1]);
                mma16816(c[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
    // c[mt][nt] = (head 16mt+g, key 2tig), (16mt+g, 2tig+1), (16mt+g+8, 2tig), (16mt+g+8, 2tig+1)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float s = 0.0f;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                s = fmaf(wv[2 * mt], fmaxf(c[mt][nt][j], 0.0f), s);
                s = fmaf(wv[2 * mt + 1], fmaxf(c[mt][nt][2 + j], 0.0f), s);
            }
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            s += __shfl_xor_sync(0xffffffffu, s, 8);
            s += __shfl_xor_sync(0xffffffffu, s, 16);
            p[nt][j] = s + 0.0f;
        }
}

// The two scores lane (g, tig) owns in round r: keys nt*8 + 2tig + {0, 1} of
// n-tile nt = 8r + g (own = false past NT). Unrolled select: no local memory.
template <int NT>
__device__ __forceinline__ bool owned_pair(const float (&p)[NT][2], int r, float& v0, float& v1, int& nt) {
    nt = 8 * r + ((int)lane_id() >> 2);
    v0 = 0.0f;
    v1 = 0.0f;
#pragma unroll
    for (int x = 0; x < NT; ++x)
        if (x == nt) { v0 = p[x][0]; v1 = p[x][1]; }
    return nt < NT;
}

// ------------------------------------------------------------------ block driver
// One block = QPB query slots. Slot j of block b is entry b*QPB + j of the
// query list (qmap[entry] when qmap is given, else the entry itself).
template <class S>
struct Block {
    typedef S Geometry;
    const bf16_bits* q;
    const bf16_bits* w;
    const bf16_bits* keys;
    long long L;
    const int* qmap;
    int nq;
    // this warp's slot
    int warp, qs, wq, entry;
    long long t;              // query, -1 for an empty slot
    long long a, b;           // its context [a, b) (empty for an empty slot)
    long long glo, ghi;       // union of the block's contexts (glo >= ghi: nothing to score)
    float wv[2 * S::MT];

    __device__ long long query_of(int e) const { return e < nq ? (qmap ? (long long)qmap[e] : (long long)e) : -1; }

    __device__ void init(const bf16_bits* q_, const bf16_bits* w_, const bf16_bits* k_, long long L_,
                         const int* qmap_, int nq_, const int* lo, const int* hi) {   // lo, hi may be null (replay: no contexts)
        q = q_; w = w_; keys = k_; L = L_; qmap = qmap_; nq = nq_;
        warp = (int)(threadIdx.x >> 5);
        qs = warp / S::WQ;
        wq = warp % S::WQ;
        glo = L;
        ghi = 0;
        for (int j = 0; j < S::QPB; ++j) {
            const long long tj = query_of(blockIdx.x * S::QPB + j);
            const long long aj = (tj >= 0 && lo) ? lo[tj] : 0, bj = (tj >= 0 && hi) ? hi[tj] : 0;
            if (aj < bj) { glo = min(glo, aj); ghi = max(ghi, bj); }
            if (j == qs) { entry = blockIdx.x * S::QPB + j; t = tj; a = aj; b = bj; }
        }
        const int g = (int)lane_id() >> 2;
#pragma unroll
        for (int mt = 0; mt < S::MT; ++mt) {
            wv[2 * mt] = t >= 0 ? to_float(w[t * S::H + 16 * mt + g]) : 0.0f;
            wv[2 * mt + 1] = t >= 0 ? to_float(w[t * S::H + 16 * mt + g + 8]) : 0.0f;
        }
    }

    // cp.async the QPB queries' q rows (empty slots: zeros). Caller commits.
    __device__ void load_q(bf16_bits* sq) const {
        const u32 base = smem_addr(sq);
        for (int i = threadIdx.x; i < S::MROWS * S::CHUNKS; i += S::THREADS) {
            const int row = i / S::CHUNKS, ch = i % S::CHUNKS;
            const long long tj = query_of(blockIdx.x * S::QPB + row / S::H);
            const bf16_bits* src = tj >= 0 ? q + (tj * S::H + row % S::H) * S::D + ch * 8 : q;
            cp_async16(base + (u32)((row * S::RS + ch * 8) * 2), src, tj >= 0);
        }
    }

    // cp.async keys [s0, s0 + NTILE); rows outside [glo, ghi) are zero-filled, never read.
    __device__ void load_tile(bf16_bits* sk, long long s0) const {
        const u32 base = smem_addr(sk);
        for (int i = threadIdx.x; i < S::NTILE * S::CHUNKS; i += S::THREADS) {
            const int row = i / S::CHUNKS, ch = i % S::CHUNKS;
            const long long s = s0 + row;
            const bool ok = s >= glo && s < ghi;
            cp_async16(base + (u32)((row * S::RS + ch * 8) * 2), keys + (ok ? s : 0) * S::D + ch * 8, ok);
        }
    }

    // Score tiles [tile0, tile0 + ntiles) (tile i = keys i*NTILE ...), double
    // buffered. For each warp whose KW keys touch its context: epi.scores(*this,
    // s_first, p); otherwise epi.skipped(*this, s_first). ntiles is block-uniform.
    template <class Epi>
    __device__ void scan(unsigned char* smem, long long tile0, int ntiles, Epi& epi) const {
        bf16_bits* sq = reinterpret_cast<bf16_bits*>(smem);
        bf16_bits* sk = reinterpret_cast<bf16_bits*>(smem + S::Q_BYTES);
        constexpr int TILE_ELEMS = S::NTILE * S::RS;
        load_q(sq);
        cp_async_commit();
#pragma unroll
        for (int st = 0; st < S::STAGES - 1; ++st) {
            if (st < ntiles) load_tile(sk + st * TILE_ELEMS, (tile0 + st) * S::NTILE);
            cp_async_commit();
        }
        const u32 qa = smem_addr(sq + qs * S::H * S::RS);
        for (int i = 0; i < ntiles; ++i) {
            cp_async_wait<S::STAGES - 2>();
            __syncthreads();                 // tile i landed for everyone; tile i-1's stage is free
            const int nxt = i + S::STAGES - 1;
            if (nxt < ntiles) load_tile(sk + (nxt % S::STAGES) * TILE_ELEMS, (tile0 + nxt) * S::NTILE);
            cp_async_commit();
            const long long s_first = (tile0 + i) * S::NTILE + wq * S::KW;
            if (t >= 0 && s_first < b && s_first + S::KW > a) {          // warp-uniform
                float p[S::NT][2];
                const u32 ka = smem_addr(sk + (i % S::STAGES) * TILE_ELEMS + wq * S::KW * S::RS);
                warp_scores<S, S::NT>(qa, ka, wv, p);
                epi.scores(*this, s_first, p);
            } else {
                epi.skipped(*this, s_first);
            }
        }
        cp_async_wait<0>();
    }

    // The tiles this block scans when blocks along grid.y split the union
    // [glo, ghi) into runs of TILES_PER_BLOCK tiles: (first tile, count <= 0 if none).
    __device__ void union_tiles(long long& tile0, int& ntiles) const {
        union_run(glo, ghi, S::NTILE, S::TILES_PER_BLOCK, tile0, ntiles);
    }
};

}  // namespace mma_sync
}  // namespace hytopk
