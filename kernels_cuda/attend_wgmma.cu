// Sparse attention forward on wgmma (sm_90a) for MLA's shared kv (docs/CONTRACT.md §8, the same
// function as hytopk_attend_fwd of attend.cu): d_qk 576, d_v 512 (V = the first 512 columns of the
// gathered kv row), one query x 64 heads per block (heads past Hq are zero rows, not written).
//
// 384 threads = 3 warpgroups. WG 2 (producer) gathers key tiles of 64 slots (64 rows x 1152 B)
// with cp.async into two stages; mbarriers full[s] (128 producer arrivals after the copies landed)
// and empty[s] (256 consumer arrivals after their MMAs read the stage). WG 0 and WG 1 (consumers)
// per tile:
//   S_c = Q K_c^T    consumer c takes keys 32c .. 32c+31 of the tile (m64n32k16 x 36, both from smem)
//   row max of the tile through shared memory (named barrier), then the same online softmax as
//   attend.cu (base 2, p = exp2(s*scale_log2 - m), P rounded to bf16); P_c -> shared memory
//   O_c += P V[:, 256c .. 256c+255]   (m64n256k16: own keys' P from registers, the other consumer's
//   from shared memory; V read in place from the K tile as an MN-major operand, no second copy)
// out = O / l (correctly rounded), lse = (m + log2 l) * ln 2; no valid slot: out 0, lse -inf.
//
// Shared-memory operands use the no-swizzle core-matrix layout (hytopk_wgmma_common.cuh): element
// (r, d) of a [rows][576] tile at (r/8)*9216 + (d/8)*128 + (r%8)*16 + (d%8)*2. As K (B of Q K^T,
// K-major) leading offset 128 (next 8 d), stride 9216 (next 8 keys); as V (B of P V, MN-major) the
// same bytes with leading offset 9216 (next 8 keys, the K direction) and stride 128 (next 8 d).
#include "hytopk_cp_async.cuh"
#include "hytopk_wgmma_common.cuh"

using namespace hytopk;
using namespace hytopk::wgp;

namespace hytopk {
namespace attw {

typedef unsigned short bf16_t;
constexpr int DQK = 576, DV = 512, ROWS = 64, NK = 64;
constexpr int CH = DQK / 8;                       // 16-byte chunks per row: 72
constexpr int GROUP = CH * 128;                   // bytes per 8 rows: 9216
constexpr int TILE_BYTES = NK / 8 * GROUP;        // 73728
constexpr int Q_BYTES = ROWS / 8 * GROUP;         // 73728
constexpr int P_BYTES = ROWS * 32 * 2;            // one consumer's P: 64 rows x 32 keys bf16 (4 chunks/row)
constexpr int Q_OFF = 0;
constexpr int K_OFF = Q_OFF + Q_BYTES;
constexpr int P_OFF = K_OFF + 2 * TILE_BYTES;
constexpr int RED_OFF = P_OFF + 2 * P_BYTES;      // float [2][64] tile row maxima, then [2][64] row sums
constexpr int MASK_OFF = RED_OFF + 4 * ROWS * 4;  // float [2 stages][64] slot valid 1/0
constexpr int BAR_OFF = MASK_OFF + 2 * NK * 4;    // full[2], empty[2]
constexpr int SMEM = BAR_OFF + 4 * 8;
static_assert(SMEM <= 227 * 1024, "attend_wgmma: shared memory over 227 KiB");
constexpr int THREADS = 384;
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * ((65536 / THREADS) / 8 * 8),
              "attend_wgmma: register budgets exceed the block's pool");
// named barriers (0 = __syncthreads), 256 consumer threads each
constexpr int BAR_Q = 1, BAR_MAX = 2, BAR_P = 3, BAR_L = 4;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// mbarrier wait that traps (a launch error) instead of hanging the GPU when a phase never completes:
// no wait of a working launch comes near 2 s (%globaltimer, ns; one 32-bit register: the consumers
// run at the 168-register launch cap)
__device__ __forceinline__ u32 ns_now() {
    u32 t;
    asm volatile("mov.u32 %0, %%globaltimer_lo;\n" : "=r"(t));
    return t;
}
__device__ __forceinline__ void wait_or_trap(u32 bar, u32 parity) {
    u32 done, t0 = 0;
    bool timed = false;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        if (!done) {                                   // the clock is read only once the first poll failed
            if (!timed) { t0 = ns_now(); timed = true; }
            else if (ns_now() - t0 > 2000000000u) asm volatile("trap;");
        }
    } while (!done);
}

}  // namespace attw
}  // namespace hytopk

using namespace hytopk::attw;

// q [n, Hq, 576] bf16 (contiguous); kv rows at kv + s * kv_stride (elements; 16-byte aligned rows);
// idx [n, kk] int32 in [-1, L) (-1 and out-of-range slots masked; duplicates count per slot);
// out [n, Hq, 512] float or bf16 bits; lse [n, Hq] float. grid n * nhb (nhb = ceil(Hq / 64)): the
// head blocks of one query are adjacent blocks, so they run together and gather the same rows from L2.
template <bool OUT_BF16>
__global__ void __launch_bounds__(384, 1)
hytopk_attend_fwd_wgmma(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                        const int* __restrict__ idx, int kk, int n, long long L, int Hq, int nhb,
                        float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int t = (int)(blockIdx.x / (unsigned)nhb), h0 = (int)(blockIdx.x % (unsigned)nhb) * ROWS;
    if (t >= n) return;                                               // (the whole block)
    const u32 base = smem_addr(smem);
    const u32 sq = base + Q_OFF, sk0 = base + K_OFF, sp0 = base + P_OFF;
    float* red = reinterpret_cast<float*>(smem + RED_OFF);
    float* smask = reinterpret_cast<float*>(smem + MASK_OFF);
    const u32 full0 = base + BAR_OFF, empty0 = full0 + 16;
    const int ntiles = (kk + NK - 1) / NK;
    const int* lst = idx + (long long)t * kk;

    if (threadIdx.x == 0) {
        mbar_init(full0, 128);
        mbar_init(full0 + 8, 128);
        mbar_init(empty0, 256);
        mbar_init(empty0 + 8, 256);
        mbar_fence_init();
    }
    __syncthreads();
    const int wg = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);

    if (wg == 2) {
        // ---------------------------------------------------------------- producer
        regs_dec<PRODUCER_REGS>();
        const int r8 = tid & 7, cq = tid >> 3;                        // row within 8, first chunk
        // tile it-1 is published before waiting for stage it & 1 to drain (tile it-2's readers), so
        // a tile's copies run under the consumers' work on the tile before it
        for (int it = 0; it < ntiles; ++it) {
            const int st = it & 1;
            if (it >= 1) {
                cp_async_wait<0>();                                   // tile it-1 landed (this thread's copies)
                fence_proxy_async();                                  // ... visible to the consumers' wgmma
                mbar_arrive(full0 + 8 * (st ^ 1));
            }
            if (it >= 2) wait_or_trap(empty0 + 8 * st, (u32)(((it >> 1) - 1) & 1));
            const u32 dst = sk0 + (u32)(st * TILE_BYTES) + (u32)(r8 * 16);
            const int j0 = it * NK;
#pragma unroll
            for (int g = 0; g < NK / 8; ++g) {
                const int j = j0 + g * 8 + r8;
                const long long s = j < kk ? (long long)__ldg(lst + j) : -1;
                const bool ok = s >= 0 && s < L;
                const bf16_t* src = kv + (ok ? s * kv_stride : 0);
                for (int c = cq; c < CH; c += 16)                     // 8 consecutive threads: 128 contiguous bytes
                    cp_async16(dst + (u32)(g * GROUP + c * 128), src + (ok ? c * 8 : 0), ok);
            }
            if (tid < NK) {
                const int j = j0 + tid;
                const long long s = j < kk ? (long long)__ldg(lst + j) : -1;
                smask[st * NK + tid] = (s >= 0 && s < L) ? 1.0f : 0.0f;
            }
            cp_async_commit();
        }
        if (ntiles > 0) {
            cp_async_wait<0>();
            fence_proxy_async();
            mbar_arrive(full0 + 8 * ((ntiles - 1) & 1));
        }
        return;
    }

    // -------------------------------------------------------------------- consumers
    regs_inc<CONSUMER_REGS>();
    const int c = wg;                                                 // key half (S) and column half (O)
    const int warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
    const int r0 = warp * 16 + g8, r1 = r0 + 8;                       // this thread's two rows

    // Q rows h0 .. h0+63 (zero rows past Hq) into the core-matrix layout
    for (int i = (int)threadIdx.x; i < ROWS * CH; i += 256) {
        const int r = (i & 7) + ((i >> 3) / CH) * 8, ch = (i >> 3) % CH;
        const bool ok = h0 + r < Hq;
        const long long row = ok ? (long long)t * Hq + h0 + r : 0;
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

    for (int it = 0; it < ntiles; ++it) {
        const int st = it & 1;
        const u32 sk = sk0 + (u32)(st * TILE_BYTES);
        wait_or_trap(full0 + 8 * st, (u32)((it >> 1) & 1));

        // S_c = Q K_c^T: 64 rows x 32 keys, 36 k-steps of 16 (256 bytes of each operand's rows)
        float s[16];
        {
            const u32 a_lo = ((sq >> 4) & 0x3fffu) | (8u << 16);
            const u32 b_lo = (((sk + (u32)(c * 4 * GROUP)) >> 4) & 0x3fffu) | (8u << 16);
            constexpr u32 HI = (u32)(GROUP >> 4);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < DQK / 16; ++ks)
                wgmma_m64n32k16_bf16(s, ((u64)HI << 32) | (a_lo + 16u * ks), ((u64)HI << 32) | (b_lo + 16u * ks), ks > 0);
            wgmma_commit();
            wgmma_wait_all();
        }
        // logits (base 2) of this thread's 8 keys per row: s[4nb + e], key 32c + 8nb + 2tig + (e & 1)
        const float* msk = smask + st * NK + c * 32;
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int nb = 0; nb < 4; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float w = msk[nb * 8 + tig * 2 + (e & 1)];
                s[4 * nb + e] = w > 0.0f ? s[4 * nb + e] * scale_log2 : neg_inf();
                mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * nb + e]);
            }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        if (tig == 0) {
            red[c * ROWS + r0] = mx[0];
            red[c * ROWS + r1] = mx[1];
        }
        bar_sync(BAR_MAX, 256);                       // also: both consumers' P.V of tile it-1 done
        float alpha[2], muse[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = h ? r1 : r0;
            const float mnew = fmaxf(m[h], fmaxf(red[r], red[ROWS + r]));
            muse[h] = mnew == neg_inf() ? 0.0f : mnew;
            alpha[h] = exp2f(m[h] - muse[h]);         // m = -inf (nothing yet): 0
            m[h] = mnew;
        }
        // P (bf16) as the A fragments of this consumer's two k16 steps, and into shared memory for
        // the other consumer: element (row r, key k) at (r/8)*512 + (k/8)*128 + (r%8)*16 + (k%8)*2
        u32 pa[2][4];
        float ps[2] = {0.0f, 0.0f};
        const u32 spc = sp0 + (u32)(c * P_BYTES);
#pragma unroll
        for (int nb = 0; nb < 4; ++nb) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float w = msk[nb * 8 + tig * 2 + (e & 1)];
                p[e] = w > 0.0f ? exp2f(s[4 * nb + e] - muse[e >> 1]) : 0.0f;
                ps[e >> 1] += p[e];
            }
            const u32 lo = pack_bf16(p[0], p[1]), hi = pack_bf16(p[2], p[3]);
            pa[nb >> 1][(nb & 1) * 2 + 0] = lo;       // rows g8: keys 16kk + 8(nb&1) + 2tig
            pa[nb >> 1][(nb & 1) * 2 + 1] = hi;       // rows g8 + 8
            const u32 at = spc + (u32)(warp * 2 * 512 + nb * 128 + g8 * 16 + tig * 4);
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(lo) : "memory");
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at + 512u), "r"(hi) : "memory");
        }
        lsum[0] = lsum[0] * alpha[0] + ps[0];
        lsum[1] = lsum[1] * alpha[1] + ps[1];
        // x * 1 == x: skip the 128 multiplies when no row of the warp got a new maximum (most tiles
        // after the first few); warp-uniform, and no MMA inside the branch
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                o[4 * i + 0] *= alpha[0]; o[4 * i + 1] *= alpha[0];
                o[4 * i + 2] *= alpha[1]; o[4 * i + 3] *= alpha[1];
            }
        }
        fence_proxy_async();                          // P stores -> the other consumer's wgmma
        bar_sync(BAR_P, 256);

        // O_c += P V[:, 256c ..]: k16 steps over the tile's 64 keys, this consumer's own 32 keys first
        // (P from registers), then the other's (P from shared memory); no branch between the MMAs
        // (a divergent path makes ptxas serialise them)
        {
            const u32 v0 = sk + (u32)(c * 32 * 128);  // column 256c: 32 chunks of 8 d
#ifndef HYTOPK_ATTW_V_SWAP           // MN-major no swizzle: lead = the K (key) direction, PTX ISA canonical layouts
            constexpr u32 V_HI = 128u >> 4, V_LEAD = (u32)(GROUP >> 4);
#else                                // probe: the two offsets' roles swapped
            constexpr u32 V_HI = (u32)(GROUP >> 4), V_LEAD = 128u >> 4;
#endif
            const u32 other = sp0 + (u32)((c ^ 1) * P_BYTES);
            wgmma_fence();
#pragma unroll
            for (int kk2 = 0; kk2 < 2; ++kk2) {       // own keys 32c + 16kk2 ..: key groups 4c + 2kk2
                const u32 vlo = (((v0 + (u32)((4 * c + 2 * kk2) * GROUP)) >> 4) & 0x3fffu) | (V_LEAD << 16);
                wgmma_m64n256k16_bf16_rs_tb(o, pa[kk2], ((u64)V_HI << 32) | vlo, 1);
            }
#pragma unroll
            for (int kk2 = 0; kk2 < 2; ++kk2) {       // the other's keys 32(1-c) + 16kk2 ..
                const u32 vlo = (((v0 + (u32)((4 * (c ^ 1) + 2 * kk2) * GROUP)) >> 4) & 0x3fffu) | (V_LEAD << 16);
                const u32 alo = (((other + (u32)(kk2 * 256)) >> 4) & 0x3fffu) | (8u << 16);
                wgmma_m64n256k16_bf16_tb(o, ((u64)(512u >> 4) << 32) | alo, ((u64)V_HI << 32) | vlo, 1);
            }
            wgmma_commit();
            wgmma_wait_all();
        }
        mbar_arrive(empty0 + 8 * st);                  // this thread is done reading stage st
    }

    // l = the two consumers' sums; out = O / l
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 1);
        lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 2);
    }
    if (tig == 0) {
        red[2 * ROWS + c * ROWS + r0] = lsum[0];
        red[2 * ROWS + c * ROWS + r1] = lsum[1];
    }
    bar_sync(BAR_L, 256);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = h ? r1 : r0;
        if (h0 + r >= Hq) continue;
        const float l = red[2 * ROWS + r] + red[3 * ROWS + r];
        const long long row = (long long)t * Hq + h0 + r;
#pragma unroll
        for (int nb = 0; nb < 32; ++nb) {
            const float x0 = l > 0.0f ? __fdiv_rn(o[4 * nb + 2 * h], l) : 0.0f;
            const float x1 = l > 0.0f ? __fdiv_rn(o[4 * nb + 2 * h + 1], l) : 0.0f;
            const long long at = row * DV + c * 256 + nb * 8 + tig * 2;
            if (OUT_BF16)
                *reinterpret_cast<u32*>(reinterpret_cast<bf16_t*>(out) + at) = pack_bf16(x0, x1);
            else
                *reinterpret_cast<float2*>(reinterpret_cast<float*>(out) + at) = make_float2(x0, x1);
        }
        if (c == 0 && tig == 0) {
            const float mm = m[h] == neg_inf() ? 0.0f : m[h];
            lse[row] = l > 0.0f ? (mm + log2f(l)) * 0.69314718055994531f : neg_inf();
        }
    }
}
