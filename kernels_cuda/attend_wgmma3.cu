// Sparse attention forward on wgmma (sm_90a), version 3 (same function as attend_wgmma2.cu; the
// same math conventions, other rounding: see below). What changed against version 2s (consumer-bound):
// - each consumer warpgroup w owns every other 64-key tile (tile t: w = t % 2, stage t % 2) and
//   computes its S = Q K_t^T alone with m64n64k16 (36 instructions per tile, not 2 x 36 of n32):
//   half the Q reads from shared memory per key
// - the running row max is chained: M_t = max(M_{t-1}, rowmax S_t); warpgroup w issues S_t, then
//   waits (one named barrier) for M_{t-1} and the other warpgroup's P_{t-1} (bf16, written into tile
//   t-1's rope column tile, which S no longer needs), runs its softmax, publishes M_t / P_t, then
//   O_w (columns 256w ..) += P_{t-1} V_{t-1} and, rescaled to M_t, += P_t V_t (A from shared
//   memory for both). No lock step: one warpgroup's softmax runs under the other's MMAs; nothing of
//   its own is in flight during its softmax (ptxas serialises every wgmma when accumulators are
//   touched under a pending one). O and l are rescaled to each M in tile order, so both halves end
//   at the same max; l = the two warpgroups' sums of their own tiles' P.
// - the key tile: 9 column tiles of 64 keys x 128 B, 128-byte swizzle (version 2s's gather, one
//   row's 128 B per quarter warp), key j, column d at
//     (d/64)*8192 + j*128 + (((d%64)/8) ^ (j%8))*16 + (d%8)*2
//   A stage is filled and released in two regions: Y_s = the column tiles of the other half (read
//   by the other warpgroup's P.V only, released early) and X_s = the own half + the rope tile
//   (holding P_t, read by both P.V); S runs over Y first, then X, as each region lands.
// - a producer warpgroup (384 threads, FA3's / version 2's shape): cp.async with .L2::256B completing
//   on the full barriers (cp.async.mbarrier.arrive.noinc); consumers fence.proxy.async after each
//   full-barrier wait. __launch_bounds__(384, 1) compiles at 168 registers; the producer drops to
//   PRODUCER_REGS and the consumers rise to CONSUMER_REGS (setmaxnreg). Why not 320 threads at
//   __maxnreg__(200) (the first version 3): it never launched. The register file is four 16K
//   quarters, one per scheduler; a block's warps are spread over them, 10 warps put 3 on one
//   quarter: at most 16384 / 3 / 32 -> 168 registers per thread for a 10-warp block. With 12 warps
//   each quarter holds one producer warp and two consumer warps: 32 x (40 + 2 x 232) = 16128.
// Rounding differs from versions 1/2 (k-step order of S, P rounded under the chained max), so the
// tests compare version 3 with the reference and wgmma2 within tolerance, not bitwise.
#include "hytopk_cp_async.cuh"
#include "hytopk_wgmma_common.cuh"

using namespace hytopk;
using namespace hytopk::wgp;

namespace hytopk {
namespace attw3 {

typedef unsigned short bf16_t;
constexpr int DQK = 576, DV = 512, ROWS = 64, NK = 64;
constexpr int CH = DQK / 8;                       // 16-byte chunks per row: 72
constexpr int GROUP = CH * 128;                   // Q: bytes per 8 rows (no swizzle): 9216
constexpr int CT_BYTES = NK * 128;                // one column tile (64 d) of a 64-key tile: 8192
constexpr int NCT = DQK / 64;                     // column tiles: 9 (8 = the rope, then P)
constexpr int TILE_BYTES = NCT * CT_BYTES;        // 73728
constexpr int Q_BYTES = ROWS / 8 * GROUP;         // 73728
constexpr int Q_OFF = 0;
constexpr int K_OFF = Q_OFF + Q_BYTES;
constexpr int RED_OFF = K_OFF + 2 * TILE_BYTES;   // float [2][64] the chained maxima M_t (by tile parity), [2][64] row sums
constexpr int MASK_OFF = RED_OFF + 4 * ROWS * 4;  // float [2 stages][64] slot valid 1/0
constexpr int BAR_OFF = MASK_OFF + 2 * NK * 4;    // fullY[2], fullX[2], emptyY[2], emptyX[2]
constexpr int SMEM = BAR_OFF + 8 * 8;
constexpr int LAUNCH_SMEM = SMEM + 1024;          // the base is rounded up to 1024 B (swizzle atoms)
static_assert(LAUNCH_SMEM <= 227 * 1024, "attend_wgmma3: shared memory over 227 KiB");
static_assert(K_OFF % 1024 == 0 && TILE_BYTES % 1024 == 0, "attend_wgmma3: atom alignment");
static_assert(ROWS * NK * 2 == CT_BYTES, "attend_wgmma3: P (64 x 64 bf16) fills the rope column tile");
constexpr int PRODUCERS = 128;                    // the producer warpgroup
constexpr int THREADS = 256 + PRODUCERS;          // 384: 12 warps, 3 per register-file quarter
constexpr int QW = PRODUCERS / 8;                 // producer quarter warps: 16
constexpr int GN = NK / QW;                       // rows per producer quarter warp: 4
// setmaxnreg budgets: per quarter one producer warp + two consumer warps fit its 16384 registers
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;   // what __launch_bounds__(384, 1) allows: 168
static_assert(32 * (PRODUCER_REGS + 2 * CONSUMER_REGS) <= 16384, "attend_wgmma3: budgets exceed a register-file quarter");
static_assert(PRODUCER_REGS <= LAUNCH_REGS && CONSUMER_REGS >= LAUNCH_REGS, "attend_wgmma3: setmaxnreg must dec / inc");
// named barriers (0 = __syncthreads): the 256 consumer threads; P ready for warpgroup 0 / 1
constexpr int BAR_Q = 1, BAR_L = 2, BAR_P0 = 3;   // BAR_P0 + w: P_{t-1} and M_{t-1} for warpgroup w
constexpr int BAR_WG0 = 5;                        // BAR_WG0 + w: warpgroup w's 128 threads

__device__ __forceinline__ u64 desc_sw128(u32 addr, u32 lead, u32 stride) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) | ((u64)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
// column tile i (0..8) of region Y_s (i < 4) or X_s (i >= 4) of stage s: S's k-step order too
__device__ __forceinline__ int region_ct(int s, int i) {
    return i < 4 ? 4 * (s ^ 1) + i : (i < 8 ? 4 * s + (i - 4) : 8);
}

// q [n, Hq, 576] bf16; kv rows at kv + s * kv_stride (16-byte aligned rows); idx [n, kk] int32 in
// [-1, L) (-1 and out-of-range slots masked); out [n, Hq, 512] float or bf16 bits; lse [n, Hq].
template <bool OUT_BF16>
__device__ __forceinline__ void attend_fwd_wgmma3(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv,
                                                  long long kv_stride, const int* __restrict__ idx, int kk, int n,
                                                  long long L, int Hq, int nhb, float scale_log2,
                                                  void* __restrict__ out, float* __restrict__ lse) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tq = (int)(blockIdx.x / (unsigned)nhb), h0 = (int)(blockIdx.x % (unsigned)nhb) * ROWS;
    if (tq >= n) return;
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char* smem = smem_raw + (base - raw);
    const u32 sq = base + Q_OFF, sk0 = base + K_OFF;
    float* red = reinterpret_cast<float*>(smem + RED_OFF);
    float* smask = reinterpret_cast<float*>(smem + MASK_OFF);
    const u32 fullY = base + BAR_OFF, fullX = fullY + 16, emptyY = fullY + 32, emptyX = fullY + 48;
    const int ntiles = (kk + NK - 1) / NK;
    const int* lst = idx + (long long)tq * kk;

    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; ++s) {
            mbar_init(fullY + 8 * s, 2 * PRODUCERS);   // a plain arrival (mask stored) + a cp.async arrival per thread
            mbar_init(fullX + 8 * s, PRODUCERS);
            mbar_init(emptyY + 8 * s, 4);              // the other warpgroup's warps
            mbar_init(emptyX + 8 * s, 8);              // both warpgroups' warps (the rope tile holds P)
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (threadIdx.x >= 256) {
        // ---------------------------------------------------------------- producer (one warpgroup)
        regs_dec<PRODUCER_REGS>();
        const int tid = (int)threadIdx.x - 256, r8 = tid & 7, qw = tid >> 3;   // quarter warp qw: rows qw + 16g
        int nx[GN], nm = -1;
        auto load_slots = [&](int it) {
            const int j0 = it * NK;
#pragma unroll
            for (int g = 0; g < GN; ++g) {
                const int j = j0 + qw + QW * g;
                nx[g] = j < kk ? __ldg(lst + j) : -1;
            }
            if (tid < NK) nm = j0 + tid < kk ? __ldg(lst + j0 + tid) : -1;
        };
        // column tiles [i0, i1) of the region order of stage s: row j's 128 B of tile ct, slot r8 ^ (j % 8)
        auto copy = [&](u32 stage, int s, int i0, int i1) {
#pragma unroll
            for (int g = 0; g < GN; ++g) {
                const int j = qw + QW * g;                                 // j % 8 = qw % 8
                const long long sl = nx[g];
                const bool ok = sl >= 0 && sl < L;
                const bf16_t* src = kv + (ok ? sl * kv_stride + r8 * 8 : 0);
                const u32 d = stage + (u32)(j * 128 + ((r8 ^ (qw & 7)) << 4));
#pragma unroll
                for (int i = i0; i < i1; ++i) {
                    const int ct = region_ct(s, i);
                    cp_async16_l2pf(d + (u32)(ct * CT_BYTES), src + (ok ? ct * 64 : 0), ok);
                }
            }
        };
        if (ntiles > 0) load_slots(0);
        for (int it = 0; it < ntiles; ++it) {
            const int s = it & 1;
            const u32 par = (u32)(((it >> 1) - 1) & 1);
            const u32 stage = sk0 + (u32)(s * TILE_BYTES);
            if (it >= 2) mbar_wait_or_trap(emptyY + 8 * s, par);             // the other warpgroup's P.V of tile it-2 done
            if (tid < NK) smask[s * NK + tid] = (nm >= 0 && (long long)nm < L) ? 1.0f : 0.0f;
            copy(stage, s, 0, 4);
            mbar_arrive(fullY + 8 * s);                                  // (release: the mask store)
            cp_async_arrive_noinc(fullY + 8 * s);
            if (it >= 2) mbar_wait_or_trap(emptyX + 8 * s, par);             // both P.V of tile it-2 done
            copy(stage, s, 4, NCT);
            cp_async_arrive_noinc(fullX + 8 * s);
            if (it + 1 < ntiles) load_slots(it + 1);                     // in flight under the next waits
        }
        cp_async_wait_all();                                             // no copy outlives the thread
    } else {
        // -------------------------------------------------------------------- consumers
        regs_inc<CONSUMER_REGS>();
        const int w = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);
        const int warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
        const int r0 = warp * 16 + g8, r1 = r0 + 8;

        for (int i = (int)threadIdx.x; i < ROWS * CH; i += 256) {
            const int r = (i & 7) + ((i >> 3) / CH) * 8, ch = (i >> 3) % CH;
            const bool ok = h0 + r < Hq;
            const long long row = ok ? (long long)tq * Hq + h0 + r : 0;
            cp_async16(sq + (u32)((r >> 3) * GROUP + ch * 128 + (r & 7) * 16), q + row * DQK + ch * 8, ok);
        }
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        bar_sync(BAR_Q, 256);

        float m[2] = {neg_inf(), neg_inf()}, lsum[2] = {0.0f, 0.0f};
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        // O *= exp2(m - M) and l likewise, M the next tile's max (O's MMAs all complete)
        auto rescale = [&](const float (&mn)[2]) {
            float a[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float mu = mn[h] == neg_inf() ? 0.0f : mn[h];
                a[h] = exp2f(m[h] - mu);                                  // m = -inf (nothing yet): 0
                lsum[h] *= a[h];
                m[h] = mn[h];
            }
            if (__any_sync(0xffffffffu, a[0] != 1.0f || a[1] != 1.0f)) {
#pragma unroll
                for (int i = 0; i < 32; ++i) {
                    o[4 * i + 0] *= a[0]; o[4 * i + 1] *= a[0];
                    o[4 * i + 2] *= a[1]; o[4 * i + 3] *= a[1];
                }
            }
        };
        const u32 vcol = (u32)(4 * w * CT_BYTES);                        // this warpgroup's O columns 256w ..
        constexpr u32 QHI = (u32)(GROUP >> 4);
        const u32 a_lo0 = ((sq >> 4) & 0x3fffu) | (8u << 16);

        for (int t = w;; t += 2) {
            const u32 a_lo = opaque_u32(a_lo0);
            const bool own = t < ntiles;
            const u32 stage = opaque_u32(sk0 + (u32)(w * TILE_BYTES));       // (else 36 hoisted descriptors spill)
            const u32 u = (u32)((t >> 1) & 1);
            float s[32];
            if (own) {
                // S_t = Q K_t^T (64 x 64): region Y first (released early), then X
                mbar_wait_or_trap(fullY + 8 * w, u);
                fence_proxy_async();
                wgmma_fence();
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int k4 = 0; k4 < 4; ++k4) {
                        const int ct = region_ct(w, i), ks = ct * 4 + k4;
                        const u64 b = desc_sw128(stage + (u32)(ct * CT_BYTES + k4 * 32), 16, 1024);
                        wgmma_m64n64k16_bf16(s, ((u64)QHI << 32) | (a_lo + 16u * ks), b, i + k4 > 0);
                    }
                wgmma_commit();
                if (t >= 2) {                                             // own P.V of tile t-2 done: X_w free (with the other's)
                    wgmma_wait<1>();
                    __syncwarp();
                    if (lane == 0) mbar_arrive(emptyX + 8 * w);
                }
                mbar_wait_or_trap(fullX + 8 * w, u);
                fence_proxy_async();
                wgmma_fence();
#pragma unroll
                for (int i = 4; i < NCT; ++i)
#pragma unroll
                    for (int k4 = 0; k4 < 4; ++k4) {
                        const int ct = region_ct(w, i), ks = ct * 4 + k4;
                        const u64 b = desc_sw128(stage + (u32)(ct * CT_BYTES + k4 * 32), 16, 1024);
                        wgmma_m64n64k16_bf16(s, ((u64)QHI << 32) | (a_lo + 16u * ks), b, 1);
                    }
                wgmma_commit();
            }
            const bool ss = t >= 1 && t - 1 < ntiles;                   // the other warpgroup's tile t-1 exists
            float mp[2] = {m[0], m[1]};                                   // M_{t-1}
            if (ss) {                                                     // its M_{t-1} and P_{t-1} are in shared memory
                bar_sync(BAR_P0 + w, 256);
                fence_proxy_async();
                mp[0] = red[((t - 1) & 1) * ROWS + r0];
                mp[1] = red[((t - 1) & 1) * ROWS + r1];
            }
            // nothing in flight from here to the P.V issues: ptxas serialises every wgmma when
            // accumulators (s, O) are touched under a pending one
            wgmma_wait<0>();
            float ps[2] = {0.0f, 0.0f}, mn[2] = {mp[0], mp[1]};          // M_t = max(M_{t-1}, rowmax S_t)
            if (own) {
                // P_t overwrites the rope tile that every warp's part of S_t reads: a warp's wait
                // covers only its own part, so all four parts are done before any warp stores P
                // (without it the CPU emulation caught warps writing P under another warp's S)
                bar_sync(BAR_WG0 + w, 128);
                // logits (base 2): s[4nb + e] = row (e < 2 ? r0 : r1), key 8nb + 2tig + (e & 1)
                const float* msk = smask + w * NK;
#pragma unroll
                for (int nb = 0; nb < 8; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float wv = msk[nb * 8 + tig * 2 + (e & 1)];
                        s[4 * nb + e] = wv > 0.0f ? s[4 * nb + e] * scale_log2 : neg_inf();
                        mn[e >> 1] = fmaxf(mn[e >> 1], s[4 * nb + e]);
                    }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    mn[h] = fmaxf(mn[h], __shfl_xor_sync(0xffffffffu, mn[h], 1));
                    mn[h] = fmaxf(mn[h], __shfl_xor_sync(0xffffffffu, mn[h], 2));
                }
                // P_t (bf16) into the rope tile (A of both warpgroups' P.V; registers are short):
                // (row r, key k) at (r/8)*1024 + (k/8)*128 + (r%8)*16 + (k%8)*2
                const float mu[2] = {mn[0] == neg_inf() ? 0.0f : mn[0], mn[1] == neg_inf() ? 0.0f : mn[1]};
                const u32 pp = stage + (u32)(8 * CT_BYTES);
#pragma unroll
                for (int nb = 0; nb < 8; ++nb) {
                    float p[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        p[e] = exp2f(s[4 * nb + e] - mu[e >> 1]);         // masked: exp2(-inf) = 0
                        ps[e >> 1] += p[e];
                    }
                    const u32 lo = pack_bf16x2(p[0], p[1]), hi = pack_bf16x2(p[2], p[3]);
                    const u32 at = pp + (u32)(warp * 2048 + nb * 128 + g8 * 16 + tig * 4);
                    st_shared_u32(at, lo);
                    st_shared_u32(at + 1024u, hi);
                }
                if (tig == 0) {
                    red[(t & 1) * ROWS + r0] = mn[0];
                    red[(t & 1) * ROWS + r1] = mn[1];
                }
                fence_proxy_async();                                      // P stores -> the other's wgmma
                bar_arrive(BAR_P0 + (w ^ 1), 256);
            }
            if (ss) {
                // O_w (at M_{t-1}) += P_{t-1} V_{t-1}[:, 256w ..] (P from the other stage's rope tile)
                rescale(mp);
                const u32 ost = opaque_u32(sk0 + (u32)((w ^ 1) * TILE_BYTES)), op = ost + (u32)(8 * CT_BYTES);
                wgmma_fence();
#pragma unroll
                for (int k2 = 0; k2 < 4; ++k2) {
                    const u32 alo = (((op + (u32)(k2 * 256)) >> 4) & 0x3fffu) | (8u << 16);
                    const u64 vb = desc_sw128(ost + vcol + (u32)(k2 * 2048), CT_BYTES, 1024);
                    wgmma_m64n256k16_bf16_tb(o, ((u64)(1024u >> 4) << 32) | alo, vb, 1);
                }
                wgmma_commit();
                wgmma_wait<0>();                                          // (O is rescaled next)
                __syncwarp();
                if (lane == 0) {                                          // Y of the other stage free; X once its owner's P.V is done
                    mbar_arrive(emptyY + 8 * (w ^ 1));
                    mbar_arrive(emptyX + 8 * (w ^ 1));
                }
            }
            if (!own) break;
            rescale(mn);
            lsum[0] += ps[0];
            lsum[1] += ps[1];
            // O_w += P_t V_t[:, 256w ..] (P from the own rope tile: every warp's rows stored); completes under the next S
            bar_sync(BAR_WG0 + w, 128);
            const u32 pp = stage + (u32)(8 * CT_BYTES);
            wgmma_fence();
#pragma unroll
            for (int k2 = 0; k2 < 4; ++k2) {
                const u32 alo = (((pp + (u32)(k2 * 256)) >> 4) & 0x3fffu) | (8u << 16);
                const u64 vb = desc_sw128(stage + vcol + (u32)(k2 * 2048), CT_BYTES, 1024);
                wgmma_m64n256k16_bf16_tb(o, ((u64)(1024u >> 4) << 32) | alo, vb, 1);
            }
            wgmma_commit();
        }

        // l = the two warpgroups' sums (both at the last tile's max); out = O / l
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 1);
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 2);
        }
        if (tig == 0) {
            red[2 * ROWS + w * ROWS + r0] = lsum[0];
            red[2 * ROWS + w * ROWS + r1] = lsum[1];
        }
        bar_sync(BAR_L, 256);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = h ? r1 : r0;
            if (h0 + r >= Hq) continue;
            const float l = red[2 * ROWS + r] + red[3 * ROWS + r];
            const long long row = (long long)tq * Hq + h0 + r;
#pragma unroll
            for (int nb = 0; nb < 32; ++nb) {
                const float x0 = l > 0.0f ? __fdiv_rn(o[4 * nb + 2 * h], l) : 0.0f;
                const float x1 = l > 0.0f ? __fdiv_rn(o[4 * nb + 2 * h + 1], l) : 0.0f;
                const long long at = row * DV + w * 256 + nb * 8 + tig * 2;
                if (OUT_BF16)
                    *reinterpret_cast<u32*>(reinterpret_cast<bf16_t*>(out) + at) = pack_bf16x2(x0, x1);
                else
                    *reinterpret_cast<float2*>(reinterpret_cast<float*>(out) + at) = make_float2(x0, x1);
            }
            if (w == 0 && tig == 0) {
                const float mm = m[h] == neg_inf() ? 0.0f : m[h];
                lse[row] = l > 0.0f ? (mm + log2f(l)) * 0.69314718055994531f : neg_inf();
            }
        }
    }
}

}  // namespace attw3
}  // namespace hytopk

using namespace hytopk::attw3;

// one query x 64 heads per CTA (grid n * nhb), 2 consumer warpgroups + 1 producer warpgroup
template <bool OUT_BF16>
__global__ void __launch_bounds__(THREADS, 1)
hytopk_attend_fwd_wgmma3(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                         const int* __restrict__ idx, int kk, int n, long long L, int Hq, int nhb,
                         float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    attend_fwd_wgmma3<OUT_BF16>(q, kv, kv_stride, idx, kk, n, L, Hq, nhb, scale_log2, out, lse);
}
