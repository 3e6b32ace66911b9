// The mma_sync core (hytopk_mma_sync.cuh) with its epilogues: fused
// filter, dense table, recovery rows, score-only checksum and replay. All take
// bf16 bits (q[n,H,D], w[n,H], keys[L,D], 16-byte aligned) and call the same
// warp_scores(), so their scores agree bit for bit.
#include "hytopk_mma_sync.cuh"
using namespace hytopk;
using namespace hytopk::mma_sync;

namespace {

// Filter: compare on chip, append passing (pos, bits) with one atomic per warp
// and round; count keeps counting past capacity, slots >= capacity are never written.
struct FilterEpi {
    const u32* T;
    int capacity;
    int* cand_idx;
    u32* cand_val;
    int* count;
    u32 tkey;
    template <class B, int NT>
    __device__ void scores(const B& blk, long long s_first, const float (&p)[NT][2]) {
        const int tig = (int)lane_id() & 3;
        const long long row = blk.t * (long long)capacity;
#pragma unroll
        for (int r = 0; r < (NT + 7) / 8; ++r) {
            float v0, v1;
            int nt;
            const bool own = owned_pair(p, r, v0, v1, nt);
            const long long s0 = s_first + nt * 8 + 2 * tig, s1 = s0 + 1;
            const u32 b0 = __float_as_uint(v0), b1 = __float_as_uint(v1);
            const bool pass0 = own && s0 >= blk.a && s0 < blk.b && order_key_bits(b0) >= tkey;
            const bool pass1 = own && s1 >= blk.a && s1 < blk.b && order_key_bits(b1) >= tkey;
            const u32 m0 = __ballot_sync(0xffffffffu, pass0), m1 = __ballot_sync(0xffffffffu, pass1);
            const int total = __popc(m0) + __popc(m1);
            if (total == 0) continue;                           // warp-uniform
            int base = 0;
            if (lane_id() == 0) base = atomicAdd(count + blk.t, total);
            base = __shfl_sync(0xffffffffu, base, 0);
            const int slot0 = base + __popc(m0 & lanes_below_mask());
            const int slot1 = base + __popc(m0) + __popc(m1 & lanes_below_mask());
            if (pass0 && slot0 < capacity) { cand_idx[row + slot0] = (int)s0; cand_val[row + slot0] = b0; }
            if (pass1 && slot1 < capacity) { cand_idx[row + slot1] = (int)s1; cand_val[row + slot1] = b1; }
        }
    }
    template <class B>
    __device__ void skipped(const B&, long long) {}
};

// Dense: out[t, s] = score inside the context, -inf elsewhere (every s < L).
struct DenseEpi {
    u32* out;
    static constexpr u32 NEG_INF = NEG_INF_BITS;
    template <class B, int NT>
    __device__ void scores(const B& blk, long long s_first, const float (&p)[NT][2]) {
        const int tig = (int)lane_id() & 3;
        u32* row = out + blk.t * blk.L;
#pragma unroll
        for (int r = 0; r < (NT + 7) / 8; ++r) {
            float v0, v1;
            int nt;
            if (!owned_pair(p, r, v0, v1, nt)) continue;
            const long long s0 = s_first + nt * 8 + 2 * tig, s1 = s0 + 1;
            const u32 b0 = (s0 >= blk.a && s0 < blk.b) ? __float_as_uint(v0) : NEG_INF;
            const u32 b1 = (s1 >= blk.a && s1 < blk.b) ? __float_as_uint(v1) : NEG_INF;
            // s0 is even (tiles start at multiples of NTILE): with L even the pair is 8-byte aligned
            if ((blk.L & 1) == 0 && s1 < blk.L) {
                *reinterpret_cast<uint2*>(row + s0) = make_uint2(b0, b1);
            } else {
                if (s0 < blk.L) row[s0] = b0;
                if (s1 < blk.L) row[s1] = b1;
            }
        }
    }
    template <class B>
    __device__ void skipped(const B& blk, long long s_first) {       // this warp's keys miss its context
        if (blk.t < 0) return;
        u32* row = out + blk.t * blk.L;
        const long long end = min(blk.L, s_first + (long long)B::Geometry::KW);
        for (long long s = s_first + lane_id(); s < end; s += 32) row[s] = NEG_INF;
    }
};

// Recovery rows: buf[entry, s - a] for s in [a, min(b, a + stride)).
struct RowsEpi {
    u32* buf;
    long long stride;
    template <class B, int NT>
    __device__ void scores(const B& blk, long long s_first, const float (&p)[NT][2]) {
        const int tig = (int)lane_id() & 3;
        const long long end = min(blk.b, blk.a + stride);
        u32* row = buf + (long long)blk.entry * stride - blk.a;
#pragma unroll
        for (int r = 0; r < (NT + 7) / 8; ++r) {
            float v0, v1;
            int nt;
            if (!owned_pair(p, r, v0, v1, nt)) continue;
            const long long s0 = s_first + nt * 8 + 2 * tig;
            if (s0 >= blk.a && s0 < end) row[s0] = __float_as_uint(v0);
            if (s0 + 1 >= blk.a && s0 + 1 < end) row[s0 + 1] = __float_as_uint(v1);
        }
    }
    template <class B>
    __device__ void skipped(const B&, long long) {}
};

// Score-only: the wrapping sum of the order keys of every in-context score.
struct ChecksumEpi {
    u64 sum;
    template <class B, int NT>
    __device__ void scores(const B& blk, long long s_first, const float (&p)[NT][2]) {
        const int tig = (int)lane_id() & 3;
#pragma unroll
        for (int r = 0; r < (NT + 7) / 8; ++r) {
            float v0, v1;
            int nt;
            if (!owned_pair(p, r, v0, v1, nt)) continue;
            const long long s0 = s_first + nt * 8 + 2 * tig;
            if (s0 >= blk.a && s0 < blk.b) sum += order_key(v0);
            if (s0 + 1 >= blk.a && s0 + 1 < blk.b) sum += order_key(v1);
        }
    }
    template <class B>
    __device__ void skipped(const B&, long long) {}
};

}  // namespace

// Fused score-and-filter. grid: (ceil(n / QPB), ceil((L + NTILE) / (NTILE * TILES_PER_BLOCK)));
// smem: Shape::SMEM_BYTES. count must be zeroed.
template <int H, int D>
__global__ void __launch_bounds__(256, 2)
hytopk_filter_mma_sync(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ w,
                    const bf16_bits* __restrict__ keys, long long L, int n,
                    const int* __restrict__ lo, const int* __restrict__ hi, const u32* __restrict__ T,
                    int capacity, int* __restrict__ cand_idx, u32* __restrict__ cand_val,
                    int* __restrict__ count) {
    extern __shared__ __align__(16) unsigned char smem[];
    Block<Shape<H, D>> blk;
    blk.init(q, w, keys, L, nullptr, n, lo, hi);
    long long tile0;
    int ntiles;
    blk.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;                                // block-uniform
    FilterEpi epi = {T, capacity, cand_idx, cand_val, count, blk.t >= 0 ? order_key_bits(T[blk.t]) : 0xffffffffu};
    blk.scan(smem, tile0, ntiles, epi);
}

// Dense table over [0, L). grid: (ceil(n / QPB), ceil(L / (NTILE * TILES_PER_BLOCK))).
template <int H, int D>
__global__ void __launch_bounds__(256, 2)
hytopk_dense_mma_sync(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ w,
                   const bf16_bits* __restrict__ keys, long long L, int n,
                   const int* __restrict__ lo, const int* __restrict__ hi, u32* __restrict__ out) {
    typedef Shape<H, D> S;
    extern __shared__ __align__(16) unsigned char smem[];
    Block<Shape<H, D>> blk;
    blk.init(q, w, keys, L, nullptr, n, lo, hi);
    long long t0, t1;
    const auto query = [&blk](int j) { return blk.query_of(blockIdx.x * S::QPB + j); };
    if (!dense_run(L, blk.glo, blk.ghi, S::NTILE, S::TILES_PER_BLOCK, S::QPB, query, out, t0, t1)) return;
    if (t0 >= t1) return;                                   // block-uniform
    DenseEpi epi = {out};
    blk.scan(smem, t0, (int)(t1 - t0), epi);
}

// Recovery: buf[j, s - lo[rows[j]]] = score of (rows[j], s). grid as the filter's, over nrows.
template <int H, int D>
__global__ void __launch_bounds__(256, 2)
hytopk_score_rows_mma_sync(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ w,
                        const bf16_bits* __restrict__ keys, long long L, const int* __restrict__ rows,
                        int nrows, const int* __restrict__ lo, const int* __restrict__ hi,
                        u32* __restrict__ buf, long long stride) {
    extern __shared__ __align__(16) unsigned char smem[];
    Block<Shape<H, D>> blk;
    blk.init(q, w, keys, L, rows, nrows, lo, hi);
    long long tile0;
    int ntiles;
    blk.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;
    RowsEpi epi = {buf, stride};
    blk.scan(smem, tile0, ntiles, epi);
}

// Score-only floor. grid as the filter's. *checksum must be zeroed.
template <int H, int D>
__global__ void __launch_bounds__(256, 2)
hytopk_score_only_mma_sync(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ w,
                        const bf16_bits* __restrict__ keys, long long L, int n,
                        const int* __restrict__ lo, const int* __restrict__ hi,
                        unsigned long long* __restrict__ checksum) {
    extern __shared__ __align__(16) unsigned char smem[];
    Block<Shape<H, D>> blk;
    blk.init(q, w, keys, L, nullptr, n, lo, hi);
    long long tile0;
    int ntiles;
    blk.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;
    ChecksumEpi epi = {0ull};
    blk.scan(smem, tile0, ntiles, epi);
    u64 sum = epi.sum;
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane_id() == 0 && sum) atomicAdd(checksum, sum);
}

// Replay: out[t, j] = score of keys[idx[t, j]] (-inf where idx is -1 or out of
// range), from a gathered key tile: each warp scores RKW keys of its own query
// per pass. grid: (ceil(n / QPB), ceil(k / (RJT * R_PASSES))); smem: R_SMEM_BYTES.
template <int H, int D>
__global__ void __launch_bounds__(256, 2)
hytopk_replay_mma_sync(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ w,
                    const bf16_bits* __restrict__ keys, long long L, int n,
                    const int* __restrict__ idx, int k, u32* __restrict__ out) {
    typedef Shape<H, D> S;
    extern __shared__ __align__(16) unsigned char smem[];
    Block<Shape<H, D>> blk;
    blk.init(q, w, keys, L, nullptr, n, nullptr, nullptr);
    const int j_begin = blockIdx.y * S::RJT * S::R_PASSES;
    if (j_begin >= k) return;                               // block-uniform
    bf16_bits* sq = reinterpret_cast<bf16_bits*>(smem);
    bf16_bits* sk = reinterpret_cast<bf16_bits*>(smem + S::Q_BYTES);
    blk.load_q(sq);
    cp_async_commit();
    const u32 qa = smem_addr(sq + blk.qs * S::H * S::RS);
    const u32 ka = smem_addr(sk + blk.warp * S::RKW * S::RS);
    const u32 kbase = smem_addr(sk);
    const int tig = (int)lane_id() & 3;
    for (int pass = 0; pass < S::R_PASSES; ++pass) {
        const int j0 = j_begin + pass * S::RJT;
        if (j0 >= k) break;                                 // block-uniform
        __syncthreads();                                    // the previous pass is done with sk
        for (int i = threadIdx.x; i < S::WARPS * S::RKW * S::CHUNKS; i += S::THREADS) {
            const int row = i / S::CHUNKS, ch = i % S::CHUNKS;
            const int wr = row / S::RKW;                    // the warp this row belongs to
            const long long tj = blk.query_of(blockIdx.x * S::QPB + wr / S::WQ);
            const int jj = j0 + (wr % S::WQ) * S::RKW + row % S::RKW;
            const long long s = (tj >= 0 && jj < k) ? (long long)idx[tj * k + jj] : -1;
            const bool ok = s >= 0 && s < L;
            cp_async16(kbase + (u32)((row * S::RS + ch * 8) * 2), keys + (ok ? s : 0) * S::D + ch * 8, ok);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        if (blk.t < 0) continue;                            // warp-uniform
        float p[S::RNT][2];
        warp_scores<S, S::RNT>(qa, ka, blk.wv, p);
        const int jw = j0 + blk.wq * S::RKW;
        float v0, v1;
        int nt;
        if (owned_pair(p, 0, v0, v1, nt)) {                 // RNT <= 8: one round
            const float v[2] = {v0, v1};
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                const int jj = jw + nt * 8 + 2 * tig + x;
                if (jj >= k) continue;
                const long long s = idx[blk.t * k + jj];
                out[blk.t * k + jj] = (s >= 0 && s < L) ? __float_as_uint(v[x]) : 0xff800000u;
            }
        }
    }
}
