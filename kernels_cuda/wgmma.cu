// The wgmma core (hytopk_wgmma.cuh, sm_90a) with its epilogues: fused
// filter, dense table, recovery rows and the score-only checksum, for bf16
// inputs (*_wgmma) and fp8 e4m3 inputs with per-key scales (*_wgmma_fp8).
// Arguments: q[n,H,D], w[n,H] (bf16 bits; float32 for fp8), keys[L,D],
// kscale[L] (fp8 only; ignored for bf16), all 16-byte aligned.
// Every slot's scores come from Block::scores(): one score function per kind.
#include "hytopk_wgmma.cuh"
using namespace hytopk;
using namespace hytopk::wg;

namespace {

// Filter of the ping-pong scan: compare on chip (lane tig tests slots j = tig mod 4),
// append passing (position, bits) to this warp's staging buffer of the slot in shared
// memory (ballot ranks, a warp-uniform fill count: no atomics); a full buffer, and
// every buffer at the end, is flushed with one global atomic for its whole run.
// Atomic latency was the v1 bottleneck: one dependent round trip per slot and tile.
template <class S>
struct FilterEpi {
    int capacity;
    int* cand_idx;
    u32* cand_val;
    int* count;
    int cnt[S::QPB];               // warp-uniform: entries in this warp's buffer of slot j

    __device__ __forceinline__ uint2* buffer(const Block<S>& blk, int j) const {
        return blk.s_stage + ((int)(threadIdx.x >> 5) * S::QPB + j) * S::E;
    }
    // copy entries [0, n) of buffer j to the slot's candidates from global index base
    __device__ __forceinline__ void copy_out(const Block<S>& blk, int j, int base, int n) const {
        const uint2* buf = buffer(blk, j);
        const long long row = (long long)blk.s_t[j] * capacity;
        for (int k = (int)lane_id(); k < n; k += 32)
            if (base + k < capacity) {
                const uint2 e = buf[k];
                cand_idx[row + base + k] = (int)e.x;
                cand_val[row + base + k] = e.y;
            }
    }
    template <int J0, class B, int NJ>
    __device__ __forceinline__ void scores(const B& blk, long long s_warp, const float (&p)[NJ][2]) {
        const int lane = (int)lane_id(), g = lane >> 2, tig = lane & 3;
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
            const int j = J0 + jj;
            const int t = blk.s_t[j];
            const int a = blk.s_a[j], b = blk.s_b[j];         // positions < L < 2^31: int compares
            const u32 tkey = blk.s_aux[j];
            const bool mine = t >= 0 && tig == (j & 3);
            const int s0 = (int)s_warp + g, s1 = s0 + 8;
            const bool pass0 = mine && s0 >= a && s0 < b && order_key(p[jj][0]) >= tkey;
            const bool pass1 = mine && s1 >= a && s1 < b && order_key(p[jj][1]) >= tkey;
            const u32 m0 = __ballot_sync(0xffffffffu, pass0), m1 = __ballot_sync(0xffffffffu, pass1);
            const int total = __popc(m0) + __popc(m1);
            if (total == 0) continue;                                  // warp-uniform
            if (cnt[j] + total > S::E) {                               // full: flush the run (rare)
                __syncwarp();
                int base = 0;
                if (lane == 0) base = atomicAdd(count + t, cnt[j]);
                base = __shfl_sync(0xffffffffu, base, 0);
                copy_out(blk, j, base, cnt[j]);
                __syncwarp();
                cnt[j] = 0;
            }
            uint2* buf = buffer(blk, j);
            if (pass0) buf[cnt[j] + __popc(m0 & lanes_below_mask())] = make_uint2((u32)s0, __float_as_uint(p[jj][0]));
            if (pass1) buf[cnt[j] + __popc(m0) + __popc(m1 & lanes_below_mask())] = make_uint2((u32)s1, __float_as_uint(p[jj][1]));
            cnt[j] += total;
        }
    }
    template <class B>
    __device__ void skipped(const B&, long long) {}
    // every buffer's run: all slots' atomics in flight together (lane j adds slot j's)
    __device__ __forceinline__ void finish(const Block<S>& blk) {
        __syncwarp();
        const int lane = (int)lane_id();
        int mybase = 0;
#pragma unroll
        for (int j = 0; j < S::QPB; ++j)
            if (lane == j && cnt[j] > 0) mybase = atomicAdd(count + blk.s_t[j], cnt[j]);
#pragma unroll
        for (int j = 0; j < S::QPB; ++j) {
            const int base = __shfl_sync(0xffffffffu, mybase, j);
            if (cnt[j] > 0) copy_out(blk, j, base, cnt[j]);
        }
    }
};

// Dense: out[t, s] = score inside the context, -inf elsewhere (every s < L).
struct DenseEpi {
    u32* out;
    static constexpr u32 NEG_INF = NEG_INF_BITS;
    template <int J0, class B, int NJ>
    __device__ void scores(const B& blk, long long s_warp, const float (&p)[NJ][2]) {
        const int lane = (int)lane_id(), g = lane >> 2, tig = lane & 3;
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
            const int j = J0 + jj;
            const int t = blk.s_t[j];
            if (t < 0 || tig != (j & 3)) continue;
            const int a = blk.s_a[j], b = blk.s_b[j];         // positions < L < 2^31: int compares
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = (int)s_warp + g + 8 * e;
                if (s < blk.L) out[(long long)t * blk.L + s] = (s >= a && s < b) ? __float_as_uint(p[jj][e]) : NEG_INF;
            }
        }
    }
    template <class B>
    __device__ void skipped(const B& blk, long long s_warp) {       // this warp's 16 keys miss every context
        const int lane = (int)lane_id();
        for (int j = 0; j < B::Geometry::QPB; ++j) {
            const int t = blk.s_t[j];
            const long long s = s_warp + (lane & 15);
            if (t >= 0 && lane < 16 && s < blk.L) out[(long long)t * blk.L + s] = NEG_INF;
        }
    }
    template <class B>
    __device__ void finish(const B&) {}
};

// Recovery rows: buf[entry, s - a] for s in [a, min(b, a + stride)).
struct RowsEpi {
    u32* buf;
    long long stride;
    template <int J0, class B, int NJ>
    __device__ void scores(const B& blk, long long s_warp, const float (&p)[NJ][2]) {
        const int lane = (int)lane_id(), g = lane >> 2, tig = lane & 3;
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
            const int j = J0 + jj;
            if (blk.s_t[j] < 0 || tig != (j & 3)) continue;
            const long long a = blk.s_a[j], end = min((long long)blk.s_b[j], a + stride);
            u32* row = buf + (long long)(blockIdx.x * B::Geometry::QPB + j) * stride - a;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = (int)s_warp + g + 8 * e;
                if (s >= a && s < end) row[s] = __float_as_uint(p[jj][e]);
            }
        }
    }
    template <class B>
    __device__ void skipped(const B&, long long) {}
    template <class B>
    __device__ void finish(const B&) {}
};

// Score-only: the wrapping sum of the order keys of every in-context score.
struct ChecksumEpi {
    u64 sum;
    template <int J0, class B, int NJ>
    __device__ void scores(const B& blk, long long s_warp, const float (&p)[NJ][2]) {
        const int lane = (int)lane_id(), g = lane >> 2, tig = lane & 3;
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) {
            const int j = J0 + jj;
            if (blk.s_t[j] < 0 || tig != (j & 3)) continue;
            const int a = blk.s_a[j], b = blk.s_b[j];         // positions < L < 2^31: int compares
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = (int)s_warp + g + 8 * e;
                if (s >= a && s < b) sum += order_key(p[jj][e]);
            }
        }
    }
    template <class B>
    __device__ void skipped(const B&, long long) {}
    template <class B>
    __device__ void finish(const B&) {}
};

template <class In, int H, int D>
using BlockOf = Block<Shape<H, D, In>>;

template <class In, int H, int D>
__device__ __forceinline__ void filter_body(const typename In::elem* q, const typename In::weight* w,
                                            const typename In::elem* keys, const float* kscale, long long L, int n,
                                            const int* lo, const int* hi, const u32* T, int capacity,
                                            int* cand_idx, u32* cand_val, int* count) {
    extern __shared__ __align__(128) unsigned char smem[];
    BlockOf<In, H, D> blk;
    blk.init(smem, q, w, keys, kscale, L, nullptr, n, lo, hi);
    long long tile0;
    int ntiles;
    blk.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;                                          // block-uniform
    if (threadIdx.x < Shape<H, D, In>::QPB && blk.s_t[threadIdx.x] >= 0)
        blk.s_aux[threadIdx.x] = order_key_bits(T[blk.s_t[threadIdx.x]]);
    __syncthreads();
    FilterEpi<Shape<H, D, In>> epi = {capacity, cand_idx, cand_val, count};
#pragma unroll
    for (int j = 0; j < Shape<H, D, In>::QPB; ++j) epi.cnt[j] = 0;
    blk.scan_pingpong(tile0, ntiles, epi);
}

template <class In, int H, int D>
__device__ __forceinline__ void dense_body(const typename In::elem* q, const typename In::weight* w,
                                           const typename In::elem* keys, const float* kscale, long long L, int n,
                                           const int* lo, const int* hi, u32* out) {
    typedef Shape<H, D, In> S;
    extern __shared__ __align__(128) unsigned char smem[];
    BlockOf<In, H, D> blk;
    blk.init(smem, q, w, keys, kscale, L, nullptr, n, lo, hi);
    long long t0, t1;
    const auto query = [&blk](int j) { return (long long)blk.s_t[j]; };
    if (!dense_run(L, blk.glo, blk.ghi, S::KT, S::TILES_PER_BLOCK, S::QPB, query, out, t0, t1)) return;
    if (t0 >= t1) return;                                             // block-uniform
    DenseEpi epi = {out};
    blk.scan_pingpong(t0, (int)(t1 - t0), epi);
}

template <class In, int H, int D>
__device__ __forceinline__ void rows_body(const typename In::elem* q, const typename In::weight* w,
                                          const typename In::elem* keys, const float* kscale, long long L,
                                          const int* rows, int nrows, const int* lo, const int* hi,
                                          u32* buf, long long stride) {
    extern __shared__ __align__(128) unsigned char smem[];
    BlockOf<In, H, D> blk;
    blk.init(smem, q, w, keys, kscale, L, rows, nrows, lo, hi);
    long long tile0;
    int ntiles;
    blk.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;
    RowsEpi epi = {buf, stride};
    blk.scan_pingpong(tile0, ntiles, epi);
}

template <class In, int H, int D>
__device__ __forceinline__ void score_only_body(const typename In::elem* q, const typename In::weight* w,
                                                const typename In::elem* keys, const float* kscale, long long L,
                                                int n, const int* lo, const int* hi, u64* checksum) {
    extern __shared__ __align__(128) unsigned char smem[];
    BlockOf<In, H, D> blk;
    blk.init(smem, q, w, keys, kscale, L, nullptr, n, lo, hi);
    long long tile0;
    int ntiles;
    blk.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;
    ChecksumEpi epi = {0ull};
    blk.scan_pingpong(tile0, ntiles, epi);
    u64 sum = epi.sum;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane_id() == 0 && sum) atomicAdd(checksum, sum);
}

}  // namespace

// One kernel per (stage, input kind); grids as the mma_sync core's (hytopk_mma_sync.cuh) with
// QPB queries per block and KT * TILES_PER_BLOCK keys per block; smem: Shape::SMEM_BYTES.
#define HYTOPK_WG_KERNELS(SUFFIX, IN)                                                                              \
    template <int H, int D>                                                                                        \
    __global__ void __launch_bounds__(256, 1) hytopk_filter_##SUFFIX(                                              \
        const IN::elem* __restrict__ q, const IN::weight* __restrict__ w, const IN::elem* __restrict__ keys,      \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                          \
        const int* __restrict__ hi, const u32* __restrict__ T, int capacity, int* __restrict__ cand_idx,          \
        u32* __restrict__ cand_val, int* __restrict__ count) {                                                     \
        filter_body<IN, H, D>(q, w, keys, kscale, L, n, lo, hi, T, capacity, cand_idx, cand_val, count);    \
    }                                                                                                              \
    template <int H, int D>                                                                                        \
    __global__ void __launch_bounds__(256, 1) hytopk_dense_##SUFFIX(                                               \
        const IN::elem* __restrict__ q, const IN::weight* __restrict__ w, const IN::elem* __restrict__ keys,      \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                          \
        const int* __restrict__ hi, u32* __restrict__ out) {                                                       \
        dense_body<IN, H, D>(q, w, keys, kscale, L, n, lo, hi, out);                                              \
    }                                                                                                              \
    template <int H, int D>                                                                                        \
    __global__ void __launch_bounds__(256, 1) hytopk_score_rows_##SUFFIX(                                          \
        const IN::elem* __restrict__ q, const IN::weight* __restrict__ w, const IN::elem* __restrict__ keys,      \
        const float* __restrict__ kscale, long long L, const int* __restrict__ rows, int nrows,                    \
        const int* __restrict__ lo, const int* __restrict__ hi, u32* __restrict__ buf, long long stride) {        \
        rows_body<IN, H, D>(q, w, keys, kscale, L, rows, nrows, lo, hi, buf, stride);                             \
    }                                                                                                              \
    template <int H, int D>                                                                                        \
    __global__ void __launch_bounds__(256, 1) hytopk_score_only_##SUFFIX(                                          \
        const IN::elem* __restrict__ q, const IN::weight* __restrict__ w, const IN::elem* __restrict__ keys,      \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                          \
        const int* __restrict__ hi, unsigned long long* __restrict__ checksum) {                                   \
        score_only_body<IN, H, D>(q, w, keys, kscale, L, n, lo, hi, checksum);                                    \
    }

HYTOPK_WG_KERNELS(wgmma, Bf16In)

HYTOPK_WG_KERNELS(wgmma_fp8, E4m3In)
