// THE wgmma scoring core (sm_90a): warpgroup tensor-core MMAs read both operands
// from shared memory, keys as A (M = 64 keys per warpgroup), the block's
// QPB x H (query, head) rows as B (N = 256), K = D. Inputs are bf16 (k16 steps)
// or fp8 e4m3 with a float32 scale per key row (k32 steps, as DeepSeek's
// indexer keys). Shared by the wgmma filter, dense, recovery and score-only
// kernels (wgmma.cu), so their scores agree bit for bit.
//
// Why keys as A: a thread's accumulators then hold two keys x 64 (query, head)
// columns, so the head reduction is in-thread plus two shuffles; with heads as
// rows it would cross the four warps of a warpgroup through shared memory.
//
// Shared-memory layout (both operands, K-major, no swizzle): 8-row x 16-byte
// core matrices stored as 128 contiguous bytes; chunk c of row r lives at
// (r / 8) * (CH * 128) + c * 128 + (r % 8) * 16, CH = 16-byte chunks per row.
// The descriptor's leading offset (next 16 bytes of K) is 128, its stride
// offset (next 8 rows) CH * 128. Thread i of a cp.async sweep writes bytes
// [16i, 16i + 16): consecutive threads fill one core matrix.
//
// Fixed arithmetic of one score (independent of tile position, warp, block):
// dot(q[t,h], key) = the wgmma chain over K steps ascending; lane (g, tig)
// sums w[h] * max(0, dot) over its heads h = 8j + 2tig, 8j + 2tig + 1, j
// ascending (fmaf); then + xor-shuffle over lane bits 0 and 1 (commutative:
// all four lanes end with the same bits); fp8: times the key's scale; + 0.0f.
#pragma once
#include "hytopk_order.cuh"
#include "hytopk_score.cuh"
#include "hytopk_cp_async.cuh"
#include "hytopk_key_runs.cuh"
#include "hytopk_wgmma_common.cuh"

namespace hytopk {
namespace wg {

typedef unsigned char e4m3_bits;

using namespace wgp;                   // mma wrappers, fences, descriptors, named barriers

// ------------------------------------------------------------------ input kinds
struct Bf16In {                        // q, keys, w: bf16 bits; no key scale
    typedef bf16_bits elem;
    typedef bf16_bits weight;
    static constexpr int BYTES = 2;
    static constexpr bool SCALED = false;
    static __device__ __forceinline__ void mma(float (&d)[128], u64 da, u64 db, int acc) { wgmma_m64n256k16_bf16(d, da, db, acc); }
    static __device__ __forceinline__ void mma(float (&d)[64], u64 da, u64 db, int acc) { wgmma_m64n128k16_bf16(d, da, db, acc); }
};
struct E4m3In {                        // q, keys: fp8 e4m3 bits; w: float32; scale[L]: float32 per key
    typedef e4m3_bits elem;
    typedef float weight;
    static constexpr int BYTES = 1;
    static constexpr bool SCALED = true;
    static __device__ __forceinline__ void mma(float (&d)[128], u64 da, u64 db, int acc) { wgmma_m64n256k32_e4m3(d, da, db, acc); }
    static __device__ __forceinline__ void mma(float (&d)[64], u64 da, u64 db, int acc) { wgmma_m64n128k32_e4m3(d, da, db, acc); }
};

// Compile-time geometry (256 threads = 2 warpgroups).
template <int H_, int D_, class In_>
struct Shape {
    typedef In_ In;
    static constexpr int H = H_;
    static constexpr int D = D_;
    static_assert(H == 16 || H == 32 || H == 64, "wgmma core: H must be 16, 32 or 64 (pad heads with zeros)");
    static constexpr int ROW_BYTES = D * In::BYTES;
    static_assert(ROW_BYTES % 32 == 0 && ROW_BYTES <= 256, "wgmma core: a row must be 32 to 256 bytes, a multiple of 32");
    static constexpr int THREADS = 256;
    static constexpr int QPB = 256 / H;                 // queries per block: N = QPB * H = 256
    static constexpr int NROWS = 256;
    static constexpr int CH = ROW_BYTES / 16;           // 16-byte chunks per row
    static constexpr int KSTEPS = ROW_BYTES / 32;       // one wgmma per 32 bytes of K
    static constexpr int GROUP_BYTES = CH * 128;        // 8 rows
    static constexpr int KT = 128;                      // keys per tile: 64 per warpgroup
    static constexpr int WG_STAGES = 4;                 // ping-pong scan: 64-key tiles per warpgroup
    static constexpr int Q_BYTES = NROWS * ROW_BYTES;
    static constexpr int WG_TILE_BYTES = 64 * ROW_BYTES;
    static constexpr int STAGE_BYTES = 2 * WG_STAGES * WG_TILE_BYTES;
    static constexpr int W_BYTES = NROWS * 4;
    static constexpr int SLOT_BYTES = QPB * 16;
    // the filter's candidate staging: per warp and slot E entries of (position, bits)
    static constexpr int BASE_BYTES = Q_BYTES + STAGE_BYTES + W_BYTES + SLOT_BYTES;
    static constexpr int E_FIT = ((227 * 1024 - BASE_BYTES) / (8 * QPB * 8)) / 16 * 16;
    static constexpr int E = E_FIT < 128 ? E_FIT : 128;
    static_assert(E >= 16, "wgmma core: no room for the filter's candidate staging");
    static constexpr int SMEM_BYTES = BASE_BYTES + 8 * QPB * E * 8;
    static_assert(SMEM_BYTES <= 227 * 1024, "wgmma core: shared memory over the 227 KiB a block can have");
    static constexpr int TILES_PER_BLOCK = 32;          // keys per block: 4096
    static constexpr int JQ = H / 8;                    // n8 column blocks per query
};

// ------------------------------------------------------------------ block driver
// One block = QPB query slots (entry blockIdx.x * QPB + j of the query list;
// qmap[entry] when given). Slot data lives in shared memory (read as broadcasts).
template <class S>
struct Block {
    typedef S Geometry;
    typedef typename S::In In;
    const typename In::elem* q;
    const typename In::elem* keys;
    const float* kscale;          // E4m3In only
    long long L;
    const int* qmap;
    int nq;
    long long glo, ghi;           // union of the slots' contexts
    unsigned char* smem;
    int* s_t;                     // query of slot j (-1: empty)
    int* s_a;
    int* s_b;
    u32* s_aux;                   // epilogue data per slot (the filter's threshold key)
    float* s_w;                   // [QPB * H] weights as float
    uint2* s_stage;               // [8 warps][QPB][E] staged candidates (filter)

    __device__ long long query_of(int e) const { return e < nq ? (qmap ? (long long)qmap[e] : (long long)e) : -1; }

    // Every thread: slots, the union, weights. Ends with a barrier.
    __device__ void init(unsigned char* smem_, const typename In::elem* q_, const typename In::weight* w,
                         const typename In::elem* k_, const float* ks_, long long L_, const int* qmap_, int nq_,
                         const int* lo, const int* hi) {
        smem = smem_; q = q_; keys = k_; kscale = ks_; L = L_; qmap = qmap_; nq = nq_;
        s_w = reinterpret_cast<float*>(smem + S::Q_BYTES + S::STAGE_BYTES);
        s_t = reinterpret_cast<int*>(s_w + S::NROWS);
        s_a = s_t + S::QPB;
        s_b = s_a + S::QPB;
        s_aux = reinterpret_cast<u32*>(s_b + S::QPB);
        s_stage = reinterpret_cast<uint2*>(smem + S::BASE_BYTES);
        glo = L;
        ghi = 0;
        for (int j = 0; j < S::QPB; ++j) {
            const long long tj = query_of(blockIdx.x * S::QPB + j);
            const long long aj = (tj >= 0 && lo) ? lo[tj] : 0, bj = (tj >= 0 && hi) ? hi[tj] : 0;
            if (aj < bj) { glo = min(glo, aj); ghi = max(ghi, bj); }
        }
        if (threadIdx.x < S::QPB) {
            const int j = threadIdx.x;
            const long long tj = query_of(blockIdx.x * S::QPB + j);
            s_t[j] = (int)tj;
            s_a[j] = (tj >= 0 && lo) ? lo[tj] : 0;
            s_b[j] = (tj >= 0 && hi) ? hi[tj] : 0;
            s_aux[j] = 0u;
        }
        for (int i = threadIdx.x; i < S::NROWS; i += S::THREADS) {
            const long long tj = query_of(blockIdx.x * S::QPB + i / S::H);
            s_w[i] = tj >= 0 ? to_float(w[tj * S::H + i % S::H]) : 0.0f;
        }
        __syncthreads();
    }

    // cp.async sweep of `rows` rows into the core-matrix layout at dst; row r comes
    // from src_row(r) (nullptr: zero-fill). Thread i writes bytes [16i, 16i + 16).
    template <class RowFn>
    __device__ void sweep(u32 dst, int rows, RowFn src_row) const {
        for (int i = threadIdx.x; i < rows * S::CH; i += S::THREADS) {
            const int r = (i / (8 * S::CH)) * 8 + (i & 7), c = (i >> 3) % S::CH;
            const unsigned char* row = src_row(r);
            cp_async16(dst + 16u * (u32)i, row ? row + c * 16 : reinterpret_cast<const unsigned char*>(keys), row != nullptr);
        }
    }

    __device__ void load_q() const {
        const Block* self = this;
        sweep(smem_addr(smem), S::NROWS, [self](int r) -> const unsigned char* {
            const long long tj = self->query_of(blockIdx.x * S::QPB + r / S::H);
            return tj >= 0 ? reinterpret_cast<const unsigned char*>(self->q + (tj * S::H + r % S::H) * S::D) : nullptr;
        });
    }

    // Warpgroup wgi's 64 keys of its stage st (ping-pong scan) against all NROWS rows:
    // issued and committed; the caller waits (wgmma_wait_all) after passing the turn.
    __device__ void mma_wg_issue(int wgi, int st, float (&d)[128]) const {
        const u32 a0 = smem_addr(smem + S::Q_BYTES + (wgi * S::WG_STAGES + st) * S::WG_TILE_BYTES);
        const u32 b0 = smem_addr(smem);
        const u64 da = smem_desc(a0, 128u, S::GROUP_BYTES), db = smem_desc(b0, 128u, S::GROUP_BYTES);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < S::KSTEPS; ++ks)
            In::mma(d, da + 16ull * ks, db + 16ull * ks, ks > 0);    // + 32 bytes of K: the address field, in 16-byte units
        wgmma_commit();
    }

    // p[jj][e] = score of (slot J0 + jj, key s_warp + g + 8e), the same bits in the 4 lanes
    // of a g, from accumulators d of the MMA over the rows of slots [J0, J0 + NJ).
    template <int J0, int NJ, int NACC>
    __device__ __forceinline__ void scores(const float (&d)[NACC], long long s_warp, float (&p)[NJ][2]) const {
        static_assert(NACC == NJ * S::H / 2, "accumulators: NJ slots x H heads / (128 threads / 64 keys)");
        const int lane = (int)lane_id(), g = lane >> 2, tig = lane & 3;
        const float2* w2 = reinterpret_cast<const float2*>(s_w) + J0 * S::H / 2;
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float s = 0.0f;
#pragma unroll
                for (int q8 = 0; q8 < S::JQ; ++q8) {
                    const int nb = jj * S::JQ + q8;
                    const float2 wv = w2[4 * nb + tig];              // w of columns 8nb + 2tig, + 1
                    s = fmaf(wv.x, fmaxf(d[4 * nb + 2 * e], 0.0f), s);
                    s = fmaf(wv.y, fmaxf(d[4 * nb + 2 * e + 1], 0.0f), s);
                }
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                p[jj][e] = s;
            }
        if (In::SCALED) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const long long s = s_warp + g + 8 * e;
                const float sc = (s < L) ? kscale[s] : 0.0f;
#pragma unroll
                for (int jj = 0; jj < NJ; ++jj) p[jj][e] *= sc;
            }
        }
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) { p[jj][0] += 0.0f; p[jj][1] += 0.0f; }
    }

    // Warpgroup wgi's 64 keys [s0, s0 + 64) into its stage st (ping-pong scan), by its 128 threads.
    // Thread tw copies 16-byte pieces tw + 128 j: consecutive threads fill one core matrix.
    __device__ void load_wg_tile(int wgi, int st, long long s0) const {
        const int tw = (int)(threadIdx.x & 127);
        const u32 dst = smem_addr(smem + S::Q_BYTES + (wgi * S::WG_STAGES + st) * S::WG_TILE_BYTES);
        const unsigned char* base = reinterpret_cast<const unsigned char*>(keys);
        const int lo32 = (int)glo, hi32 = (int)ghi, k0 = (int)s0;        // positions < L < 2^31
#pragma unroll
        for (int j = 0; j < (64 * S::CH) / 128; ++j) {
            const int i = tw + 128 * j;
            const int r = (i / (8 * S::CH)) * 8 + (i & 7), c = (i >> 3) % S::CH;
            const int s = k0 + r;
            const bool ok = s >= lo32 && s < hi32;
            cp_async16(dst + 16u * (u32)i, base + (ok ? (size_t)s * S::ROW_BYTES + c * 16 : 0), ok);
        }
    }

    // Ping-pong scan (the default): the two warpgroups own the two 64-key halves of every tile as
    // before (same keys, same scores), but each runs its own cp.async pipeline and
    // named barrier, and the MMA turn passes between them (barriers 3, 4), so one
    // warpgroup's epilogue (and its atomics' latency) runs under the other's MMAs.
    template <class Epi>
    __device__ void scan_pingpong(long long tile0, int ntiles, Epi& epi) const {
        const int wgi = (int)(threadIdx.x >> 7), wi = (int)((threadIdx.x >> 5) & 3);
        load_q();
        cp_async_commit();
#pragma unroll
        for (int st = 0; st < S::WG_STAGES - 1; ++st) {
            if (st < ntiles) load_wg_tile(wgi, st, (tile0 + st) * S::KT + wgi * 64);
            cp_async_commit();
        }
        for (int i = 0; i < ntiles; ++i) {
            cp_async_wait<S::WG_STAGES - 2>();
            fence_proxy_async();
            if (i == 0) __syncthreads();    // q (copied by all 256 threads) and tile 0 landed
            else bar_sync(1 + wgi, 128);    // this warpgroup's tile i landed; its stage i-1 is free
            const int nxt = i + S::WG_STAGES - 1;
            if (nxt < ntiles) load_wg_tile(wgi, nxt % S::WG_STAGES, (tile0 + nxt) * S::KT + wgi * 64);
            cp_async_commit();
            const long long s_wg = (tile0 + i) * S::KT + wgi * 64, s_warp = s_wg + wi * 16;
            const bool active = s_wg < ghi && s_wg + 64 > glo;              // warpgroup-uniform
            if (wgi == 1 || i > 0) bar_sync(3 + wgi, 256);                   // my turn for the tensor cores
            float d[128];
            if (active) {
                mma_wg_issue(wgi, i % S::WG_STAGES, d);
                wgmma_wait_all();
            }
            // the other warpgroup's turn only now: arriving right after the issue (run 14) queued
            // both warpgroups' MMAs together and then ran both epilogues together (slower)
            bar_arrive(4 - wgi, 256);
            if (active) {
                float p[S::QPB][2];
                scores<0, S::QPB>(d, s_warp, p);
                epi.template scores<0>(*this, s_warp, p);
            } else {
                epi.skipped(*this, s_warp);
            }
        }
        if (wgi == 0 && ntiles > 0) bar_sync(3, 256);                       // warpgroup 1's last turn
        cp_async_wait<0>();
        epi.finish(*this);
    }

    // The tiles this block scans when blocks along grid.y split the union into
    // runs of TILES_PER_BLOCK tiles: (first tile, count <= 0 if none).
    __device__ void union_tiles(long long& tile0, int& ntiles) const {
        union_run(glo, ghi, S::KT, S::TILES_PER_BLOCK, tile0, ntiles);
    }
};

}  // namespace wg
}  // namespace hytopk
