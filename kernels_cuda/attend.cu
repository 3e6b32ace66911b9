// Sparse attention over the selected keys (docs/CONTRACT.md §8): forward, backward, and the
// deterministic key reduction of the backward. Geometry and helpers: hytopk_attend.cuh.
//
// Forward (hytopk_attend_fwd): grid (query tiles, Hkv * head blocks). A tile is QPT adjacent
// queries; its key list is the query's idx row (QPT = 1: each slot one occurrence, -1 masked) or
// the pair's union row (QPT = 2: reference.attention.pair_union; mult[j][i] = how often query i
// selected key j, 0 masks it). Online softmax in float32 (base 2: logits * scale*log2e), P in bf16
// for the P.V MMA, out = O / l (correctly rounded division), lse = (m + log2 l) * ln 2.
//
// Backward (hytopk_attend_bwd, QPT = 1): P = exp2(s*scale_log2 - lse*log2e), dP = dO.V,
// dS = P (dP - delta) scale; dQ = dS.K accumulated per block in key-tile order (no atomics); the
// per-slot dK = dS^T.Q and dV = P^T.dO of the block go either to `part` (one row per
// (query, kv head, head block, slot): hytopk_attend_dkv_reduce sums them per key in a fixed
// order: bitwise reproducible) or, ATOMIC, straight into dk/dv with float atomics;
// hytopk_attend_bwd_hb2 lets two head blocks share one part row (the second adds the first's value).
// The key-major backward (GQA / MHA, few heads per kv head): hytopk_attend_bwd_dq (dq only, a query
// pair per block over its union) and hytopk_attend_dkv_keys (dK / dV one warp per key over the
// entries that selected it, in a fixed order: no part rows, no atomics).
// The pair's union: hytopk_attend_pair_union_bits (bitmaps, no sort), _reg / the first version (sorts).
#include "hytopk_attend.cuh"
using namespace hytopk;
using namespace hytopk::attend;

// Row r of a block -> (query index within the tile, head within the kv head's group) and whether
// it is real (not a padding row, a head past the group, or a query past n).
struct RowMap {
    int hb_heads, G, hb, t0, n, qpt;
    __device__ __forceinline__ int query(int r) const { return min(r / hb_heads, qpt - 1); }
    __device__ __forceinline__ int head(int r) const { return hb * hb_heads + r % hb_heads; }
    __device__ __forceinline__ bool real(int r) const {
        return r < qpt * hb_heads && head(r) < G && t0 + r / hb_heads < n;
    }
};

template <class S>
__device__ __forceinline__ void load_rows(u32 dst, int stride, int D, const bf16_t* __restrict__ src, const RowMap& rm,
                                          int Hq, int g) {
    const int C = D / 8;
    for (int i = threadIdx.x; i < S::ROWS * C; i += S::THREADS) {
        const int r = i / C, c = i - r * C;
        const bool ok = rm.real(r);
        const long long row = ok ? (long long)(rm.t0 + r / rm.hb_heads) * Hq + (long long)g * rm.G + rm.head(r) : 0;
        cp_async16(dst + (u32)((r * stride + c * 8) * 2), src + row * D + c * 8, ok);
    }
}

// --------------------------------------------------------------------------------- forward
// q [n, Hq, DQK] bf16; k rows at k + (s*Hkv + g)*... : k_stride = elements between keys, the kv
// head's row at + g*DQK (GQA [L, Hkv, DQK]) or MLA kv [L, DQK] (Hkv = 1); v likewise ([L, Hkv, DV]),
// unused when SHARED. list [tiles, U] int32, len: per-tile lengths (null: U), mult [tiles, U, 2]
// (null: QPT = 1). out [n, Hq, DV] (float or bf16 bits), lse [n, Hq] float.
// NACC: independent logit accumulators per n8 tile (k-steps round robin, summed at the end): 1 is
// one chain of DQK/16 dependent MMAs per tile (ncu: the forward's second stall at 8/16 heads, where
// a warp has one n8 tile); 2 halves the chain (other float rounding: the _acc2 kernels).
template <int MT, int NK, int DQK, int DV, int QPT, bool SHARED, bool OUT_BF16, int NACC>
__device__ __forceinline__ void
attend_fwd_body(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ list,
                const int* __restrict__ lens, const int* __restrict__ mult, int U, int n, long long L, int Hq,
                int Hkv, int hb_heads, float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    using S = Shape<MT, NK, DQK, DV, QPT, SHARED>;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tile = blockIdx.x;
    const int G = Hq / Hkv;
    const int nhb = (G + hb_heads - 1) / hb_heads;
    const int g = blockIdx.y / nhb, hb = blockIdx.y - g * nhb;
    const RowMap rm{hb_heads, G, hb, tile * QPT, n, QPT};

    const u32 sq = smem_addr(smem);
    const u32 sk0 = sq + S::Q_BYTES;
    const u32 sv0 = sk0 + 2 * S::K_BYTES;
    const u32 sp = sv0 + 2 * S::V_BYTES;
    float* red = reinterpret_cast<float*>(smem + S::Q_BYTES + 2 * S::K_BYTES + 2 * S::V_BYTES + S::P_BYTES);
    float* lred = red + S::NSPLIT * S::ROWS;
    float* mul0 = lred + S::NSPLIT * S::ROWS;

    const int* lst = list + (long long)tile * U;
    const int len = lens ? min(U, lens[tile]) : U;
    const int* mlt = mult ? mult + (long long)tile * U * 2 : nullptr;
    const bf16_t* kg = k + (long long)g * DQK;
    const bf16_t* vg = SHARED ? kg : v + (long long)g * DV;
    const long long vstr = SHARED ? k_stride : v_stride;
    const int ntiles = (len + NK - 1) / NK;

    load_rows<S>(sq, S::QS, DQK, q, rm, Hq, g);
    if (ntiles > 0)
        gather_tile<S>(sk0, sv0, mul0, lst, mlt, 0, len, L, kg, k_stride, vg, vstr);
    cp_async_commit();

    const int warp = (int)(threadIdx.x >> 5), lane = (int)lane_id();
    const int mt = warp / S::NSPLIT, spl = warp - mt * S::NSPLIT;
    const int gq = lane >> 2, tig = lane & 3;
    const int r0 = mt * 16 + gq, r1 = r0 + 8;                 // this lane's two rows
    const int j_r[2] = {rm.query(r0), rm.query(r1)};
    const u32 a_q = sq + (u32)(mt * 16 * S::QS * 2) + a_lane_off(S::QS);
    const u32 a_p = sp + (u32)(mt * 16 * S::PS * 2) + a_lane_off(S::PS);
    const u32 b_k = bn_lane_off(S::QS) + (u32)(spl * S::SK * S::QS * 2);
    const u32 b_v = bk_lane_off(S::VS);

    float m[2] = {neg_inf(), neg_inf()}, lsum[2] = {0.0f, 0.0f};
    float o[S::VNT][4];
#pragma unroll
    for (int i = 0; i < S::VNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][e] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
        const int st = it & 1;
        cp_async_wait<0>();
        __syncthreads();                                       // tile it landed; tile it-1 fully used
        if (it + 1 < ntiles)
            gather_tile<S>(sk0 + (u32)((st ^ 1) * S::K_BYTES), sv0 + (u32)((st ^ 1) * S::V_BYTES),
                           mul0 + (st ^ 1) * S::NK * S::QPT, lst, mlt, (it + 1) * NK, len, L, kg, k_stride, vg, vstr);
        cp_async_commit();
        const u32 sk = sk0 + (u32)(st * S::K_BYTES);
        const u32 sv = SHARED ? sk : sv0 + (u32)(st * S::V_BYTES);
        const float* mul = mul0 + st * S::NK * S::QPT;

        // logits of this warp's SK keys for its 16 rows
        float c[S::SNT][4];
#pragma unroll
        for (int nt = 0; nt < S::SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[nt][e] = 0.0f;
        if (NACC == 1) {
#pragma unroll 4
            for (int ks = 0; ks < DQK / 16; ++ks) {
                u32 a[4];
                ldsm_x4(a, a_q + (u32)(ks * 32));
#pragma unroll
                for (int nt = 0; nt < S::SNT; ++nt) {
                    u32 b0, b1;
                    ldsm_x2(b0, b1, sk + b_k + (u32)(nt * 8 * S::QS * 2 + ks * 32));
                    mma16816(c[nt], a, b0, b1);
                }
            }
        } else {
            static_assert(NACC == 1 || (NACC == 2 && DQK % 32 == 0), "attend: NACC 1, or 2 with DQK % 32 == 0");
            float c2[S::SNT][4];
#pragma unroll
            for (int nt = 0; nt < S::SNT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) c2[nt][e] = 0.0f;
#pragma unroll 2
            for (int ks = 0; ks < DQK / 16; ks += 2) {
                u32 a[4], a2[4];
                ldsm_x4(a, a_q + (u32)(ks * 32));
                ldsm_x4(a2, a_q + (u32)(ks * 32 + 32));
#pragma unroll
                for (int nt = 0; nt < S::SNT; ++nt) {
                    u32 b0, b1, b2, b3;
                    ldsm_x2(b0, b1, sk + b_k + (u32)(nt * 8 * S::QS * 2 + ks * 32));
                    ldsm_x2(b2, b3, sk + b_k + (u32)(nt * 8 * S::QS * 2 + ks * 32 + 32));
                    mma16816(c[nt], a, b0, b1);
                    mma16816(c2[nt], a2, b2, b3);
                }
            }
#pragma unroll
            for (int nt = 0; nt < S::SNT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) c[nt][e] += c2[nt][e];
        }
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int nt = 0; nt < S::SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = spl * S::SK + nt * 8 + tig * 2 + (e & 1);
                const float w = mul[col * S::QPT + j_r[e >> 1]];
                c[nt][e] = w > 0.0f ? c[nt][e] * scale_log2 : neg_inf();
                mx[e >> 1] = fmaxf(mx[e >> 1], c[nt][e]);
            }
        mx[0] = quad_max(mx[0]);
        mx[1] = quad_max(mx[1]);
        if (tig == 0) {
            red[spl * S::ROWS + r0] = mx[0];
            red[spl * S::ROWS + r1] = mx[1];
        }
        __syncthreads();
        float alpha[2], muse[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = h ? r1 : r0;
            float mt_ = neg_inf();
#pragma unroll
            for (int s2 = 0; s2 < S::NSPLIT; ++s2) mt_ = fmaxf(mt_, red[s2 * S::ROWS + r]);
            const float mnew = fmaxf(m[h], mt_);
            muse[h] = mnew == neg_inf() ? 0.0f : mnew;
            alpha[h] = exp2f(m[h] - muse[h]);                  // m = -inf (nothing yet): 0
            m[h] = mnew;
        }
        float ps[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < S::SNT; ++nt) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = spl * S::SK + nt * 8 + tig * 2 + (e & 1);
                const float w = mul[col * S::QPT + j_r[e >> 1]];
                p[e] = w > 0.0f ? w * exp2f(c[nt][e] - muse[e >> 1]) : 0.0f;
                ps[e >> 1] += p[e];
            }
            const int col = spl * S::SK + nt * 8 + tig * 2;
            *reinterpret_cast<u32*>(smem + S::Q_BYTES + 2 * S::K_BYTES + 2 * S::V_BYTES + (r0 * S::PS + col) * 2) =
                pack_bf16(p[0], p[1]);
            *reinterpret_cast<u32*>(smem + S::Q_BYTES + 2 * S::K_BYTES + 2 * S::V_BYTES + (r1 * S::PS + col) * 2) =
                pack_bf16(p[2], p[3]);
        }
        lsum[0] = lsum[0] * alpha[0] + ps[0];
        lsum[1] = lsum[1] * alpha[1] + ps[1];
#pragma unroll
        for (int i = 0; i < S::VNT; ++i) {
            o[i][0] *= alpha[0]; o[i][1] *= alpha[0];
            o[i][2] *= alpha[1]; o[i][3] *= alpha[1];
        }
        __syncthreads();                                       // P of every warp in shared memory
#pragma unroll
        for (int ks = 0; ks < NK / 16; ++ks) {
            u32 a[4];
            ldsm_x4(a, a_p + (u32)(ks * 32));
#pragma unroll
            for (int i = 0; i < S::VNT; ++i) {
                const int vt = spl * S::VNT + i;
                if (vt < S::DVT) {
                    u32 b0, b1;
                    ldsm_x2_t(b0, b1, sv + b_v + (u32)((ks * 16 * S::VS + vt * 8) * 2));
                    mma16816(o[i], a, b0, b1);
                }
            }
        }
    }
    cp_async_wait<0>();

    // l = the sum over the warps of the m-tile, in split order
    lsum[0] = quad_sum(lsum[0]);
    lsum[1] = quad_sum(lsum[1]);
    __syncthreads();
    if (tig == 0) {
        lred[spl * S::ROWS + r0] = lsum[0];
        lred[spl * S::ROWS + r1] = lsum[1];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = h ? r1 : r0;
        if (!rm.real(r)) continue;
        float l = 0.0f;
        for (int s2 = 0; s2 < S::NSPLIT; ++s2) l += lred[s2 * S::ROWS + r];
        const long long row = (long long)(rm.t0 + r / hb_heads) * Hq + (long long)g * G + rm.head(r);
#pragma unroll
        for (int i = 0; i < S::VNT; ++i) {
            const int vt = spl * S::VNT + i;
            if (vt >= S::DVT) continue;
            const float x0 = l > 0.0f ? __fdiv_rn(o[i][2 * h], l) : 0.0f;
            const float x1 = l > 0.0f ? __fdiv_rn(o[i][2 * h + 1], l) : 0.0f;
            const long long at = row * DV + vt * 8 + tig * 2;
            if (OUT_BF16)
                *reinterpret_cast<u32*>(reinterpret_cast<bf16_t*>(out) + at) = pack_bf16(x0, x1);
            else
                *reinterpret_cast<float2*>(reinterpret_cast<float*>(out) + at) = make_float2(x0, x1);
        }
        if (spl == 0 && tig == 0) {
            const float mm = m[h] == neg_inf() ? 0.0f : m[h];
            lse[row] = l > 0.0f ? (mm + log2f(l)) * 0.69314718055994531f : neg_inf();
        }
    }
}

template <int MT, int NK, int DQK, int DV, int QPT, bool SHARED, bool OUT_BF16>
__global__ void __launch_bounds__(256, 1)
hytopk_attend_fwd(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                  const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ list,
                  const int* __restrict__ lens, const int* __restrict__ mult, int U, int n, long long L, int Hq,
                  int Hkv, int hb_heads, float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    attend_fwd_body<MT, NK, DQK, DV, QPT, SHARED, OUT_BF16, 1>(q, k, k_stride, v, v_stride, list, lens, mult, U, n, L,
                                                              Hq, Hkv, hb_heads, scale_log2, out, lse);
}

template <int MT, int NK, int DQK, int DV, int QPT, bool SHARED, bool OUT_BF16>
__global__ void __launch_bounds__(256, 1)
hytopk_attend_fwd_acc2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                       const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ list,
                       const int* __restrict__ lens, const int* __restrict__ mult, int U, int n, long long L, int Hq,
                       int Hkv, int hb_heads, float scale_log2, void* __restrict__ out, float* __restrict__ lse) {
    attend_fwd_body<MT, NK, DQK, DV, QPT, SHARED, OUT_BF16, 2>(q, k, k_stride, v, v_stride, list, lens, mult, U, n, L,
                                                              Hq, Hkv, hb_heads, scale_log2, out, lse);
}

// --------------------------------------------------------------------------------- backward
// delta[row] = sum over d of dout[row, d] * out[row, d] (float32, fixed order: one warp per row,
// lane-strided partials, xor-butterfly); rows = n * Hq.
template <bool OUT_BF16>
__global__ void __launch_bounds__(256)
hytopk_attend_delta(const bf16_t* __restrict__ dout, const void* __restrict__ out, long long rows, int DV,
                    float* __restrict__ delta) {
    const long long row = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = (int)lane_id();
    float acc = 0.0f;
    for (int d = lane; d < DV; d += 32) {
        const float o = OUT_BF16 ? bf16_to_float(reinterpret_cast<const bf16_t*>(out)[row * DV + d])
                                 : reinterpret_cast<const float*>(out)[row * DV + d];
        acc = fmaf(bf16_to_float(dout[row * DV + d]), o, acc);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) delta[row] = acc;
}

// grid (queries t0 .. t0 + gridDim.x - 1, Hkv * head blocks). dq [n, Hq, DQK] float (written).
// ATOMIC: dk [L, Hkv, DQK] / dv [L, Hkv, DV] float += (SHARED: dk is MLA's dkv [L, DQK], dv unused);
// else part[((tl * Hkv + g) * nhb + hb) * U + slot][W] (W = DQK + (SHARED ? 0 : DV)) = this block's
// contribution of that slot (rows of masked slots are not written).
// MODE: BWD_PART (the part rows above), BWD_ATOMIC (dk/dv atomics) or BWD_PART_HB2: head blocks
// 2h and 2h+1 of a (query, kv head) share one part row ((tl * Hkv + g) * ceil(nhb / 2) + h) * U +
// slot, in a fixed order: block 2h stores its tile's rows and raises flags[1 + pair] to the tile
// count; block 2h+1 waits for that, then stores (2h's value + its own). Blocks take their work in
// launch order from the counter flags[0] (2h+1 waits only on a block that started before it), so
// the pair runs side by side and 2h's rows are still in L2 when 2h+1 reads them: half the part
// rows to write (and to read in the reduction) of BWD_PART, and no atomics.
// BWD_DQ: dq only (the key-major hytopk_attend_dkv_keys computes dK/dV apart).
enum { BWD_PART = 0, BWD_ATOMIC = 1, BWD_PART_HB2 = 2, BWD_DQ = 3 };

// QPT 2 (BWD_DQ only): a tile is a query pair over its union (list = the union rows, lens, mult as
// the forward's): each slot counts mult times for its query (dq += mult ds K), 0 masks it.
template <int MT, int NK, int DQK, int DV, bool SHARED, int MODE, int QPT = 1>
__device__ __forceinline__ void
attend_bwd_body(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ idx,
                const int* __restrict__ lens, const int* __restrict__ mult, int U, int n, int t0,
                long long L, int Hq, int Hkv, int hb_heads, float scale, float scale_log2,
                const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ part,
                int* __restrict__ flags) {
    static_assert(QPT == 1 || MODE == BWD_DQ, "attend_bwd: query pairs in the dq-only mode");
    using S = Shape<MT, NK, DQK, DV, QPT, SHARED>;
    extern __shared__ __align__(16) unsigned char smem[];
    const int G = Hq / Hkv;
    const int nhb = (G + hb_heads - 1) / hb_heads;
    int tl = blockIdx.x, by = blockIdx.y;
    if (MODE == BWD_PART_HB2) {                                // work in launch order (see above)
        __shared__ int sid;
        if (threadIdx.x == 0) sid = atomicAdd(flags, 1);
        __syncthreads();
        tl = sid / (Hkv * nhb);
        by = sid - tl * (Hkv * nhb);
    }
    const int t = t0 + tl;
    const int g = by / nhb, hb = by - g * nhb;
    const int nrow = (nhb + 1) >> 1;
    const bool lead = MODE == BWD_PART_HB2 && (hb & 1) == 0 && hb + 1 < nhb;   // raises the flag
    const bool follow = MODE == BWD_PART_HB2 && (hb & 1) == 1;                 // waits, adds
    int* const flag = MODE == BWD_PART_HB2 ? flags + 1 + ((long long)tl * Hkv + g) * nrow + (hb >> 1) : nullptr;
    const RowMap rm{hb_heads, G, hb, t * QPT, n, QPT};        // QPT 1: t * 1 = the query
    constexpr int W = DQK + (SHARED ? 0 : DV);

    const u32 sq = smem_addr(smem);
    const u32 sdo = sq + S::Q_BYTES;
    const u32 sk0 = sdo + S::DO_BYTES;
    const u32 sv0 = sk0 + 2 * S::K_BYTES;
    const u32 sp = sv0 + 2 * S::V_BYTES;
    const u32 sds = sp + S::P_BYTES;
    unsigned char* gen = smem + S::Q_BYTES + S::DO_BYTES + 2 * S::K_BYTES + 2 * S::V_BYTES + 2 * S::P_BYTES;
    float* slse = reinterpret_cast<float*>(gen);
    float* sdelta = slse + S::ROWS;
    float* mul0 = sdelta + S::ROWS;
    unsigned char* pbase = smem + S::Q_BYTES + S::DO_BYTES + 2 * S::K_BYTES + 2 * S::V_BYTES;

    const int* lst = idx + (long long)t * U;
    const int len = lens ? min(U, lens[t]) : U;
    const int* mlt = mult ? mult + (long long)t * U * 2 : nullptr;
    const bf16_t* kg = k + (long long)g * DQK;
    const bf16_t* vg = SHARED ? kg : v + (long long)g * DV;
    const long long vstr = SHARED ? k_stride : v_stride;
    const int ntiles = (len + NK - 1) / NK;

    load_rows<S>(sq, S::QS, DQK, q, rm, Hq, g);
    load_rows<S>(sdo, S::OS, DV, dout, rm, Hq, g);
    if (ntiles > 0)
        gather_tile<S>(sk0, sv0, mul0, lst, mlt, 0, len, L, kg, k_stride, vg, vstr);
    cp_async_commit();
    for (int r = threadIdx.x; r < S::ROWS; r += S::THREADS) {
        const bool ok = rm.real(r);
        const long long row = (long long)(rm.t0 + rm.query(r)) * Hq + (long long)g * G + rm.head(r);
        const float l = ok ? lse[row] : neg_inf();
        slse[r] = l * 1.4426950408889634f;                    // -inf: a row with no key (P = 0)
        sdelta[r] = ok ? delta[row] : 0.0f;
    }

    const int warp = (int)(threadIdx.x >> 5), lane = (int)lane_id();
    const int mt = warp / S::NSPLIT, spl = warp - mt * S::NSPLIT;
    const int gq = lane >> 2, tig = lane & 3;
    const int r0 = mt * 16 + gq, r1 = r0 + 8;
    const int j_r[2] = {rm.query(r0), rm.query(r1)};
    const u32 a_q = sq + (u32)(mt * 16 * S::QS * 2) + a_lane_off(S::QS);
    const u32 a_do = sdo + (u32)(mt * 16 * S::OS * 2) + a_lane_off(S::OS);
    const u32 a_ds = sds + (u32)(mt * 16 * S::PS * 2) + a_lane_off(S::PS);
    const u32 b_k = bn_lane_off(S::QS) + (u32)(spl * S::SK * S::QS * 2);
    const u32 b_v = bn_lane_off(S::VS) + (u32)(spl * S::SK * S::VS * 2);
    const u32 bt_k = bk_lane_off(S::QS);

    float dqa[S::QNT][4];
#pragma unroll
    for (int i = 0; i < S::QNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dqa[i][e] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
        const int st = it & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < ntiles)
            gather_tile<S>(sk0 + (u32)((st ^ 1) * S::K_BYTES), sv0 + (u32)((st ^ 1) * S::V_BYTES),
                           mul0 + (st ^ 1) * S::NK * QPT, lst, mlt, (it + 1) * NK, len, L, kg, k_stride, vg, vstr);
        cp_async_commit();
        const u32 sk = sk0 + (u32)(st * S::K_BYTES);
        const u32 sv = SHARED ? sk : sv0 + (u32)(st * S::V_BYTES);
        const float* mul = mul0 + st * S::NK * QPT;

        float c[S::SNT][4], dpa[S::SNT][4];
#pragma unroll
        for (int nt = 0; nt < S::SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[nt][e] = dpa[nt][e] = 0.0f;
#pragma unroll 4
        for (int ks = 0; ks < DQK / 16; ++ks) {
            u32 a[4];
            ldsm_x4(a, a_q + (u32)(ks * 32));
#pragma unroll
            for (int nt = 0; nt < S::SNT; ++nt) {
                u32 b0, b1;
                ldsm_x2(b0, b1, sk + b_k + (u32)(nt * 8 * S::QS * 2 + ks * 32));
                mma16816(c[nt], a, b0, b1);
            }
        }
#pragma unroll 4
        for (int ks = 0; ks < DV / 16; ++ks) {
            u32 a[4];
            ldsm_x4(a, a_do + (u32)(ks * 32));
#pragma unroll
            for (int nt = 0; nt < S::SNT; ++nt) {
                u32 b0, b1;
                ldsm_x2(b0, b1, sv + b_v + (u32)(nt * 8 * S::VS * 2 + ks * 32));
                mma16816(dpa[nt], a, b0, b1);
            }
        }
#pragma unroll
        for (int nt = 0; nt < S::SNT; ++nt) {
            float p[4], ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = spl * S::SK + nt * 8 + tig * 2 + (e & 1);
                const int r = (e >> 1) ? r1 : r0;
                const float ls = slse[r];
                const float w = mul[col * QPT + j_r[e >> 1]];         // QPT 1: 0 or 1 (the same bits)
                p[e] = (w > 0.0f && ls != neg_inf()) ? w * exp2f(c[nt][e] * scale_log2 - ls) : 0.0f;
                ds[e] = p[e] * (dpa[nt][e] - sdelta[r]) * scale;
            }
            const int col = spl * S::SK + nt * 8 + tig * 2;
            *reinterpret_cast<u32*>(pbase + (r0 * S::PS + col) * 2) = pack_bf16(p[0], p[1]);
            *reinterpret_cast<u32*>(pbase + (r1 * S::PS + col) * 2) = pack_bf16(p[2], p[3]);
            *reinterpret_cast<u32*>(pbase + S::P_BYTES + (r0 * S::PS + col) * 2) = pack_bf16(ds[0], ds[1]);
            *reinterpret_cast<u32*>(pbase + S::P_BYTES + (r1 * S::PS + col) * 2) = pack_bf16(ds[2], ds[3]);
        }
        if (follow && threadIdx.x == 0)                        // the lead's rows of this tile are in
            while (ld_acquire(flag) < it + 1) __nanosleep(32);
        __syncthreads();                                       // P and dS of every warp in shared memory

        // dQ += dS . K (this warp's column tiles), key-tile order
#pragma unroll
        for (int ks = 0; ks < NK / 16; ++ks) {
            u32 a[4];
            ldsm_x4(a, a_ds + (u32)(ks * 32));
#pragma unroll
            for (int i = 0; i < S::QNT; ++i) {
                const int qt = spl * S::QNT + i;
                if (qt < S::DQT) {
                    u32 b0, b1;
                    ldsm_x2_t(b0, b1, sk + bt_k + (u32)((ks * 16 * S::QS + qt * 8) * 2));
                    mma16816(dqa[i], a, b0, b1);
                }
            }
        }
        // per-slot dK = dS^T . Q and dV = P^T . dO: units (16 keys, 8 columns) spread over the warps
        constexpr int KMT = NK / 16, NCOL = W / 8, UNITS = MODE == BWD_DQ ? 0 : KMT * NCOL;
        for (int u = warp; u < UNITS; u += S::WARPS) {
            const int km = u / NCOL, nc = u - km * NCOL;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const bool kpart = nc < S::DQT;                     // a dK column tile
            const bool vpart = SHARED ? nc < S::DVT : !kpart;   // a dV column tile
            if (kpart) {
#pragma unroll 4
                for (int kr = 0; kr < MT; ++kr) {
                    u32 a[4], b0, b1;
                    ldsm_x4_t(a, sds + at_lane_off(S::PS) + (u32)((kr * 16 * S::PS + km * 16) * 2));
                    ldsm_x2_t(b0, b1, sq + bk_lane_off(S::QS) + (u32)((kr * 16 * S::QS + nc * 8) * 2));
                    mma16816(acc, a, b0, b1);
                }
            }
            if (vpart) {
                const int vc = SHARED ? nc : nc - S::DQT;
#pragma unroll 4
                for (int kr = 0; kr < MT; ++kr) {
                    u32 a[4], b0, b1;
                    ldsm_x4_t(a, sp + at_lane_off(S::PS) + (u32)((kr * 16 * S::PS + km * 16) * 2));
                    ldsm_x2_t(b0, b1, sdo + bk_lane_off(S::OS) + (u32)((kr * 16 * S::OS + vc * 8) * 2));
                    mma16816(acc, a, b0, b1);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int jj = km * 16 + gq + 8 * h;
                const int slot = it * NK + jj;
                if (mul[jj] <= 0.0f) continue;                 // masked slot (or past U)
                const long long s = __ldg(lst + slot);
                const int col = nc * 8 + tig * 2;
                if (MODE == BWD_ATOMIC) {
                    float* dst = (SHARED || kpart) ? dk + (s * Hkv + g) * DQK + col
                                                   : dv + (s * Hkv + g) * DV + (col - DQK);
                    atomicAdd(dst, acc[2 * h]);
                    atomicAdd(dst + 1, acc[2 * h + 1]);
                } else if (MODE == BWD_PART_HB2) {
                    const long long row = (((long long)tl * Hkv + g) * nrow + (hb >> 1)) * U + slot;
                    float2* dst = reinterpret_cast<float2*>(part + row * W + col);
                    float2 x = make_float2(acc[2 * h], acc[2 * h + 1]);
                    if (follow) {                               // the lead's value first: a fixed order
                        const float2 p0 = __ldcg(dst);
                        x = make_float2(p0.x + x.x, p0.y + x.y);
                    }
                    *dst = x;
                } else {
                    const long long row = (((long long)tl * Hkv + g) * nhb + hb) * U + slot;
                    *reinterpret_cast<float2*>(part + row * W + col) = make_float2(acc[2 * h], acc[2 * h + 1]);
                }
            }
        }
        if (lead) {                                            // this tile's rows visible, then the flag
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) st_release(flag, it + 1);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = h ? r1 : r0;
        if (!rm.real(r)) continue;
        const long long row = (long long)(rm.t0 + rm.query(r)) * Hq + (long long)g * G + rm.head(r);
#pragma unroll
        for (int i = 0; i < S::QNT; ++i) {
            const int qt = spl * S::QNT + i;
            if (qt < S::DQT)
                *reinterpret_cast<float2*>(dq + row * DQK + qt * 8 + tig * 2) = make_float2(dqa[i][2 * h], dqa[i][2 * h + 1]);
        }
    }
}

template <int MT, int NK, int DQK, int DV, bool SHARED, bool ATOMIC>
__global__ void __launch_bounds__(256, 1)
hytopk_attend_bwd(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                  const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ idx, int U, int n, int t0,
                  long long L, int Hq, int Hkv, int hb_heads, float scale, float scale_log2,
                  const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                  float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ part) {
    attend_bwd_body<MT, NK, DQK, DV, SHARED, ATOMIC ? BWD_ATOMIC : BWD_PART>
        (q, k, k_stride, v, v_stride, idx, nullptr, nullptr, U, n, t0, L, Hq, Hkv, hb_heads, scale, scale_log2, dout, lse, delta, dq, dk,
         dv, part, nullptr);
}

// dq alone (BWD_DQ): the query-major half of the key-major backward (hytopk_attend_dkv_keys).
// grid (tiles, Hkv * head blocks); QPT 1: list = idx [n, U], lens / mult null; QPT 2: list = the
// pairs' union rows [tiles, U], lens [tiles], mult [tiles, U, 2] (pair_union), as the forward.
template <int MT, int NK, int DQK, int DV, int QPT, bool SHARED>
__global__ void __launch_bounds__(256, 1)
hytopk_attend_bwd_dq(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                     const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ list,
                     const int* __restrict__ lens, const int* __restrict__ mult, int U, int n, long long L, int Hq,
                     int Hkv, int hb_heads, float scale, float scale_log2, const bf16_t* __restrict__ dout,
                     const float* __restrict__ lse, const float* __restrict__ delta, float* __restrict__ dq) {
    attend_bwd_body<MT, NK, DQK, DV, SHARED, BWD_DQ, QPT>
        (q, k, k_stride, v, v_stride, list, lens, mult, U, n, 0, L, Hq, Hkv, hb_heads, scale, scale_log2, dout, lse,
         delta, dq, nullptr, nullptr, nullptr, nullptr);
}

// Key-major dK / dV (GQA / MHA with few query heads per kv head): one warp per (key j, kv head g)
// walks the entries that selected j (entry = t * U + slot, ascending: `entry[starts[j] ..
// starts[j + 1])`, a fixed order) and recomputes, per query head h of the group, p = exp2(s *
// scale_log2 - lse log2e), dp = dO.V, ds = p (dp - delta) scale; dK[j, g] = sum ds Q[t, h],
// dV[j, g] = sum p dO[t, h], in float32, written once (rows no entry selected: 0). No part rows, no
// atomics: bitwise reproducible. Lanes: NG groups of LPG; group e takes entries e, e + NG, ...,
// UNR at a time with their loads issued first; lane i of a group holds dims (c * LPG + i) * 8 .. + 8
// of each chunk c, packed bf16 (widened at each use).
// The groups' sums are added in one fixed pattern at the end.
// (H200, MHA 128 / 128, n 1024, k 2048: LPG 8, UNR 1 3.35 ms; LPG 16, UNR 4 4.08 ms: the shuffles
// and widenings per entry, not the rows in flight, set its rate)
template <int DQK, int DV>
struct KeysShape {
    static constexpr int LPG = 8, NG = 32 / LPG;
    static constexpr int CK = DQK / (8 * LPG), CV = DV / (8 * LPG);     // 16-byte chunks per lane
    static constexpr int UNR = 1;
    static constexpr int MINB = CK + CV <= 4 ? 2 : 1;                  // 128 / 128: 2 blocks an SM, 128 registers
};

template <int DQK, int DV>
__global__ void __launch_bounds__(256, KeysShape<DQK, DV>::MINB)
hytopk_attend_dkv_keys(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                       const bf16_t* __restrict__ v, long long v_stride, const bf16_t* __restrict__ dout,
                       const float* __restrict__ lse, const float* __restrict__ delta, const int* __restrict__ entry,
                       const long long* __restrict__ starts, int U, long long L, int Hq, int Hkv, float scale,
                       float scale_log2, float* __restrict__ dk, float* __restrict__ dv) {
    static_assert(DQK % 64 == 0 && DV % 64 == 0, "dkv_keys: head dims multiples of 64");
    using KS = KeysShape<DQK, DV>;
    constexpr int LPG = KS::LPG, NG = KS::NG, CK = KS::CK, CV = KS::CV, UNR = KS::UNR;
    const long long w = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (w >= L * Hkv) return;
    const long long j = w / Hkv;
    const int g = (int)(w - j * Hkv), G = Hq / Hkv;
    const int lane = (int)lane_id(), eg = lane / LPG, li = lane % LPG;
    const u32 gmask = (LPG == 32 ? 0xffffffffu : ((1u << LPG) - 1u)) << (eg * LPG);
    auto ld = [](const bf16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); };
    auto lo = [](u32 x) { return __uint_as_float(x << 16); };
    auto hi = [](u32 x) { return __uint_as_float(x & 0xffff0000u); };
    auto dot = [&](const uint4& x, const uint4& y, float acc) {
        const u32 a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) acc = fmaf(hi(a[i]), hi(b[i]), fmaf(lo(a[i]), lo(b[i]), acc));
        return acc;
    };
    auto axpy = [&](float* acc, float c, const uint4& x) {   // acc += c x
        const u32 a[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[2 * i] = fmaf(c, lo(a[i]), acc[2 * i]);
            acc[2 * i + 1] = fmaf(c, hi(a[i]), acc[2 * i + 1]);
        }
    };
    uint4 kr[CK], vr[CV];
    float ak[CK * 8], av[CV * 8];
#pragma unroll
    for (int c = 0; c < CK; ++c) kr[c] = ld(k + j * k_stride + (long long)g * DQK + (c * LPG + li) * 8);
#pragma unroll
    for (int c = 0; c < CV; ++c) vr[c] = ld(v + j * v_stride + (long long)g * DV + (c * LPG + li) * 8);
#pragma unroll
    for (int i = 0; i < CK * 8; ++i) ak[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < CV * 8; ++i) av[i] = 0.0f;
    const long long a = starts[j], b = starts[j + 1];
    for (long long e0 = a + eg; e0 < b; e0 += NG * UNR) {     // entries e0 + NG u, u < UNR, of this group
        long long t[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) t[u] = e0 + NG * u < b ? entry[e0 + NG * u] / U : -1;
        for (int gg = 0; gg < G; ++gg) {
            uint4 qr[UNR][CK], orr[UNR][CV];
            float l[UNR], d[UNR];
#pragma unroll
            for (int u = 0; u < UNR; ++u) {
                const long long r = (t[u] < 0 ? t[0] : t[u]) * Hq + (long long)g * G + gg;
#pragma unroll
                for (int c = 0; c < CK; ++c) qr[u][c] = ld(q + r * DQK + (c * LPG + li) * 8);
#pragma unroll
                for (int c = 0; c < CV; ++c) orr[u][c] = ld(dout + r * DV + (c * LPG + li) * 8);
                l[u] = t[u] < 0 ? neg_inf() : __ldg(lse + r);   // past the list / no key: P = 0
                d[u] = __ldg(delta + r);
            }
#pragma unroll
            for (int u = 0; u < UNR; ++u) {
                float s = 0.0f, dp = 0.0f;
#pragma unroll
                for (int c = 0; c < CK; ++c) s = dot(qr[u][c], kr[c], s);
#pragma unroll
                for (int c = 0; c < CV; ++c) dp = dot(orr[u][c], vr[c], dp);
#pragma unroll
                for (int o = 1; o < LPG; o <<= 1) {
                    s += __shfl_xor_sync(gmask, s, o);
                    dp += __shfl_xor_sync(gmask, dp, o);
                }
                if (l[u] == neg_inf()) continue;                 // group-uniform
                const float p = exp2f(s * scale_log2 - l[u] * 1.4426950408889634f);
                const float ds = p * (dp - d[u]) * scale;
#pragma unroll
                for (int c = 0; c < CK; ++c) axpy(ak + 8 * c, ds, qr[u][c]);
#pragma unroll
                for (int c = 0; c < CV; ++c) axpy(av + 8 * c, p, orr[u][c]);
            }
        }
    }
#pragma unroll
    for (int o = LPG; o < 32; o <<= 1) {                       // the groups' sums, one fixed pattern
#pragma unroll
        for (int i = 0; i < CK * 8; ++i) ak[i] += __shfl_xor_sync(0xffffffffu, ak[i], o);
#pragma unroll
        for (int i = 0; i < CV * 8; ++i) av[i] += __shfl_xor_sync(0xffffffffu, av[i], o);
    }
    if (eg != 0) return;
#pragma unroll
    for (int c = 0; c < CK; ++c) {
        float4* dst = reinterpret_cast<float4*>(dk + (j * Hkv + g) * DQK + (c * LPG + li) * 8);
        dst[0] = make_float4(ak[8 * c], ak[8 * c + 1], ak[8 * c + 2], ak[8 * c + 3]);
        dst[1] = make_float4(ak[8 * c + 4], ak[8 * c + 5], ak[8 * c + 6], ak[8 * c + 7]);
    }
#pragma unroll
    for (int c = 0; c < CV; ++c) {
        float4* dst = reinterpret_cast<float4*>(dv + (j * Hkv + g) * DV + (c * LPG + li) * 8);
        dst[0] = make_float4(av[8 * c], av[8 * c + 1], av[8 * c + 2], av[8 * c + 3]);
        dst[1] = make_float4(av[8 * c + 4], av[8 * c + 5], av[8 * c + 6], av[8 * c + 7]);
    }
}

// The deterministic backward with head-block pairs sharing part rows (BWD_PART_HB2): a 1-D grid of
// (queries of the chunk) x Hkv x nhb blocks; flags [1 + chunk * Hkv * ceil(nhb / 2)] zeroed.
template <int MT, int NK, int DQK, int DV, bool SHARED>
__global__ void __launch_bounds__(256, 1)
hytopk_attend_bwd_hb2(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, long long k_stride,
                      const bf16_t* __restrict__ v, long long v_stride, const int* __restrict__ idx, int U, int n,
                      int t0, long long L, int Hq, int Hkv, int hb_heads, float scale, float scale_log2,
                      const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                      float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ part,
                      int* __restrict__ flags) {
    attend_bwd_body<MT, NK, DQK, DV, SHARED, BWD_PART_HB2>
        (q, k, k_stride, v, v_stride, idx, nullptr, nullptr, U, n, t0, L, Hq, Hkv, hb_heads, scale, scale_log2, dout, lse, delta, dq, dk,
         dv, part, flags);
}

// Deterministic key reduction: segment i (entries order[starts[i] .. starts[i+1]) of one key row
// dst_row[i], sorted by entry = fixed order) is added, in that order, onto the running sums.
// dk [rows, DQK] (+ dv [rows, DV] unless SHARED: part columns DQK.. go there).
template <bool SHARED>
__global__ void __launch_bounds__(256)
hytopk_attend_dkv_reduce(const float* __restrict__ part, int W, int DQK, int DV, const long long* __restrict__ order,
                         const long long* __restrict__ starts, const long long* __restrict__ dst_row, int nseg,
                         float* __restrict__ dk, float* __restrict__ dv) {
    const int sgm = blockIdx.x;
    if (sgm >= nseg) return;
    const long long a = starts[sgm], b = starts[sgm + 1], r = dst_row[sgm];
    for (int col = threadIdx.x + blockIdx.y * 256; col < W; col += 256 * gridDim.y) {
        float* dst = col < DQK ? dk + r * DQK + col : dv + r * DV + (col - DQK);
        float acc = *dst;
        for (long long e = a; e < b; ++e) acc += part[order[e] * W + col];
        *dst = acc;
    }
}

// hytopk_attend_dkv_reduce's sums (per column the same order: the same bits), one warp per
// segment: lane l takes the float4 column chunks l, l + 32, ... (W <= 128 RC, W % 4 == 0); the
// segment's entry ids come 32 at a time (one per lane, broadcast by shuffles) and two entries'
// rows are loaded (streaming: part is read once) before their adds, in order.
template <bool SHARED, int RC>
__global__ void __launch_bounds__(256)
hytopk_attend_dkv_reduce_warp(const float* __restrict__ part, int W, int DQK, int DV,
                              const long long* __restrict__ order, const long long* __restrict__ starts,
                              const long long* __restrict__ dst_row, int nseg, float* __restrict__ dk,
                              float* __restrict__ dv) {
    const int sgm = (int)blockIdx.x * 8 + (int)(threadIdx.x >> 5);
    if (sgm >= nseg) return;
    const int lane = (int)lane_id(), W4 = W >> 2;
    const long long a = starts[sgm], b = starts[sgm + 1], r = dst_row[sgm];
    auto dst = [&](int c) {                                    // this lane's c-th float4 of the key row
        const int col = 4 * (lane + 32 * c);
        return reinterpret_cast<float4*>(SHARED || col < DQK ? dk + r * DQK + col : dv + r * DV + (col - DQK));
    };
    auto add = [](float4& s, const float4& x) { s.x += x.x; s.y += x.y; s.z += x.z; s.w += x.w; };
    float4 acc[RC];
#pragma unroll
    for (int c = 0; c < RC; ++c) acc[c] = lane + 32 * c < W4 ? *dst(c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (long long e0 = a; e0 < b; e0 += 32) {
        const int m = (int)min(32LL, b - e0);
        const long long mine = lane < m ? order[e0 + lane] : 0;
        for (int j = 0; j < m; j += 2) {
            const long long e1 = __shfl_sync(0xffffffffu, mine, j);
            const long long e2 = __shfl_sync(0xffffffffu, mine, min(j + 1, m - 1));
            const float4* s1 = reinterpret_cast<const float4*>(part + e1 * W);
            const float4* s2 = reinterpret_cast<const float4*>(part + e2 * W);
            float4 x1[RC], x2[RC];
#pragma unroll
            for (int c = 0; c < RC; ++c) {
                if (lane + 32 * c < W4) {
                    x1[c] = __ldcs(s1 + lane + 32 * c);
                    x2[c] = __ldcs(s2 + lane + 32 * c);
                }
            }
#pragma unroll
            for (int c = 0; c < RC; ++c) {
                if (lane + 32 * c < W4) {
                    add(acc[c], x1[c]);
                    if (j + 1 < m) add(acc[c], x2[c]);
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < RC; ++c)
        if (lane + 32 * c < W4) *dst(c) = acc[c];
}

// The key list two adjacent queries share (reference.attention.pair_union, the `pair` variants'
// input): block p sorts the 2 kk entries (position << 1 | query) of queries 2p, 2p+1 (bitonic, in
// shared memory: N = a power of two >= max(256, 2 kk) keys), then writes the distinct positions in
// ascending order with how many slots of each query hold them; -1 / 0 past count[p].
// Positions must be < 2^30 (the host checks L); -1 or out-of-range slots are dropped.
__device__ __forceinline__ void
pair_union_sorted(const int* __restrict__ idx, int n, int kk, long long L, int N, int p, u32* key,
                  int* __restrict__ uidx, int* __restrict__ mult, int* __restrict__ count) {
    __shared__ int wsum[8];
    constexpr u32 NONE = 0xffffffffu;
    const int U = 2 * kk;
    for (int i = threadIdx.x; i < N; i += 256) {
        u32 kv = NONE;
        if (i < U) {
            const int tag = i >= kk ? 1 : 0;
            const int t = 2 * p + tag;
            if (t < n) {
                const long long s = idx[(long long)t * kk + (i - tag * kk)];
                if (s >= 0 && s < L) kv = ((u32)s << 1) | (u32)tag;
            }
        }
        key[i] = kv;
    }
    __syncthreads();
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < N / 2; i += 256) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool up = (lo & size) == 0;
                const u32 a = key[lo], b = key[hi];
                if ((a > b) == up) {
                    key[lo] = b;
                    key[hi] = a;
                }
            }
            __syncthreads();
        }
    }
    // one run of equal positions per union slot: heads counted per thread chunk, block-scanned
    const int per = N / 256, i0 = (int)threadIdx.x * per;
    auto head = [&](int i) { return key[i] != NONE && (i == 0 || (key[i] >> 1) != (key[i - 1] >> 1)); };
    int c = 0;
    for (int i = i0; i < i0 + per; ++i) c += head(i) ? 1 : 0;
    const int lane = (int)lane_id(), w = (int)(threadIdx.x >> 5);
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) wsum[w] = incl;
    __syncthreads();
    int slot = incl - c, total = 0;
    for (int j = 0; j < 8; ++j) {
        slot += j < w ? wsum[j] : 0;
        total += wsum[j];
    }
    const long long row = (long long)p * U;
    for (int i = i0; i < i0 + per; ++i) {
        if (!head(i)) continue;
        const u32 pos = key[i] >> 1;
        int c0 = 0, c1 = 0;
        for (int j = i; j < N && key[j] != NONE && (key[j] >> 1) == pos; ++j) (key[j] & 1u) ? ++c1 : ++c0;
        uidx[row + slot] = (int)pos;
        mult[2 * (row + slot)] = c0;
        mult[2 * (row + slot) + 1] = c1;
        ++slot;
    }
    for (int j = total + (int)threadIdx.x; j < U; j += 256) {
        uidx[row + j] = -1;
        mult[2 * (row + j)] = 0;
        mult[2 * (row + j) + 1] = 0;
    }
    if (threadIdx.x == 0) count[p] = total;
}

__global__ void __launch_bounds__(256)
hytopk_attend_pair_union(const int* __restrict__ idx, int n, int kk, long long L, int N, int* __restrict__ uidx,
                         int* __restrict__ mult, int* __restrict__ count) {
    extern __shared__ __align__(16) unsigned char smem[];
    pair_union_sorted(idx, n, kk, L, N, (int)blockIdx.x, reinterpret_cast<u32*>(smem), uidx, mult, count);
}

// hytopk_attend_pair_union's output without a sort, for contexts of at most 32 W keys: each query
// of the pair sets its keys' bits in its own W-word bitmap (atomicOr: the bitmaps do not depend on
// the order), then the union's words are scanned in key order: the set bits are the distinct
// positions, ascending. A key a query lists again (its bit already set) also sets a bit in the
// repeat bitmap and goes to a list of at most UNION_REPEATS repeats; a position with that bit gets
// its multiplicities counted from the list (counts do not depend on the list's order). The output
// is exactly the sort's. A block with more repeats sorts instead (pair_union_sorted).
// Shared memory: max(12 W + 4 UNION_REPEATS, 4 N) bytes.
constexpr int UNION_REPEATS = 512;
__global__ void __launch_bounds__(256)
hytopk_attend_pair_union_bits(const int* __restrict__ idx, int n, int kk, long long L, int W, int N,
                              int* __restrict__ uidx, int* __restrict__ mult, int* __restrict__ count) {
    extern __shared__ __align__(16) unsigned char smem[];
    u32* bm = reinterpret_cast<u32*>(smem);                    // [3][W]: query 0, query 1, repeated
    u32* rep = bm + 3 * W;                                     // [UNION_REPEATS]: (position << 1 | query)
    __shared__ int nrep, wsum[8];
    const int p = blockIdx.x, U = 2 * kk, tid = (int)threadIdx.x;
    for (int i = tid; i < 3 * W; i += 256) bm[i] = 0u;
    if (tid == 0) nrep = 0;
    __syncthreads();
    for (int i = tid; i < U; i += 256) {
        const int tag = i >= kk ? 1 : 0;
        const int t = 2 * p + tag;
        if (t >= n) continue;
        const long long s = __ldg(idx + (long long)t * kk + (i - tag * kk));
        if (s < 0 || s >= L) continue;
        const u32 bit = 1u << (s & 31);
        if (atomicOr(bm + tag * W + (s >> 5), bit) & bit) {     // a repeat of this query's key
            atomicOr(bm + 2 * W + (s >> 5), bit);
            const int r = atomicAdd(&nrep, 1);
            if (r < UNION_REPEATS) rep[r] = ((u32)s << 1) | (u32)tag;
        }
    }
    __syncthreads();
    const int nr = nrep;
    if (nr > UNION_REPEATS) {                                   // uniform: read after the barrier
        __syncthreads();
        pair_union_sorted(idx, n, kk, L, N, p, bm, uidx, mult, count);
        return;
    }
    // warp wp scans words [wp * WPW, ...): lane l takes word base + l, so the union's entries go out
    // nearly consecutive across the lanes (coalesced stores), in key order
    const int lane = (int)lane_id(), wp = tid >> 5, WPW = (W + 7) / 8;
    const int ws = min(W, wp * WPW), we = min(W, ws + WPW);
    int c = 0;
    for (int w = ws + lane; w < we; w += 32) c += __popc(bm[w] | bm[W + w]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if (lane == 0) wsum[wp] = c;
    __syncthreads();
    int slot0 = 0, total = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        slot0 += j < wp ? wsum[j] : 0;
        total += wsum[j];
    }
    const long long row = (long long)p * U;
    for (int wb = ws; wb < we; wb += 32) {
        const int w = wb + lane;
        const u32 b0 = w < we ? bm[w] : 0u, b1 = w < we ? bm[W + w] : 0u, br = w < we ? bm[2 * W + w] : 0u;
        const int cw = __popc(b0 | b1);
        int incl = cw;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        int slot = slot0 + incl - cw;
        slot0 += __shfl_sync(0xffffffffu, incl, 31);
        for (u32 u = b0 | b1; u; u &= u - 1) {
            const int bit = __ffs(u) - 1;
            int c0 = (b0 >> bit) & 1, c1 = (b1 >> bit) & 1;
            if ((br >> bit) & 1) {                              // repeated: count the list's copies
                const u32 pos = (u32)(w * 32 + bit);
                for (int r = 0; r < nr; ++r)
                    if ((rep[r] >> 1) == pos) (rep[r] & 1u) ? ++c1 : ++c0;
            }
            uidx[row + slot] = w * 32 + bit;
            *reinterpret_cast<int2*>(mult + 2 * (row + slot)) = make_int2(c0, c1);
            ++slot;
        }
    }
    for (int j = total + tid; j < U; j += 256) {
        uidx[row + j] = -1;
        *reinterpret_cast<int2*>(mult + 2 * (row + j)) = make_int2(0, 0);
    }
    if (tid == 0) count[p] = total;
}

// hytopk_attend_pair_union's output, sorted in registers: thread t holds entries t*R .. t*R+R-1 of the
// N = 256 R (<= 4096) packed entries; the bitonic network's strides < R are register swaps, < 32 R
// warp shuffles, and only the strides >= 32 R (6 of the 78 stages at N = 4096) go through shared
// memory (padded one word per 32: conflict-free for R <= 16). Any correct sort gives the same
// sorted array, so the output is identical to hytopk_attend_pair_union's.
template <int R>
__global__ void __launch_bounds__(256, 3)     // 3 blocks per SM: 80 registers at R = 16, no spills
hytopk_attend_pair_union_reg(const int* __restrict__ idx, int n, int kk, long long L, int* __restrict__ uidx,
                             int* __restrict__ mult, int* __restrict__ count) {
    static_assert(R == 1 || R == 2 || R == 4 || R == 8 || R == 16, "pair_union_reg: R a power of two <= 16");
    constexpr int N = 256 * R, LOGN = (R == 1 ? 8 : R == 2 ? 9 : R == 4 ? 10 : R == 8 ? 11 : 12);
    constexpr u32 NONE = 0xffffffffu;
    __shared__ u32 key[N + N / 32];
    __shared__ int wsum[8];
#define PU_AT(i) ((i) + ((i) >> 5))
    const int p = blockIdx.x, U = 2 * kk, tid = (int)threadIdx.x, i0 = tid * R;
    const int lane = (int)lane_id(), w = tid >> 5;
    u32 x[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = i0 + r;
        u32 kv = NONE;
        if (i < U) {
            const int tag = i >= kk ? 1 : 0;
            const int t = 2 * p + tag;
            if (t < n) {
                const long long s = __ldg(idx + (long long)t * kk + (i - tag * kk));
                if (s >= 0 && s < L) kv = ((u32)s << 1) | (u32)tag;
            }
        }
        x[r] = kv;
    }
#pragma unroll
    for (int ls = 1; ls <= LOGN; ++ls) {
        const int size = 1 << ls;
#pragma unroll
        for (int lt = ls - 1; lt >= 0; --lt) {
            const int stride = 1 << lt;
            if (stride < R) {                                   // both entries in this thread
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (r & stride) continue;
                    // (i0 + r) & size: r's bit below R (compile time), i0's from R up (one per thread)
                    const bool up = size < R ? (r & size) == 0 : (i0 & size) == 0;
                    const u32 a = x[r], b = x[r | stride];
                    x[r] = up ? min(a, b) : max(a, b);
                    x[r | stride] = up ? max(a, b) : min(a, b);
                }
            } else if (stride < 32 * R) {                       // partner lane
                const int lm = stride / R;
                const bool keep_min = ((lane & lm) == 0) == ((i0 & size) == 0);   // size > R: one per thread
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const u32 y = __shfl_xor_sync(0xffffffffu, x[r], lm);
                    x[r] = keep_min ? min(x[r], y) : max(x[r], y);
                }
            } else {                                            // partner warp: through shared memory
                __syncthreads();                                // earlier readers are done
#pragma unroll
                for (int r = 0; r < R; ++r) key[PU_AT(i0 + r)] = x[r];
                __syncthreads();
                const bool keep_min = ((i0 & stride) == 0) == ((i0 & size) == 0);   // stride >= 32 R > r
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const u32 y = key[PU_AT((i0 + r) ^ stride)];
                    x[r] = keep_min ? min(x[r], y) : max(x[r], y);
                }
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) key[PU_AT(i0 + r)] = x[r];
    __syncthreads();
    // one run of equal positions per union slot: heads counted per thread, block-scanned
    int c = 0;
    u32 prev = tid == 0 ? NONE : key[PU_AT(i0 - 1)];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        c += (x[r] != NONE && (prev == NONE || (x[r] >> 1) != (prev >> 1))) ? 1 : 0;
        prev = x[r];
    }
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) wsum[w] = incl;
    __syncthreads();
    int slot = incl - c, total = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        slot += j < w ? wsum[j] : 0;
        total += wsum[j];
    }
    const long long row = (long long)p * U;
    prev = tid == 0 ? NONE : key[PU_AT(i0 - 1)];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u32 cur = x[r];
        const bool head = cur != NONE && (prev == NONE || (cur >> 1) != (prev >> 1));
        prev = cur;
        if (!head) continue;
        const u32 pos = cur >> 1;
        int c0 = 0, c1 = 0;                                     // the run: query 0's entries first
        for (int j = i0 + r; j < N; ++j) {
            const u32 e = key[PU_AT(j)];
            if (e == NONE || (e >> 1) != pos) break;
            (e & 1u) ? ++c1 : ++c0;
        }
        uidx[row + slot] = (int)pos;
        *reinterpret_cast<int2*>(mult + 2 * (row + slot)) = make_int2(c0, c1);
        ++slot;
    }
    for (int j = total + tid; j < U; j += 256) {
        uidx[row + j] = -1;
        *reinterpret_cast<int2*>(mult + 2 * (row + j)) = make_int2(0, 0);
    }
    if (tid == 0) count[p] = total;
#undef PU_AT
}
