// THE warp-specialised wgmma scoring core (sm_90a), "wgmma_ws": one producer warp
// feeds key tiles through the bulk-copy (TMA) engine into a ring of shared-memory
// stages guarded by mbarriers; C consumer warpgroups (4 by default) run the MMAs
// and the epilogues. With four consumers each scheduler holds four math warps, so
// one warpgroup's epilogue runs under the others' MMAs (the v4 wgmma core had two
// warpgroups and stalled on its epilogue: ncu, docs/perf_notes.md).
//
// Operands. Keys are A (M = 64 keys per consumer), the block's QPB x H
// (query, head) rows are B: with C = 4 consumer c takes key half c / 2 of a
// 128-key stage and row half c % 2 (N = 128), with C = 2 key half c and all
// 256 rows (N = 256). A thread's accumulators hold 2 keys x N / 4 columns, so
// the head sum is in-thread plus two shuffles. Both operands sit in shared
// memory in the no-swizzle core-matrix layout (hytopk_wgmma_common.cuh); q and
// keys are put into that layout once in global memory (hytopk_ws_pretile, a
// permutation inside each group of 8 rows), so each stage is ONE contiguous
// bulk copy (32 KiB of bf16 keys) and a query's rows another.
//
// The score, fixed arithmetic (every epilogue and the replay kernel call
// partial_sums + quad_sums + finish_score, so their bits agree):
//   dot(q[t,h], key) = the wgmma chain over K steps ascending (scale_d = 0 first);
//   lane (g, tig) sums w[h] * (dot + |dot|) over its heads h = 8j + 2tig, 8j + 2tig + 1,
//   j ascending (fmaf, float32 w): x_tig; the quad's sum (x_0 + x_1) + (x_2 + x_3) (FADD
//   commutes: the same bits in whichever lane computes it); times 0.5 (bf16) or
//   0.5 * kscale[key] (fp8 e4m3); + 0.0f.
// x + |x| = 2 max(x, 0) exactly for finite x (one full-rate FADD instead of a
// half-rate FMNMX); the 1/2 is folded into the final scale, which is exact barring
// underflow. Differences to max(0, x): a dot of -inf gives NaN (ranks lowest), and
// |dot| > 2^127 overflows to inf; neither occurs for finite bf16 / e4m3 inputs of
// indexer size (|dot| <= D * 448^2 for e4m3, far below 2^127 for bf16 keys < 2^60).
#pragma once
#include "hytopk_order.cuh"
#include "hytopk_score.cuh"
#include "hytopk_cp_async.cuh"
#include "hytopk_key_runs.cuh"
#include "hytopk_wgmma_common.cuh"

namespace hytopk {
namespace ws {

using namespace wgp;

// ------------------------------------------------------------------ input kinds
struct Bf16 {                          // q, keys: bf16 bits; k16 MMA steps
    typedef bf16_bits elem;
    static constexpr int BYTES = 2;
    static constexpr bool SCALED = false;
    static __device__ __forceinline__ void mma(float (&d)[8], u64 a, u64 b, int c) { wgmma_m64n16k16_bf16(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[16], u64 a, u64 b, int c) { wgmma_m64n32k16_bf16(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[32], u64 a, u64 b, int c) { wgmma_m64n64k16_bf16(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[64], u64 a, u64 b, int c) { wgmma_m64n128k16_bf16(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[128], u64 a, u64 b, int c) { wgmma_m64n256k16_bf16(d, a, b, c); }
};
struct E4m3 {                          // q, keys: fp8 e4m3 bits, a float32 scale per key; k32 MMA steps
    typedef unsigned char elem;
    static constexpr int BYTES = 1;
    static constexpr bool SCALED = true;
    static __device__ __forceinline__ void mma(float (&d)[8], u64 a, u64 b, int c) { wgmma_m64n16k32_e4m3(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[16], u64 a, u64 b, int c) { wgmma_m64n32k32_e4m3(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[32], u64 a, u64 b, int c) { wgmma_m64n64k32_e4m3(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[64], u64 a, u64 b, int c) { wgmma_m64n128k32_e4m3(d, a, b, c); }
    static __device__ __forceinline__ void mma(float (&d)[128], u64 a, u64 b, int c) { wgmma_m64n256k32_e4m3(d, a, b, c); }
};

// One MMA chain over K (KSTEPS instructions of 32 bytes of K each), issued and
// committed by the calling warpgroup; a / b are core-matrix operands in shared memory.
// Descriptors as 32-bit words: the low one (address, leading offset 128 B) steps by
// 256 B = 16 units per K step inside its 14-bit address field (smem < 256 KiB: no carry),
// the high one (stride offset: GROUP_BYTES) is a constant; 64-bit adds and the register
// shuffling around them were a sixth of the v1 loop's instructions.
template <class In, int KSTEPS, int GROUP_BYTES, int ACC>
__device__ __forceinline__ void mma_chain(float (&d)[ACC], u32 a, u32 b) {
    constexpr u32 HI = (u32)(GROUP_BYTES >> 4) & 0x3fffu;
    const u32 a_lo = ((a >> 4) & 0x3fffu) | (8u << 16), b_lo = ((b >> 4) & 0x3fffu) | (8u << 16);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
        In::mma(d, ((u64)HI << 32) | (a_lo + 16u * ks), ((u64)HI << 32) | (b_lo + 16u * ks), ks > 0);
    wgmma_commit();
}

__device__ __forceinline__ float relu2(float x) { return x + fabsf(x); }     // 2 max(x, 0), one FADD

// This lane's partial head sums of NJ query slots for its two keys (rows g, g + 8 of
// its warp's 16): x[jj][e] over its columns of [jj * H, (jj + 1) * H) in d, heads
// 8 q8 + 2 tig, + 1 with q8 ascending; w2 = float2 weights of slot 0 of d's columns.
template <int H, int NJ, int ACC>
__device__ __forceinline__ void partial_sums(const float (&d)[ACC], const float2* __restrict__ w2, float (&x)[NJ][2]) {
    constexpr int JQ = H / 8;                            // n8 column blocks per query
    static_assert(ACC == NJ * H / 2, "accumulators: NJ slots x H heads / (128 threads / 64 keys)");
    const int tig = (int)(lane_id() & 3);
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int q8 = 0; q8 < JQ; ++q8) {
            const int nb = jj * JQ + q8;
            const float2 wv = w2[jj * (H / 2) + 4 * q8 + tig];          // w of heads 8 q8 + 2 tig, + 1
            a0 = fmaf(wv.x, relu2(d[4 * nb + 0]), a0);
            a0 = fmaf(wv.y, relu2(d[4 * nb + 1]), a0);
            a1 = fmaf(wv.x, relu2(d[4 * nb + 2]), a1);
            a1 = fmaf(wv.y, relu2(d[4 * nb + 3]), a1);
        }
        x[jj][0] = a0;
        x[jj][1] = a1;
    }
}

// The quad's sums, one slot per lane: lane tig ends with the head sum of slots 4u + tig
// (u < U = ceil(NJ / 4)) in v[u][e]. A reduce-scatter over the quad: round 1 (xor 1)
// each lane keeps the slots of its parity and sends the rest, round 2 (xor 2) likewise;
// NJ / 2 + NJ / 4 shuffles instead of the 2 NJ of a butterfly per slot. Every slot's sum is
// (x_a + x_a^1) + (x_a^2 + x_a^3), the butterfly's association: FADD commutes, so the bits do
// not depend on which lane owns the slot (the replay kernel's butterfly gives the same).
// NJ = 1 or 2: lanes tig and tig ^ 2 (and ^ 1 for NJ = 1) hold the same sum.
template <int NJ>
__device__ __forceinline__ void quad_sums(float (&x)[NJ][2], float (&v)[(NJ + 3) / 4][2]) {
    const int tig = (int)(lane_id() & 3);
    const bool odd = tig & 1, hi2 = tig & 2;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        if constexpr (NJ == 1) {
            float s = x[0][e];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            v[0][e] = s;
        } else {
            constexpr int P = NJ / 2;                    // after round 1: pair sums of slots 2p + (tig & 1)
            float y[P];
#pragma unroll
            for (int p = 0; p < P; ++p) {
                const float keep = odd ? x[2 * p + 1][e] : x[2 * p][e], send = odd ? x[2 * p][e] : x[2 * p + 1][e];
                y[p] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
            }
            if constexpr (P == 1) {                      // NJ = 2: slot tig & 1 in lanes tig, tig ^ 2
                v[0][e] = y[0] + __shfl_xor_sync(0xffffffffu, y[0], 2);
            } else {
#pragma unroll
                for (int r = 0; r < P / 2; ++r) {        // slot 2 (2r + (tig >> 1 & 1)) + (tig & 1) = 4r + tig
                    const float keep = hi2 ? y[2 * r + 1] : y[2 * r], send = hi2 ? y[2 * r] : y[2 * r + 1];
                    v[r][e] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
                }
            }
        }
    }
}

// The score from a head sum: half_scale = 0.5 (bf16) or 0.5 * kscale[key] (e4m3).
__device__ __forceinline__ float finish_score(float sum, float half_scale) { return sum * half_scale + 0.0f; }

template <class In>
__device__ __forceinline__ float half_scale_of(const float* kscale, long long s, long long L) {
    if (!In::SCALED) return 0.5f;
    return s < L ? 0.5f * kscale[s] : 0.0f;
}

// ------------------------------------------------------------------ geometry
// Mirrored by workbench/geometry.py (WsGeometry); the compile check asserts both agree.
template <int H_, int D_, class In_, int C_>
struct Shape {
    typedef In_ In;
    static constexpr int H = H_;
    static constexpr int D = D_;
    static constexpr int C = C_;                         // consumer warpgroups
    static_assert(H == 16 || H == 32 || H == 64, "wgmma_ws core: H must be 16, 32 or 64 (pad heads with zeros)");
    static_assert(C == 2 || C == 4, "wgmma_ws core: 2 or 4 consumer warpgroups");
    static constexpr int ROW_BYTES = D * In::BYTES;
    static_assert(ROW_BYTES % 32 == 0 && ROW_BYTES <= 256, "wgmma_ws core: a row must be 32 to 256 bytes, a multiple of 32");
    static constexpr int THREADS = 128 * (C + 1);       // consumers first, the producer warpgroup last
    static constexpr int QPB = 256 / H;                  // query slots per block: 256 (query, head) rows
    static constexpr int NR = 512 / C;                   // rows per consumer (N of its MMA)
    static constexpr int NJ = QPB * NR / 256;            // slots per consumer
    static constexpr int U = (NJ + 3) / 4;               // slots per lane: 4u + tig
    static constexpr int ACC = NR / 2;                   // accumulators per thread
    static constexpr int CH = ROW_BYTES / 16;
    static constexpr int KSTEPS = ROW_BYTES / 32;
    static constexpr int GROUP_BYTES = CH * 128;         // 8 rows
    static constexpr int KT = 128;                       // keys per stage: 64 per key half
    static constexpr int TILE_BYTES = KT * ROW_BYTES;
    static constexpr int STAGES = In::BYTES == 2 ? 4 : 6;
    static constexpr int TILES_PER_BLOCK = 64;           // keys per block run: 8192
    static constexpr int Q_BYTES = 256 * ROW_BYTES;
    static constexpr int W_OFF = Q_BYTES + STAGES * TILE_BYTES;
    static constexpr int SLOT_OFF = W_OFF + 256 * 4;     // s_t, s_a, s_b, s_aux: QPB ints each
    static constexpr int BAR_OFF = SLOT_OFF + 16 * QPB;  // full[STAGES], empty[STAGES], qbar
    static constexpr int BASE_BYTES = (BAR_OFF + 8 * (2 * STAGES + 1) + 15) / 16 * 16;
    // the filter's candidate staging: per consumer warp and slot, E entries of (position, bits)
    static constexpr int STAGING_ENTRY = 4 * C * NJ * 8;
    static constexpr int E_FIT = ((227 * 1024 - BASE_BYTES) / STAGING_ENTRY) / 16 * 16;
    static constexpr int E = E_FIT < 128 ? E_FIT : 128;
    static_assert(E >= 16, "wgmma_ws core: no room for the filter's candidate staging");
    static constexpr int SMEM_BYTES = BASE_BYTES + STAGING_ENTRY * E;
    static_assert(SMEM_BYTES <= 227 * 1024, "wgmma_ws core: shared memory over the 227 KiB a block can have");
    // setmaxnreg moves registers inside the block's own pool, which is what it got at launch:
    // THREADS x the __launch_bounds__(THREADS, 1) cap (65536 / THREADS, down to a multiple of 8).
    // Asking for more than the pool holds never returns (the consumers' alloc spins).
    static constexpr int LAUNCH_REGS = (65536 / THREADS) / 8 * 8;
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = C == 4 ? 112 : 240;
    static_assert(128 * PRODUCER_REGS + 128 * C * CONSUMER_REGS <= THREADS * LAUNCH_REGS,
                  "wgmma_ws core: the roles' registers exceed the block's pool");
};

// ------------------------------------------------------------------ the block
// Blocks are numbered along x as group * runs + run: consecutive blocks share their
// query group (its q stays in L2) and walk its key runs.
template <class S>
struct Core {
    typedef typename S::In In;
    typedef S Geometry;
    const typename In::elem* qt;      // q in the core-matrix layout, [rows n * H]
    const typename In::elem* kt;      // keys in the core-matrix layout, padded to whole stages
    const float* kscale;              // E4m3 only
    long long L;
    const int* qmap;
    int nq;
    int group, run;
    long long glo, ghi;               // union of the slots' contexts
    unsigned char* smem;
    int* s_t;                         // query of slot j (-1: empty)
    int* s_a;
    int* s_b;
    u32* s_aux;                       // epilogue data per slot (the filter's threshold key)
    float* s_w;                       // [256] weights of the (query, head) rows
    uint2* s_stage;                   // [consumer warps][NJ][E] staged candidates (filter)

    __device__ long long query_of(int e) const { return e < nq ? (qmap ? (long long)qmap[e] : (long long)e) : -1; }
    __device__ u32 bar(int i) const { return smem_addr(smem + S::BAR_OFF) + 8u * (u32)i; }   // full[s], empty[s], q
    __device__ u32 full_bar(int st) const { return bar(st); }
    __device__ u32 empty_bar(int st) const { return bar(S::STAGES + st); }
    __device__ u32 q_bar() const { return bar(2 * S::STAGES); }

    // Every thread: slots, the union, weights, barriers. Ends with a block barrier.
    __device__ void init(unsigned char* smem_, const typename In::elem* qt_, const float* w, const typename In::elem* kt_,
                         const float* ks_, long long L_, const int* qmap_, int nq_, const int* lo, const int* hi,
                         int runs) {
        smem = smem_; qt = qt_; kt = kt_; kscale = ks_; L = L_; qmap = qmap_; nq = nq_;
        group = (int)(blockIdx.x / (unsigned)runs);
        run = (int)(blockIdx.x % (unsigned)runs);
        s_w = reinterpret_cast<float*>(smem + S::W_OFF);
        s_t = reinterpret_cast<int*>(smem + S::SLOT_OFF);
        s_a = s_t + S::QPB;
        s_b = s_a + S::QPB;
        s_aux = reinterpret_cast<u32*>(s_b + S::QPB);
        s_stage = reinterpret_cast<uint2*>(smem + S::BASE_BYTES);
        glo = L;
        ghi = 0;
        for (int j = 0; j < S::QPB; ++j) {
            const long long tj = query_of(group * S::QPB + j);
            const long long aj = (tj >= 0 && lo) ? lo[tj] : 0, bj = (tj >= 0 && hi) ? hi[tj] : 0;
            if (aj < bj) { glo = min(glo, aj); ghi = max(ghi, bj); }
        }
        if (threadIdx.x < S::QPB) {
            const int j = threadIdx.x;
            const long long tj = query_of(group * S::QPB + j);
            s_t[j] = (int)tj;
            s_a[j] = (tj >= 0 && lo) ? lo[tj] : 0;
            s_b[j] = (tj >= 0 && hi) ? hi[tj] : 0;
            s_aux[j] = 0u;
        }
        for (int i = threadIdx.x; i < 256; i += S::THREADS) {
            const long long tj = query_of(group * S::QPB + i / S::H);
            s_w[i] = tj >= 0 ? w[tj * S::H + i % S::H] : 0.0f;
        }
        if (threadIdx.x == 0) {
            for (int st = 0; st < S::STAGES; ++st) {
                mbar_init(full_bar(st), 1);                  // the producer's expect_tx arrival
                mbar_init(empty_bar(st), 4 * S::C);          // one arrival per consumer warp
            }
            mbar_init(q_bar(), 1);
            mbar_fence_init();
        }
        __syncthreads();
    }

    __device__ u32 q_smem() const { return smem_addr(smem); }
    __device__ u32 stage_smem(int st) const { return smem_addr(smem + S::Q_BYTES + st * S::TILE_BYTES); }

    // The producer (one thread): the slots' q rows, then tiles [tile0, tile0 + ntiles) into the ring.
    __device__ void produce(long long tile0, int ntiles) const {
        constexpr u32 QROWS_BYTES = S::H * S::ROW_BYTES;
        u32 qbytes = 0;
        for (int j = 0; j < S::QPB; ++j) qbytes += s_t[j] >= 0 ? QROWS_BYTES : 0u;
        mbar_expect_tx(q_bar(), qbytes);
        const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(qt);
        for (int j = 0; j < S::QPB; ++j)
            if (s_t[j] >= 0)
                bulk_g2s(q_smem() + j * QROWS_BYTES, qsrc + (size_t)s_t[j] * QROWS_BYTES, QROWS_BYTES, q_bar());
        const unsigned char* ksrc = reinterpret_cast<const unsigned char*>(kt);
        for (int i = 0; i < ntiles; ++i) {
            const int st = i % S::STAGES;
            if (i >= S::STAGES) mbar_wait(empty_bar(st), (u32)((i / S::STAGES - 1) & 1));
            mbar_expect_tx(full_bar(st), S::TILE_BYTES);
            bulk_g2s(stage_smem(st), ksrc + (size_t)(tile0 + i) * S::TILE_BYTES, S::TILE_BYTES, full_bar(st));
        }
    }

    // A consumer warpgroup: per tile, wait for the stage, MMA, release the stage, epilogue.
    // Its slots are j0 .. j0 + NJ - 1; lane tig owns slots j0 + 4u + tig (u < U, 4u + tig < NJ).
    // Epi: begin(core, j0) once (the owned slots' data into registers); scores(core, s_warp, v)
    // with v[u][e] = the owned slot's score of key s_warp + g + 8e (the warp's 16 keys
    // s_warp ..); skipped(core, s_warp) when its key half misses the union; finish(core) at the end.
    // WG is a template argument: with the warpgroup's key and row halves known at compile
    // time, the descriptors derive from uniform values only and stay in uniform registers.
    template <int WG, class Epi>
    __device__ void consume(long long tile0, int ntiles, Epi& epi) const {
        const int wi = (int)((threadIdx.x >> 5) & 3);
        constexpr int kh = S::C == 4 ? (WG >> 1) : WG, rh = S::C == 4 ? (WG & 1) : 0;
        const int j0 = rh * S::NJ;
        const u32 a_off = (u32)(kh * 8 * S::GROUP_BYTES);                   // key rows kh * 64 ..
        const u32 b_addr = q_smem() + (u32)(rh * (S::NR / 8) * S::GROUP_BYTES);
        const float2* w2 = reinterpret_cast<const float2*>(s_w) + j0 * (S::H / 2);
        epi.begin(*this, j0);
        mbar_wait(q_bar(), 0u);
        for (int i = 0; i < ntiles; ++i) {
            const int st = i % S::STAGES;
            const long long s_wg = (tile0 + i) * S::KT + kh * 64, s_warp = s_wg + wi * 16;
            const bool active = s_wg < ghi && s_wg + 64 > glo;              // warpgroup-uniform
            mbar_wait(full_bar(st), (u32)((i / S::STAGES) & 1));
            float d[S::ACC];
            if (active) {
                mma_chain<In, S::KSTEPS, S::GROUP_BYTES>(d, stage_smem(st) + a_off, b_addr);
                wgmma_wait_all();
            }
            __syncwarp();
            if (lane_id() == 0) mbar_arrive(empty_bar(st));                 // the MMA has read the stage
            if (active) {
                float x[S::NJ][2], v[S::U][2];
                partial_sums<S::H, S::NJ>(d, w2, x);
                quad_sums<S::NJ>(x, v);
                const int g = (int)(lane_id() >> 2);
                const float h0 = half_scale_of<In>(kscale, s_warp + g, L), h1 = half_scale_of<In>(kscale, s_warp + g + 8, L);
#pragma unroll
                for (int u = 0; u < S::U; ++u) {
                    v[u][0] = finish_score(v[u][0], h0);
                    v[u][1] = finish_score(v[u][1], h1);
                }
                epi.scores(*this, s_warp, v);
            } else {
                epi.skipped(*this, s_warp);
            }
        }
        epi.finish(*this);
    }

    // Role split. Every thread of the block calls it (after init and the epilogue's setup).
    template <class Epi>
    __device__ __forceinline__ void run_roles(long long tile0, int ntiles, Epi& epi) const {
        if ((int)(threadIdx.x >> 7) == S::C) {
            regs_dec<S::PRODUCER_REGS>();
            if (threadIdx.x == 128 * S::C) produce(tile0, ntiles);
        } else {
            regs_inc<S::CONSUMER_REGS>();
            switch (threadIdx.x >> 7) {
                case 0: consume<0>(tile0, ntiles, epi); break;
                case 1: consume<1>(tile0, ntiles, epi); break;
                case 2: if constexpr (S::C == 4) consume<2>(tile0, ntiles, epi); break;
                default: if constexpr (S::C == 4) consume<3>(tile0, ntiles, epi); break;
            }
        }
    }

    __device__ void union_tiles(long long& tile0, int& ntiles) const {
        union_run(glo, ghi, S::KT, S::TILES_PER_BLOCK, tile0, ntiles, run);
    }
};

}  // namespace ws
}  // namespace hytopk
