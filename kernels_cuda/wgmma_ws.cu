// The warp-specialised wgmma core (hytopk_wgmma_ws.cuh, sm_90a) with its epilogues:
// fused filter, dense table, recovery rows, score-only checksum, and the replay of
// gathered keys, for bf16 inputs (*_ws) and fp8 e4m3 inputs with per-key scales
// (*_ws_fp8); *_ws2: the same core with two consumer warpgroups of N = 256 (bf16).
// Arguments: qt / kt = q [n, H, D] and keys [L, D] put into the core-matrix layout by
// hytopk_ws_pretile (keys padded with zero rows to whole 128-key stages), w [n, H]
// float32, kscale [L] float32 (fp8 only; ignored for bf16); all 16-byte aligned.
// Scan grids are 1-D: block = query group * runs + run (Core::init).
#include "hytopk_wgmma_ws.cuh"
#include "hytopk_radix.cuh"
using namespace hytopk;
using namespace hytopk::ws;

namespace {

constexpr u32 FULL = 0xffffffffu;

// The owned slots of a lane (hytopk_wgmma_ws.cuh, Core::consume): slot j0 + 4u + tig,
// its query (-1: none or not owned) and context. With one slot per lane (H >= 32) they are
// cached in registers by load(); with more (H = 16, whose 112 registers have no room) they
// are read from shared memory at each use.
template <class S>
struct Owned {
    static constexpr bool CACHE = S::U == 1;
    int j0;
    int t_[1], a_[1], b_[1];        // slot u = 0, when CACHE
    const Core<S>* c;
    __device__ __forceinline__ int jl(int u) const { return 4 * u + (int)(lane_id() & 3); }
    __device__ __forceinline__ void load(const Core<S>& core, int j0_) {
        j0 = j0_;
        c = &core;
        if (CACHE) {
            t_[0] = jl(0) < S::NJ ? core.s_t[j0 + jl(0)] : -1;
            a_[0] = jl(0) < S::NJ ? core.s_a[j0 + jl(0)] : 0;
            b_[0] = jl(0) < S::NJ ? core.s_b[j0 + jl(0)] : 0;
        }
    }
    __device__ __forceinline__ int t(int u) const { return CACHE ? t_[0] : (jl(u) < S::NJ ? c->s_t[j0 + jl(u)] : -1); }
    __device__ __forceinline__ int a(int u) const { return CACHE ? a_[0] : c->s_a[j0 + jl(u)]; }
    __device__ __forceinline__ int b(int u) const { return CACHE ? b_[0] : c->s_b[j0 + jl(u)]; }
    __device__ __forceinline__ u32 aux(int u) const { return c->s_aux[j0 + jl(u)]; }
};

// Filter: compare on chip, append passing (position, bits) to this warp's staging
// buffer of the slot in shared memory; a full buffer, and every buffer at the end,
// is flushed with one global atomic for its whole run (no atomics in the loop).
// One ballot pair covers the four slots j0 + 4u + tig of a u.
template <class S>
struct FilterEpi {
    int capacity;
    int* cand_idx;
    u32* cand_val;
    int* count;
    Owned<S> own;
    u32 tkey0;                     // the threshold key of slot u = 0 (cached with one slot per lane)
    int cnt[S::U];                 // entries in this warp's buffer of the owned slot (same in the 8 lanes of a tig)

    __device__ __forceinline__ void begin(const Core<S>& c, int j0) {
        own.load(c, j0);
        tkey0 = own.t(0) >= 0 ? own.aux(0) : 0u;
#pragma unroll
        for (int u = 0; u < S::U; ++u) cnt[u] = 0;
    }
    __device__ __forceinline__ u32 tkey(int u) const { return Owned<S>::CACHE ? tkey0 : own.aux(u); }
    __device__ __forceinline__ uint2* buffer(const Core<S>& c, int jl) const {
        return c.s_stage + ((int)(threadIdx.x >> 5) * S::NJ + jl) * S::E;
    }
    // entries [0, n) of this warp's buffer of local slot jl to query t's candidates from index base
    __device__ __forceinline__ void copy_out(const Core<S>& c, int jl, int t, int base, int n) const {
        const uint2* buf = buffer(c, jl);
        const long long row = (long long)t * capacity;
        for (int k = (int)lane_id(); k < n; k += 32)
            if (base + k < capacity) {
                const uint2 e = buf[k];
                cand_idx[row + base + k] = (int)e.x;
                cand_val[row + base + k] = e.y;
            }
    }
    __device__ __forceinline__ void scores(const Core<S>& c, long long s_warp, const float (&v)[S::U][2]) {
        const int lane = (int)lane_id(), g = lane >> 2, tig = lane & 3;
        const int s0 = (int)s_warp + g, s1 = s0 + 8;                  // positions < L < 2^31: int compares
        const u32 mine = 0x11111111u << tig;                            // the lanes of my slot
#pragma unroll
        for (int u = 0; u < S::U; ++u) {
            // non-short-circuit &: straight-line selects, no branches in the common path
            const int t = own.t(u), a = t >= 0 ? own.a(u) : 0, b = t >= 0 ? own.b(u) : 0;
            const u32 tk = t >= 0 ? tkey(u) : 0u;
            const bool ok = t >= 0;
            const bool pass0 = ok & (s0 >= a) & (s0 < b) & (order_key(v[u][0]) >= tk);
            const bool pass1 = ok & (s1 >= a) & (s1 < b) & (order_key(v[u][1]) >= tk);
            const u32 m0 = __ballot_sync(FULL, pass0), m1 = __ballot_sync(FULL, pass1);
            if ((m0 | m1) == 0u) continue;                              // warp-uniform
            const int n0 = __popc(m0 & mine), tot = n0 + __popc(m1 & mine);
            const u32 fm = __ballot_sync(FULL, cnt[u] + tot > S::E);
            if (fm) {                                                   // a buffer is full: flush its run (rare)
                __syncwarp();
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (4 * u + q >= S::NJ || !((fm >> q) & 1u)) continue;   // lane q speaks for slot 4u + q
                    const int cq = __shfl_sync(FULL, cnt[u], q), tq = __shfl_sync(FULL, t, q);
                    int base = 0;
                    if (lane == q) base = atomicAdd(count + tq, cq);
                    base = __shfl_sync(FULL, base, q);
                    copy_out(c, 4 * u + q, tq, base, cq);
                    if (tig == q) cnt[u] = 0;
                }
                __syncwarp();
            }
            if (pass0 || pass1) {
                uint2* buf = buffer(c, 4 * u + tig);
                const u32 below = lanes_below_mask();
                if (pass0) buf[cnt[u] + __popc(m0 & mine & below)] = make_uint2((u32)s0, __float_as_uint(v[u][0]));
                if (pass1) buf[cnt[u] + n0 + __popc(m1 & mine & below)] = make_uint2((u32)s1, __float_as_uint(v[u][1]));
            }
            cnt[u] += tot;
        }
    }
    __device__ __forceinline__ void skipped(const Core<S>&, long long) {}
    // every buffer's run: all slots' atomics in flight together (lane q adds slot 4u + q)
    __device__ __forceinline__ void finish(const Core<S>& c) {
        __syncwarp();
        const int lane = (int)lane_id();
        int mybase[S::U];
#pragma unroll
        for (int u = 0; u < S::U; ++u) {
            mybase[u] = 0;
            if (lane < 4 && cnt[u] > 0) mybase[u] = atomicAdd(count + own.t(u), cnt[u]);
        }
#pragma unroll
        for (int u = 0; u < S::U; ++u)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                if (4 * u + q >= S::NJ) continue;
                const int cq = __shfl_sync(FULL, cnt[u], q), base = __shfl_sync(FULL, mybase[u], q);
                const int tq = __shfl_sync(FULL, own.t(u), q);
                if (cq > 0) copy_out(c, 4 * u + q, tq, base, cq);
            }
    }
};

// Dense: out[t, s] = score inside the context, -inf elsewhere (every s < L).
template <class S>
struct DenseEpi {
    u32* out;
    Owned<S> own;
    __device__ __forceinline__ void begin(const Core<S>& c, int j0) { own.load(c, j0); }
    __device__ __forceinline__ void scores(const Core<S>& c, long long s_warp, const float (&v)[S::U][2]) {
        const int g = (int)(lane_id() >> 2);
#pragma unroll
        for (int u = 0; u < S::U; ++u) {
            const int t = own.t(u);
            if (t < 0) continue;
            const int a = own.a(u), b = own.b(u);
            u32* row = out + (long long)t * c.L;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = (int)s_warp + g + 8 * e;
                if (s < c.L) row[s] = (s >= a && s < b) ? __float_as_uint(v[u][e]) : NEG_INF_BITS;
            }
        }
    }
    __device__ __forceinline__ void skipped(const Core<S>& c, long long s_warp) {   // 16 keys outside every context
        const int lane = (int)lane_id();
        const long long s = s_warp + (lane & 15);
        for (int jj = 0; jj < S::NJ; ++jj) {
            const int t = c.s_t[own.j0 + jj];
            if (t >= 0 && lane < 16 && s < c.L) out[(long long)t * c.L + s] = NEG_INF_BITS;
        }
    }
    __device__ __forceinline__ void finish(const Core<S>&) {}
};

// Recovery rows: buf[entry, s - a] for s in [a, min(b, a + stride)), entry = the slot's index in the query list.
template <class S>
struct RowsEpi {
    u32* buf;
    long long stride;
    Owned<S> own;
    __device__ __forceinline__ void begin(const Core<S>& c, int j0) { own.load(c, j0); }
    __device__ __forceinline__ void scores(const Core<S>& c, long long s_warp, const float (&v)[S::U][2]) {
        const int g = (int)(lane_id() >> 2), tig = (int)(lane_id() & 3);
#pragma unroll
        for (int u = 0; u < S::U; ++u) {
            if (own.t(u) < 0) continue;
            const long long a = own.a(u), end = min((long long)own.b(u), a + stride);   // the stored part of the row
            u32* row = buf + (long long)(c.group * S::QPB + own.j0 + 4 * u + tig) * stride - a;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = (int)s_warp + g + 8 * e;
                if (s >= a && s < end) row[s] = __float_as_uint(v[u][e]);
            }
        }
    }
    __device__ __forceinline__ void skipped(const Core<S>&, long long) {}
    __device__ __forceinline__ void finish(const Core<S>&) {}
};

// Score-only: the wrapping sum of the order keys of every in-context score.
template <class S>
struct ChecksumEpi {
    u64* checksum;
    u64 sum;
    Owned<S> own;
    __device__ __forceinline__ void begin(const Core<S>& c, int j0) { own.load(c, j0); }
    __device__ __forceinline__ void scores(const Core<S>&, long long s_warp, const float (&v)[S::U][2]) {
        const int g = (int)(lane_id() >> 2);
#pragma unroll
        for (int u = 0; u < S::U; ++u) {
            if (own.t(u) < 0) continue;
            const int a = own.a(u), b = own.b(u);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int s = (int)s_warp + g + 8 * e;
                if (s >= a && s < b) sum += order_key(v[u][e]);
            }
        }
    }
    __device__ __forceinline__ void skipped(const Core<S>&, long long) {}
    __device__ __forceinline__ void finish(const Core<S>&) {
        u64 s = sum;
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(FULL, s, off);
        if (lane_id() == 0 && s) atomicAdd(checksum, s);
    }
};

template <class In, int H, int D, int C>
using ShapeOf = Shape<H, D, In, C>;

#define HYTOPK_WS_ARGS                                                                                            \
    const typename In::elem *__restrict__ qt, const float *__restrict__ w, const typename In::elem *__restrict__ kt, \
        const float *__restrict__ kscale, long long L

template <class In, int H, int D, int C>
__device__ __forceinline__ void filter_body(HYTOPK_WS_ARGS, int n, const int* lo, const int* hi, const u32* T,
                                            int capacity, int* cand_idx, u32* cand_val, int* count, int runs) {
    typedef ShapeOf<In, H, D, C> S;
    extern __shared__ __align__(1024) unsigned char smem[];
    Core<S> core;
    core.init(smem, qt, w, kt, kscale, L, nullptr, n, lo, hi, runs);
    long long tile0;
    int ntiles;
    core.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;                                          // block-uniform
    if (threadIdx.x < S::QPB && core.s_t[threadIdx.x] >= 0)
        core.s_aux[threadIdx.x] = order_key_bits(T[core.s_t[threadIdx.x]]);
    __syncthreads();
    FilterEpi<S> epi;
    epi.capacity = capacity; epi.cand_idx = cand_idx; epi.cand_val = cand_val; epi.count = count;
    core.run_roles(tile0, ntiles, epi);
}

template <class In, int H, int D, int C>
__device__ __forceinline__ void dense_body(HYTOPK_WS_ARGS, int n, const int* lo, const int* hi, u32* out, int runs) {
    typedef ShapeOf<In, H, D, C> S;
    extern __shared__ __align__(1024) unsigned char smem[];
    Core<S> core;
    core.init(smem, qt, w, kt, kscale, L, nullptr, n, lo, hi, runs);
    long long t0, t1;
    const auto query = [&core](int j) { return (long long)core.s_t[j]; };
    if (!dense_run(L, core.glo, core.ghi, S::KT, S::TILES_PER_BLOCK, S::QPB, query, out, t0, t1, core.run)) return;
    if (t0 >= t1) return;                                             // block-uniform
    DenseEpi<S> epi;
    epi.out = out;
    core.run_roles(t0, (int)(t1 - t0), epi);
}

template <class In, int H, int D, int C>
__device__ __forceinline__ void rows_body(HYTOPK_WS_ARGS, const int* rows, int nrows, const int* lo, const int* hi,
                                          u32* buf, long long stride, int runs) {
    typedef ShapeOf<In, H, D, C> S;
    extern __shared__ __align__(1024) unsigned char smem[];
    Core<S> core;
    core.init(smem, qt, w, kt, kscale, L, rows, nrows, lo, hi, runs);
    long long tile0;
    int ntiles;
    core.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;
    RowsEpi<S> epi;
    epi.buf = buf;
    epi.stride = stride;
    core.run_roles(tile0, ntiles, epi);
}

template <class In, int H, int D, int C>
__device__ __forceinline__ void score_only_body(HYTOPK_WS_ARGS, int n, const int* lo, const int* hi, u64* checksum,
                                                int runs) {
    typedef ShapeOf<In, H, D, C> S;
    extern __shared__ __align__(1024) unsigned char smem[];
    Core<S> core;
    core.init(smem, qt, w, kt, kscale, L, nullptr, n, lo, hi, runs);
    long long tile0;
    int ntiles;
    core.union_tiles(tile0, ntiles);
    if (ntiles <= 0) return;
    ChecksumEpi<S> epi;
    epi.checksum = checksum;
    epi.sum = 0ull;
    core.run_roles(tile0, ntiles, epi);
}

// ------------------------------------------------------------------ gathered keys: replay, threshold
// One warpgroup per block scores query t at the key positions of its slots [jb, jb + nslots):
// key rows keys[pos_of(j)] (row-major [L, D]; pos -1: zeros) are gathered with cp.async into
// the core-matrix layout, STAGES buffers deep; the MMA has N = H (the query's rows) and the
// same partial_sums / quad_sums / finish_score as the scan epilogues, so every score has the
// filter's bits. emit(j, bits) takes slot j's score (-inf where pos = -1).
template <class In, int H, int D, int STAGES = 2>
struct GatherShape {
    static constexpr int ROW_BYTES = D * In::BYTES;
    static constexpr int CH = ROW_BYTES / 16;
    static constexpr int KSTEPS = ROW_BYTES / 32;
    static constexpr int GROUP_BYTES = CH * 128;
    static constexpr int Q_BYTES = H * ROW_BYTES;
    static constexpr int TILE_BYTES = 64 * ROW_BYTES;
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * TILE_BYTES + 4 * H + STAGES * 64 * 8;
};

template <class In, int H, int D>
struct ReplayShape : GatherShape<In, H, D, 2> {
    static constexpr int RT = 8;                             // 64-key tiles per block
};

template <class In, int H, int D, int STAGES, class PosOf, class Emit>
__device__ __forceinline__ void gather_scores(HYTOPK_WS_ARGS, int t, long long jb, long long nslots,
                                              const PosOf& pos_of, const Emit& emit, unsigned char* smem) {
    typedef GatherShape<In, H, D, STAGES> R;
    const int tid = (int)threadIdx.x;
    const int nt = (int)((nslots + 63) / 64);
    float* s_w = reinterpret_cast<float*>(smem + R::Q_BYTES + STAGES * R::TILE_BYTES);
    float* s_sc = s_w + H;                                   // [STAGES][64] half scales of the gathered keys
    int* s_pos = reinterpret_cast<int*>(s_sc + STAGES * 64); // [STAGES][64] their positions (-1: none)
    const u32 sq = smem_addr(smem), sk = sq + R::Q_BYTES;
    const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(qt) + (size_t)t * R::Q_BYTES;
    for (int i = tid; i < R::Q_BYTES / 16; i += 128) cp_async16(sq + 16u * i, qsrc + 16 * i, true);
    for (int i = tid; i < H; i += 128) s_w[i] = w[(long long)t * H + i];
    const unsigned char* keys = reinterpret_cast<const unsigned char*>(kt);     // row-major here
    const auto load = [&](int jt) {                          // every thread calls it (a barrier inside)
        const int buf = jt % STAGES;
        if (tid < 64) {                                      // each slot's position once, not once per chunk
            const long long j = jb + (long long)jt * 64 + tid;
            const int s = j < jb + nslots ? pos_of(j) : -1;
            s_pos[buf * 64 + tid] = s;
            s_sc[buf * 64 + tid] = s >= 0 ? half_scale_of<In>(kscale, s, L) : 0.0f;
        }
        __syncthreads();
        for (int i = tid; i < 64 * R::CH; i += 128) {
            const int r = (i / (8 * R::CH)) * 8 + (i & 7), c = (i >> 3) % R::CH;
            const int s = s_pos[buf * 64 + r];
            cp_async16(sk + buf * R::TILE_BYTES + 16u * i, keys + (s >= 0 ? (size_t)s * R::ROW_BYTES + c * 16 : 0), s >= 0);
        }
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {                  // q and the first STAGES - 1 tiles
        if (i < nt) load(i);
        cp_async_commit();
    }
    const int wi = tid >> 5, g = (int)(lane_id() >> 2), tig = (int)(lane_id() & 3);
    for (int jt = 0; jt < nt; ++jt) {
        // into buffer (jt - 1) % STAGES: every thread left it at the barrier ending tile jt - 1
        if (jt + STAGES - 1 < nt) load(jt + STAGES - 1);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        fence_proxy_async();
        __syncthreads();                                     // tile jt (and q, w) landed
        float d[H / 2];
        mma_chain<In, R::KSTEPS, R::GROUP_BYTES>(d, sk + (jt % STAGES) * R::TILE_BYTES, sq);
        wgmma_wait_all();
        float x[1][2], p[1][2];
        partial_sums<H, 1>(d, reinterpret_cast<const float2*>(s_w), x);
        quad_sums<1>(x, p);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int r = 16 * wi + g + 8 * e;
            const long long j = jb + (long long)jt * 64 + r;
            if (tig == 0 && j < jb + nslots) {
                const float v = finish_score(p[0][e], s_sc[(jt % STAGES) * 64 + r]);
                emit(j, s_pos[(jt % STAGES) * 64 + r] >= 0 ? __float_as_uint(v) : NEG_INF_BITS);
            }
        }
        __syncthreads();                                     // every thread is past buffer jt % STAGES before it is refilled
    }
    cp_async_wait<0>();
}

// Replay: query t = blockIdx.x, selected slots [64 RT y, 64 RT (y + 1)) of its k; idx = -1: -inf.
template <class In, int H, int D>
__device__ __forceinline__ void replay_body(HYTOPK_WS_ARGS, int n, const int* idx, int k, u32* out) {
    typedef ReplayShape<In, H, D> R;
    extern __shared__ __align__(1024) unsigned char smem[];
    const int t = (int)blockIdx.x;
    const long long jb = (long long)blockIdx.y * R::RT * 64;
    if (t >= n || jb >= k) return;
    const int* irow = idx + (long long)t * k;
    gather_scores<In, H, D, 2>(qt, w, kt, kscale, L, t, jb, min((long long)R::RT * 64, (long long)k - jb),
                               [&](long long j) { return irow[j]; },
                               [&](long long j, u32 v) { out[(long long)t * k + j] = v; }, smem);
}

// Threshold (stages 1-4 fused): query t = blockIdx.x scores its M evenly spaced samples
// p_j = lo + (j * c) // M (64-bit, as the contract says) into shared memory and takes the
// r-th best, as hytopk_threshold does (the first such sample in position order gives T's bits).
constexpr int WS_MAX_SAMPLES = 8192;

template <class In, int H, int D>
struct ThresholdShape : GatherShape<In, H, D, 3> {
    static constexpr int GATHER_BYTES = GatherShape<In, H, D, 3>::SMEM_BYTES;
    static constexpr int SMEM_BYTES_ALL = (GATHER_BYTES + 15) / 16 * 16 + 4 * WS_MAX_SAMPLES + 4 * RADIX
                                          + (int)sizeof(SelectScalars);
};

template <class In, int H, int D>
__device__ __forceinline__ void threshold_body(HYTOPK_WS_ARGS, int n, const int* lo, const int* hi, const int* M,
                                               const int* r, u32* T) {
    typedef ThresholdShape<In, H, D> TS;
    extern __shared__ __align__(1024) unsigned char smem[];
    const int t = (int)blockIdx.x;
    if (t >= n) return;
    const int Mt = M[t];
    const long long a = lo[t], c = (long long)hi[t] - a;
    if (Mt <= 0 || c <= 0) {                                 // no sampling: NaN lets every key through
        if (threadIdx.x == 0) T[t] = 0x7fc00000u;
        return;
    }
    u32* bits = reinterpret_cast<u32*>(smem + (TS::GATHER_BYTES + 15) / 16 * 16);
    u32* hist = bits + WS_MAX_SAMPLES;
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(hist + RADIX);
    const int m = min(Mt, WS_MAX_SAMPLES);
    gather_scores<In, H, D, 3>(qt, w, kt, kscale, L, t, 0, m,
                               [&](long long j) { return (int)(a + (j * c) / Mt); },
                               [&](long long j, u32 v) { bits[j] = v; }, smem);
    __syncthreads();
    write_rth_sample<false>(bits, m, r[t], hist, sc, T + t);
}


// ------------------------------------------------------------------ grouped threshold (issue 14)
// G adjacent queries per block (N = G * H rows of one MMA, G = min(NROWS / H, 8)). Per chunk of
// JC sample indices j (128 for G <= 2, else 64: a merge costs 4 barriers), the G queries'
// positions p_j = lo + (j * c) // M (64-bit) are merged into their union (distinct positions,
// ascending; adjacent causal queries share most of them, a shared context all of them) and
// appended to a ring of union rows; 64-row key tiles are cut from
// the ring across chunk boundaries (no partial tiles but the last), gathered with cp.async STAGES
// deep, and scored against all G queries by one MMA; query d keeps the score of row u where u holds
// its own sample j. The score path is gather_scores' (mma_chain, partial_sums, quad_sums,
// finish_score), so every sample has the filter's bits whatever row or tile it lands in. Scores go
// to scratch[t, j] (bits, [n, mcap]); then each query's r-th best by the in-shared-memory radix
// select, and T = the first such sample in position order, as threshold_body.
template <class In, int H, int D, int NROWS, int STAGES>
struct GroupThresholdShape {
    static constexpr int G = (NROWS / H) < 8 ? (NROWS / H) : 8;   // queries per block
    static constexpr int N = G * H;
    static_assert(N == 64 || N == 128 || N == 256, "grouped threshold: G * H must be 64, 128 or 256");
    static constexpr int JC = G <= 2 ? 128 : 64;                   // sample indices per chunk and query
    static constexpr int NSEG = JC / 32;                           // warp-sized segments per list
    static constexpr int RING = next_pow2(G * JC + 64);           // a chunk's union + a partial tile
    static constexpr int ROW_BYTES = D * In::BYTES;
    static constexpr int CH = ROW_BYTES / 16;
    static constexpr int KSTEPS = ROW_BYTES / 32;
    static constexpr int GROUP_BYTES = CH * 128;
    static constexpr int Q_BYTES = N * ROW_BYTES;
    static constexpr int TILE_BYTES = 64 * ROW_BYTES;
    static constexpr int TILE_OFF = Q_BYTES;
    static constexpr int W_OFF = TILE_OFF + STAGES * TILE_BYTES;              // [N] float
    static constexpr int SPOS_OFF = W_OFF + 4 * N;                             // [STAGES][64] int: position, -1 none
    static constexpr int SHS_OFF = SPOS_OFF + 4 * 64 * STAGES;                 // [STAGES][64] float: half scale
    static constexpr int LIST_OFF = SHS_OFF + 4 * 64 * STAGES;                 // [G][JC] int: a chunk's positions
    static constexpr int OP_OFF = LIST_OFF + 4 * G * JC;                       // [G][JC + 1] int: owned prefix
    static constexpr int HC_OFF = OP_OFF + 4 * G * (JC + 1);                   // [G][NSEG] int: owned per segment
    static constexpr int UPOS_OFF = HC_OFF + 4 * G * NSEG;                     // [RING] int: union positions
    static constexpr int QI_OFF = (UPOS_OFF + 4 * RING + 7) / 8 * 8;           // [G] ll c; [4][G] int t, m, M, lo
    static constexpr int HIST_OFF = QI_OFF + 8 * G + 4 * 4 * G;                // RADIX u32 + SelectScalars
    static constexpr int USLOT_OFF = HIST_OFF + 4 * RADIX + (int)sizeof(SelectScalars);   // [RING][G] short: j
    static constexpr int SSLOT_OFF = USLOT_OFF + 2 * RING * G;                 // [STAGES][64][G] short: j
    static constexpr int END = (SSLOT_OFF + 2 * 64 * G * STAGES + 15) / 16 * 16;
    // the select's sample keys reuse the key tiles when they are large enough
    static constexpr bool KEYS_IN_TILES = STAGES * TILE_BYTES >= 4 * WS_MAX_SAMPLES;
    static constexpr int KEYS_OFF = KEYS_IN_TILES ? TILE_OFF : END;
    static constexpr int SMEM_BYTES = KEYS_IN_TILES ? END : END + 4 * WS_MAX_SAMPLES;
    static_assert(SMEM_BYTES <= 227 * 1024, "grouped threshold: shared memory over 227 KiB");
};

// entries of the sorted row P[0 .. JC) below p (entries past a list's end hold 0x7fffffff)
template <int JC>
__device__ __forceinline__ int lower_rank(const int* P, int p) {
    int lb = 0;
#pragma unroll
    for (int step = JC / 2; step > 0; step >>= 1) lb += P[lb + step - 1] < p ? step : 0;
    return (lb == JC - 1 && P[JC - 1] < p) ? JC : lb;
}

// LINES (issue 14, *_lines kernels): a quarter warp copies 128 contiguous bytes of one row (whole
// sectors) instead of 8 rows x 16 bytes; the same tile layout, so the same bits (wgmma_ws_threshold.cu
// says why: the 16-byte copies are served a quarter warp at a time, and 8 rows x 16 bytes fetch each
// sector twice).
template <class In, int H, int D, int NROWS, int STAGES, bool LINES = false>
__device__ __forceinline__ void threshold_group_body(HYTOPK_WS_ARGS, int n, const int* lo, const int* hi, const int* M,
                                                     const int* r, int mcap, u32* scratch, u32* T) {
    typedef GroupThresholdShape<In, H, D, NROWS, STAGES> S;
    constexpr int G = S::G, JC = S::JC, RING = S::RING;
    constexpr int EPT = (G * JC + 127) / 128;                      // merge elements per thread
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = (int)threadIdx.x;
    const int t0 = (int)blockIdx.x * G;
    if (t0 >= n) return;
    float* s_w = reinterpret_cast<float*>(smem + S::W_OFF);
    int* s_spos = reinterpret_cast<int*>(smem + S::SPOS_OFF);
    float* s_shs = reinterpret_cast<float*>(smem + S::SHS_OFF);
    int* s_list = reinterpret_cast<int*>(smem + S::LIST_OFF);
    int* s_op = reinterpret_cast<int*>(smem + S::OP_OFF);
    int* s_hc = reinterpret_cast<int*>(smem + S::HC_OFF);
    int* s_upos = reinterpret_cast<int*>(smem + S::UPOS_OFF);
    long long* s_c = reinterpret_cast<long long*>(smem + S::QI_OFF);
    int* s_t = reinterpret_cast<int*>(s_c + G);
    int* s_m = s_t + G;                                            // samples scored (0: none)
    int* s_M = s_m + G;                                            // the M of the formula
    int* s_lo = s_M + G;
    u32* hist = reinterpret_cast<u32*>(smem + S::HIST_OFF);
    SelectScalars* sc = reinterpret_cast<SelectScalars*>(hist + RADIX);
    short* s_uslot = reinterpret_cast<short*>(smem + S::USLOT_OFF);
    short* s_sslot = reinterpret_cast<short*>(smem + S::SSLOT_OFF);
    u32* s_keys = reinterpret_cast<u32*>(smem + S::KEYS_OFF);
    const u32 sq = smem_addr(smem), sk = sq + S::TILE_OFF;

    if (tid < G) {
        const int t = t0 + tid;
        int Mt = 0, a = 0;
        long long c = 0;
        if (t < n) { Mt = M[t]; a = lo[t]; c = (long long)hi[t] - a; }
        const bool on = t < n && Mt > 0 && c > 0;
        s_t[tid] = t < n ? t : -1;
        s_M[tid] = on ? Mt : 1;
        s_m[tid] = on ? min(Mt, mcap) : 0;
        s_lo[tid] = a;
        s_c[tid] = on ? c : 0;
    }
    {   // q rows of the G queries (absent queries: zeros), then their weights
        const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(qt);
        constexpr int QCH = H * S::ROW_BYTES / 16;                 // 16-byte chunks per query
        for (int i = tid; i < G * QCH; i += 128) {
            const int d = i / QCH;
            const bool ok = t0 + d < n;
            cp_async16(sq + 16u * i, qsrc + (ok ? ((size_t)(t0 + d) * QCH + i % QCH) * 16 : 0), ok);
        }
        for (int i = tid; i < S::N; i += 128) s_w[i] = t0 + i / H < n ? w[(long long)(t0 + i / H) * H + i % H] : 0.0f;
    }
    __syncthreads();
    int nchunks = 0;
#pragma unroll
    for (int d = 0; d < G; ++d) nchunks = max(nchunks, (s_m[d] + JC - 1) / JC);

    // the ring of union rows: [head, tail) merged and not yet issued
    int head = 0, tail = 0, ci = 0, issued = 0;
    const auto merge = [&]() {                                     // chunk ci's union to [tail, tail + U)
        __syncthreads();                                           // every thread is done with the ring's last reads
        const long long j0 = (long long)ci * JC;
        for (int e = tid; e < G * JC; e += 128) {
            const int d = e / JC;
            const long long j = j0 + e % JC;
            s_list[e] = j < s_m[d] ? (int)(s_lo[d] + (j * s_c[d]) / s_M[d]) : 0x7fffffff;
        }
        for (int e = tid; e < G * JC * G; e += 128) s_uslot[((tail + e / G) & (RING - 1)) * G + e % G] = -1;
        __syncthreads();
        bool own[EPT];
        int below[EPT];
#pragma unroll
        for (int q = 0; q < EPT; ++q) {                            // owner: first in its list, in no list before
            const int e = q * 128 + tid;
            own[q] = false;
            if (e < G * JC) {                                      // warp-uniform (G * JC is a multiple of 32)
                const int d = e / JC, i = e % JC, p = s_list[e];
                bool o = p != 0x7fffffff && (i == 0 || s_list[e - 1] != p);
                for (int d2 = 0; d2 < d && o; ++d2) {
                    const int lb = lower_rank<JC>(s_list + d2 * JC, p);
                    o = !(lb < JC && s_list[d2 * JC + lb] == p);
                }
                own[q] = o;
                const u32 mask = __ballot_sync(0xffffffffu, o);
                below[q] = __popc(mask & lanes_below_mask());
                if (lane_id() == 0) s_hc[d * S::NSEG + i / 32] = __popc(mask);
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < EPT; ++q) {
            const int e = q * 128 + tid;
            if (e < G * JC) {
                const int d = e / JC, i = e % JC;
                int before = 0, all = 0;                           // owned in the list's earlier segments, in all
#pragma unroll
                for (int sg = 0; sg < S::NSEG; ++sg) {
                    const int h = s_hc[d * S::NSEG + sg];
                    before += sg < i / 32 ? h : 0;
                    all += h;
                }
                s_op[d * (JC + 1) + i] = before + below[q];
                if (i == JC - 1) s_op[d * (JC + 1) + JC] = all;
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < EPT; ++q) {                            // union rank = distinct positions below p
            const int e = q * 128 + tid;
            if (e < G * JC && s_list[e] != 0x7fffffff) {
                const int d = e / JC, p = s_list[e];
                int rank = 0;
                for (int d2 = 0; d2 < G; ++d2) rank += s_op[d2 * (JC + 1) + lower_rank<JC>(s_list + d2 * JC, p)];
                const int row = (tail + rank) & (RING - 1);
                if (own[q]) s_upos[row] = p;
                s_uslot[row * G + d] = (short)(j0 + e % JC);
            }
        }
        int U = 0;
#pragma unroll
        for (int d = 0; d < G; ++d) U += s_op[d * (JC + 1) + JC];
        tail += U;
        ++ci;
        __syncthreads();
    };
    const auto issue = [&]() -> bool {                             // every thread; block-uniform result
        while (tail - head < 64 && ci < nchunks) merge();          // a chunk's union has >= 1 row
        if (tail == head) return false;
        const int st = issued % STAGES;
        const int rows = min(64, tail - head);
        if (tid < 64) {
            const int row = (head + tid) & (RING - 1);
            const int s = tid < rows ? s_upos[row] : -1;
            s_spos[st * 64 + tid] = s;
            s_shs[st * 64 + tid] = s >= 0 ? half_scale_of<In>(kscale, s, L) : 0.0f;
#pragma unroll
            for (int d = 0; d < G; ++d)
                s_sslot[(st * 64 + tid) * G + d] = tid < rows ? s_uslot[row * G + d] : (short)-1;
        }
        const unsigned char* keys = reinterpret_cast<const unsigned char*>(kt);     // row-major here
        for (int i = tid; i < 64 * S::CH; i += 128) {
            int rr, c;
            u32 off;
            if constexpr (LINES && S::CH % 8 == 0) {               // quarter i / 8: row (i / 8) % 64, block (i / 8) / 64
                rr = (i >> 3) & 63;
                c = 8 * ((i >> 3) >> 6) + (i & 7);
                off = (u32)((rr >> 3) * S::GROUP_BYTES + c * 128 + (rr & 7) * 16);
            } else {
                rr = (i / (8 * S::CH)) * 8 + (i & 7);
                c = (i >> 3) % S::CH;
                off = 16u * i;
            }
            const int s = rr < rows ? s_upos[(head + rr) & (RING - 1)] : -1;
            cp_async16(sk + st * S::TILE_BYTES + off, keys + (s >= 0 ? (size_t)s * S::ROW_BYTES + c * 16 : 0), s >= 0);
        }
        head += rows;
        ++issued;
        return true;
    };

#pragma unroll 1
    for (int i = 0; i < STAGES - 1; ++i) {                         // q and the first STAGES - 1 tiles
        issue();
        cp_async_commit();
    }
    const int wi = tid >> 5, g = (int)(lane_id() >> 2), tig = (int)(lane_id() & 3);
    for (int it = 0; it < issued; ++it) {
        issue();                                                   // tile it + STAGES - 1, if any
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        fence_proxy_async();
        __syncthreads();                                           // tile it, its metadata, q and w landed
        const int st = it % STAGES;
        float d[S::N / 2];
        mma_chain<In, S::KSTEPS, S::GROUP_BYTES>(d, sk + st * S::TILE_BYTES, sq);
        wgmma_wait_all();
        float x[G][2], v[(G + 3) / 4][2];
        partial_sums<H, G>(d, reinterpret_cast<const float2*>(s_w), x);
        quad_sums<G>(x, v);
#pragma unroll
        for (int u = 0; u < (G + 3) / 4; ++u) {
            // the lane that speaks for query slot dq (quad_sums: G >= 4 slot 4u + tig; G = 2 slot tig & 1
            // in lanes tig, tig ^ 2; G = 1 every lane)
            const int dq = G >= 4 ? 4 * u + tig : (G == 2 ? (tig & 1) : 0);
            const bool speaks = G >= 4 ? dq < G : (G == 2 ? tig < 2 : tig == 0);
            if (!speaks) continue;
            const int t = s_t[dq];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int row = 16 * wi + g + 8 * e;
                const int j = s_sslot[(st * 64 + row) * G + dq];
                if (j >= 0 && t >= 0) {
                    const float sv = finish_score(v[u][e], s_shs[st * 64 + row]);
                    __stcs(scratch + (long long)t * mcap + j, __float_as_uint(sv));
                }
            }
        }
        __syncthreads();                                           // buffer st is free for the refill
    }
    cp_async_wait<0>();
    __syncthreads();                                               // the scratch rows are complete (block scope)
    for (int dq = 0; dq < G; ++dq) {                               // block-uniform
        const int t = s_t[dq], m = s_m[dq];
        if (t < 0) continue;
        if (m <= 0) {                                              // no sampling: NaN lets every key through
            if (tid == 0) T[t] = 0x7fc00000u;
            continue;
        }
        const u32* row = scratch + (long long)t * mcap;
        for (int base = 0; base < m; base += 128 * 16) {          // 16 loads in flight per thread, not one
            u32 v[16];
#pragma unroll
            for (int q = 0; q < 16; ++q) v[q] = base + q * 128 + tid < m ? __ldcg(row + base + q * 128 + tid) : 0u;
#pragma unroll
            for (int q = 0; q < 16; ++q)
                if (base + q * 128 + tid < m) s_keys[base + q * 128 + tid] = order_key_bits(v[q]);
        }
        __syncthreads();
        const u32 rank = (u32)min(max(r[t], 1), m);
        auto sample_key = [&](long long j, u32* out) { *out = s_keys[j]; return true; };
        const u32 kstar = block_radix_select<true, true>(sample_key, m, rank, hist, sc);
        const u32 need = sc->remaining;
        if (tid < 32) {                                            // the need-th sample (position order) with key K*
            u32 seen = 0u;
            for (int base = 0; base < m; base += 32) {
                const int j = base + (int)lane_id();
                const bool match = j < m && s_keys[j] == kstar;
                const u32 mask = __ballot_sync(FULL, match);
                if (seen + __popc(mask) >= need) {
                    if (match && seen + __popc(mask & lanes_below_mask()) + 1u == need) T[t] = __ldcg(row + j);
                    break;
                }
                seen += __popc(mask);
            }
        }
        __syncthreads();                                           // s_keys and the select's scratch are reused
    }
}

}  // namespace

// Put rows of 16 * ch bytes into the core-matrix layout: chunk c of row r to
// (r / 8) * (ch * 128) + c * 128 + (r % 8) * 16 bytes; rows [rows, rows_out) are zeros.
__global__ void hytopk_ws_pretile(const uint4* __restrict__ src, long long rows, int ch, long long rows_out,
                                  uint4* __restrict__ dst) {
    const long long total = rows_out * ch;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long grp = (i >> 3) / ch, row = grp * 8 + (i & 7);
        const int c = (int)((i >> 3) % ch);
        dst[i] = row < rows ? src[row * ch + c] : make_uint4(0u, 0u, 0u, 0u);
    }
}

// One kernel per (stage, input kind, consumers): threads Shape::THREADS (ReplayShape: 128),
// dynamic shared memory Shape::SMEM_BYTES; scan grids (groups * runs) along x.
#define HYTOPK_WS_KERNELS(SUFFIX, IN, C)                                                                          \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(128 * (C + 1), 1) hytopk_filter_##SUFFIX(                                 \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ kt,         \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                      \
        const int* __restrict__ hi, const u32* __restrict__ T, int capacity, int* __restrict__ cand_idx,      \
        u32* __restrict__ cand_val, int* __restrict__ count, int runs) {                                       \
        filter_body<IN, H, D, C>(qt, w, kt, kscale, L, n, lo, hi, T, capacity, cand_idx, cand_val, count, runs); \
    }                                                                                                          \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(128 * (C + 1), 1) hytopk_score_only_##SUFFIX(                             \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ kt,         \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                      \
        const int* __restrict__ hi, unsigned long long* __restrict__ checksum, int runs) {                     \
        score_only_body<IN, H, D, C>(qt, w, kt, kscale, L, n, lo, hi, checksum, runs);                        \
    }

#define HYTOPK_WS_MORE_KERNELS(SUFFIX, IN)                                                                        \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(640, 1) hytopk_dense_##SUFFIX(                                            \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ kt,         \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                      \
        const int* __restrict__ hi, u32* __restrict__ out, int runs) {                                         \
        dense_body<IN, H, D, 4>(qt, w, kt, kscale, L, n, lo, hi, out, runs);                                  \
    }                                                                                                          \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(640, 1) hytopk_score_rows_##SUFFIX(                                       \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ kt,         \
        const float* __restrict__ kscale, long long L, const int* __restrict__ rows, int nrows,                \
        const int* __restrict__ lo, const int* __restrict__ hi, u32* __restrict__ buf, long long stride,      \
        int runs) {                                                                                            \
        rows_body<IN, H, D, 4>(qt, w, kt, kscale, L, rows, nrows, lo, hi, buf, stride, runs);                 \
    }                                                                                                          \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(128) hytopk_replay_##SUFFIX(                                              \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ keys,       \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ idx, int k,              \
        u32* __restrict__ out) {                                                                               \
        replay_body<IN, H, D>(qt, w, keys, kscale, L, n, idx, k, out);                                        \
    }                                                                                                          \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(128) hytopk_threshold_##SUFFIX(                                           \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ keys,       \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                      \
        const int* __restrict__ hi, const int* __restrict__ M, const int* __restrict__ r,                      \
        u32* __restrict__ T) {                                                                                 \
        threshold_body<IN, H, D>(qt, w, keys, kscale, L, n, lo, hi, M, r, T);                                 \
    }

// Grouped threshold (threshold_group_body): 128 threads, GroupThresholdShape::SMEM_BYTES; grid ceil(n / G).
// N = 256 rows (G = 256 / H, at most 8) with 6 stages, or N = 128 with 4 (two blocks per SM).
#define HYTOPK_WS_GROUP_KERNEL(NAME, IN, NROWS, STAGES, LINES)                                                   \
    template <int H, int D>                                                                                    \
    __global__ void __launch_bounds__(128) NAME(                                                               \
        const IN::elem* __restrict__ qt, const float* __restrict__ w, const IN::elem* __restrict__ keys,       \
        const float* __restrict__ kscale, long long L, int n, const int* __restrict__ lo,                      \
        const int* __restrict__ hi, const int* __restrict__ M, const int* __restrict__ r, int mcap,            \
        u32* __restrict__ scratch, u32* __restrict__ T) {                                                      \
        threshold_group_body<IN, H, D, NROWS, STAGES, LINES>(qt, w, keys, kscale, L, n, lo, hi, M, r, mcap, scratch, T); \
    }
HYTOPK_WS_GROUP_KERNEL(hytopk_threshold_group_ws, Bf16, 256, 6, false)
HYTOPK_WS_GROUP_KERNEL(hytopk_threshold_group128_ws, Bf16, 128, 4, false)
HYTOPK_WS_GROUP_KERNEL(hytopk_threshold_group128_lines_ws, Bf16, 128, 4, true)

HYTOPK_WS_KERNELS(ws, Bf16, 4)
HYTOPK_WS_MORE_KERNELS(ws, Bf16)
HYTOPK_WS_KERNELS(ws_fp8, E4m3, 4)
HYTOPK_WS_MORE_KERNELS(ws_fp8, E4m3)
// two consumer warpgroups of N = 256 (bf16): the variant that shows what the 4-consumer split buys
HYTOPK_WS_KERNELS(ws2, Bf16, 2)
