// Sampled threshold v2 of the wgmma_ws core (issue 14, sm_90a, bf16): one block per query,
// a producer warp that keeps STAGES - 1 gathered 64-row key tiles in flight, one consumer
// warpgroup that scores them, then the r-th best in shared memory.
//
// Why (docs/perf_notes.md, "Sampled threshold v2"; ncu of hytopk_replay_ws at dsv32-128k): the
// gather was L2-bound (L2 throughput 94%) on twice the sectors it needs. gather_scores' copies
// give a warp 8 rows x 64 bytes, and a 16-byte-per-thread request is taken a quarter warp (8
// lanes) at a time: lanes 0-7 (chunk 0 of 8 rows) and lanes 8-15 (chunk 1 of the same rows) each
// fetch the same 8 sectors: 32 sectors per request instead of 16 (ncu: 134M excessive of 290M).
// Here a quarter warp copies 128 contiguous bytes of ONE row (4 whole sectors). In the MMA's
// no-swizzle layout those 8 chunks sit 128 bytes apart (one bank group: 8 shared-memory
// wavefronts per quarter, as before); with SWZ the key tile uses the 128-byte swizzle (chunk c of
// row r at r * 128 + (c ^ r % 8) * 16 in each 64-column block): one wavefront per quarter.
// The pipeline around it: the replay threshold also wrote [n, M] positions and scores (64 MB each,
// past the L2) and ran the select as another kernel; the fused kernel ran every step of a tile
// in one warpgroup behind block barriers (position, barrier, copies, wait, MMA, epilogue, barrier).
// Here the producer warp only computes positions (stepped by quotient and remainder, no
// division in the loop, no global positions array) and issues cp.async; it signals a tile's
// full mbarrier after its own copies of that tile completed (cp.async.wait_group + proxy
// fence), and waits on the tile's empty mbarrier before reusing its buffer. The consumer
// waits on full, runs the MMA, releases the buffer, and writes the sample bits to shared
// memory. Two blocks per SM (~99 KB at H = 64, D = 128, 4096 samples): up to 6 tiles (96 KB)
// in flight per SM, and one block's select runs under the other's gather.
//
// Bits: the score path is gather_scores' (mma_chain with the key tile as A and the query's
// H rows as B, partial_sums, quad_sums, finish_score with the bf16 half scale 0.5), so every
// sample has the filter's bits; T = the first sample in position order whose key is the r-th
// best key (as threshold_body / hytopk_threshold).
//
// Arguments: qt = q [n, H, D] in the core-matrix layout (hytopk_ws_pretile), w [n, H] float32,
// keys [L, D] bf16 row-major, M and r per query (the contract's; the kernel reads m = min(M, mcap)
// samples, p_j = lo + (j * c) // M in 64 bits), mcap = the samples' room in shared memory.
// Threads ThresholdV2Shape::THREADS, dynamic shared memory ALIGN_PAD + FIXED_BYTES + 4 * mcap, grid n.
#include "hytopk_wgmma_ws.cuh"
#include "hytopk_radix.cuh"
using namespace hytopk;
using namespace hytopk::ws;

namespace {

constexpr u32 FULL = 0xffffffffu;

// Mirrored by workbench/geometry.py (WsThresholdV2Geometry); the compile check asserts both agree.
template <int H, int D, int STAGES, bool SWZ_ = true>
struct ThresholdV2Shape {
    static_assert(H == 16 || H == 32 || H == 64, "threshold v2: H must be 16, 32 or 64 (pad heads with zeros)");
    static_assert(STAGES >= 2, "threshold v2: at least two key tiles");
    static constexpr int THREADS = 160;                  // consumer warpgroup (warps 0-3) + producer warp 4
    static constexpr int ROW_BYTES = D * 2;
    static_assert(ROW_BYTES % 32 == 0 && ROW_BYTES <= 256, "threshold v2: a row must be 32 to 256 bytes, a multiple of 32");
    static constexpr int CH = ROW_BYTES / 16;
    static constexpr int KSTEPS = ROW_BYTES / 32;
    static constexpr int GROUP_BYTES = CH * 128;         // 8 rows in the core-matrix layout
    static constexpr int Q_BYTES = H * ROW_BYTES;
    static constexpr int TILE_BYTES = 64 * ROW_BYTES;
    static constexpr int CP_PER_LANE = 64 * CH / 32;     // 16-byte copies per producer lane and tile
    static constexpr bool LINES = CH % 8 == 0;           // rows of whole 128-byte blocks: a quarter warp per block
    static constexpr bool SWZ = SWZ_ && LINES;           // the key tile in the 128-byte swizzle (else no swizzle)
    static constexpr int KB_BYTES = 64 * 128;            // one 64-row x 128-byte block of a swizzled tile
    static constexpr int TILE_OFF = 0;                   // 1024-byte aligned: the swizzle is on address bits 4-9
    static constexpr int Q_OFF = STAGES * TILE_BYTES;
    static constexpr int W_OFF = Q_OFF + Q_BYTES;                        // [H] float
    static constexpr int POS_OFF = W_OFF + 4 * H;                        // [STAGES][64] int (producer only)
    static constexpr int BAR_OFF = POS_OFF + 4 * 64 * STAGES;            // full[STAGES], empty[STAGES]
    static constexpr int HIST_OFF = BAR_OFF + 16 * STAGES;               // RADIX u32 + SelectScalars
    static constexpr int FIXED_BYTES = HIST_OFF + 4 * RADIX + (int)sizeof(SelectScalars);   // then [mcap] u32 bits
    // the launch adds ALIGN_PAD bytes: the layout starts at the first 1024-byte boundary (a misaligned swizzled
    // tile would give wrong scores, and a trap would poison the context)
    static constexpr int ALIGN_PAD = 1024;
    static_assert(!SWZ || TILE_BYTES % 1024 == 0, "threshold v2: swizzled tiles are 1024-byte aligned");
    static_assert(BAR_OFF % 8 == 0, "threshold v2: mbarriers are 8-byte aligned");
};

// The MMA chain of gather_scores (mma_chain in hytopk_wgmma_ws.cuh: K steps ascending, scale_d = 0
// first) with the key tile A in the 128-byte swizzle: descriptor layout type 1 (bits 62-63),
// stride offset 1024 bytes (8 rows of 128 bytes), leading offset unused by a swizzled K-major
// operand (1), K step ks at 64-column block ks / 4 (KB_BYTES apart) + 32 bytes * (ks % 4) inside
// the 128-byte row. B (the query's rows) keeps the no-swizzle core-matrix layout of qt. The
// products and their accumulation do not depend on where the operands sit: the same bits.
template <int KSTEPS, int B_GROUP_BYTES, int KB_BYTES, int ACC>
__device__ __forceinline__ void mma_chain_a128(float (&d)[ACC], u32 a, u32 b) {
    constexpr u32 A_HI = (1024u >> 4) | (1u << 30);
    constexpr u32 B_HI = (u32)(B_GROUP_BYTES >> 4) & 0x3fffu;
    const u32 a_lo = ((a >> 4) & 0x3fffu) | (1u << 16), b_lo = ((b >> 4) & 0x3fffu) | (8u << 16);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
        Bf16::mma(d, ((u64)A_HI << 32) | (a_lo + (u32)(KB_BYTES >> 4) * (u32)(ks / 4) + 2u * (u32)(ks % 4)),
                  ((u64)B_HI << 32) | (b_lo + 16u * ks), ks > 0);
    wgmma_commit();
}

template <int H, int D, int STAGES, bool SWZ>
__device__ __forceinline__ void threshold_v2_body(const bf16_bits* __restrict__ qt, const float* __restrict__ w,
                                                  const bf16_bits* __restrict__ keys, long long L, int n,
                                                  const int* __restrict__ lo, const int* __restrict__ hi,
                                                  const int* __restrict__ M, const int* __restrict__ r, int mcap,
                                                  u32* __restrict__ T) {
    typedef ThresholdV2Shape<H, D, STAGES, SWZ> S;
    (void)L;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const int t = (int)blockIdx.x;
    if (t >= n) return;
    const int Mt = M[t];
    const long long a = lo[t], c = (long long)hi[t] - a;
    const int m = min(Mt, mcap);
    if (Mt <= 0 || c <= 0 || m <= 0) {                   // no sampling: NaN lets every key through
        if (threadIdx.x == 0) T[t] = 0x7fc00000u;
        return;                                          // block-uniform
    }
    const int tid = (int)threadIdx.x;
    float* s_w = reinterpret_cast<float*>(smem + S::W_OFF);
    int* s_pos = reinterpret_cast<int*>(smem + S::POS_OFF);
    u32* hist = reinterpret_cast<u32*>(smem + S::HIST_OFF);
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(hist + RADIX);
    u32* bits = reinterpret_cast<u32*>(smem + S::FIXED_BYTES);
    const u32 sk = smem_addr(smem) + S::TILE_OFF, sq = smem_addr(smem) + S::Q_OFF, bars = smem_addr(smem + S::BAR_OFF);
    const auto full = [bars](int st) { return bars + 8u * (u32)st; };
    const auto empty = [bars](int st) { return bars + 8u * (u32)(STAGES + st); };
    for (int i = tid; i < H; i += S::THREADS) s_w[i] = w[(long long)t * H + i];
    if (tid == 0) {
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(full(st), 1);                      // the producer's lane 0, after its copies landed
            mbar_init(empty(st), 4);                     // one arrival per consumer warp
        }
        mbar_fence_init();
    }
    __syncthreads();
    const int nt = (m + 63) / 64;

    if (tid >= 128) {                                    // ---- producer warp (warp-uniform branch)
        const int lane = tid & 31;
        const unsigned char* krows = reinterpret_cast<const unsigned char*>(keys);  // row-major [L, D]
        const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(qt) + (size_t)t * S::Q_BYTES;
        for (int i = lane; i < S::Q_BYTES / 16; i += 32) cp_async16(sq + 16u * i, qsrc + 16 * i, true);   // with tile 0
        // rows j = 64 i + lane + 32 h: j * c = quo * M + rem, stepped by 64 c per tile (no division in the loop)
        const long long step = 64 * c, step_q = step / Mt, step_r = step % Mt;
        long long quo[2], rem[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const long long jc = (long long)(lane + 32 * h) * c;
            quo[h] = jc / Mt;
            rem[h] = jc % Mt;
        }
        constexpr int K = STAGES - 1;                    // tiles issued and not yet signalled
        for (int i = 0; i < nt; ++i) {
            const int st = i % STAGES;
            if (i >= STAGES) mbar_wait(empty(st), (u32)((i / STAGES - 1) & 1));   // tile i - STAGES consumed
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = lane + 32 * h;
                s_pos[st * 64 + row] = 64LL * i + row < m ? (int)(a + quo[h]) : -1;    // < hi <= L
                quo[h] += step_q;
                rem[h] += step_r;
                if (rem[h] >= Mt) { rem[h] -= Mt; ++quo[h]; }
            }
            __syncwarp();
            const u32 dst = sk + (u32)(st * S::TILE_BYTES);
            if constexpr (S::LINES) {
                // quarter warp lane / 8 copies 128-byte block kb of row 4 u + lane / 8, lane % 8 its 16-byte
                // chunk cb. The lane's 16 positions are read first: an LDS between two copies would wait
                // (the copies' asm clobbers memory), ~30 cycles a copy.
                constexpr int RPL = 16;                  // rows per lane
                const int cb = lane & 7;
                int pos[RPL];
#pragma unroll
                for (int u = 0; u < RPL; ++u) pos[u] = s_pos[st * 64 + 4 * u + (lane >> 3)];
#pragma unroll
                for (int u = 0; u < RPL; ++u) {
                    const int row = 4 * u + (lane >> 3);
                    const bool ok = pos[u] >= 0;
                    const unsigned char* src = krows + (ok ? (size_t)pos[u] * S::ROW_BYTES : 0) + 16 * cb;
#pragma unroll
                    for (int kb = 0; kb < S::CH / 8; ++kb) {
                        const u32 off = S::SWZ ? (u32)(kb * S::KB_BYTES + row * 128 + ((cb ^ (row & 7)) << 4))
                                               : (u32)((row >> 3) * S::GROUP_BYTES + (8 * kb + cb) * 128 + (row & 7) * 16);
                        cp_async16(dst + off, src + 128 * kb, ok);
                    }
                }
            } else {
                // rows of less than 128 bytes (test shapes): gather_scores' order (8 rows x 64 bytes per warp)
#pragma unroll
                for (int k = 0; k < S::CP_PER_LANE; ++k) {
                    const int e = lane + 32 * k;
                    const int row = (e / (8 * S::CH)) * 8 + (e & 7), ch = (e >> 3) % S::CH;
                    const int s = s_pos[st * 64 + row];
                    cp_async16(dst + 16u * (u32)e, krows + (s >= 0 ? (size_t)s * S::ROW_BYTES + 16 * ch : 0), s >= 0);
                }
            }
            cp_async_commit();
            if (i >= K) {                                // tile i - K (and q with tile 0) landed: signal it
                cp_async_wait<K>();
                fence_proxy_async();                     // visible to the tensor cores' async proxy
                __syncwarp();
                if (lane == 0) mbar_arrive(full((i - K) % STAGES));
            }
        }
        cp_async_wait<0>();
        fence_proxy_async();
        __syncwarp();
        if (lane == 0)
            for (int i = max(0, nt - K); i < nt; ++i) mbar_arrive(full(i % STAGES));
    } else {                                             // ---- consumer warpgroup
        const int wi = tid >> 5, g = (int)(lane_id() >> 2), tig = (int)(lane_id() & 3);
        const float2* w2 = reinterpret_cast<const float2*>(s_w);
        for (int i = 0; i < nt; ++i) {
            const int st = i % STAGES;
            mbar_wait(full(st), (u32)((i / STAGES) & 1));
            float d[H / 2];
            if constexpr (S::SWZ)
                mma_chain_a128<S::KSTEPS, S::GROUP_BYTES, S::KB_BYTES>(d, sk + (u32)(st * S::TILE_BYTES), sq);
            else
                mma_chain<Bf16, S::KSTEPS, S::GROUP_BYTES>(d, sk + (u32)(st * S::TILE_BYTES), sq);
            wgmma_wait_all();
            __syncwarp();
            if (lane_id() == 0) mbar_arrive(empty(st));  // the MMA has read the tile
            float x[1][2], p[1][2];
            partial_sums<H, 1>(d, w2, x);
            quad_sums<1>(x, p);
            if (tig == 0) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = 64 * i + 16 * wi + g + 8 * e;
                    if (j < m) bits[j] = __float_as_uint(finish_score(p[0][e], half_scale_of<Bf16>(nullptr, 0, 0)));
                }
            }
        }
    }
    __syncthreads();                                     // every sample's bits are in shared memory

    write_rth_sample<true>(bits, m, r[t], hist, sc, T + t);
}

}  // namespace

// STAGES 4: two blocks per SM up to 4096 samples at H = 64, D = 128; STAGES 3 keeps two blocks
// at 8192 samples (contexts of 1M keys). The wrapper picks (WsThresholdV2Geometry). *_ns_*: the
// key tile in the no-swizzle layout (the descriptors every other ws kernel uses).
#define HYTOPK_WS_THRESHOLD_V2(NAME, STAGES, SWZ)                                                                \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(160, 2) NAME(                                                            \
        const bf16_bits* __restrict__ qt, const float* __restrict__ w, const bf16_bits* __restrict__ keys,     \
        long long L, int n, const int* __restrict__ lo, const int* __restrict__ hi, const int* __restrict__ M, \
        const int* __restrict__ r, int mcap, u32* __restrict__ T) {                                           \
        threshold_v2_body<H, D, STAGES, SWZ>(qt, w, keys, L, n, lo, hi, M, r, mcap, T);                        \
    }
HYTOPK_WS_THRESHOLD_V2(hytopk_threshold_v2_ws, 4, true)
HYTOPK_WS_THRESHOLD_V2(hytopk_threshold_v2s3_ws, 3, true)
HYTOPK_WS_THRESHOLD_V2(hytopk_threshold_v2_ns_ws, 4, false)
HYTOPK_WS_THRESHOLD_V2(hytopk_threshold_v2s3_ns_ws, 3, false)
