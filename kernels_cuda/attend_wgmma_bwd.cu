// Sparse attention backward on wgmma (sm_90a) for MLA's shared kv (docs/CONTRACT.md §8; the same
// function as hytopk_attend_bwd of attend.cu): d_qk 576, d_v 512 (V = the first 512 columns of the
// gathered kv row), one query x 64 heads per block (heads past Hq are zero rows, not written).
// PDS / split_dkv (the wrapper's WRITES = "split", its default up to 128 heads): the same kernel without
// its dK/dV MMAs, writing P and dS instead, then a second kernel over all the heads (below the first).
//
// 384 threads = 3 warpgroups. WG 2 (producer) gathers key tiles of NK = 32 slots (32 rows x 1152 B,
// no-swizzle core-matrix layout; PDS: the 128-byte swizzle, below) with cp.async into two stages, as attend_wgmma2.cu's producer
// (full / empty mbarriers, the next tile's slots loaded one tile ahead). WG 0 and WG 1 (consumers)
// per tile:
//   consumer 0: S = Q K^T, consumer 1: dP = dO V^T, all 32 keys (m64n32k16 x 36 each: dP's last 4
//                 k-steps multiply a zero tile, so both warpgroups run one instruction stream; N = 32
//                 reads each A byte once per 32 keys, half of what two N = 16 halves read)
//   consumer 1 hands dP - delta (float32) to consumer 0 through shared memory (the P / dS tiles' 8 KiB);
//   consumer 0: P = exp2(S scale_log2 - lse log2e) (0 on masked slots and rows without a key),
//   dS = P (dP - delta) scale (float32, as attend.cu), both rounded to bf16 into shared memory
// then both, consumer c:
//   dQ_c += dS K[:, 288c .. 288c+287]       (2 k-steps of 16 keys x 2 m64n144k16, K read MN-major)
//   dKV^T[64m .. 64m+63, keys] = Q^T dS (+ dO^T P for m < 8)   m-tiles of 64 columns: c takes
//                                 4c .. 4c+3 (m64n32k16 x 8) and m-tile 8 on its own 16 keys
//                                 (m64n16k16 x 4); A = Q^T / dO^T read MN-major from the row tiles,
//                                 B = dS / P MN-major
// and writes each m-tile's 64 columns x 32 slots: ATOMIC into dkv [L, 576] (float atomics, not
// reproducible), else into part[((tl * nhb + hb) * kk + slot) * 576 + d] (the rows attend.cu's
// BWD_PART writes: hytopk_attend_dkv_reduce sums them per key in a fixed order). VEC: 16 bytes at a
// time (red.global.add.v4.f32 / st.global.v4.f32) after a 4x4 transpose among lanes (a thread's
// accumulator holds one column of 16 (slot, column) pairs; four lanes hold four adjacent columns),
// a quarter of the scalar writes' operations but 16 shuffles per m-tile on the consumers' path
// (measured: scalar atomics 48.8 ms, vector ones 57.0, run 6 of results/h200-2026-12-02-s3/). dq is
// written once per (query, head): no atomics, the key-tile order fixed.
// STAGED (the wrapper's default): the consumers do not write dK/dV themselves. Each hands its tile's
// dKV^T a unit at a time (16 slots x 64 columns: an m-tile's slot half, or m-tile 8's 16 slots; 9
// per tile) to the producer warpgroup through one 4 KiB buffer per consumer, handed over on a pair
// of named barriers (unit full / free: the consumer's 128 threads + its 2 storer warps), and the
// producer's warps 2c, 2c+1 write consumer c's units 16 bytes at a time, whole 256-byte row pieces
// (red.global.add.v4.f32 / st.global.v4.f32), between issuing the next tile's copies. The consumers
// no longer wait on the writes' queue: run 7 of results/h200-2026-12-02-s7, atomics 49.9 ms against
// 51.7, part rows 83.3 against 92.1 (the same floats, the same places). The units' round trips were
// the cost (run 9 of results/h200-2026-12-03-s8: 48.2 ms with the hand-over but no writes, 23.8 with
// neither): named barriers in place of mbarriers, 44.8 ms against 50.7-51.1 (runs 2-4 of
// results/h200-2026-12-03-s9). Tried there and slower (commit 2399e0c has them): 8-slot units by
// stmatrix, double-buffered (47.1); these units by stmatrix (47.6); whole m-tile units double-buffered
// in the tile's own K stage once its dQ MMAs have read it (46.1).
//
// PDS (the split's first pass) gathers its key tiles into the 128-byte swizzle instead (9 column tiles
// of [32 keys][128 B], chunk c of key j at slot c ^ (j % 8): each quarter warp copies one row's 128
// contiguous bytes, and each 32-byte sector lands in 32 contiguous bytes), reads them through swizzled
// descriptors (S / dP: K-major; dQ: MN-major, consumer c's columns 256 c .. + 255 and 512 + 32 c .. + 31),
// and publishes a tile by cp.async.mbarrier.arrive as it lands. In the core-matrix layout below every
// 16 bytes were an L2 request of their own (8x the requests and 2x the sectors of attend_wgmma3's
// gather, the L2 at 79 % of its throughput): 40.6 ms against 43.5, the same bits (run 7 of
// results/h200-2026-12-04-s12).
// Shared memory (no swizzle; element (r, d) of a [rows][D] bf16 tile at (r/8)*(D*16) + (d/8)*128 +
// (r%8)*16 + (d%8)*2): Q [64][576], dO [64][512], K [2 stages][32][576], P and dS [64][32] each (the
// same 8 KiB hold dP - delta as float [64][32], key j of row r at r*32 + (j ^ 8(r%4)), before them),
// a zero [64][16] tile.
// As operands (offsets in bytes: leading = next 8 of K, stride = next 8 of M/N):
//   Q for S (A, K-major): leading 128, stride 9216      K for S / dP (B, K-major): 128, 9216
//   dO for dP (A, K-major): 128, 8192                    dS for dQ (A, K-major): 128, 512
//   K for dQ (B, MN-major: N = d, K = keys): leading 9216 (8 keys), stride 128 (8 d)
//   Q^T (A, MN-major: M = d, K = heads): leading 9216, stride 128; dO^T: 8192, 128
//   dS / P for dKV^T (B, MN-major: N = keys, K = heads): leading 512 (8 heads), stride 128 (8 keys)
#include "hytopk_cp_async.cuh"
#include "hytopk_wgmma_common.cuh"

using namespace hytopk;
using namespace hytopk::wgp;

namespace hytopk {
namespace attwb {

typedef unsigned short bf16_t;
constexpr int DQK = 576, DV = 512, ROWS = 64, NK = 32;
constexpr int QG = DQK / 8 * 128;                 // bytes per 8 rows of a [.][576] tile: 9216
constexpr int OG = DV / 8 * 128;                  // ... of a [.][512] tile: 8192
constexpr int PG = NK / 8 * 128;                  // ... of a [64][32] P / dS tile: 512
constexpr int Q_BYTES = ROWS / 8 * QG;            // 73728
constexpr int DO_BYTES = ROWS / 8 * OG;           // 65536
constexpr int TILE_BYTES = NK / 8 * QG;           // 36864
constexpr int PT_BYTES = ROWS / 8 * PG;           // 4096
constexpr int Q_OFF = 0;
constexpr int DO_OFF = Q_OFF + Q_BYTES;
constexpr int K_OFF = DO_OFF + DO_BYTES;
constexpr int P_OFF = K_OFF + 2 * TILE_BYTES;
constexpr int DS_OFF = P_OFF + PT_BYTES;
constexpr int KEY_OFF = DS_OFF + PT_BYTES;         // int [2 stages][NK]: the slot's key, -1 masked
constexpr int BAR_OFF = KEY_OFF + 2 * NK * 4;      // full[2], empty[2]
constexpr int ZERO_OFF = (BAR_OFF + 8 * 8 + 127) & ~127;   // a zero [64][16] bf16 tile (2 KiB): dP's 4 padding k-steps
constexpr int SMEM = ZERO_OFF + ROWS / 8 * 256;
constexpr int LAUNCH_SMEM = SMEM + 128;            // the base is rounded up to 128 B
// PDS: the key tiles in the 128-byte swizzle (9 column tiles of [32 rows][128 B], chunk c of row j at
// slot c ^ (j % 8)), the base rounded up to 1024 B (the swizzle's atom)
constexpr int CT_BYTES = NK * 128;                 // 4096
constexpr int LAUNCH_SMEM_PDS = SMEM + 1024;
static_assert(K_OFF % 1024 == 0 && TILE_BYTES % 1024 == 0 && 9 * CT_BYTES == TILE_BYTES, "attend_wgmma_bwd: swizzled key tiles");
static_assert(LAUNCH_SMEM_PDS <= 227 * 1024, "attend_wgmma_bwd: the first pass's shared memory over 227 KiB");
// STAGED: one dK/dV unit per consumer (16 slots x 64 columns, float [16][64], 4-column pieces of row
// s at column ^ 8 ((s >> 1) & 3): the consumers' scalar stores and the storers' 16-byte loads both
// conflict-free)
constexpr int UNIT_SLOTS = 16, UNIT_COLS = 64, UNIT_BYTES = UNIT_SLOTS * UNIT_COLS * 4;
constexpr int UNITS_PER_TILE = 9;                  // m-tiles 4c .. 4c+3 in slot halves, then m-tile 8's 16 slots
constexpr int STG_OFF = SMEM;
constexpr int LAUNCH_SMEM_STAGED = STG_OFF + 2 * UNIT_BYTES + 128;
static_assert(LAUNCH_SMEM_STAGED <= 227 * 1024, "attend_wgmma_bwd: shared memory over 227 KiB");
constexpr int THREADS = 384;
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),   // the 168 x 384 launched with
              "attend_wgmma_bwd: setmaxnreg budgets exceed the block's launch registers (.inc would wait forever)");
// STAGED: the producer warpgroup also writes dK/dV (its drain holds a unit's 4 pieces and keys while
// the writes queue: 88 registers without spilling; the consumers, without the per-tile row
// addresses, fit in 208)
constexpr int PRODUCER_REGS_STAGED = 88, CONSUMER_REGS_STAGED = 208;
static_assert(128 * PRODUCER_REGS_STAGED + 256 * CONSUMER_REGS_STAGED <= THREADS * (65536 / THREADS / 8 * 8),
              "attend_wgmma_bwd: staged setmaxnreg budgets exceed the block's launch registers");
constexpr int QCOLS = DQK / 2, QN = QCOLS / 2;     // dQ columns per consumer (288) in two m64n144 halves
static_assert(QN == 144, "attend_wgmma_bwd: dQ halves are m64n144");
// named barriers (0 = __syncthreads): the 256 consumer threads
// BAR_X: consumer 1's dP - delta in shared memory (arrive) -> consumer 0 (sync); BAR_C0: consumer 0 alone
constexpr int BAR_Q = 1, BAR_FREE = 2, BAR_P = 3, BAR_X = 4, BAR_C0 = 5;
// STAGED, the producer's 128 threads: every storer is done with a stage's keys before they are replaced
constexpr int BAR_KEYS = 6;
// STAGED, consumer c's unit: written (its 128 threads arrive, storer warps 2c, 2c + 1 sync), and read
// (the storers arrive, the consumer syncs before its next unit); 192 threads each
constexpr int BAR_UFULL = 7, BAR_UFREE = 9, UNIT_BAR_THREADS = 128 + 64;   // + c

// STAGED: the byte offset of (row ls, column col) in a unit (the layout above)
__device__ __forceinline__ u32 unit_off(int ls, int col) {
    return (u32)(4 * (ls * UNIT_COLS + (col ^ (8 * ((ls >> 1) & 3)))));
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
// a 128-byte-swizzle operand descriptor (as attend_wgmma3.cu's)
__device__ __forceinline__ u64 desc_sw128(u32 addr, u32 lead, u32 stride) {
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) | ((u64)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);
}

// lse * log2 e (-inf: P = 0) and delta of this thread's two rows h0 + r0, h0 + r1 of query t (rows
// from Hq on: padding heads); the first passes' consumers
__device__ __forceinline__ void row_lse_delta(const float* __restrict__ lse, const float* __restrict__ delta, int t, int Hq,
                                              int h0, int r0, int r1, float (&ls)[2], float (&dl)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = h ? r1 : r0;
        const bool ok = h0 + r < Hq;
        const long long row = (long long)t * Hq + h0 + r;
        ls[h] = ok ? lse[row] * 1.4426950408889634f : neg_inf();
        dl[h] = ok ? delta[row] : 0.0f;
    }
}

// One gathered key row into the 128-byte swizzle (the gathers of pds, sp and dqp): row j of a tile of
// NCT column tiles of ct_bytes each, this lane's 16-byte chunk l8 of each tile's 128 bytes at slot
// l8 ^ (j % 8). A quarter warp (l8 = 0..7) copies the row's 128 contiguous bytes per column tile, so
// each 32-byte sector is one L2 request (the core-matrix layout took one per 16 bytes). row: the
// row's first column (any valid address when !ok: zeros land instead)
template <int NCT>
__device__ __forceinline__ void gather_row_sw128(u32 tile, u32 ct_bytes, int j, int l8, const bf16_t* row, bool ok) {
    const bf16_t* src = row + 8 * l8;
    const u32 dst = tile + (u32)(j * 128 + ((l8 ^ (j & 7)) << 4));
#pragma unroll
    for (int i = 0; i < NCT; ++i) cp_async16_l2pf(dst + i * ct_bytes, src + (ok ? 64 * i : 0), ok);
}

// Four lanes q = 0..3 (lane bits 2, 3: lanes xor 4 and xor 8) hold x[j] = element q of item j; after,
// lane q holds element j of item q in x[j] (two exchange stages, 4 shuffles)
__device__ __forceinline__ void transpose4(float (&x)[4], int q) {
    const bool b = (q & 2) != 0, c = (q & 1) != 0;
    // lanes xor 8: keep items 2b, 2b+1 (element q: u0, u1), receive their element q ^ 2 (r0, r1)
    const float r0 = __shfl_xor_sync(0xffffffffu, b ? x[0] : x[2], 8);
    const float r1 = __shfl_xor_sync(0xffffffffu, b ? x[1] : x[3], 8);
    const float u0 = b ? x[2] : x[0], u1 = b ? x[3] : x[1];
    // lanes xor 4: keep item q (elements q: k0, q ^ 2: k1), receive its elements q ^ 1 (w0), q ^ 3 (w1)
    const float w0 = __shfl_xor_sync(0xffffffffu, c ? u0 : u1, 4);
    const float w1 = __shfl_xor_sync(0xffffffffu, c ? r0 : r1, 4);
    const float k0 = c ? u1 : u0, k1 = c ? r1 : r0;
    const float l0 = c ? w0 : k0, l1 = c ? k0 : w0;    // elements 2b, 2b + 1
    const float h0 = c ? w1 : k1, h1 = c ? k1 : w1;    // elements 2(1 - b), 2(1 - b) + 1
    x[0] = b ? h0 : l0;
    x[1] = b ? h1 : l1;
    x[2] = b ? l0 : h0;
    x[3] = b ? l1 : h1;
}

// q [n, Hq, 576] bf16; kv rows at kv + s * kv_stride (16-byte aligned rows); idx [n, kk] int32
// (-1 and out-of-range slots masked; a key listed twice counts per slot); dout [n, Hq, 512] bf16;
// lse [n, Hq] (natural log), delta [n, Hq] float. grid (queries t0 .. t0 + gridDim.x / nhb - 1) x
// nhb head blocks of 64: block b is query t0 + b / nhb, heads 64 (b % nhb) ... dq [n, Hq, 576]
// float (written); ATOMIC: dkv [L, 576] float (+=); else part rows as above (masked slots' rows
// are not written).
template <bool ATOMIC, bool VEC, bool STAGED, bool PDS = false>
__device__ __forceinline__ void attend_bwd_wgmma(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv,
                                                 long long kv_stride, const int* __restrict__ idx, int kk, int n,
                                                 int t0, long long L, int Hq, int nhb, float scale, float scale_log2,
                                                 const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                                                 const float* __restrict__ delta, float* __restrict__ dq,
                                                 float* __restrict__ out) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tl = (int)(blockIdx.x / (unsigned)nhb), hb = (int)(blockIdx.x % (unsigned)nhb);
    const int t = t0 + tl, h0 = hb * ROWS;
    if (t >= n) return;                               // (the whole block; the launch never has t >= n)
    const u32 raw = smem_addr(smem_raw), base = PDS ? (raw + 1023u) & ~1023u : (raw + 127u) & ~127u;
    unsigned char* smem = smem_raw + (base - raw);
    const u32 sq = base + Q_OFF, sdo = base + DO_OFF, sk0 = base + K_OFF, sp = base + P_OFF, sds = base + DS_OFF;
    int* skey = reinterpret_cast<int*>(smem + KEY_OFF);
    const u32 full0 = base + BAR_OFF, empty0 = full0 + 16;
    const int ntiles = (kk + NK - 1) / NK;
    const int* lst = idx + (long long)t * kk;

    if (threadIdx.x == 0) {
        // PDS: each producer thread arrives twice (its key store, then its copies landing)
        mbar_init(full0, PDS ? 256 : 128);
        mbar_init(full0 + 8, PDS ? 256 : 128);
        mbar_init(empty0, 8);                         // one arrival per consumer warp
        mbar_init(empty0 + 8, 8);
        mbar_fence_init();
    }
    __syncthreads();
    const int wg = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);

    if (wg == 2) {
        // ---------------------------------------------------------------- producer
        regs_dec<STAGED ? PRODUCER_REGS_STAGED : PRODUCER_REGS>();
        // rows g * 8 + r8 (g < 4) of the tile, chunks cq + 16 i (< 72). A warp copies 8 rows x 4
        // chunks (4 whole core matrices, 4 shared-memory wavefronts); each quarter warp 4 rows x 2
        // chunks, whole 32-byte sectors: 8 rows' chunk c per quarter warp (8 half sectors) made L2
        // serve every gathered sector twice
        const int lane8 = tid & 7, qw = (tid >> 3) & 3;
        const int r8 = (qw & 1) * 4 + (lane8 >> 1), cq = (tid >> 5) * 4 + (qw >> 1) * 2 + (lane8 & 1);
        int nx[NK / 8], nm = -1;                      // the next tile's slots (nm: slot tid's key)
        // PDS: quarter warp qg (tid >> 3) copies rows qg and qg + 16 whole, its lane l8 chunks 8 i + l8:
        // a quarter warp's copy is one row's 128 contiguous bytes (nx[0], nx[1]: the two rows' keys)
        constexpr int GR = PDS ? 2 : NK / 8;
        const int qg = tid >> 3, l8 = tid & 7;
        auto load_slots = [&](int it) {
            const int j0 = it * NK;
#pragma unroll
            for (int g = 0; g < GR; ++g) {
                const int j = j0 + (PDS ? qg + 16 * g : g * 8 + r8);
                nx[g] = j < kk ? __ldg(lst + j) : -1;
            }
            if (tid < NK) nm = j0 + tid < kk ? __ldg(lst + j0 + tid) : -1;
        };
        // STAGED: warps 2 sc, 2 sc + 1 also store consumer sc's dK/dV units (drain): thread stid reads
        // 4-column piece pc of unit rows prow + 4 r and writes each 16 bytes at once (a warp: two rows'
        // 256 contiguous bytes). Everything but the count recomputed per unit.
        auto drain = [&](int tile, int j) {           // unit j of consumer sc's tile
            const int sc = tid >> 6, stid = tid & 63, pc = stid & 15, prow = stid >> 4;
            const u32 ubuf = base + STG_OFF + (u32)(sc * UNIT_BYTES);
            const int colb = j < 8 ? 64 * (4 * sc + (j >> 1)) : 512, slotb = j < 8 ? 16 * (j & 1) : 16 * sc;
            bar_sync(BAR_UFULL + sc, UNIT_BAR_THREADS);
            uint4 v[4];
            int kx[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int ls = prow + 4 * r;
                kx[r] = skey[(tile & 1) * NK + slotb + ls];
                v[r] = ld_shared_v4(ubuf + unit_off(ls, 4 * pc));
            }
            // the unit is in registers: the consumer may refill it while these writes queue (run 6 of
            // results/h200-2026-12-02-s7: released after them, the atomics took 58.0 ms); not after the
            // block's last unit, which no consumer sync pairs with (the tile through opaque_u32: as a
            // plain compare, ptxas serialised the part-row kernel's wgmma, C7511)
            if (opaque_u32((u32)tile) < (u32)(ntiles - 1) || j < UNITS_PER_TILE - 1)
                bar_arrive(BAR_UFREE + sc, UNIT_BAR_THREADS);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (kx[r] < 0) continue;              // masked slot (or past kk): not written
                float* row = ATOMIC ? out + (long long)kx[r] * DQK
                                    : out + ((long long)blockIdx.x * kk + (long long)tile * NK + slotb + prow + 4 * r) * DQK;
                float* p = row + colb + 4 * pc;
                const float a = __uint_as_float(v[r].x), b = __uint_as_float(v[r].y);
                const float c = __uint_as_float(v[r].z), d = __uint_as_float(v[r].w);
                if (ATOMIC) red_add_v4(p, a, b, c, d);
                else st_global_v4(p, a, b, c, d);
            }
        };
        if (ntiles > 0) load_slots(0);
        for (int it = 0; it < ntiles; ++it) {
            const int st = it & 1;
            if (it >= 1 && !STAGED && !PDS) {         // tile it-1 landed: publish it
                cp_async_wait<0>();
                fence_proxy_async();
                mbar_arrive(full0 + 8 * ((it - 1) & 1));
            }
            if (it >= 2) mbar_wait_or_trap(empty0 + 8 * st, (u32)(((it >> 1) - 1) & 1));
            if (STAGED && it >= 2) bar_sync(BAR_KEYS, 128);   // (the warps drain their consumers' units apart)
            if constexpr (PDS) {
                // whole 128-byte row pieces per quarter warp into the swizzle: each 32-byte sector lands in
                // 32 contiguous bytes, so the L2 serves it in one request (the core-matrix layout took one
                // request per 16 bytes: 8x the requests, 2x the sectors of attend_wgmma3's gather, the L2
                // at 79 % of its peak, results/h200-2026-12-04-s12 run 6)
#pragma unroll
                for (int g = 0; g < GR; ++g) {
                    const long long s = nx[g];
                    const bool ok = s >= 0 && s < L;
                    gather_row_sw128<DQK / 64>(sk0 + (u32)(st * TILE_BYTES), CT_BYTES, qg + 16 * g, l8,
                                               kv + (ok ? s * kv_stride : 0), ok);
                }
            } else {
                const u32 dst = sk0 + (u32)(st * TILE_BYTES + r8 * 16);
#pragma unroll
                for (int g = 0; g < NK / 8; ++g) {
                    const long long s = nx[g];
                    const bool ok = s >= 0 && s < L;
                    const bf16_t* src = kv + (ok ? s * kv_stride : 0);
#pragma unroll
                    for (int i = 0; i < (DQK / 8 + 15) / 16; ++i) {
                        const int c = cq + 16 * i;
                        if (c < DQK / 8) cp_async16(dst + (u32)(g * QG + c * 128), src + (ok ? c * 8 : 0), ok);
                    }
                }
            }
            if (tid < NK) skey[st * NK + tid] = (nm >= 0 && (long long)nm < L) ? nm : -1;
            if (PDS) {
                // published as the copies land (cp.async.mbarrier.arrive): the producer never waits for
                // them, the next tile is issued as soon as its stage is free (alone, with the core-matrix
                // layout, no faster: run 3 of results/h200-2026-12-04-s12; run 7 measured it with the
                // swizzle). Not in the direct kernels: the consumers' proxy fence below made ptxas
                // serialise their wgmma.
                mbar_arrive(full0 + 8 * st);          // (release: the keys; after their store, as the
                                                      // cp.async arrival below releases no plain stores)
                cp_async_arrive_noinc(full0 + 8 * st);
            }
            cp_async_commit();
            if (it + 1 < ntiles) load_slots(it + 1);   // in flight under the next waits
            if (STAGED) {
                // tile it-1's units while tile it lands; tile it published before the last one (the
                // consumers go on to tile it as soon as they have handed it over)
                if (it >= 1)
                    for (int j = 0; j < UNITS_PER_TILE - 1; ++j) drain(it - 1, j);
                cp_async_wait<0>();
                fence_proxy_async();
                mbar_arrive(full0 + 8 * st);
                if (it >= 1) drain(it - 1, UNITS_PER_TILE - 1);
            }
        }
        if (ntiles > 0) {
            if (STAGED) {
                for (int j = 0; j < UNITS_PER_TILE; ++j) drain(ntiles - 1, j);
            } else if (PDS) {
                cp_async_wait_all();                  // no copy outlives the thread
            } else {
                cp_async_wait<0>();
                fence_proxy_async();
                mbar_arrive(full0 + 8 * ((ntiles - 1) & 1));
            }
        }
    } else {
        // -------------------------------------------------------------------- consumers
        regs_inc<STAGED ? CONSUMER_REGS_STAGED : CONSUMER_REGS>();
        const int c = wg;
        const int warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
        const int r0 = warp * 16 + g8, r1 = r0 + 8;   // this thread's two rows (heads h0 + r)

        // Q and dO rows h0 .. h0+63 (zero rows past Hq) into the core-matrix layout: 8 consecutive
        // threads copy 8 rows' chunk ch (one 128-byte core matrix)
        auto load_rows = [&](u32 dst, const bf16_t* __restrict__ src, int D) {
            const int C = D / 8;
            for (int i = (int)threadIdx.x; i < ROWS * C; i += 256) {
                const int r = (i & 7) + ((i >> 3) / C) * 8, ch = (i >> 3) % C;
                const bool ok = h0 + r < Hq;
                const long long row = (long long)t * Hq + (ok ? h0 + r : 0);
                cp_async16(dst + (u32)((r >> 3) * C * 128 + ch * 128 + (r & 7) * 16), src + row * D + ch * 8, ok);
            }
        };
        load_rows(sq, q, DQK);
        load_rows(sdo, dout, DV);
        cp_async_commit();
        for (int i = (int)threadIdx.x; i < ROWS / 8 * 256 / 4; i += 256) st_shared_u32(base + ZERO_OFF + 4 * i, 0u);
        float ls[2], dl[2];                           // lse * log2 e (-inf: P = 0) and delta of the two rows
        row_lse_delta(lse, delta, t, Hq, h0, r0, r1, ls, dl);
        cp_async_wait<0>();
        fence_proxy_async();
        bar_sync(BAR_Q, 256);

        float dqa[2][QN / 2];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int i = 0; i < QN / 2; ++i) dqa[j][i] = 0.0f;

        // STAGED: this consumer's unit (8 values per thread) to the storers, one at a time
        u32 nu = 0;                                   // units handed over
        // element i = 4 sbl + 2 h2 + e: unit row 8 sbl + 2 tig + e, column 16 warp + g8 + 8 h2
        auto put_unit = [&](const float (&v)[8]) {
            // c, warp, lane from threadIdx (opaque): nothing more held across the key loop (it would spill)
            const u32 x = opaque_u32(threadIdx.x), cc = x >> 7, wl = x & 127;
            const int w_ = (int)(wl >> 5), g_ = (int)(wl >> 2) & 7, t_ = (int)wl & 3;
            const u32 ubuf = base + STG_OFF + cc * UNIT_BYTES;
            if (opaque_u32(nu) > 0)                   // the storers have the unit before (opaque: as nu > 0,
                bar_sync(BAR_UFREE + (int)cc, UNIT_BAR_THREADS);   // ptxas serialised the wgmma, C7511)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int ls = 8 * (i >> 2) + 2 * t_ + (i & 1), col = 16 * w_ + g_ + 8 * ((i >> 1) & 1);
                st_shared_u32(ubuf + unit_off(ls, col), __float_as_uint(v[i]));   // ((ls >> 1) & 3 = t_)
            }
            bar_arrive(BAR_UFULL + (int)cc, UNIT_BAR_THREADS);
            ++nu;
        };

        // PDS (the split backward's first pass): consumer 0's P and dS of tile it, bf16, into the
        // query's 64-key block it / 2 (its 32-key half it % 2) of `out`, laid out as the second pass
        // reads them (split_dkv below: [P | dS] per block, each [nhb * 64 heads][64 keys] in 8 x 8
        // core matrices, element (h, j) at (h / 8) 512 + (j / 8) 64 + (h % 8) 8 + j % 8): a warp's
        // store is one whole 128-byte core matrix. Nothing held across the key loop: the query and
        // head block re-read from blockIdx (opaque).
        auto put_pds = [&](int it_, const float (&pv)[16], const float (&dv)[16]) {
            const u32 bx = opaque_u32(blockIdx.x);
            const int tq = (int)(bx / (unsigned)nhb), hbq = (int)(bx % (unsigned)nhb);
            const long long tile = (long long)(nhb * ROWS) * 64;                  // elements of one P or dS block
            bf16_t* pb = reinterpret_cast<bf16_t*>(out) + ((long long)tq * ((kk + 63) / 64) + (it_ >> 1)) * 2 * tile;
            const int o0 = (hbq * 8 + 2 * warp) * 512 + 4 * (it_ & 1) * 64 + g8 * 8 + 2 * tig;   // row r0; r1: + 512
#pragma unroll
            for (int nb = 0; nb < NK / 8; ++nb) {
                st_global_u32(pb + o0 + nb * 64, pack_bf16x2(pv[4 * nb], pv[4 * nb + 1]));
                st_global_u32(pb + o0 + nb * 64 + 512, pack_bf16x2(pv[4 * nb + 2], pv[4 * nb + 3]));
                st_global_u32(pb + tile + o0 + nb * 64, pack_bf16x2(dv[4 * nb], dv[4 * nb + 1]));
                st_global_u32(pb + tile + o0 + nb * 64 + 512, pack_bf16x2(dv[4 * nb + 2], dv[4 * nb + 3]));
            }
        };

        for (int it = 0; it < ntiles; ++it) {
            const int st = it & 1;
            const u32 sk = sk0 + (u32)(st * TILE_BYTES);
            const int* key = skey + st * NK;
            mbar_wait_or_trap(full0 + 8 * st, (u32)((it >> 1) & 1));
            if (PDS) fence_proxy_async();             // the tile's cp.async (generic proxy) -> this wgmma
            // consumer 0: S = Q K^T, consumer 1: dP = dO V^T (64 rows x the tile's 32 keys); element
            // 4 nb + e of sd is row (e >> 1 ? r1 : r0), key 8 nb + 2 tig + (e & 1)
            float sd[16];
            {
                const u64 bk = smem_desc(sk, 128, QG), swz = desc_sw128(sk, 16, 1024);
                const u64 a = c ? smem_desc(sdo, 128, OG) : smem_desc(sq, 128, QG);
                const u64 z = smem_desc(base + ZERO_OFF, 128, 256);   // as A (64 rows) and as B (32 keys)
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < DQK / 16; ++ks) {
                    const bool pad = c && ks >= DV / 16;          // dP past d_v: 0 x 0
                    // PDS: the swizzled tile, column tile ks / 4, its 32-byte k-step ks % 4
                    const u64 b = PDS ? swz + (u64)(256 * (ks >> 2) + 2 * (ks & 3)) : bk + (u64)(16 * ks);
                    wgmma_m64n32k16_bf16(sd, pad ? z : a + (u64)(16 * ks), pad ? z : b, ks > 0);
                }
                wgmma_commit();
                wgmma_wait_all();
            }
            // dP - delta, float [64][32] (swizzled) over the P / dS tiles
            auto xat = [&](int r, int j) { return sp + (u32)(4 * (r * NK + (j ^ (8 * (r & 3))))); };
            if (c) {
                bar_sync(BAR_FREE, 256);              // both consumers' MMAs of the last tile (P, dS) retired
#pragma unroll
                for (int nb = 0; nb < NK / 8; ++nb)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = h ? r1 : r0, j = 8 * nb + 2 * tig;
                        st_shared_f32x2(xat(r, j), sd[4 * nb + 2 * h] - dl[h], sd[4 * nb + 2 * h + 1] - dl[h]);
                    }
                bar_arrive(BAR_X, 256);
            } else {
                float p[16];
#pragma unroll
                for (int e = 0; e < 16; ++e) {
                    const int j = 8 * (e >> 2) + 2 * tig + (e & 1), h = (e >> 1) & 1;
                    p[e] = (key[j] >= 0 && ls[h] != neg_inf()) ? exp2f(sd[e] * scale_log2 - ls[h]) : 0.0f;
                }
                bar_sync(BAR_FREE, 256);
                bar_sync(BAR_X, 256);                 // consumer 1's dP - delta is in
                float d[16];
#pragma unroll
                for (int nb = 0; nb < NK / 8; ++nb)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = h ? r1 : r0, j = 8 * nb + 2 * tig;
                        float x0, x1;
                        ld_shared_f32x2(xat(r, j), x0, x1);
                        d[4 * nb + 2 * h] = p[4 * nb + 2 * h] * x0 * scale;
                        d[4 * nb + 2 * h + 1] = p[4 * nb + 2 * h + 1] * x1 * scale;
                    }
                bar_sync(BAR_C0, 128);                // every read of the float tile done: P / dS over it
                if (PDS) put_pds(it, p, d);
#pragma unroll
                for (int nb = 0; nb < NK / 8; ++nb) {
                    const int j = 8 * nb + 2 * tig;
                    const u32 a0 = (u32)((r0 >> 3) * PG + (j >> 3) * 128 + (r0 & 7) * 16 + (j & 7) * 2);
                    const u32 b0 = a0 + (u32)PG;      // row r1 = r0 + 8: the next 8-row group
                    st_shared_u32(sp + a0, pack_bf16x2(p[4 * nb], p[4 * nb + 1]));
                    st_shared_u32(sp + b0, pack_bf16x2(p[4 * nb + 2], p[4 * nb + 3]));
                    st_shared_u32(sds + a0, pack_bf16x2(d[4 * nb], d[4 * nb + 1]));
                    st_shared_u32(sds + b0, pack_bf16x2(d[4 * nb + 2], d[4 * nb + 3]));
                }
            }
            fence_proxy_async();                      // P / dS stores -> both consumers' wgmma
            bar_sync(BAR_P, 256);

            // dQ_c += dS K[:, 288c ..]: K MN-major (N = d, K = keys)
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < NK / 16; ++ks) {
                const u64 a = smem_desc(sds + (u32)(ks * 256), 128, PG);
                if constexpr (PDS) {
                    // the swizzled tile, MN-major: consumer c's columns 256 c .. + 255 (column tiles 4c ..)
                    // and 512 + 32 c .. + 31 (half the rope's tile, consumer 1's starting 64 bytes into the
                    // atom: legal by the descriptor rules, not a CUTLASS pattern; its columns matched bit for
                    // bit on the H200): dq's 144 accumulators as 128 + 16
                    float (&d256)[128] = *reinterpret_cast<float (*)[128]>(&dqa[0][0]);
                    float (&d32)[16] = *reinterpret_cast<float (*)[16]>(&dqa[0][0] + 128);
                    wgmma_m64n256k16_bf16_tb(d256, a, desc_sw128(sk + (u32)(4 * c * CT_BYTES + ks * 2048), CT_BYTES, 1024), 1);
                    wgmma_m64n32k16_bf16_tb(d32, a, desc_sw128(sk + (u32)(8 * CT_BYTES + 64 * c + ks * 2048), CT_BYTES, 1024), 1);
                } else {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const u64 b = smem_desc(sk + (u32)(ks * 2 * QG + (QCOLS * c + QN * j) / 8 * 128), QG, 128);
                        wgmma_m64n144k16_bf16_tb(dqa[j], a, b, 1);
                    }
                }
            }
            wgmma_commit();
            if (PDS) {                                // the second pass does dK/dV (split_dkv)
                wgmma_wait<0>();
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * st);
                continue;
            }
            // dKV^T: m-tiles 4c .. 4c+3 (64 columns x the tile's 32 slots: Q^T dS + dO^T P), then
            // m-tile 8 (columns 512 .. 575: Q^T dS only) on this consumer's 16 slots; the same code for
            // both consumers (a warpgroup-uniform path: no serialised wgmma). Two accumulators in turn:
            // an m-tile's MMAs run while the one before is written out.
            auto issue_m = [&](float (&acc)[16], int m) {
                // the bases through opaque_u32: descriptors built here, not hoisted out of the key loop
                // (five m-tiles' worth of them held across it would spill)
                const u32 q_ = opaque_u32(sq), o_ = opaque_u32(sdo), d_ = opaque_u32(sds), p_ = opaque_u32(sp);
                wgmma_fence();
#pragma unroll
                for (int kh = 0; kh < ROWS / 16; ++kh)
                    wgmma_m64n32k16_bf16_ta_tb(acc, smem_desc(q_ + (u32)(m * 1024 + kh * 2 * QG), QG, 128),
                                               smem_desc(d_ + (u32)(kh * 2 * PG), PG, 128), kh > 0);
#pragma unroll
                for (int kh = 0; kh < ROWS / 16; ++kh)
                    wgmma_m64n32k16_bf16_ta_tb(acc, smem_desc(o_ + (u32)(m * 1024 + kh * 2 * OG), OG, 128),
                                               smem_desc(p_ + (u32)(kh * 2 * PG), PG, 128), 1);
                wgmma_commit();
            };
            // This thread's dK/dV rows of the tile, its column base folded in, and whether the slot is
            // valid (each write is then one instruction with an immediate offset: the address arithmetic,
            // the key's shared-memory load and the branch per write were half the consumers' stall
            // samples, run 5 of results/h200-2026-12-02-s3).
            // scalar: row u = 2 sb + e is slot 8 sb + 2 tig + e, from column 256 c + 16 warp + g8;
            // VEC: row sb is slot 8 sb + 2 tig + (qq & 1), from column 256 c + 16 warp + 8 (qq >> 1) + 4 (g8 >> 2)
            // (after the transpose lane qq = g8 & 3 holds item (h2, e) = (qq >> 1, qq & 1))
            constexpr int NROW = VEC ? NK / 8 : NK / 4;
            const int qq = g8 & 3;
            float* rowp[NROW];
            bool rowok[NROW];
            if (!STAGED) {
                const int colb = 256 * c + 16 * warp + (VEC ? 8 * (qq >> 1) + 4 * (g8 >> 2) : g8);
#pragma unroll
                for (int u = 0; u < NROW; ++u) {
                    const int jj = VEC ? 8 * u + 2 * tig + (qq & 1) : 8 * (u >> 1) + 2 * tig + (u & 1);
                    const int s_ = key[jj];
                    // part rows: tl * nhb + hb = blockIdx.x (read through opaque_u32: nothing hoisted out of the key loop)
                    float* row = ATOMIC ? out + (long long)s_ * DQK
                                        : out + ((long long)opaque_u32(blockIdx.x) * kk + (long long)it * NK + jj) * DQK;
                    rowok[u] = s_ >= 0;
                    rowp[u] = s_ >= 0 ? row + colb : out;             // (out: any valid address; not written)
                }
            }
            // every row of the warp's lanes valid (the usual tile): writes without a test (ptxas wraps
            // each conditional red, even a PTX-predicated one, in a branch and two convergence
            // instructions)
            bool mine = true;
            if (!STAGED)
#pragma unroll
                for (int u = 0; u < NROW; ++u) mine = mine && rowok[u];
            const bool dense = STAGED || __all_sync(0xffffffffu, mine);
            // pred: a constant at each call (the two copies of a store loop below): test the row
            auto put = [&](bool pred, float* p, float v, bool ok) {
                if (pred && !ok) return;
                if (ATOMIC) atomicAdd(p, v);
                else *p = v;
            };
            auto put4 = [&](bool pred, float* p, const float (&v)[4], bool ok) {
                if (pred && !ok) return;
                if (ATOMIC) red_add_v4(p, v[0], v[1], v[2], v[3]);
                else st_global_v4(p, v[0], v[1], v[2], v[3]);
            };
            // m-tile 4c + mi out: element i = 4 sb + 2 h2 + e is slot 8 sb + 2 tig + e, column
            // 64 (4c + mi) + 16 warp + g8 + 8 h2
            auto store_m = [&](const float (&acc)[16], int mi) {
                if (STAGED) {                         // slot halves 0 .. 15, 16 .. 31: elements 8 hs ..
#pragma unroll
                    for (int hs = 0; hs < 2; ++hs) {
                        float v[8];
#pragma unroll
                        for (int i = 0; i < 8; ++i) v[i] = acc[8 * hs + i];
                        put_unit(v);
                    }
                    return;
                }
                auto go = [&](bool pred) {
                    if (VEC) {
#pragma unroll
                        for (int sb = 0; sb < NK / 8; ++sb) {
                            float x[4] = {acc[4 * sb], acc[4 * sb + 1], acc[4 * sb + 2], acc[4 * sb + 3]};
                            transpose4(x, qq);
                            put4(pred, rowp[sb] + 64 * mi, x, rowok[sb]);
                        }
                    } else {
#pragma unroll
                        for (int i = 0; i < 16; ++i) {
                            const int u = 2 * (i >> 2) + (i & 1);
                            put(pred, rowp[u] + 64 * mi + 8 * ((i >> 1) & 1), acc[i], rowok[u]);
                        }
                    }
                };
                if (dense) go(false);
                else go(true);
            };
            // m-tile 8 out (columns 512 .. 575, this consumer's slots 16 c ..): element i = 4 sb8 + 2 h2 + e
            // is slot 16 c + 8 sb8 + 2 tig + e, column 512 + 16 warp + g8 + 8 h2: rows of sb = 2 c + sb8
            auto store_m8 = [&](const float (&acc)[8]) {
                if (STAGED) {
                    put_unit(acc);
                    return;
                }
                const int back = 512 - 256 * c;           // from the rows' column base
                auto go = [&](bool pred) {
                    if (VEC) {
#pragma unroll
                        for (int sb8 = 0; sb8 < 2; ++sb8) {
                            float x[4] = {acc[4 * sb8], acc[4 * sb8 + 1], acc[4 * sb8 + 2], acc[4 * sb8 + 3]};
                            transpose4(x, qq);
                            put4(pred, (c ? rowp[2 + sb8] : rowp[sb8]) + back, x, c ? rowok[2 + sb8] : rowok[sb8]);
                        }
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; ++i) {
                            const int sb8 = i >> 2, e = i & 1;
                            const int u0 = 2 * sb8 + e, u1 = 2 * (2 + sb8) + e;
                            put(pred, (c ? rowp[u1] : rowp[u0]) + back + 8 * ((i >> 1) & 1), acc[i],
                                c ? rowok[u1] : rowok[u0]);
                        }
                    }
                };
                if (dense) go(false);
                else go(true);
            };
            float ma[16], mb[16];
            float (&m8)[8] = *reinterpret_cast<float (*)[8]>(ma);   // m-tile 8 in ma's first half, once ma is out
            issue_m(ma, 4 * c);                       // pending: dQ, ma
            issue_m(mb, 4 * c + 1);                   // dQ, ma, mb
            wgmma_wait<1>();                          // dQ and ma retired
            store_m(ma, 0);
            issue_m(ma, 4 * c + 2);
            wgmma_wait<1>();
            store_m(mb, 1);
            issue_m(mb, 4 * c + 3);
            wgmma_wait<1>();
            store_m(ma, 2);
            {
                const u32 q_ = opaque_u32(sq), d_ = opaque_u32(sds);
                wgmma_fence();
#pragma unroll
                for (int kh = 0; kh < ROWS / 16; ++kh)
                    wgmma_m64n16k16_bf16_ta_tb(m8, smem_desc(q_ + (u32)(8 * 1024 + kh * 2 * QG), QG, 128),
                                               smem_desc(d_ + (u32)(kh * 2 * PG + c * 2 * 128), PG, 128), kh > 0);
            }
            wgmma_commit();
            wgmma_wait<1>();
            store_m(mb, 3);
            wgmma_wait<0>();
            store_m8(m8);
            __syncwarp();                             // every lane's MMAs on stage st are complete
            if (lane == 0) mbar_arrive(empty0 + 8 * st);
        }

        if (PDS && c == 0 && (ntiles & 1)) {         // the last 64-key block's unused half: zeros
            const float z[16] = {};
            put_pds(ntiles, z, z);
        }
        // dq rows (heads past Hq not written); the query and head block read again from blockIdx
        // (opaque: not hoisted), so no row address stays live, spilled, across the key loop
        const u32 bx = opaque_u32(blockIdx.x);
        const int te = t0 + (int)(bx / (unsigned)nhb), he = (int)(bx % (unsigned)nhb) * ROWS;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * 16 + g8 + 8 * h;
            if (he + r >= Hq) continue;
            const long long row = (long long)te * Hq + he + r;
            if constexpr (PDS) {                      // element 4 nb + 2 h + e of the 128 + 16 (above)
                const float* d = &dqa[0][0];
#pragma unroll
                for (int nb = 0; nb < 36; ++nb) {
                    const int col = nb < 32 ? 256 * c + 8 * nb : 512 + 32 * c + 8 * (nb - 32);
                    *reinterpret_cast<float2*>(dq + row * DQK + col + tig * 2) = make_float2(d[4 * nb + 2 * h], d[4 * nb + 2 * h + 1]);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int nb = 0; nb < QN / 8; ++nb) {
                        const long long at = row * DQK + QCOLS * c + QN * j + nb * 8 + tig * 2;
                        *reinterpret_cast<float2*>(dq + at) = make_float2(dqa[j][4 * nb + 2 * h], dqa[j][4 * nb + 2 * h + 1]);
                    }
            }
        }
    }
}


// ---------------------------------------------------------------------------------------------------
// SPLIT: the backward in two passes (the wrapper's WRITES = "split"). The first (PDS above, the same
// kernel without its dK/dV MMAs) writes each query's P and dS (bf16, the very operands the one-pass
// kernel multiplies) to a scratch of [queries][64-key blocks][P | dS][nhb * 64 heads][64 keys]; the
// second, split_dkv, computes dKV[keys, d] = dS^T Q + P^T dO with the keys as M and all the query's
// heads as K (up to 128: both head blocks in one sum), so each (query, slot, column) leaves once, not
// once per head block: half the one-pass kernel's float additions at 128 heads. A block is one query
// x a third of the 576 columns; WG 0's first thread copies the key blocks (bulk copies, 4 stages; 2
// with BULK), consumers 1 and 2 take alternate blocks: m64n192k16 x (hpad / 16) x 2, then the rows
// leave while the other consumer's MMAs run. BULK (the default): each warp stores 8 of its 16 rows at
// a time to its staging buffer and lanes 0-7 hand one 768-byte row each to the TMA
// (cp.reduce.async.bulk .add.f32 into dkv, or cp.async.bulk into the part rows [count][kk][576]);
// else each thread writes its two key rows' 96 floats 8 bytes at a time (red.global.add.v2.f32 /
// st.global.v2.f32). The same floats to the same places either way.
namespace dkv {
constexpr int KT = 64;                              // keys per block
constexpr int COLS = 192, PARTS = DQK / COLS;       // columns per CTA (a third)
constexpr int HMAX = 128;                           // heads: nhb * 64, at most two head blocks
constexpr int RG = COLS / 8 * 128;                  // bytes per 8 heads of a [.][192] tile: 3072
constexpr int TG = KT / 8 * 128;                    // bytes per 8 heads of a [.][64] P / dS block: 1024
constexpr int Q_OFF = 0, DO_OFF = HMAX / 8 * RG;    // Q and dO columns of this third: [128][192] each
constexpr int TILE = HMAX / 8 * TG;                 // one P or dS block (16 KiB at 128 heads)
constexpr int ST_OFF = 2 * DO_OFF;
// BULK: the rows leave by the TMA's bulk operations from a staging buffer per consumer warp (8 rows
// of 192 floats, 800-byte pitch: a warp's 8-byte stores of 8 rows hit each bank twice, the minimum),
// which leaves room for 2 stages of [P | dS] (each consumer always takes the same one)
constexpr int ROW_PITCH = COLS * 4 + 32, STG_WARP = 8 * ROW_PITCH;
template <bool BULK>
struct Layout {
    static constexpr int NST = BULK ? 2 : 4;                        // stages of [P | dS]
    static constexpr int STG_OFF = ST_OFF + NST * 2 * TILE;
    static constexpr int BAR_OFF = STG_OFF + (BULK ? 8 * STG_WARP : 0);   // full[NST], empty[NST]
    static constexpr int LAUNCH_SMEM = BAR_OFF + 2 * NST * 8 + 128;
    static_assert(LAUNCH_SMEM <= 227 * 1024, "attend_wgmma_bwd split_dkv: shared memory over 227 KiB");
};
constexpr int LAUNCH_SMEM = Layout<false>::LAUNCH_SMEM, LAUNCH_SMEM_BULK = Layout<true>::LAUNCH_SMEM;
static_assert(PARTS * COLS == DQK && DV % 64 == 0, "attend_wgmma_bwd split_dkv: column thirds");
constexpr int THREADS = 384, PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),
              "attend_wgmma_bwd split_dkv: setmaxnreg budgets exceed the block's launch registers");
}  // namespace dkv

// q [n, Hq, 576], dout [n, Hq, 512] bf16; pds: the first pass's blocks of queries t0 .. t0 + count - 1;
// idx [n, kk]; the block makes query t0 + tl's columns 192 part ... (hytopk_attend_bwd_dkv: tl = b / 3,
// part = b % 3). HPAD = nhb * 64.
template <bool ATOMIC, int HPAD, bool BULK>
__device__ __forceinline__ void split_dkv(int tl, int part, const bf16_t* __restrict__ q, const bf16_t* __restrict__ dout,
                                          const bf16_t* __restrict__ pds, const int* __restrict__ idx, int kk, int t0,
                                          long long L, int Hq, float* __restrict__ out) {
    constexpr int KT = dkv::KT, COLS = dkv::COLS, RG = dkv::RG, TG = dkv::TG, TILE = dkv::TILE;
    using Lay = dkv::Layout<BULK>;
    constexpr int NST = Lay::NST, ST_OFF = dkv::ST_OFF, THREADS = dkv::THREADS;
    static_assert(HPAD == 64 || HPAD == 128, "split_dkv: one or two head blocks");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int t = t0 + tl, col0 = COLS * part;
    const u32 raw = smem_addr(smem_raw), base = (raw + 127u) & ~127u;
    const u32 sq = base + dkv::Q_OFF, sdo = base + dkv::DO_OFF, full0 = base + (u32)Lay::BAR_OFF, empty0 = full0 + 8 * NST;
    const int nt = (kk + KT - 1) / KT;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(full0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 4);             // one arrival per warp of the block's consumer
        }
        mbar_fence_init();
    }
    // this third's Q and dO columns (zero rows past Hq, zero dO columns past 512): 8 consecutive
    // threads copy one core matrix (8 rows' chunk ch)
    for (int i = (int)threadIdx.x; i < HPAD * (COLS / 8); i += THREADS) {
        const int r = (i & 7) + ((i >> 3) / (COLS / 8)) * 8, ch = (i >> 3) % (COLS / 8);
        const bool ok = r < Hq, okv = ok && col0 + ch * 8 < DV;
        const long long row = (long long)t * Hq + (ok ? r : 0);
        const u32 at = (u32)((r >> 3) * RG + ch * 128 + (r & 7) * 16);
        cp_async16(sq + at, q + row * DQK + col0 + ch * 8, ok);
        cp_async16(sdo + at, dout + row * DV + (okv ? col0 + ch * 8 : 0), okv);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    const int wg = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);
    constexpr u32 BLOCK = (u32)HPAD * KT * 2;         // bytes of one P or dS block
    const bf16_t* blocks = pds + (long long)tl * nt * 2 * HPAD * KT;
    if (wg == 0) {
        regs_dec<dkv::PRODUCER_REGS>();
        if (tid == 0)
            for (int T = 0; T < nt; ++T) {
                const int s = T % NST;
                if (T >= NST) mbar_wait_or_trap(empty0 + 8 * s, (u32)(((T / NST) - 1) & 1));
                const u32 sp = base + ST_OFF + (u32)(s * 2 * TILE);
                mbar_expect_tx(full0 + 8 * s, 2 * BLOCK);
                bulk_g2s(sp, blocks + (long long)T * 2 * HPAD * KT, BLOCK, full0 + 8 * s);
                bulk_g2s(sp + TILE, blocks + ((long long)T * 2 + 1) * HPAD * KT, BLOCK, full0 + 8 * s);
            }
        return;
    }
    regs_inc<dkv::CONSUMER_REGS>();
    const int c = wg - 1, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
    const int* lst = idx + (long long)t * kk;
    for (int T = c; T < nt; T += 2) {
        const int s = T % NST;
        const u32 sp = base + ST_OFF + (u32)(s * 2 * TILE), sds = sp + TILE;
        mbar_wait_or_trap(full0 + 8 * s, (u32)((T / NST) & 1));
        // element 4 nb + 2 h + e: key row warp * 16 + g8 + 8 h of the block, column col0 + 8 nb + 2 tig + e
        float acc[COLS / 2];
        wgmma_fence();
#pragma unroll
        for (int kh = 0; kh < HPAD / 16; ++kh)       // dS^T Q: A = dS (M = keys, MN-major), B = Q (N = d, MN-major)
            wgmma_m64n192k16_bf16_ta_tb(acc, smem_desc(sds + (u32)(kh * 2 * TG), TG, 128),
                                        smem_desc(sq + (u32)(kh * 2 * RG), RG, 128), kh > 0);
#pragma unroll
        for (int kh = 0; kh < HPAD / 16; ++kh)       // + P^T dO (dO's columns past 512 are zeros)
            wgmma_m64n192k16_bf16_ta_tb(acc, smem_desc(sp + (u32)(kh * 2 * TG), TG, 128),
                                        smem_desc(sdo + (u32)(kh * 2 * RG), RG, 128), 1);
        wgmma_commit();
        wgmma_wait<0>();
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * s);    // the stage is free; the writes go on from registers
        if constexpr (BULK) {
            // 8 rows at a time through the warp's buffer: stored, fenced for the async proxy, then lane
            // r < 8 hands row r's 768 bytes to the TMA (float additions at L2, or a copy to its part row)
            const u32 stg = base + (u32)(Lay::STG_OFF + (c * 4 + warp) * dkv::STG_WARP);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (lane < 8) bulk_wait_read<0>();   // the buffer's previous rows are read
                __syncwarp();
                const u32 at = stg + (u32)(g8 * dkv::ROW_PITCH + 8 * tig);
#pragma unroll
                for (int nb = 0; nb < COLS / 8; ++nb)
                    st_shared_f32x2(at + (u32)(32 * nb), acc[4 * nb + 2 * h], acc[4 * nb + 2 * h + 1]);
                fence_proxy_async();
                __syncwarp();
                if (lane < 8) {
                    const int slot = T * KT + warp * 16 + lane + 8 * h;
                    const int key = slot < kk ? __ldg(lst + slot) : -1;
                    if (key >= 0 && (long long)key < L) {                 // masked slot: not written
                        float* row = (ATOMIC ? out + (long long)key * DQK : out + ((long long)tl * kk + slot) * DQK) + col0;
                        if (ATOMIC) bulk_s2g_add_f32(row, stg + (u32)(lane * dkv::ROW_PITCH), COLS * 4);
                        else bulk_s2g(row, stg + (u32)(lane * dkv::ROW_PITCH), COLS * 4);
                    }
                    bulk_commit();
                }
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int slot = T * KT + warp * 16 + g8 + 8 * h;
                const int key = slot < kk ? __ldg(lst + slot) : -1;
                if (key < 0 || (long long)key >= L) continue;             // masked slot: not written
                float* row = (ATOMIC ? out + (long long)key * DQK : out + ((long long)tl * kk + slot) * DQK) + col0 + 2 * tig;
#pragma unroll
                for (int nb = 0; nb < COLS / 8; ++nb) {
                    if (ATOMIC) red_add_v2(row + 8 * nb, acc[4 * nb + 2 * h], acc[4 * nb + 2 * h + 1]);
                    else st_global_v2(row + 8 * nb, acc[4 * nb + 2 * h], acc[4 * nb + 2 * h + 1]);
                }
            }
        }
    }
    if (BULK && lane < 8) bulk_wait<0>();            // the block's shared memory outlives the TMA's reads
}


// ---------------------------------------------------------------------------------------------------
// SPLIT with a dq pass (the wrapper's DQ_PASS, its default at two head blocks): three passes. The first
// pass above spends its time in a serial chain per 32-key tile (S / dP, the exchange, dQ, the release),
// with Q and dO in shared memory leaving room for two such tiles. Without dQ (moved to a pass of its
// own) the first pass holds no accumulator across the keys, so Q and dO fit in the consumers' registers
// as the MMAs' A fragments: split_sp computes S = Q K^T (consumer 0) and dP = dO V^T (consumer 1) over
// 64-key tiles with m64n64k16 (A from registers, B = the gathered tile, K-major in the 128-byte
// swizzle), consumer 0 hands P (float) to consumer 1 through shared memory (two buffers, [element
// pair][thread]: each thread reads what its twin wrote), and they store P and dS (bf16, the same values
// as the first pass above, the same layout) to the scratch. A stage is released as soon as its MMAs
// retire, before the softmax. split_dkv (above) then makes dK / dV, and split_dq makes dq = dS K per
// query and column third, a head block per consumer ([64 heads] x [192 columns]): the dS blocks and
// the third of each key row gathered again (swizzled, read MN-major), the 16-key chunks in the first
// pass's order (dq the same bits as the first pass above computes, where the wgmma's k16 sums do not
// depend on N). Both gathers land in the 128-byte swizzle (one L2 request per 32-byte sector): 13.2 and
// 8.3 ms against 18.9-21.5 and 11.7-12.3 in the core-matrix layout; atomics 40.4 ms against the
// two-pass split's 41.9, deterministic 57.2 against 58.7 (results/h200-2026-12-04-s13 run 6).
namespace sp {
constexpr int NK = 64;                              // keys per tile
constexpr int NST = 2;                              // stages
constexpr int TILE_BYTES = NK / 8 * QG;             // 73728
constexpr int X_BYTES = 32 * 128 * 4;               // P (float): 32 elements x 128 threads
constexpr int K_OFF = 0, X_OFF = NST * TILE_BYTES, KEY_OFF = X_OFF + 2 * X_BYTES;
constexpr int BAR_OFF = KEY_OFF + NST * NK * 4;     // full[NST], empty[NST]
constexpr int ZERO_OFF = BAR_OFF + 2 * NST * 8 + 96;  // a zero [64 keys][16] bf16 tile (2 KiB, 128-byte aligned)
// the key tiles in the 128-byte swizzle: 9 column tiles of [64 keys][128 B], chunk c of key j at c ^ (j % 8)
// (each quarter warp's row piece lands in 128 contiguous bytes: one L2 request per 32-byte sector), the
// base rounded up to 1024 B (the swizzle's atom)
constexpr int CT_BYTES = NK * 128;                  // 8192
constexpr int LAUNCH_SMEM = ZERO_OFF + NK / 8 * 256 + 1024;
static_assert(LAUNCH_SMEM <= 227 * 1024 && ZERO_OFF % 128 == 0, "attend_wgmma_bwd split_sp: shared memory over 227 KiB");
static_assert(K_OFF % 1024 == 0 && TILE_BYTES == 9 * CT_BYTES && TILE_BYTES % 1024 == 0, "attend_wgmma_bwd split_sp: swizzled key tiles");
constexpr int THREADS = 384, PRODUCER_REGS = 56, CONSUMER_REGS = 224;   // (the producer's 8 slot keys spill at 40)
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),
              "attend_wgmma_bwd split_sp: setmaxnreg budgets exceed the block's launch registers");
// named barriers: P of tile parity b in buffer b (consumer 0 arrives, consumer 1 syncs), buffer b read
// (consumer 1 arrives, consumer 0 syncs before its refill two tiles on)
constexpr int BAR_XFULL = 1, BAR_XFREE = 3;
}  // namespace sp

// the 32-bit word at p (two bf16), through the read-only path
__device__ __forceinline__ u32 ldg_u32(const bf16_t* p) { return (u32)__ldg(reinterpret_cast<const int*>(p)); }

// grid (queries t0 ..) x nhb head blocks, as the first pass above, block vb (hytopk_attend_bwd_sp:
// blockIdx.x) = query t0 + vb / nhb's head block vb % nhb; pds as there (dq not written)
__device__ __forceinline__ void split_sp(u32 vb, const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                                         const int* __restrict__ idx, int kk, int n, int t0, long long L, int Hq,
                                         int nhb, float scale, float scale_log2, const bf16_t* __restrict__ dout,
                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                         bf16_t* __restrict__ pds) {
    constexpr int NK = sp::NK, NST = sp::NST;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int tl = (int)(vb / (unsigned)nhb), hb = (int)(vb % (unsigned)nhb);
    const int t = t0 + tl, h0 = hb * ROWS;
    if (t >= n) return;
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char* smem = smem_raw + (base - raw);
    const u32 sk0 = base + sp::K_OFF, sx0 = base + sp::X_OFF;
    for (int i = (int)threadIdx.x; i < NK / 8 * 256 / 4; i += (int)blockDim.x) st_shared_u32(base + sp::ZERO_OFF + 4 * i, 0u);
    fence_proxy_async();                              // the zero tile -> the consumers' wgmma (after the sync below)
    int* skey = reinterpret_cast<int*>(smem + sp::KEY_OFF);
    const u32 full0 = base + sp::BAR_OFF, empty0 = full0 + 8 * NST;
    const int ntiles = (kk + NK - 1) / NK;
    const int* lst = idx + (long long)t * kk;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(full0 + 8 * s, 256);            // each producer thread: its key store, its copies landing
            mbar_init(empty0 + 8 * s, 8);             // one arrival per consumer warp
        }
        mbar_fence_init();
    }
    __syncthreads();
    const int wg = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);

    if (wg == 2) {
        // ---------------------------------------------------------------- producer
        regs_dec<sp::PRODUCER_REGS>();
        // quarter warp qg (tid >> 3) copies rows qg + 16 g whole, its lane l8 chunks 8 i + l8: a quarter
        // warp's copy is one row's 128 contiguous bytes (the L2 fetching each row's 256-byte blocks)
        const int qg = tid >> 3, l8 = tid & 7;
        int nx[NK / 16], nm = -1;
        auto load_slots = [&](int it) {
            const int j0 = it * NK;
#pragma unroll
            for (int g = 0; g < NK / 16; ++g) {
                const int j = j0 + qg + 16 * g;
                nx[g] = j < kk ? __ldg(lst + j) : -1;
            }
            if (tid < NK) nm = j0 + tid < kk ? __ldg(lst + j0 + tid) : -1;
        };
        // published as the copies land (cp.async.mbarrier.arrive): the producer never waits for them
        if (ntiles > 0) load_slots(0);
        for (int it = 0; it < ntiles; ++it) {
            const int st = it % NST;
            if (it >= NST) mbar_wait_or_trap(empty0 + 8 * st, (u32)(((it / NST) - 1) & 1));
#pragma unroll
            for (int g = 0; g < NK / 16; ++g) {
                const long long s = nx[g];
                const bool ok = s >= 0 && s < L;
                gather_row_sw128<DQK / 64>(sk0 + (u32)(st * sp::TILE_BYTES), sp::CT_BYTES, qg + 16 * g, l8,
                                           kv + (ok ? s * kv_stride : 0), ok);
            }
            if (tid < NK) skey[st * NK + tid] = (nm >= 0 && (long long)nm < L) ? nm : -1;
            mbar_arrive(full0 + 8 * st);              // (release: the keys)
            cp_async_arrive_noinc(full0 + 8 * st);
            if (it + 1 < ntiles) load_slots(it + 1);
        }
        cp_async_wait_all();                          // no copy outlives the thread
        return;
    }
    // -------------------------------------------------------------------- consumers
    regs_inc<sp::CONSUMER_REGS>();
    const int c = wg;
    const int warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, tig = lane & 3;
    const int r0 = warp * 16 + g8, r1 = r0 + 8;       // this thread's two rows (heads h0 + r)
    // consumer 0: Q [64][576] as 36 k-steps of A fragments; consumer 1: dO [64][512] as 32 (rows past
    // Hq zero). Fragment ks: (r0, 16 ks + 2 tig ..), (r1, ..), (r0, .. + 8), (r1, .. + 8)
    constexpr int KQ = DQK / 16, KO = DV / 16;
    u32 a[KQ][4];
    {
        const int D = c ? DV : DQK;
        const bf16_t* src = c ? dout : q;
        const bool ok0 = h0 + r0 < Hq, ok1 = h0 + r1 < Hq;
        const bf16_t* p0 = src + ((long long)t * Hq + (ok0 ? h0 + r0 : 0)) * D + 2 * tig;
        const bf16_t* p1 = src + ((long long)t * Hq + (ok1 ? h0 + r1 : 0)) * D + 2 * tig;
        // every load from a valid address, masked after (conditional loads made ptxas spill ~70 registers)
        const u32 m0 = ok0 ? ~0u : 0u, m1 = ok1 ? ~0u : 0u;
#pragma unroll
        for (int ks = 0; ks < KQ; ++ks) {
            const bool in = !c || ks < KO;
            const int o = in ? 16 * ks : 0;
            const u32 mi = in ? ~0u : 0u;
            a[ks][0] = ldg_u32(p0 + o) & m0 & mi;
            a[ks][1] = ldg_u32(p1 + o) & m1 & mi;
            a[ks][2] = ldg_u32(p0 + o + 8) & m0 & mi;
            a[ks][3] = ldg_u32(p1 + o + 8) & m1 & mi;
        }
    }
    float ls[2], dl[2];                           // lse * log2 e (-inf: P = 0) and delta of the two rows
    row_lse_delta(lse, delta, t, Hq, h0, r0, r1, ls, dl);
    // P / dS of tile it (element i = 4 nb + 2 h + e: row h ? r1 : r0, key 8 nb + 2 tig + e) into the
    // query's block it, [P | dS] (c), as the first pass above lays them out: one warp store per core matrix
    auto put = [&](int it_, const float (&v)[32]) {
        const u32 bx = opaque_u32(vb);
        const int tq = (int)(bx / (unsigned)nhb), hbq = (int)(bx % (unsigned)nhb);
        const long long tile = (long long)(nhb * ROWS) * 64;
        bf16_t* pb = pds + ((long long)tq * ((kk + 63) / 64) + it_) * 2 * tile + (opaque_u32((u32)c) ? tile : 0);
        const int o0 = (hbq * 8 + 2 * warp) * 512 + g8 * 8 + 2 * tig;
#pragma unroll
        for (int nb = 0; nb < NK / 8; ++nb) {
            st_global_u32(pb + o0 + nb * 64, pack_bf16x2(v[4 * nb], v[4 * nb + 1]));
            st_global_u32(pb + o0 + nb * 64 + 512, pack_bf16x2(v[4 * nb + 2], v[4 * nb + 3]));
        }
    };
    for (int it = 0; it < ntiles; ++it) {
        const int st = it % NST, xb = it & 1;
        const u32 sk = sk0 + (u32)(st * sp::TILE_BYTES), sx = sx0 + (u32)(xb * sp::X_BYTES);
        mbar_wait_or_trap(full0 + 8 * st, (u32)((it / NST) & 1));
        fence_proxy_async();                          // the tile's cp.async (generic proxy) -> this wgmma
        u32 vm = 0;                                   // consumer 0: which of its 16 keys are valid
        if (!c) {
            const int* key = skey + st * NK;
#pragma unroll
            for (int nb = 0; nb < NK / 8; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e) vm |= (key[8 * nb + 2 * tig + e] >= 0 ? 1u : 0u) << (2 * nb + e);
        }
        float sd[32];
        {
            // one instruction stream for both (a branch per consumer made ptxas serialise the wgmma):
            // dP's last 4 k-steps multiply zero fragments by the zero tile
            // B's descriptor (the swizzled tile, K-major: column tile ks / 4, its 32-byte k-step ks % 4)
            // made one k-step at a time through opaque_u32 (its low word: the address): 36 descriptors
            // made ahead of the MMAs, beside the 144 fragment registers, spilled
            const u64 bk = desc_sw128(sk, 16, 1024), z = smem_desc(base + sp::ZERO_OFF, 128, 256);
            const u64 hi = bk & 0xffffffff00000000ull;
            const u32 lo0 = (u32)bk;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KQ; ++ks) {
                const u32 lo = opaque_u32(lo0 + (u32)((sp::CT_BYTES >> 4) * (ks >> 2) + 2 * (ks & 3)));
                wgmma_m64n64k16_bf16_rs(sd, a[ks], c && ks >= KO ? z : hi | lo, ks > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * st);  // the tile (and its keys) may be refilled now
        if (!c) {
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int h = (i >> 1) & 1;
                sd[i] = ((vm >> (2 * (i >> 2) + (i & 1))) & 1u) && ls[h] != neg_inf()
                            ? exp2f(sd[i] * scale_log2 - ls[h]) : 0.0f;
            }
            if (it >= 2) bar_sync(sp::BAR_XFREE + xb, 256);   // consumer 1 has read tile it-2's P
#pragma unroll
            for (int i = 0; i < 16; ++i) st_shared_f32x2(sx + (u32)(8 * (i * 128 + tid)), sd[2 * i], sd[2 * i + 1]);
            bar_arrive(sp::BAR_XFULL + xb, 256);
        } else {
            bar_sync(sp::BAR_XFULL + xb, 256);
#pragma unroll
            for (int i = 0; i < 16; ++i) {            // elements 2 i, 2 i + 1: one row (h = i & 1)
                float p0, p1;
                ld_shared_f32x2(sx + (u32)(8 * (i * 128 + tid)), p0, p1);
                sd[2 * i] = p0 * (sd[2 * i] - dl[i & 1]) * scale;
                sd[2 * i + 1] = p1 * (sd[2 * i + 1] - dl[i & 1]) * scale;
            }
            if (it + 2 < ntiles) bar_arrive(sp::BAR_XFREE + xb, 256);
        }
        put(it, sd);                                  // consumer 0: P, consumer 1: dS
    }
}

namespace dqp {
constexpr int KT = 64, COLS = 192, PARTS = DQK / COLS, HMAX = 128;
constexpr int TG = KT / 8 * 128;                    // bytes per 8 heads of a [.][64] dS block: 1024
constexpr int DS_BYTES = HMAX / 8 * TG;             // 16384
// the key rows' third in the 128-byte swizzle: 3 column tiles of [64 keys][128 B], chunk c of key j at
// c ^ (j % 8) (a quarter warp's row piece lands in 128 contiguous bytes: one L2 request per 32-byte
// sector), read MN-major (N = the 192 columns, three whole atoms)
constexpr int CT_BYTES = KT * 128;                  // 8192
constexpr int K_BYTES = COLS / 64 * CT_BYTES;       // 24576
constexpr int STAGE = DS_BYTES + K_BYTES, NST = 4;
constexpr int BAR_OFF = NST * STAGE;                // full[NST], empty[NST]
constexpr int LAUNCH_SMEM = BAR_OFF + 2 * NST * 8 + 1024;   // the base rounded up to 1024 B
static_assert(LAUNCH_SMEM <= 227 * 1024 && DS_BYTES % 1024 == 0 && STAGE % 1024 == 0, "attend_wgmma_bwd split_dq: shared memory");
constexpr int THREADS = 384, PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * (65536 / THREADS / 8 * 8),
              "attend_wgmma_bwd split_dq: setmaxnreg budgets exceed the block's launch registers");
}  // namespace dqp

// kv rows at kv + s * kv_stride; pds: the first pass's blocks of queries t0 .. t0 + count - 1 (two head
// blocks: 128 heads padded); the block makes query t0 + tl's columns 192 part .. (hytopk_attend_bwd_dqp:
// tl = b / 3, part = b % 3); dq
// [n, Hq, 576] float (written). WG 0 gathers (cp.async, NST stages of the dS block and the 64 key rows'
// third, published by cp.async.mbarrier.arrive as they land); consumer c (WGs 1, 2) accumulates the
// third's dq of head block c (m64n192k16: A = dS K-major, B = the rows MN-major), its 16-key chunks in
// the first pass's order (the same bits as hytopk_attend_bwd_pds's dq).
__device__ __forceinline__ void split_dq(int tl, int part, const bf16_t* __restrict__ kv, long long kv_stride, const bf16_t* __restrict__ pds,
                                         const int* __restrict__ idx, int kk, int t0, long long L, int Hq,
                                         float* __restrict__ dq) {
    constexpr int KT = dqp::KT, COLS = dqp::COLS, TG = dqp::TG, NST = dqp::NST, HPAD = dqp::HMAX;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int t = t0 + tl, col0 = COLS * part;
    const u32 raw = smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    const u32 full0 = base + (u32)dqp::BAR_OFF, empty0 = full0 + 8 * NST;
    const int nt = (kk + KT - 1) / KT;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; ++s) {
            mbar_init(full0 + 8 * s, 128);            // every producer thread, once its copies landed
            mbar_init(empty0 + 8 * s, 8);             // one arrival per consumer warp
        }
        mbar_fence_init();
    }
    __syncthreads();
    const int wg = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);
    const int* lst = idx + (long long)t * kk;
    const int warp = tid >> 5, lane = tid & 31;
    if (wg == 0) {
        regs_dec<dqp::PRODUCER_REGS>();
        // the dS block: HPAD * 64 bf16, contiguous in pds and in the stage (16 bytes a thread at a time);
        // the key rows: quarter warp qg (tid >> 3) copies rows qg + 16 g, its lane l8 chunk l8 of each
        // column tile (one row's 128 contiguous bytes per quarter warp and column tile)
        const bf16_t* blocks = pds + (long long)tl * nt * 2 * HPAD * KT;
        const int qg = tid >> 3, l8 = tid & 7;
        int kx[KT / 16];
        auto keys = [&](int T) {
#pragma unroll
            for (int g = 0; g < KT / 16; ++g) {
                const int j = T * KT + qg + 16 * g;
                kx[g] = j < kk ? __ldg(lst + j) : -1;
            }
        };
        if (nt > 0) keys(0);
        for (int T = 0; T < nt; ++T) {
            const int s = T % NST;
            if (T >= NST) mbar_wait_or_trap(empty0 + 8 * s, (u32)(((T / NST) - 1) & 1));
            const u32 sds = base + (u32)(s * dqp::STAGE), sk = sds + dqp::DS_BYTES;
            const bf16_t* ds = blocks + ((long long)T * 2 + 1) * HPAD * KT;
#pragma unroll
            for (int i = 0; i < HPAD * KT / 8 / 128; ++i) cp_async16(sds + (u32)(16 * (tid + 128 * i)), ds + 8 * (tid + 128 * i), true);
#pragma unroll
            for (int g = 0; g < KT / 16; ++g) {
                const long long s_ = kx[g];
                const bool ok = s_ >= 0 && s_ < L;
                gather_row_sw128<COLS / 64>(sk, dqp::CT_BYTES, qg + 16 * g, l8, kv + (ok ? s_ * kv_stride + col0 : 0), ok);
            }
            cp_async_arrive_noinc(full0 + 8 * s);    // published as the copies land
            if (T + 1 < nt) keys(T + 1);
        }
        cp_async_wait_all();                          // no copy outlives the thread
        return;
    }
    regs_inc<dqp::CONSUMER_REGS>();
    const int c = wg - 1, g8 = lane >> 2, tig = lane & 3;
    float acc[COLS / 2];
#pragma unroll
    for (int i = 0; i < COLS / 2; ++i) acc[i] = 0.0f;
    for (int T = 0; T < nt; ++T) {
        const int s = T % NST;
        const u32 sds = base + (u32)(s * dqp::STAGE), sk = sds + dqp::DS_BYTES;
        mbar_wait_or_trap(full0 + 8 * s, (u32)((T / NST) & 1));
        fence_proxy_async();                          // the block's cp.async (generic proxy) -> this wgmma
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < KT / 16; ++ks)
            wgmma_m64n192k16_bf16_tb(acc, smem_desc(sds + (u32)(c * 8 * TG + ks * 256), 128, TG),
                                     desc_sw128(sk + (u32)(ks * 2048), dqp::CT_BYTES, 1024), 1);
        wgmma_commit();
        wgmma_wait<1>();                              // block T - 1's MMAs retired: its stage is free
        if (T >= 1) {
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * ((T - 1) % NST));
        }
    }
    wgmma_wait<0>();
    // dq rows (heads past Hq not written): element 4 nb + 2 h + e is head 64 c + 16 warp + g8 + 8 h,
    // column col0 + 8 nb + 2 tig + e
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = 64 * c + 16 * warp + g8 + 8 * h;
        if (r >= Hq) continue;
        float* row = dq + ((long long)t * Hq + r) * DQK + col0 + 2 * tig;
#pragma unroll
        for (int nb = 0; nb < COLS / 8; ++nb)
            *reinterpret_cast<float2*>(row + 8 * nb) = make_float2(acc[4 * nb + 2 * h], acc[4 * nb + 2 * h + 1]);
    }
}

}  // namespace attwb
}  // namespace hytopk

using namespace hytopk::attwb;

// grid (queries in the chunk) * nhb; ATOMIC: out = dkv [L, 576] float; else out = part rows; VEC:
// 16-byte writes, else scalar ones (the faster atomics on the H200: instantiations.attend_wgmma_bwd_name)
template <bool ATOMIC, bool VEC, bool STAGED>
__global__ void __launch_bounds__(384, 1)
hytopk_attend_bwd_wgmma(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                        const int* __restrict__ idx, int kk, int n, int t0, long long L, int Hq, int nhb, float scale,
                        float scale_log2, const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ delta, float* __restrict__ dq, float* __restrict__ out) {
    attend_bwd_wgmma<ATOMIC, VEC, STAGED>(q, kv, kv_stride, idx, kk, n, t0, L, Hq, nhb, scale, scale_log2, dout, lse, delta, dq,
                             out);
}

// SPLIT, first pass: S, dP and dQ as above, P and dS (bf16) to pds instead of the dK/dV MMAs
__global__ void __launch_bounds__(THREADS, 1)
hytopk_attend_bwd_pds(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                      const int* __restrict__ idx, int kk, int n, int t0, long long L, int Hq, int nhb, float scale,
                      float scale_log2, const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                      const float* __restrict__ delta, float* __restrict__ dq, bf16_t* __restrict__ pds) {
    attend_bwd_wgmma<false, false, false, true>(q, kv, kv_stride, idx, kk, n, t0, L, Hq, nhb, scale, scale_log2, dout, lse,
                                                delta, dq, reinterpret_cast<float*>(pds));
}

// SPLIT, second pass: ATOMIC: out = dkv [L, 576] float (+=); else the part rows [count][kk][576]
// (BULK: through the TMA's bulk operations, else red / st.global.v2 from the accumulators)
template <bool ATOMIC, int HPAD, bool BULK>
__global__ void __launch_bounds__(dkv::THREADS, 1)
hytopk_attend_bwd_dkv(const bf16_t* __restrict__ q, const bf16_t* __restrict__ dout, const bf16_t* __restrict__ pds,
                      const int* __restrict__ idx, int kk, int t0, long long L, int Hq, float* __restrict__ out) {
    split_dkv<ATOMIC, HPAD, BULK>((int)(blockIdx.x / (unsigned)dkv::PARTS), (int)(blockIdx.x % (unsigned)dkv::PARTS), q, dout,
                                  pds, idx, kk, t0, L, Hq, out);
}


// SPLIT with a dq pass, first pass: S, dP, and P / dS (bf16) to pds, Q and dO in registers (no dq)
__global__ void __launch_bounds__(sp::THREADS, 1)
hytopk_attend_bwd_sp(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                     const int* __restrict__ idx, int kk, int n, int t0, long long L, int Hq, int nhb, float scale,
                     float scale_log2, const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                     const float* __restrict__ delta, bf16_t* __restrict__ pds) {
    split_sp(blockIdx.x, q, kv, kv_stride, idx, kk, n, t0, L, Hq, nhb, scale, scale_log2, dout, lse, delta, pds);
}

// SPLIT with a dq pass, third pass: dq [n, Hq, 576] float (written) = dS K per query and column third
// (two head blocks: 65 .. 128 heads)
__global__ void __launch_bounds__(dqp::THREADS, 1)
hytopk_attend_bwd_dqp(const bf16_t* __restrict__ kv, long long kv_stride, const bf16_t* __restrict__ pds,
                     const int* __restrict__ idx, int kk, int t0, long long L, int Hq, float* __restrict__ dq) {
    split_dq((int)(blockIdx.x / (unsigned)dqp::PARTS), (int)(blockIdx.x % (unsigned)dqp::PARTS), kv, kv_stride, pds, idx, kk,
             t0, L, Hq, dq);
}

// SPLIT with a dq pass, all three passes in one launch over a ring of P / dS slots (the wrapper's RING,
// an experiment): the blocks take tickets (the order they started in) and ticket order is a step
// sequence: step s runs the first pass of query s (split_sp, 2 blocks) and then the second and third
// passes of query s - lag (split_dkv / split_dq per third, alternating: 6 blocks). Query t's P / dS live
// in slot t % ring: its consumers wait until both first-pass blocks released it (ready[slot] reaches 2
// per use), a first pass waits until the slot's previous query's 6 consumers released it (done[slot]).
// A block waits only on blocks with earlier tickets, which have all started: no deadlock whatever the
// hardware's block order (lag < ring). The waits trap after 2 s, as the mbarrier waits do (a context
// time-sliced away that long would trip them too). flags (zeroed before the launch): [0] the ticket counter,
// [1 .. ring] ready, [1 + ring .. 2 ring] done. grid 8 * count; pds: ring slots of a query's blocks;
// out: dkv (ATOMIC) or the part rows of queries t0 .. t0 + count - 1; lag <= count.
template <bool ATOMIC, bool BULK>
__global__ void __launch_bounds__(384, 1)
hytopk_attend_bwd_ring(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv, long long kv_stride,
                       const int* __restrict__ idx, int kk, int n, int t0, int count, long long L, int Hq, float scale,
                       float scale_log2, const bf16_t* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ delta, bf16_t* __restrict__ pds, float* __restrict__ out,
                       float* __restrict__ dq, int* __restrict__ flags, int lag, int ring) {
    static_assert(sp::THREADS == 384 && dkv::THREADS == 384 && dqp::THREADS == 384, "attend_wgmma_bwd ring: one block shape");
    __shared__ u32 s_ticket;
    if (threadIdx.x == 0) s_ticket = ticket_take(reinterpret_cast<u32*>(flags));
    __syncthreads();
    const u32 i = s_ticket, D = (u32)lag, C = (u32)count;
    bool first;                                       // a first-pass block (unit: its head block), else a consumer
    u32 tq, unit;                                     // (unit: third unit >> 1, dq when odd)
    if (i < 2 * D) {
        first = true, tq = i >> 1, unit = i & 1;
    } else if (i < 2 * D + 8 * (C - D)) {
        const u32 j = i - 2 * D, r = j & 7;
        first = r < 2, tq = D + (j >> 3) - (r < 2 ? 0 : D), unit = r < 2 ? r : r - 2;
    } else {
        const u32 j = i - 2 * D - 8 * (C - D);
        first = false, tq = C - D + j / 6, unit = j % 6;
    }
    const int slot = (int)(tq % (u32)ring), gen = (int)(tq / (u32)ring);
    const int te = t0 + (int)tq - slot;               // the passes' t0: query te + slot = t0 + tq, its P / dS in slot
    int* ready = flags + 1 + slot;
    int* done = flags + 1 + ring + slot;
    if (first) {
        if (threadIdx.x == 0 && gen > 0) flag_wait_or_trap(done, 6 * gen);
        __syncthreads();
        split_sp((u32)slot * 2u + unit, q, kv, kv_stride, idx, kk, n, te, L, Hq, 2, scale, scale_log2, dout, lse, delta, pds);
        fence_gpu();                                  // this thread's P / dS stores, then the block's release
        __syncthreads();
        if (threadIdx.x == 0) flag_release_add(ready, 1);
        return;
    }
    if (threadIdx.x == 0) flag_wait_or_trap(ready, 2 * (gen + 1));
    __syncthreads();
    fence_proxy_async_global();                       // the first pass's generic stores -> this block's TMA reads
    if (unit & 1) split_dq(slot, (int)(unit >> 1), kv, kv_stride, pds, idx, kk, te, L, Hq, dq);
    else split_dkv<ATOMIC, 128, BULK>(slot, (int)(unit >> 1), q, dout, pds, idx, kk, te, L, Hq,
                                      ATOMIC ? out : out + (long long)((int)tq - slot) * kk * DQK);
    __syncthreads();                                  // every read of the slot done (the stages all consumed)
    if (threadIdx.x == 0) flag_release_add(done, 1);
}
