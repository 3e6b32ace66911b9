// Sparse attention forward on wgmma (sm_90a), version 3 (same function as attend_wgmma2.cu; the
// same math conventions, other rounding: see below). Version 2s is consumer-bound (S at N = 32 per
// warpgroup reads all of Q per 32 keys; the row max exchanged in lock step). Version 3 takes the
// schedule of FlashMLA's sm90 sparse prefill (public code, read for facts):
// - keys in pairs of 64-key tiles: tile 2b in stage 0, tile 2b + 1 in stage 1. Warpgroup 0
//   computes S_0 = Q K_{2b}^T, warpgroup 1 S_1 = Q K_{2b+1}^T, each with 36 m64n64k16 (half the Q
//   reads per key of version 2s). Warpgroup w owns O's columns 256w .. 256w + 255.
// - the row max is chained through shared memory: warpgroup 0 takes M_0 = max(M, rowmax S_0),
//   warpgroup 1 then M_1 = max(M_0, rowmax S_1), the pair's max. Each warpgroup multiplies its own
//   P (bf16, in registers) into its O half at once (RS); warpgroup 0 rescales its P_0 to M_1 and
//   stores it in stage 0's rope column tile (dead once S_0 is done), warpgroup 1 stores P_1 (at
//   M_1 already) in a separate tile, and each multiplies the other's P into its O half (SS).
// - a stage is filled and released in two regions, L = column tiles 0-3 (V's columns 0-255) and
//   R = column tiles 4-8 (V's columns 256-511 and the rope). The producer fills L0, R1, R0, L1 in
//   that order; L0 is free once warpgroup 0's own P.V is done (early), R1 once warpgroup 1's, R0
//   and L1 once the other warpgroup's P.V. Warpgroup 0 runs S over L then R, warpgroup 1 over R
//   then L, and warpgroup 0 issues the next pair's S under its last P.V.
// - the key tile: 9 column tiles of 64 keys x 128 B, 128-byte swizzle (version 2s's gather, one
//   row's 128 B per quarter warp), key j, column d at
//     (d/64)*8192 + j*128 + (((d%64)/8) ^ (j%8))*16 + (d%8)*2
// - a producer warpgroup (384 threads, FA3's shape): cp.async with .L2::256B completing on the
//   full barriers (cp.async.mbarrier.arrive.noinc); consumers fence.proxy.async after each full
//   wait. __launch_bounds__(384, 1) compiles at 168 registers; the producer drops to PRODUCER_REGS
//   and the consumers rise to CONSUMER_REGS (setmaxnreg). The block keeps the registers it launched
//   with (168 x 384 = 64512): setmaxnreg.inc waits until the .dec has freed enough, so
//   128 x 40 + 256 x 232 must fit in them (a producer at 48 hung the first H200 run). Why not a
//   10-warp block at 200: it never launched (3 warps on one of the four 16K register-file quarters).
// Rounding differs from versions 1/2 (k-step order of S, P rounded under the pair's maxima), so
// the tests compare version 3 with the reference and wgmma2 within tolerance, not bitwise.
// QPT 2 (`wgmma3p`, Hq <= 32): two adjacent queries per block over the union of their selections,
// as wgmma2sp: at 8 / 16 heads one query fills 8 / 16 of the 64 MMA rows, and the block's time is
// the gather's, so a pair gathers its shared keys once (about half the key tiles per query).
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
constexpr int NCT = DQK / 64;                     // column tiles: 9 (8 = the rope)
constexpr int NL = 4;                             // region L: column tiles 0-3; region R: 4-8
constexpr int TILE_BYTES = NCT * CT_BYTES;        // 73728
constexpr int Q_BYTES = ROWS / 8 * GROUP;         // 73728
constexpr int P_BYTES = ROWS * NK * 2;            // a 64 x 64 bf16 P tile: 8192
constexpr int Q_OFF = 0;
constexpr int K_OFF = Q_OFF + Q_BYTES;
constexpr int P1_OFF = K_OFF + 2 * TILE_BYTES;    // P_1 (P_0 lives in stage 0's rope column tile)
constexpr int RED_OFF = P1_OFF + P_BYTES;         // float [2][64] the maxima M_0, M_1 (the row sums: in Q's, at the end)
// [2 pair parities][2 stages][64] slot valid: float 1/0 (QPT 1: parity 0 only); QPT 2: u32, the
// slot's two 16-bit counts, a pair's written a pair ahead (their global loads off the copies' path)
constexpr int MASK_OFF = RED_OFF + 2 * ROWS * 4;
// at the end, Q's tile holds the row sums (float [2][64]) and, from O_STAGE_OFF, the bf16 out tile
constexpr int O_STAGE_OFF = 1024;
static_assert(O_STAGE_OFF >= 2 * ROWS * 4 && O_STAGE_OFF + ROWS * DV * 2 <= Q_BYTES, "attend_wgmma3: out staging in Q's tile");
constexpr int BAR_OFF = MASK_OFF + 4 * NK * 4;    // full[stage][L, R], empty[stage][L, R]
constexpr int SMEM = BAR_OFF + 8 * 8;
constexpr int LAUNCH_SMEM = SMEM + 1024;          // the base is rounded up to 1024 B (swizzle atoms)
static_assert(LAUNCH_SMEM <= 227 * 1024, "attend_wgmma3: shared memory over 227 KiB");
static_assert(K_OFF % 1024 == 0 && TILE_BYTES % 1024 == 0, "attend_wgmma3: atom alignment");
static_assert(P_BYTES == CT_BYTES, "attend_wgmma3: P_0 fills the rope column tile");
constexpr int PRODUCERS = 128;                    // the producer warpgroup
constexpr int THREADS = 256 + PRODUCERS;          // 384: 12 warps, 3 per register-file quarter
constexpr int QW = PRODUCERS / 8;                 // producer quarter warps: 16
constexpr int GN = NK / QW;                       // rows per producer quarter warp and tile: 4
// setmaxnreg budgets: together within the registers the block launched with (else .inc never returns)
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;   // what __launch_bounds__(384, 1) allows: 168
static_assert(PRODUCERS * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * LAUNCH_REGS,
              "attend_wgmma3: setmaxnreg budgets exceed the block's launch registers (.inc would wait forever)");
static_assert(PRODUCER_REGS <= LAUNCH_REGS && CONSUMER_REGS >= LAUNCH_REGS, "attend_wgmma3: setmaxnreg must dec / inc");
// named barriers (0 = __syncthreads), all between the two consumer warpgroups (256 threads): one
// side arrives, the other waits; each is used once per pair, and neither side can arrive twice
// before the other has waited (every second arrival follows a wait on the other side)
constexpr int BAR_Q = 1, BAR_L = 2;
constexpr int BAR_M0 = 3;                         // M_0 in shared memory (0 -> 1)
constexpr int BAR_M1 = 4;                         // M_1 (1 -> 0)
constexpr int BAR_P0 = 5;                         // P_0 stored (0 -> 1)
constexpr int BAR_P1 = 6;                         // P_1 stored (1 -> 0)
enum { REG_L = 0, REG_R = 1 };

__device__ __forceinline__ u64 desc_sw128(u32 addr, u32 lead, u32 stride) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) | ((u64)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float finite_or_zero(float m) { return m == neg_inf() ? 0.0f : m; }

// q [n, Hq, 576] bf16; kv rows at kv + s * kv_stride (16-byte aligned rows); idx [n, kk] int32 in
// [-1, L) (-1 and out-of-range slots masked); out [n, Hq, 512] float or bf16 bits; lse [n, Hq].
// QPT 2 (nhb 1, Hq <= 32): block t serves queries 2t, 2t+1 (rows 0 .. Hq-1, Hq .. 2Hq-1, the rest
// zero rows) over their union: idx = the union rows [pairs, kk] (kk = its width), lens [pairs] the
// union sizes, mult [pairs, kk, 2] how many slots of each query hold the key (0 masks it for that
// query; a key counts mult times in the softmax, as wgmma2sp). QPT 1: lens, mult unused.
// prefetch > 0: while it issues pair b's copies the producer pulls pair b + prefetch's rows into L2
// (cp.async.bulk.prefetch.L2, one row per thread), so their copies hit L2. Measured
// no gain (one query) or a loss (the query pair): off by default (instantiations.ATTEND_WGMMA3_PREFETCH).
// interleave: tile t of the list's T tiles holds its slots t, t + T, t + 2T, ... (else t's 64 in a
// row): the same keys in another order (other rounding), every tile spanning a sorted list's range.
template <bool OUT_BF16, int QPT>
__device__ __forceinline__ void attend_fwd_wgmma3(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv,
                                                  long long kv_stride, const int* __restrict__ idx,
                                                  const int* __restrict__ lens, const int* __restrict__ mult, int kk,
                                                  int n, long long L, int Hq, int nhb, int prefetch,
                                                  int interleave, float scale_log2, void* __restrict__ out,
                                                  float* __restrict__ lse) {
    static_assert(QPT == 1 || QPT == 2, "attend_wgmma3: one query or a query pair per block");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tq = (int)(blockIdx.x / (unsigned)nhb), h0 = (int)(blockIdx.x % (unsigned)nhb) * ROWS;
    if (tq * QPT >= n) return;
    // row r of the block: its row of q / out / lse, or false (a zero row)
    auto row_of = [&](int r, long long& row) { return attend_block_row<QPT>(tq, h0, r, Hq, n, row); };
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char* smem = smem_raw + (base - raw);
    const u32 sq = base + Q_OFF, sk0 = base + K_OFF, sk1 = sk0 + TILE_BYTES, sp1 = base + P1_OFF;
    const u32 sp0 = sk0 + (u32)(8 * CT_BYTES);                           // P_0: stage 0's rope column tile
    float* red = reinterpret_cast<float*>(smem + RED_OFF);
    float* smask = reinterpret_cast<float*>(smem + MASK_OFF);             // (QPT 2: u32 bits)
    auto mask_of = [&](int b, int stage) { return smask + (QPT == 2 ? (b & 1) * 2 * NK : 0) + stage * NK; };
    // full / empty barrier of region reg of stage s
    const u32 bars = base + BAR_OFF;
    auto full = [&](int s, int reg) { return bars + (u32)(8 * (2 * s + reg)); };
    auto empty = [&](int s, int reg) { return bars + (u32)(32 + 8 * (2 * s + reg)); };
    const int len = QPT == 2 ? min(kk, lens[tq]) : kk;                  // slots of this block's list
    const int ntiles = (len + NK - 1) / NK, npairs = (ntiles + 1) / 2;  // an odd count ends on an empty tile

    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; ++s)
            for (int reg = 0; reg < 2; ++reg) {
                // the region a stage's fill starts with (L0, R1) also carries the stage's mask:
                // a plain arrival after the mask store + a cp.async arrival per producer thread
                const bool first = reg == (s == 0 ? REG_L : REG_R);
                mbar_init(full(s, reg), first ? 2 * PRODUCERS : PRODUCERS);
                mbar_init(empty(s, reg), 4);                          // one warpgroup's warps
            }
        mbar_fence_init();
    }
    __syncthreads();

    if (threadIdx.x >= 256) {
        // ---------------------------------------------------------------- producer (one warpgroup)
        regs_dec<PRODUCER_REGS>();
        const int tid = (int)threadIdx.x - 256, r8 = tid & 7, qw = tid >> 3;   // quarter warp qw: rows qw + 16g
        int nx0[GN], nx1[GN];                                            // the pair's two tiles: rows qw + 16g (-1: none)
        // a slot's key is a row of kv iff (u32)key < rows (negative keys wrap above it): one compare
        const u32 rows = (u32)min(L, 0x80000000ll);
        int pf = -1;                                                     // prefetch: slot tid of a later pair
        // the list slot of row j of tile t (-1: none)
        auto slot_of = [&](int t, int j) {
            const int s = interleave ? t + ntiles * j : t * NK + j;
            return s < len && t < ntiles ? s : -1;
        };
        auto load_slots = [&](int b) {
            const int* lst = idx + (long long)(int)opaque_u32((u32)tq) * kk;     // (made here: not held over the loop)
#pragma unroll
            for (int g = 0; g < GN; ++g) {
                const int j = qw + QW * g, s0 = slot_of(2 * b, j), s1 = slot_of(2 * b + 1, j);
                nx0[g] = s0 >= 0 ? __ldg(lst + s0) : -1;
                nx1[g] = s1 >= 0 ? __ldg(lst + s1) : -1;
            }
            if (prefetch > 0) {
                const int sp = slot_of(2 * (b + prefetch) + (tid >> 6), tid & 63);
                pf = sp >= 0 ? __ldg(lst + sp) : -1;
            }
        };
        // column tiles [c0, c1) of a stage: row j's 128 B of tile ct at slot r8 ^ (j % 8); invalid
        // slots are zero-filled (src-size 0: nothing is read; their address is row 0's, in bounds
        // whenever L > 0). One row address per region, the tiles at immediate offsets from it: a
        // select per copy had cost ~12 producer instructions per cp.async (ncu, run 1 of
        // results/h200-2026-12-02-s6; FlashMLA's producer: ~3)
        auto copy = [&](u32 stage, const int (&nx)[GN], int c0, int c1) {
#pragma unroll
            for (int g = 0; g < GN; ++g) {
                const int j = qw + QW * g;                                 // j % 8 = qw % 8
                const u32 sl = opaque_u32((u32)nx[g]);                  // (address math here, not hoisted over the waits)
                const bool ok = sl < rows;
                const bf16_t* src = kv + ((long long)(ok ? sl : 0u) * kv_stride + r8 * 8);
                const u32 d = stage + (u32)(j * 128 + ((r8 ^ (qw & 7)) << 4));
#pragma unroll
                for (int ct = c0; ct < c1; ++ct) cp_async16_l2pf(d + (u32)(ct * CT_BYTES), src + ct * 64, ok);
            }
        };
        // a quarter warp's first lane: its rows' mask (QPT 2: the slot's two counts, 16 bits each)
        // for tile t
        auto store_mask = [&](float* msk, const int (&nx)[GN], int t) {
            if (r8 == 0)
#pragma unroll
                for (int g = 0; g < GN; ++g) {
                    const bool ok = (u32)nx[g] < rows;
                    if (QPT == 1) {
                        msk[qw + QW * g] = ok ? 1.0f : 0.0f;
                    } else {
                        u32 wv = 0u;
                        if (ok) {   // (the address made here, none held over the loop: the producer spilled)
                            const long long at = (long long)tq * kk + (int)opaque_u32((u32)slot_of(t, qw + QW * g));
                            const int2 c = __ldg(reinterpret_cast<const int2*>(mult) + at);
                            wv = (u32)min(max(c.x, 0), 0xffff) | ((u32)min(max(c.y, 0), 0xffff) << 16);
                        }
                        reinterpret_cast<u32*>(msk)[qw + QW * g] = wv;
                    }
                }
        };
        // QPT 2: pair b's masks go out with its slots, a pair ahead of its copies (mask parity b & 1:
        // pair b - 2's, whose readers released their regions before the waits of pair b - 1)
        auto store_masks_early = [&](int b) {
            if (QPT == 2) {
                store_mask(mask_of(b, 0), nx0, 2 * b);
                store_mask(mask_of(b, 1), nx1, 2 * b + 1);
            }
        };
        if (npairs > 0) {
            load_slots(0);
            store_masks_early(0);
        }
        for (int b = 0; b < npairs; ++b) {
            const u32 par = (u32)((b - 1) & 1);                          // pair b-1's releases
            if (pf >= 0 && (long long)pf < L) prefetch_l2_bulk(kv + (long long)pf * kv_stride, DQK * 2);
            if (b) mbar_wait_or_trap(empty(0, REG_L), par);              // warpgroup 0's own P.V done
            copy(sk0, nx0, 0, NL);
            if (QPT == 1) store_mask(mask_of(b, 0), nx0, 2 * b);
            mbar_arrive(full(0, REG_L));                                 // (release: the mask store)
            cp_async_arrive_noinc(full(0, REG_L));
            if (b) mbar_wait_or_trap(empty(1, REG_R), par);              // warpgroup 1's own P.V done
            copy(sk1, nx1, NL, NCT);
            if (QPT == 1) store_mask(mask_of(b, 1), nx1, 2 * b + 1);
            mbar_arrive(full(1, REG_R));
            cp_async_arrive_noinc(full(1, REG_R));
            if (b) mbar_wait_or_trap(empty(0, REG_R), par);              // warpgroup 1's P_0 . V_0R done
            copy(sk0, nx0, NL, NCT);
            cp_async_arrive_noinc(full(0, REG_R));
            if (b) mbar_wait_or_trap(empty(1, REG_L), par);              // warpgroup 0's P_1 . V_1L done
            copy(sk1, nx1, 0, NL);
            cp_async_arrive_noinc(full(1, REG_L));
            if (b + 1 < npairs) {                                        // in flight under the next waits
                load_slots(b + 1);
                store_masks_early(b + 1);
            }
        }
        cp_async_wait_all();                                             // no copy outlives the thread
    } else {
        // -------------------------------------------------------------------- consumers
        regs_inc<CONSUMER_REGS>();
        const int w = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);
        const int warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
        const int r0 = warp * 16 + g8, r1 = r0 + 8;
        // QPT 2: the shift of row r's query's count in a slot's mask word (a zero row: query 0's)
        const int wsh[2] = {QPT == 2 && r0 >= Hq && r0 < 2 * Hq ? 16 : 0, QPT == 2 && r1 >= Hq && r1 < 2 * Hq ? 16 : 0};

        for (int i = (int)threadIdx.x; i < ROWS * CH; i += 256) {
            const int r = (i & 7) + ((i >> 3) / CH) * 8, ch = (i >> 3) % CH;
            long long row;
            const bool ok = row_of(r, row);
            if (!ok) row = 0;
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
        float s[32];
        u32 pa[4][4];                                                    // P (bf16) as the RS A fragments
        auto scale_o = [&](const float (&a)[2]) {                        // O and l *= a (O's MMAs complete)
            lsum[0] *= a[0];
            lsum[1] *= a[1];
            if (__any_sync(0xffffffffu, a[0] != 1.0f || a[1] != 1.0f)) {
#pragma unroll
                for (int i = 0; i < 32; ++i) {
                    o[4 * i + 0] *= a[0]; o[4 * i + 1] *= a[0];
                    o[4 * i + 2] *= a[1]; o[4 * i + 3] *= a[1];
                }
            }
        };
        constexpr u32 QHI = (u32)(GROUP >> 4);
        const u32 a_lo0 = ((sq >> 4) & 0x3fffu) | (8u << 16);
        // S += Q K^T over column tiles [c0, c1) of a stage (first: the first k-step starts the sum)
        // the descriptors' low words advance by (byte offset >> 4) within their 14-bit address field
        // (shared addresses < 256 KiB: no carry out), their high words are constants: two adds per
        // wgmma (rebuilding the swizzled descriptor per k-step took nine uniform instructions)
        constexpr u32 KHI = (u32)((1024 >> 4) | (1u << 30));              // stride 1024 B, 128-byte swizzle
        auto qk = [&](u32 stage_, int c0, int c1, bool first) {
            const u32 a_lo = opaque_u32(a_lo0);                              // (else 36 hoisted descriptors spill)
            const u32 b_lo = opaque_u32(((stage_ >> 4) & 0x3fffu) | (1u << 16));   // leading byte offset 16
            fence_proxy_async();
            wgmma_fence();
#pragma unroll
            for (int ct = c0; ct < c1; ++ct)
#pragma unroll
                for (int k4 = 0; k4 < 4; ++k4)
                    wgmma_m64n64k16_bf16(s, ((u64)QHI << 32) | (a_lo + 16u * (u32)(ct * 4 + k4)),
                                         ((u64)KHI << 32) | (b_lo + (u32)((ct * CT_BYTES + k4 * 32) >> 4)),
                                         !(first && ct == c0 && k4 == 0));
            wgmma_commit();
        };
        // the count of key `key` of a stage's mask for row half h (QPT 1: 1 / 0)
        auto count_of = [&](const float* msk, int key, int h) {
            if (QPT == 1) return msk[key];
            return (float)((reinterpret_cast<const u32*>(msk)[key] >> wsh[h]) & 0xffffu);
        };
        // the stage's mask on the raw logits (-inf off it), their row max (base 2: times scale_log2,
        // as max and a positive scale's rounding commute) folded into mx: s[4nb + e] = row (e < 2 ?
        // r0 : r1), key 8nb + 2tig + (e & 1). The scale is applied in the softmax's fma.
        auto mask_max = [&](const float* msk, float (&mx)[2]) {
            float rm[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int nb = 0; nb < 8; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float wv = count_of(msk, nb * 8 + tig * 2 + (e & 1), e >> 1);
                    s[4 * nb + e] = wv > 0.0f ? s[4 * nb + e] : neg_inf();
                    rm[e >> 1] = fmaxf(rm[e >> 1], s[4 * nb + e]);
                }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                rm[h] = fmaxf(rm[h], __shfl_xor_sync(0xffffffffu, rm[h], 1));
                rm[h] = fmaxf(rm[h], __shfl_xor_sync(0xffffffffu, rm[h], 2));
                mx[h] = fmaxf(mx[h], rm[h] * scale_log2);
            }
        };
        // O, l rescaled from m to mn; s := P = exp2(s scale_log2 - mn) (float; QPT 2: times the key's
        // count), its row sums into l, pa = bf16 P
        auto softmax = [&](const float* msk, const float (&mn)[2]) {
            const float mu[2] = {finite_or_zero(mn[0]), finite_or_zero(mn[1])};
            const float a[2] = {exp2f(m[0] - mu[0]), exp2f(m[1] - mu[1])};   // m = -inf (nothing yet): 0
            scale_o(a);
            m[0] = mn[0];
            m[1] = mn[1];
#pragma unroll
            for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    s[4 * nb + e] = exp2f(fmaf(s[4 * nb + e], scale_log2, -mu[e >> 1]));  // masked: exp2(-inf) = 0
                    if (QPT == 2) s[4 * nb + e] *= count_of(msk, nb * 8 + tig * 2 + (e & 1), e >> 1);
                    lsum[e >> 1] += s[4 * nb + e];
                }
                pa[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16x2(s[4 * nb + 0], s[4 * nb + 1]);
                pa[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16x2(s[4 * nb + 2], s[4 * nb + 3]);
            }
        };
        // a P tile (no swizzle): (row r, key k) at (r/8)*1024 + (k/8)*128 + (r%8)*16 + (k%8)*2
        const u32 prow = (u32)(warp * 2048 + g8 * 16 + tig * 4);
        // O (columns vcol ..) += P V over the 64 keys of a stage, P from registers or a P tile
        auto pv_rs = [&](u32 stage, u32 vcol) {
            wgmma_fence();
#pragma unroll
            for (int k2 = 0; k2 < 4; ++k2)
                wgmma_m64n256k16_bf16_rs_tb(o, pa[k2], desc_sw128(stage + vcol + (u32)(k2 * 2048), CT_BYTES, 1024), 1);
            wgmma_commit();
        };
        auto pv_ss = [&](u32 ptile, u32 stage, u32 vcol) {
            wgmma_fence();
#pragma unroll
            for (int k2 = 0; k2 < 4; ++k2) {
                const u32 alo = (((ptile + (u32)(k2 * 256)) >> 4) & 0x3fffu) | (8u << 16);
                wgmma_m64n256k16_bf16_tb(o, ((u64)(1024u >> 4) << 32) | alo,
                                         desc_sw128(stage + vcol + (u32)(k2 * 2048), CT_BYTES, 1024), 1);
            }
            wgmma_commit();
        };
        auto release = [&](u32 bar) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar);
        };
        float* sm0 = red;                                                // M_0 by row (0 -> 1)
        float* sm1 = red + ROWS;                                         // M_1 (1 -> 0)

        if (w == 0) {
            // ------------------------------------------------ warpgroup 0: tile 2b, O columns 0-255
            constexpr u32 VCOL = 0;
            for (int b = 0; b < npairs; ++b) {
                const u32 u = (u32)(b & 1);
                if (b == 0) {                                            // (later pairs: issued under the last P.V)
                    mbar_wait_or_trap(full(0, REG_L), 0);
                    qk(sk0, 0, NL, true);
                    mbar_wait_or_trap(full(0, REG_R), 0);
                    qk(sk0, NL, NCT, false);
                    wgmma_wait<0>();
                }
                float mn[2] = {m[0], m[1]};                              // M_0 = max(M, rowmax S_0)
                mask_max(mask_of(b, 0), mn);
                softmax(mask_of(b, 0), mn);
                if (tig == 0) {
                    sm0[r0] = mn[0];
                    sm0[r1] = mn[1];
                }
                bar_arrive(BAR_M0, 256);
                pv_rs(sk0, VCOL);                                        // O += P_0 V_0L
                wgmma_wait<0>();
                release(empty(0, REG_L));
                // every warp of warpgroup 0 is past its S_0 (the barrier): the rope tile takes P_0
                bar_sync(BAR_M1, 256);
                const float m1[2] = {sm1[r0], sm1[r1]};
                const float f[2] = {exp2f(m[0] - finite_or_zero(m1[0])), exp2f(m[1] - finite_or_zero(m1[1]))};
#pragma unroll
                for (int nb = 0; nb < 8; ++nb) {                         // P_0 at M_1, for warpgroup 1
                    const u32 at = sp0 + prow + (u32)(nb * 128);
                    st_shared_u32(at, pack_bf16x2(s[4 * nb + 0] * f[0], s[4 * nb + 1] * f[0]));
                    st_shared_u32(at + 1024u, pack_bf16x2(s[4 * nb + 2] * f[1], s[4 * nb + 3] * f[1]));
                }
                fence_proxy_async();                                     // P_0 stores -> warpgroup 1's wgmma
                bar_arrive(BAR_P0, 256);
                scale_o(f);
                m[0] = m1[0];
                m[1] = m1[1];
                bar_sync(BAR_P1, 256);
                pv_ss(sp1, sk1, VCOL);                                   // O += P_1 V_1L
                if (b + 1 < npairs) {                                    // the next pair's S_0 under it
                    mbar_wait_or_trap(full(0, REG_L), u ^ 1u);
                    qk(sk0, 0, NL, true);
                    wgmma_wait<1>();
                    release(empty(1, REG_L));
                    mbar_wait_or_trap(full(0, REG_R), u ^ 1u);
                    qk(sk0, NL, NCT, false);
                    wgmma_wait<0>();
                } else {
                    wgmma_wait<0>();
                    release(empty(1, REG_L));
                }
            }
        } else {
            // ------------------------------------------- warpgroup 1: tile 2b + 1, O columns 256-511
            constexpr u32 VCOL = (u32)(NL * CT_BYTES);
            for (int b = 0; b < npairs; ++b) {
                const u32 u = (u32)(b & 1);
                mbar_wait_or_trap(full(1, REG_R), u);
                qk(sk1, NL, NCT, true);
                mbar_wait_or_trap(full(1, REG_L), u);
                qk(sk1, 0, NL, false);
                wgmma_wait<0>();
                float mn[2] = {m[0], m[1]};
                mask_max(mask_of(b, 1), mn);
                bar_sync(BAR_M0, 256);
                mn[0] = fmaxf(mn[0], sm0[r0]);                           // M_1 = max(M_0, rowmax S_1)
                mn[1] = fmaxf(mn[1], sm0[r1]);
                softmax(mask_of(b, 1), mn);
                if (tig == 0) {
                    sm1[r0] = mn[0];
                    sm1[r1] = mn[1];
                }
                bar_arrive(BAR_M1, 256);
                pv_rs(sk1, VCOL);                                        // O += P_1 V_1R
                // P_1 (at M_1) for warpgroup 0, stored under that wgmma (as FlashMLA's warpgroup 1;
                // stored before it, they kept this warpgroup's tensor work waiting). Packed again from
                // the float P, not read from pa: the PTX ISA leaves any access to a running wgmma's A
                // registers before its wait_group undefined (the same bits either way)
#pragma unroll
                for (int nb = 0; nb < 8; ++nb) {
                    const u32 at = sp1 + prow + (u32)(nb * 128);
                    st_shared_u32(at, pack_bf16x2(s[4 * nb + 0], s[4 * nb + 1]));
                    st_shared_u32(at + 1024u, pack_bf16x2(s[4 * nb + 2], s[4 * nb + 3]));
                }
                bar_sync(BAR_P0, 256);
                pv_ss(sp0, sk0, VCOL);                                   // O += P_0 V_0R
                fence_proxy_async();                                     // P_1 stores -> warpgroup 0's wgmma
                bar_arrive(BAR_P1, 256);
                wgmma_wait<1>();
                release(empty(1, REG_R));
                wgmma_wait<0>();
                release(empty(0, REG_R));
            }
        }

        // l = the two warpgroups' sums (both at the last pair's M_1); out = O / l. The sums go to
        // Q's tile: every S wgmma has completed (each warpgroup's own before its last softmax, the
        // other's before the named barrier this one passed last)
        float* sums = reinterpret_cast<float*>(smem + Q_OFF);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 1);
            lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 2);
        }
        if (tig == 0) {
            sums[w * ROWS + r0] = lsum[0];
            sums[w * ROWS + r1] = lsum[1];
        }
        bar_sync(BAR_L, 256);
        const u32 ost = base + Q_OFF + O_STAGE_OFF;                      // bf16 out: staged (stage_out_bf16)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = h ? r1 : r0;
            long long row;
            if (!row_of(r, row)) continue;
            const float l = sums[r] + sums[ROWS + r];
            attend_out_row<OUT_BF16>(o, h, r, row, l, w, tig, ost, out);
            if (w == 0 && tig == 0) {
                const float mm = finite_or_zero(m[h]);
                lse[row] = l > 0.0f ? (mm + log2f(l)) * 0.69314718055994531f : neg_inf();
            }
        }
        if (OUT_BF16) {
            bar_sync(BAR_L, 256);
            copy_out_bf16(ost, row_of, reinterpret_cast<bf16_t*>(out), (int)threadIdx.x);
        }
    }
}

}  // namespace attw3
}  // namespace hytopk

using namespace hytopk::attw3;

// QPT 1: one query x 64 heads per CTA (grid n * nhb); QPT 2: a query pair per CTA (grid ceil(n / 2),
// Hq <= 32, idx / lens / mult its union); 2 consumer warpgroups + 1 producer warpgroup
template <bool OUT_BF16, int QPT>
__global__ void __launch_bounds__(THREADS, 1)
hytopk_attend_fwd_wgmma3(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                         const int* __restrict__ idx, const int* __restrict__ lens, const int* __restrict__ mult,
                         int kk, int n, long long L, int Hq, int nhb, int prefetch, int interleave,
                         float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    attend_fwd_wgmma3<OUT_BF16, QPT>(q, kv, kv_stride, idx, lens, mult, kk, n, L, Hq, nhb, prefetch, interleave,
                                     scale_log2, out, lse);
}
