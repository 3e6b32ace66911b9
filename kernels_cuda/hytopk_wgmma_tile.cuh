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

namespace hytopk {
namespace wg {

typedef unsigned char e4m3_bits;

// ------------------------------------------------------------------ wgmma PTX
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], u64 da, u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, %131, %132, %133, %134;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(scale_d), "n"(1), "n"(1), "n"(0), "n"(0));
}

__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (&d)[128], u64 da, u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(scale_d), "n"(1), "n"(1));
}


__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], u64 da, u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, %67, %68, %69, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d), "n"(1), "n"(1), "n"(0), "n"(0));
}

__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], u64 da, u64 db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d), "n"(1), "n"(1));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>        // until at most N committed groups of this warpgroup are pending
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// ordinary (cp.async) writes to shared memory become visible to the tensor cores' async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// smem_addr, cp_async16, cp_async_commit, cp_async_wait: hytopk_cp_async.cuh

// Named barriers: 0 is __syncthreads; 1, 2 order a warpgroup's own tiles; 3, 4 pass the MMA turn.
__device__ __forceinline__ void bar_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int threads) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }

// Matrix descriptor: no swizzle, K-major; addresses and offsets in 16-byte units.
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lead, u32 stride) {
#ifdef HYTOPK_WG_SWAP_OFFSETS          // probe: the two offsets' roles swapped
    const u32 t = lead; lead = stride; stride = t;
#endif
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) | ((u64)((stride >> 4) & 0x3fffu) << 32);
}

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
    static constexpr int STAGES = 3;                    // block-synchronous scan: 128-key tiles
    static constexpr int WG_STAGES = 4;                 // ping-pong scan: 64-key tiles per warpgroup
    static constexpr int Q_BYTES = NROWS * ROW_BYTES;
    static constexpr int TILE_BYTES = KT * ROW_BYTES;
    static constexpr int WG_TILE_BYTES = 64 * ROW_BYTES;
    static constexpr int STAGE_BYTES = (STAGES * TILE_BYTES > 2 * WG_STAGES * WG_TILE_BYTES)
                                           ? STAGES * TILE_BYTES : 2 * WG_STAGES * WG_TILE_BYTES;
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

    // keys [s0, s0 + KT) into stage st; rows outside [glo, ghi) are zero-filled, never read.
    __device__ void load_tile(int st, long long s0) const {
        const Block* self = this;
        sweep(smem_addr(smem + S::Q_BYTES + st * S::TILE_BYTES), S::KT, [self, s0](int r) -> const unsigned char* {
            const long long s = s0 + r;
            return (s >= self->glo && s < self->ghi) ? reinterpret_cast<const unsigned char*>(self->keys + s * S::D) : nullptr;
        });
    }

    // The warpgroup's 64 keys of stage st against all NROWS (query, head) rows.
    __device__ void mma_tile(int st, float (&d)[128]) const {
        const int wgi = (int)(threadIdx.x >> 7);
        const u32 a0 = smem_addr(smem + S::Q_BYTES + st * S::TILE_BYTES) + (u32)(wgi * 8 * S::GROUP_BYTES);
        const u32 b0 = smem_addr(smem);
        const u64 da = smem_desc(a0, 128u, S::GROUP_BYTES), db = smem_desc(b0, 128u, S::GROUP_BYTES);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < S::KSTEPS; ++ks)
            In::mma(d, da + 16ull * ks, db + 16ull * ks, ks > 0);    // + 32 bytes of K: the address field, in 16-byte units
        wgmma_commit();
        wgmma_wait_all();
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

    // Half h of the (query, head) rows (slots [h * QPB/2, (h+1) * QPB/2)) against the
    // warpgroup's 64 keys of stage st: issued and committed as one group.
    __device__ __forceinline__ void issue_half(int wgi, int st, int h, float (&d)[64]) const {
        const u32 a0 = smem_addr(smem + S::Q_BYTES + (wgi * S::WG_STAGES + st) * S::WG_TILE_BYTES);
        const u32 b0 = smem_addr(smem) + (u32)(h * (S::NROWS / 16) * S::GROUP_BYTES);
        const u64 da = smem_desc(a0, 128u, S::GROUP_BYTES), db = smem_desc(b0, 128u, S::GROUP_BYTES);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < S::KSTEPS; ++ks)
            In::mma(d, da + 16ull * ks, db + 16ull * ks, ks > 0);    // + 32 bytes of K: the address field, in 16-byte units
        wgmma_commit();
    }

    // Split-N scan (v4; slower than the ping-pong scan, measured: kept as a variant): each warpgroup runs its own cp.async pipeline
    // over its 64-key halves of the tiles (as the ping-pong scan) and splits the 256
    // (query, head) rows into two N = 128 MMAs with their own accumulators, so the
    // tensor cores always hold one: epilogue of half A of tile i under half B's MMA,
    // epilogue of half B under half A of tile i + 1. No turn protocol between the
    // warpgroups; the same keys per warp and the same score function as before.
    template <class Epi>
    __device__ void scan_halves(long long tile0, int ntiles, Epi& epi) const {
        constexpr int NJ = S::QPB / 2;
        const int wgi = (int)(threadIdx.x >> 7), wi = (int)((threadIdx.x >> 5) & 3);
        load_q();
        cp_async_commit();
#pragma unroll
        for (int st = 0; st < S::WG_STAGES - 1; ++st) {
            if (st < ntiles) load_wg_tile(wgi, st, (tile0 + st) * S::KT + wgi * 64);
            cp_async_commit();
        }
        cp_async_wait<S::WG_STAGES - 2>();
        fence_proxy_async();
        __syncthreads();                                 // q (copied by all 256 threads) and tile 0 landed
        float dA[64], dB[64];
        const long long s_first = tile0 * S::KT + wgi * 64;
        bool act = s_first < ghi && s_first + 64 > glo;  // warpgroup-uniform
        if (act) { issue_half(wgi, 0, 0, dA); issue_half(wgi, 0, 1, dB); }
        for (int i = 0; i < ntiles; ++i) {
            const long long s_wg = (tile0 + i) * S::KT + wgi * 64, s_warp = s_wg + wi * 16;
            const bool more = i + 1 < ntiles;
            const bool act1 = more && s_wg + S::KT < ghi && s_wg + S::KT + 64 > glo;
            if (act) {
                wgmma_wait<1>();                         // half A of tile i done, half B may run
                float p[NJ][2];
                scores<0, NJ>(dA, s_warp, p);
                epi.template scores<0>(*this, s_warp, p);
            } else {
                epi.skipped(*this, s_warp);
            }
            if (more) {
                cp_async_wait<S::WG_STAGES - 2>();
                fence_proxy_async();
                bar_sync(1 + wgi, 128);                  // tile i+1 landed; every warp is past tile i-1's MMAs
                const int nxt = i + S::WG_STAGES - 1;
                if (nxt < ntiles) load_wg_tile(wgi, nxt % S::WG_STAGES, (tile0 + nxt) * S::KT + wgi * 64);
                cp_async_commit();
                if (act1) issue_half(wgi, (i + 1) % S::WG_STAGES, 0, dA);
            }
            if (act) {
                if (act1) wgmma_wait<1>(); else wgmma_wait<0>();   // half B of tile i done
                float p[NJ][2];
                scores<NJ, NJ>(dB, s_warp, p);
                epi.template scores<NJ>(*this, s_warp, p);
            }
            if (act1) issue_half(wgi, (i + 1) % S::WG_STAGES, 1, dB);
            act = act1;
        }
        cp_async_wait<0>();
        epi.finish(*this);
    }

    // Block-synchronous scan (v1, kept as the *_sync filter to show the progression):
    // score tiles [tile0, tile0 + ntiles) (keys KT * tile ...), STAGES deep. Per warp:
    // epi.scores(*this, s_warp, p) for its 16 keys s_warp .. s_warp + 15 when its
    // warpgroup's 64 keys meet the union, else epi.skipped(*this, s_warp).
    template <class Epi>
    __device__ void scan(long long tile0, int ntiles, Epi& epi) const {
        load_q();
        cp_async_commit();
#pragma unroll
        for (int st = 0; st < S::STAGES - 1; ++st) {
            if (st < ntiles) load_tile(st, (tile0 + st) * S::KT);
            cp_async_commit();
        }
        const int wgi = (int)(threadIdx.x >> 7), wi = (int)((threadIdx.x >> 5) & 3);
        for (int i = 0; i < ntiles; ++i) {
            cp_async_wait<S::STAGES - 2>();
            fence_proxy_async();
            __syncthreads();                 // tile i landed for everyone; tile i-1's stage is free
            const int nxt = i + S::STAGES - 1;
            if (nxt < ntiles) load_tile(nxt % S::STAGES, (tile0 + nxt) * S::KT);
            cp_async_commit();
            const long long s_wg = (tile0 + i) * S::KT + wgi * 64, s_warp = s_wg + wi * 16;
            if (s_wg < ghi && s_wg + 64 > glo) {                // warpgroup-uniform
                float d[128];
                mma_tile(i % S::STAGES, d);
                float p[S::QPB][2];
                scores<0, S::QPB>(d, s_warp, p);
                epi.template scores<0>(*this, s_warp, p);
            } else {
                epi.skipped(*this, s_warp);
            }
        }
        cp_async_wait<0>();
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
