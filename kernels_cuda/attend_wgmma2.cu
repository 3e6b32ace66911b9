// Sparse attention forward on wgmma (sm_90a) for MLA's shared kv (docs/CONTRACT.md §8, the same
// function as hytopk_attend_fwd of attend.cu): d_qk 576, d_v 512 (V = the first 512 columns of the
// gathered kv row), one query x 64 heads per block (heads past Hq are zero rows, not written).
//
// 384 threads = 3 warpgroups. WG 2 (producer) gathers key tiles of 64 slots (64 rows x 1152 B)
// with cp.async into two stages; mbarriers full[s] (after the copies landed) and empty[s] (after
// the consumers' MMAs read the stage). WG 0 and WG 1 (consumers) per tile:
//   S_c = Q K_c^T    consumer c takes keys 32c .. 32c+31 of the tile (m64n32k16 x 36, both from smem)
//   row max of the tile through shared memory (named barrier), then the same online softmax as
//   attend.cu (base 2, p = exp2(s*scale_log2 - m), P rounded to bf16); P_c -> shared memory
//   O_c += P V[:, 256c .. 256c+255]   (m64n256k16: own keys' P from registers, the other consumer's
//   from shared memory; V read in place from the K tile as an MN-major operand, no second copy)
// out = O / l (correctly rounded), lse = (m + log2 l) * ln 2; no valid slot: out 0, lse -inf.
//
// Without SWZ the shared-memory operands use the no-swizzle core-matrix layout
// (hytopk_wgmma_common.cuh): element (r, d) of a [rows][576] tile at (r/8)*9216 + (d/8)*128 +
// (r%8)*16 + (d%8)*2. As K (B of Q K^T, K-major) leading offset 128 (next 8 d), stride 9216 (next 8
// keys); as V (B of P V, MN-major) the same bytes with leading offset 9216 (next 8 keys) and stride
// 128 (next 8 d).
//
// This is version 2. Version 1 (attend_wgmma.cu, removed: wgmma2 gives its bits, faster; perf_notes)
// was gather-bound on the H200 (the consumers waited on the producer 35% of the samples, the
// producer on a dependent idx load before every row's copies). What changed:
// - the producer loads the next tile's indices into registers one tile ahead (their latency hides
//   under a whole tile), so a tile's 16-byte cp.async run back to back with no global load between
//   them; the consumers release a stage once per warp (8 arrivals, not 256)
// - hytopk_attend_fwd_wgmma2c: the two head blocks of a query form a 2-CTA cluster; each gathers
//   half of the tile's rows (32 x 1152 B) from L2 and, once they landed, pushes them into the other
//   block's stage with one shared -> shared bulk copy (completing on the peer's full barrier as
//   36864 transaction bytes): half the L2 -> SM bytes of one block each. A stage is empty once the
//   consumers of BOTH blocks released it (8 local + 8 remote arrivals), since it is written by both.
// - SWZ (the `s` kernels): the unswizzled 16-byte copies put 8 rows' chunk c into one 128-byte core
//   matrix, so each quarter warp read 8 half sectors of 8 rows and L2 served every gathered sector
//   twice (ncu: 50% excess sectors, L2 69% busy at 1.6 TB/s of payload). With SWZ the key tile is
//   in wgmma's 128-byte-swizzle layout and each quarter warp copies one row's 128 contiguous bytes
//   (full sectors) into 8 distinct bank groups (chunk c of row j at slot c ^ (j % 8)):
//     key j, column d at (j/32)*36864 + (d/64)*4096 + (j%32)*128 + (((d%64)/8) ^ (j%8))*16 + (d%8)*2
//   (a half of 32 keys, 9 column tiles of 32 rows x 128 B, 1024-byte swizzle atoms of 8 rows).
//   As K (B of Q K^T, K-major, 128B swizzle): start + 32 B per k16 step inside a column tile, stride
//   offset 1024 (8 keys). As V (B of P V, MN-major, 128B swizzle): leading offset 4096 (next 64 d),
//   stride offset 1024 (next 8 keys). Q and P keep the no-swizzle layout.
#include "hytopk_cp_async.cuh"
#include "hytopk_wgmma_common.cuh"

using namespace hytopk;
using namespace hytopk::wgp;

namespace hytopk {
namespace attw2 {

typedef unsigned short bf16_t;
constexpr int DQK = 576, DV = 512, ROWS = 64, NK = 64;
constexpr int CH = DQK / 8;                       // 16-byte chunks per row: 72
constexpr int GROUP = CH * 128;                   // bytes per 8 rows: 9216
constexpr int TILE_BYTES = NK / 8 * GROUP;        // 73728
constexpr int HALF_BYTES = TILE_BYTES / 2;        // one cluster block's share: rows 32r .. 32r+31
constexpr int Q_BYTES = ROWS / 8 * GROUP;         // 73728
constexpr int P_BYTES = ROWS * 32 * 2;            // one consumer's P: 64 rows x 32 keys bf16
constexpr int Q_OFF = 0;
constexpr int K_OFF = Q_OFF + Q_BYTES;
constexpr int P_OFF = K_OFF + 2 * TILE_BYTES;
constexpr int RED_OFF = P_OFF + 2 * P_BYTES;      // float [2][64] tile row maxima, then [2][64] row sums
constexpr int MASK_OFF = RED_OFF + 4 * ROWS * 4;  // u32 [2 stages][64] slot weights: query 0's in bits 0-15, query 1's in 16-31
constexpr int BAR_OFF = MASK_OFF + 2 * NK * 4;    // full[2], empty[2]
constexpr int SMEM = BAR_OFF + 4 * 8;
constexpr int LAUNCH_SMEM = SMEM + 1024;          // the base is rounded up to 1024 B (swizzle atoms)
static_assert(ROWS * DV * 2 <= Q_BYTES, "attend_wgmma2: the bf16 out tile is staged in Q's");
static_assert(LAUNCH_SMEM <= 227 * 1024, "attend_wgmma2: shared memory over 227 KiB");
static_assert(K_OFF % 1024 == 0 && TILE_BYTES % 1024 == 0 && HALF_BYTES % 1024 == 0, "attend_wgmma2: atom alignment");
constexpr int CT_BYTES = 32 * 128;                // SWZ: one column tile (64 d) of a 32-key half
constexpr int THREADS = 384;
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 65536, "attend_wgmma2: register budgets exceed the SM's file");
// named barriers (0 = __syncthreads): 1-4 the 256 consumer threads, 5 the 128 producer threads
constexpr int BAR_Q = 1, BAR_MAX = 2, BAR_P = 3, BAR_L = 4, BAR_PROD = 5;

// matrix descriptor, 128-byte swizzle (mode 1): addresses and offsets in bytes
__device__ __forceinline__ u64 desc_sw128(u32 addr, u32 lead, u32 stride) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) | ((u64)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// cluster primitives (cluster_ctarank, cluster_sync, map_peer, mbar_arrive_remote, bulk_s2peer):
// hytopk_wgmma_common.cuh

// q [n, Hq, 576] bf16 (contiguous); kv rows at kv + s * kv_stride (elements; 16-byte aligned rows);
// idx [n, kk] int32 in [-1, L) (-1 and out-of-range slots masked; duplicates count per slot);
// out [n, Hq, 512] float or bf16 bits; lse [n, Hq] float. grid n * nhb (nhb = head blocks per query,
// even for CLUSTER: a cluster is the head blocks 2j, 2j+1 of one query; blocks whose heads are all
// past Hq gather and compute but write nothing).
// QPT 2 (`pair`, no cluster, Hq <= 32, nhb 1): block x serves queries 2x, 2x+1 (rows 0 .. Hq-1 and
// Hq .. 2Hq-1; the rest zero rows) over their union: idx = the union rows [pairs, kk] (kk = its
// width), lens [pairs] the union sizes, mult [pairs, kk, 2] how many slots of each query hold the
// key (0 masks it for that query; the softmax counts a key mult times, as attend.cu's pair).
template <bool OUT_BF16, bool CLUSTER, bool SWZ, int QPT>
__device__ __forceinline__ void attend_fwd_wgmma2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv,
                                                  long long kv_stride, const int* __restrict__ idx,
                                                  const int* __restrict__ lens, const int* __restrict__ mult, int kk,
                                                  int n, long long L, int Hq, int nhb, float scale_log2,
                                                  void* __restrict__ out, float* __restrict__ lse) {
    static_assert(QPT == 1 || (QPT == 2 && !CLUSTER), "attend_wgmma2: query pairs without the cluster");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int t = (int)(blockIdx.x / (unsigned)nhb), h0 = (int)(blockIdx.x % (unsigned)nhb) * ROWS;
    if (!CLUSTER && t * QPT >= n) return;           // (the whole block; the launch never has t >= n)
    // row r of the block: its row of q / out / lse, or false (a zero row)
    auto row_of = [&](int r, long long& row) { return attend_block_row<QPT>(t, h0, r, Hq, n, row); };
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;   // the same in both cluster blocks
    unsigned char* smem = smem_raw + (base - raw);
    const u32 sq = base + Q_OFF, sk0 = base + K_OFF, sp0 = base + P_OFF;
    float* red = reinterpret_cast<float*>(smem + RED_OFF);
    u32* smask = reinterpret_cast<u32*>(smem + MASK_OFF);
    const u32 full0 = base + BAR_OFF, empty0 = full0 + 16;
    const int len = QPT == 2 ? min(kk, lens[t]) : kk;     // slots of this block's list
    const int ntiles = (len + NK - 1) / NK;
    const int* lst = idx + (long long)t * kk;
    const int* mlt = QPT == 2 ? mult + (long long)t * kk * 2 : nullptr;
    const u32 rank = CLUSTER ? cluster_ctarank() : 0u, peer = rank ^ 1u;
    constexpr u32 EMPTY_COUNT = CLUSTER ? 16 : 8;   // one arrival per consumer warp (of both blocks)

    if (threadIdx.x == 0) {
        mbar_init(full0, 128);
        mbar_init(full0 + 8, 128);
        mbar_init(empty0, EMPTY_COUNT);
        mbar_init(empty0 + 8, EMPTY_COUNT);
        mbar_fence_init();
    }
    if (CLUSTER) cluster_sync();                    // the peer's barriers exist before any remote op
    else __syncthreads();
    const int wg = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);

    if (wg == 2) {
        // ---------------------------------------------------------------- producer
        regs_dec<PRODUCER_REGS>();
        // no SWZ: rows g*8 + r8 (g < GN), chunks cq + 16i; SWZ: quarter warp qw copies rows
        // row0 + qw + 16g (g < GN), all 9 column tiles, its 8 threads the 8 chunks of 128 B
        const int r8 = tid & 7, cq = tid >> 3;
        constexpr int GN = SWZ ? (CLUSTER ? 2 : 4) : (CLUSTER ? NK / 16 : NK / 8);   // this thread's rows per tile
        const int gbeg = CLUSTER ? (int)rank * (NK / 16) : 0;         // first row group of this block's share (no SWZ)
        const int row0 = CLUSTER ? (int)rank * 32 : 0;                // first row of this block's share (SWZ)
        int nx[GN], nm = -1;                                          // the next tile's slots (nm: mask slot tid)
        u32 nw = 0;                                                   // QPT 2: its two weights (mult)
        auto load_slots = [&](int it) {
            const int j0 = it * NK;
#pragma unroll
            for (int g = 0; g < GN; ++g) {
                const int j = j0 + (SWZ ? row0 + cq + 16 * g : (gbeg + g) * 8 + r8);
                nx[g] = j < len ? __ldg(lst + j) : -1;
            }
            if (tid < NK) {
                nm = j0 + tid < len ? __ldg(lst + j0 + tid) : -1;
                if (QPT == 2 && nm >= 0) {
                    const int w0 = __ldg(mlt + 2 * (j0 + tid)), w1 = __ldg(mlt + 2 * (j0 + tid) + 1);
                    nw = (u32)min(w0, 0xffff) | ((u32)min(w1, 0xffff) << 16);
                }
            }
        };
        // tile it-1 published (its copies landed: fence, [cluster: push this block's half to the
        // peer], arrive), then stage it & 1 awaited and tile it's copies issued
        auto publish = [&](int it1) {
            const int s1 = it1 & 1;
            cp_async_wait<0>();                                       // this thread's copies of tile it1 landed
            fence_proxy_async();                                      // ... visible to wgmma and the bulk copy
            if (CLUSTER) {
                bar_sync(BAR_PROD, 128);                              // all of this block's half landed
                if (tid == 0) {
                    const u32 off = (u32)(K_OFF + s1 * TILE_BYTES + (int)rank * HALF_BYTES);
                    bulk_s2peer(map_peer(base + off, peer), base + off, (u32)HALF_BYTES, map_peer(full0 + 8 * s1, peer));
                    mbar_expect_tx(full0 + 8 * s1, (u32)HALF_BYTES);  // the peer's half into this block
                } else {
                    mbar_arrive(full0 + 8 * s1);
                }
            } else {
                mbar_arrive(full0 + 8 * s1);
            }
        };
        if (ntiles > 0) load_slots(0);
        for (int it = 0; it < ntiles; ++it) {
            const int st = it & 1;
            if (it >= 1) publish(it - 1);
            if (it >= 2) mbar_wait_or_trap<CLUSTER>(empty0 + 8 * st, (u32)(((it >> 1) - 1) & 1));
            const u32 dst = sk0 + (u32)(st * TILE_BYTES + gbeg * GROUP + r8 * 16);
            if (SWZ) {
#pragma unroll
                for (int g = 0; g < GN; ++g) {
                    const int j = row0 + cq + 16 * g;                 // row of the tile; j % 8 = cq % 8
                    const long long s = nx[g];
                    const bool ok = s >= 0 && s < L;
                    const bf16_t* src = kv + (ok ? s * kv_stride + r8 * 8 : 0);
                    const u32 d = sk0 + (u32)(st * TILE_BYTES + (j >> 5) * HALF_BYTES + (j & 31) * 128 + ((r8 ^ (j & 7)) << 4));
#pragma unroll
                    for (int kt = 0; kt < DQK / 64; ++kt)
                        cp_async16_l2pf(d + (u32)(kt * CT_BYTES), src + (ok ? kt * 64 : 0), ok);
                }
            } else {
#pragma unroll
            for (int g = 0; g < GN; ++g) {
                const long long s = nx[g];
                const bool ok = s >= 0 && s < L;
                const bf16_t* src = kv + (ok ? s * kv_stride : 0);
#pragma unroll
                for (int i = 0; i < (CH + 15) / 16; ++i) {            // 8 consecutive threads: 8 rows' chunk c
                    const int c = cq + 16 * i;
                    if (c < CH) cp_async16(dst + (u32)(g * GROUP + c * 128), src + (ok ? c * 8 : 0), ok);
                }
            }
            }
            if (tid < NK) smask[st * NK + tid] = (nm >= 0 && (long long)nm < L) ? (QPT == 2 ? nw : 1u) : 0u;
            cp_async_commit();
            if (it + 1 < ntiles) load_slots(it + 1);                  // in flight under the next waits
        }
        if (ntiles > 0) publish(ntiles - 1);
    } else {
        // -------------------------------------------------------------------- consumers
        regs_inc<CONSUMER_REGS>();
        const int c = wg;                                             // key half (S) and column half (O)
        const int warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
        const int r0 = warp * 16 + g8, r1 = r0 + 8;                   // this thread's two rows
        // the weight of a slot for row r: its query's 16 bits (QPT 1: 1 / 0; a zero row: query 0's)
        const int wsh[2] = {QPT == 2 && r0 < 2 * Hq ? 16 * (r0 / Hq) : 0, QPT == 2 && r1 < 2 * Hq ? 16 * (r1 / Hq) : 0};

        // Q rows h0 .. h0+63 (zero rows past Hq) into the core-matrix layout
        for (int i = (int)threadIdx.x; i < ROWS * CH; i += 256) {
            const int r = (i & 7) + ((i >> 3) / CH) * 8, ch = (i >> 3) % CH;
            long long row;
            const bool ok = row_of(r, row);
            cp_async16(sq + (u32)((r >> 3) * GROUP + ch * 128 + (r & 7) * 16), q + (ok ? row : 0) * DQK + ch * 8, ok);
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
            mbar_wait_or_trap<false>(full0 + 8 * st, (u32)((it >> 1) & 1));

            // S_c = Q K_c^T: 64 rows x 32 keys, 36 k-steps of 16
            float s[16];
            {
                const u32 a_lo = ((sq >> 4) & 0x3fffu) | (8u << 16);
                const u32 b_lo = (((sk + (u32)(c * 4 * GROUP)) >> 4) & 0x3fffu) | (8u << 16);
                constexpr u32 HI = (u32)(GROUP >> 4);
                const u64 b_sw = desc_sw128(sk + (u32)(c * HALF_BYTES), 16, 1024);   // SWZ: keys 32c .. 32c+31 = half c
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < DQK / 16; ++ks) {
                    const u64 b = SWZ ? b_sw + (u64)(((ks >> 2) * CT_BYTES + (ks & 3) * 32) >> 4)
                                      : ((u64)HI << 32) | (b_lo + 16u * ks);
                    wgmma_m64n32k16_bf16(s, ((u64)HI << 32) | (a_lo + 16u * ks), b, ks > 0);
                }
                wgmma_commit();
                wgmma_wait_all();
            }
            // logits (base 2) of this thread's 8 keys per row: s[4nb + e], key 32c + 8nb + 2tig + (e & 1)
            const u32* msk = smask + st * NK + c * 32;
            float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int nb = 0; nb < 4; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 w = (msk[nb * 8 + tig * 2 + (e & 1)] >> wsh[e >> 1]) & 0xffffu;
                    s[4 * nb + e] = w ? s[4 * nb + e] * scale_log2 : neg_inf();
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
            bar_sync(BAR_MAX, 256);                   // also: both consumers' P.V of tile it-1 done
            float alpha[2], muse[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = h ? r1 : r0;
                const float mnew = fmaxf(m[h], fmaxf(red[r], red[ROWS + r]));
                muse[h] = mnew == neg_inf() ? 0.0f : mnew;
                alpha[h] = exp2f(m[h] - muse[h]);     // m = -inf (nothing yet): 0
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
                    const u32 w = (msk[nb * 8 + tig * 2 + (e & 1)] >> wsh[e >> 1]) & 0xffffu;
                    p[e] = w ? (QPT == 2 ? (float)w * exp2f(s[4 * nb + e] - muse[e >> 1])   // mult copies
                                         : exp2f(s[4 * nb + e] - muse[e >> 1])) : 0.0f;
                    ps[e >> 1] += p[e];
                }
                const u32 lo = pack_bf16x2(p[0], p[1]), hi = pack_bf16x2(p[2], p[3]);
                pa[nb >> 1][(nb & 1) * 2 + 0] = lo;
                pa[nb >> 1][(nb & 1) * 2 + 1] = hi;
                const u32 at = spc + (u32)(warp * 2 * 512 + nb * 128 + g8 * 16 + tig * 4);
                st_shared_u32(at, lo);
                st_shared_u32(at + 512u, hi);
            }
            lsum[0] = lsum[0] * alpha[0] + ps[0];
            lsum[1] = lsum[1] * alpha[1] + ps[1];
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int i = 0; i < 32; ++i) {
                    o[4 * i + 0] *= alpha[0]; o[4 * i + 1] *= alpha[0];
                    o[4 * i + 2] *= alpha[1]; o[4 * i + 3] *= alpha[1];
                }
            }
            fence_proxy_async();                      // P stores -> the other consumer's wgmma
            bar_sync(BAR_P, 256);

            // O_c += P V[:, 256c ..] (V = the K tile read MN-major)
            {
                const u32 v0 = sk + (u32)(c * 32 * 128);
                constexpr u32 V_HI = 128u >> 4, V_LEAD = (u32)(GROUP >> 4);
                const u32 other = sp0 + (u32)((c ^ 1) * P_BYTES);
                wgmma_fence();
                // SWZ: keys 16q .. 16q+15 (q = 2 * half + kk2) and columns 256c ..: half, 16-key row
                // offset, column tiles 4c .. 4c+3 (leading offset: the next 64 columns)
                const u32 v_sw = sk + (u32)(c * 4 * CT_BYTES);
#ifndef HYTOPK_ATTW2_V_SWAP          // MN-major SW128 (PTX ISA): leading = the next 64 columns, stride = the next 8 keys
                constexpr u32 VS_LEAD = CT_BYTES, VS_STRIDE = 1024;
#else                                // probe: the two offsets' roles swapped
                constexpr u32 VS_LEAD = 1024, VS_STRIDE = CT_BYTES;
#endif
#pragma unroll
                for (int kk2 = 0; kk2 < 2; ++kk2) {
                    const u32 vlo = (((v0 + (u32)((4 * c + 2 * kk2) * GROUP)) >> 4) & 0x3fffu) | (V_LEAD << 16);
                    const u64 vb = SWZ ? desc_sw128(v_sw + (u32)(c * HALF_BYTES + kk2 * 2048), VS_LEAD, VS_STRIDE)
                                       : ((u64)V_HI << 32) | vlo;
                    wgmma_m64n256k16_bf16_rs_tb(o, pa[kk2], vb, 1);
                }
#pragma unroll
                for (int kk2 = 0; kk2 < 2; ++kk2) {
                    const u32 vlo = (((v0 + (u32)((4 * (c ^ 1) + 2 * kk2) * GROUP)) >> 4) & 0x3fffu) | (V_LEAD << 16);
                    const u64 vb = SWZ ? desc_sw128(v_sw + (u32)((c ^ 1) * HALF_BYTES + kk2 * 2048), VS_LEAD, VS_STRIDE)
                                       : ((u64)V_HI << 32) | vlo;
                    const u32 alo = (((other + (u32)(kk2 * 256)) >> 4) & 0x3fffu) | (8u << 16);
                    wgmma_m64n256k16_bf16_tb(o, ((u64)(512u >> 4) << 32) | alo, vb, 1);
                }
                wgmma_commit();
                wgmma_wait_all();
            }
            __syncwarp();                             // every lane's MMAs on stage st are complete
            if (lane == 0) {
                mbar_arrive(empty0 + 8 * st);
                if (CLUSTER) mbar_arrive_remote(map_peer(empty0 + 8 * st, peer));   // the peer writes here too
            }
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
            long long row;
            if (!row_of(r, row)) continue;
            const float l = red[2 * ROWS + r] + red[3 * ROWS + r];
            attend_out_row<OUT_BF16>(o, h, r, row, l, c, tig, sq, out);   // (bf16: staged in Q's tile, every MMA done)
            if (c == 0 && tig == 0) {
                const float mm = m[h] == neg_inf() ? 0.0f : m[h];
                lse[row] = l > 0.0f ? (mm + log2f(l)) * 0.69314718055994531f : neg_inf();
            }
        }
        if (OUT_BF16) {
            bar_sync(BAR_L, 256);
            copy_out_bf16(sq, row_of, reinterpret_cast<bf16_t*>(out), (int)threadIdx.x);
        }
    }
    // the peer's remote arrivals on this block's barriers and its bulk copies into this block's
    // stages are over before either block exits
    if (CLUSTER) cluster_sync();
}

}  // namespace attw2
}  // namespace hytopk

using namespace hytopk::attw2;

// one head block per CTA (grid n * nhb); SWZ: the swizzled key tile (full-sector gather); QPT 2:
// a query pair per CTA over its union (grid ceil(n / 2), nhb 1, Hq <= 32; lens / mult as above)
template <bool OUT_BF16, bool SWZ, int QPT>
__global__ void __launch_bounds__(384, 1)
hytopk_attend_fwd_wgmma2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                         const int* __restrict__ idx, const int* __restrict__ lens, const int* __restrict__ mult,
                         int kk, int n, long long L, int Hq, int nhb, float scale_log2, void* __restrict__ out,
                         float* __restrict__ lse) {
    attend_fwd_wgmma2<OUT_BF16, false, SWZ, QPT>(q, kv, kv_stride, idx, lens, mult, kk, n, L, Hq, nhb, scale_log2,
                                                  out, lse);
}

// head blocks 2j, 2j+1 of a query as a 2-CTA cluster sharing the gather (nhb even)
template <bool OUT_BF16, bool SWZ>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1)
hytopk_attend_fwd_wgmma2c(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                          const int* __restrict__ idx, int kk, int n, long long L, int Hq, int nhb,
                          float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    attend_fwd_wgmma2<OUT_BF16, true, SWZ, 1>(q, kv, kv_stride, idx, nullptr, nullptr, kk, n, L, Hq, nhb, scale_log2,
                                              out, lse);
}
