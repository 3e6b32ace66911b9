// What every wgmma core (sm_90a) shares: the generated mma wrappers, the
// warpgroup fence/commit/wait, matrix descriptors, named barriers, and the
// mbarrier + bulk-copy (TMA engine) primitives of the warp-specialised core.
// Every PTX use is one small wrapper (guarded by HYTOPK_EMU_PTX): the CPU emulation
// (tests/wgmma_emulation) supplies its own versions of them.
#pragma once
#include "hytopk_order.cuh"
#include "hytopk_wgmma_ptx.cuh"
#include "hytopk_cp_async.cuh"

namespace hytopk {
namespace wgp {

#ifndef HYTOPK_EMU_PTX
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>        // until at most N committed groups of this warpgroup are pending
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// ordinary (cp.async) writes to shared memory become visible to the tensor cores' async proxy
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// the hardware's approximate reciprocal (MUFU.RCP), the first step of div.rn.f32's fast path
__device__ __forceinline__ float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Named barriers (0 is __syncthreads): `threads` of the block, a multiple of 32.
__device__ __forceinline__ void bar_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int threads) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }
#endif  // HYTOPK_EMU_PTX

// Matrix descriptor: no swizzle, K-major; addresses and offsets in 16-byte units.
// Core-matrix layout (both operands): 8 rows x 16 bytes stored as 128 contiguous bytes;
// chunk c of row r at (r / 8) * (CH * 128) + c * 128 + (r % 8) * 16, CH = 16-byte chunks
// per row: leading offset (next 16 bytes of K) 128, stride offset (next 8 rows) CH * 128.
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lead, u32 stride) {
#ifdef HYTOPK_WG_SWAP_OFFSETS          // probe: the two offsets' roles swapped
    const u32 t = lead; lead = stride; stride = t;
#endif
    return (u64)((addr >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) | ((u64)((stride >> 4) & 0x3fffu) << 32);
}

// ---- mbarriers (shared::cta addresses) and the bulk copy engine
#ifndef HYTOPK_EMU_PTX
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// makes the initialised barriers visible to the async proxy (the bulk copies complete on them)
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// one arrival that also expects `bytes` of bulk-copy transactions in the current phase
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// 1 once the phase of parity `parity` has completed (a bounded wait in hardware), else 0
__device__ __forceinline__ u32 mbar_try_wait(u32 bar, u32 parity) {
    u32 done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
// the same with acquire at cluster scope (a barrier that also gets a peer block's arrivals)
__device__ __forceinline__ u32 mbar_try_wait_cluster(u32 bar, u32 parity) {
    u32 done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
// global -> shared bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned),
// completing as transactions on mbarrier `bar`
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Register budgets of warp-specialised roles (the kernel needs __launch_bounds__(threads, 1)).
template <int REGS>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

// ---- clock, trap, conversions
__device__ __forceinline__ u32 globaltimer_lo() {
    u32 t;
    asm volatile("mov.u32 %0, %%globaltimer_lo;\n" : "=r"(t));
    return t;
}
__device__ __forceinline__ void device_trap() { asm volatile("trap;"); }
// a value the compiler cannot treat as loop-invariant (keeps arithmetic on it inside a loop)
__device__ __forceinline__ u32 opaque_u32(u32 x) {
    u32 r;
    asm volatile("mov.u32 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}
// two floats -> packed bf16x2 (round to nearest even), lo in the low half
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 16 bytes to global memory: four float reductions in one (relaxed, gpu scope; sm_90) / one store
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void st_global_v4(float* p, float a, float b, float c, float d) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// 8 bytes: two float reductions in one / one store; 4 bytes (a packed bf16 pair)
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_global_v2(float* p, float a, float b) {
    asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void st_global_u32(void* p, u32 v) {
    asm volatile("st.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Shared -> global bulk operations of the TMA (sm_90; 16-byte aligned, bytes a multiple of 16), done
// per thread in bulk groups: a plain copy, or float additions at L2. The source must be made visible to
// the async proxy first (fence_proxy_async by the threads that stored it, then their barrier);
// bulk_wait_read: the sources may be reused, bulk_wait: the writes are done.
__device__ __forceinline__ void bulk_s2g(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_s2g_add_f32(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }

// ---- flags between the blocks of one launch (global ints, gpu scope): a ticket (the order the blocks
// started in, whatever order the hardware picked), a release add, an acquire read; the fences a
// block's generic stores need before its release (fence_gpu) and an acquirer's TMA reads after it
// (fence_proxy_async_global)
__device__ __forceinline__ u32 ticket_take(u32* p) {
    u32 r;
    asm volatile("atom.global.add.u32 %0, [%1], 1;\n" : "=r"(r) : "l"(p) : "memory");
    return r;
}
__device__ __forceinline__ void flag_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int flag_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// ---- 2-CTA clusters
__device__ __forceinline__ u32 cluster_ctarank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// all threads of the cluster's blocks (each warp converged)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// this block's shared address `a` as the same offset in block `rank`'s shared memory (shared::cluster)
__device__ __forceinline__ u32 map_peer(u32 a, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ void mbar_arrive_remote(u32 cluster_bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// `bytes` of this block's shared memory at src into the peer's (dst, shared::cluster), completing as
// transaction bytes on the peer's mbarrier (shared::cluster)
__device__ __forceinline__ void bulk_s2peer(u32 dst, u32 src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}
#endif  // HYTOPK_EMU_PTX

// until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    while (!mbar_try_wait(bar, parity)) {}
}
// the same, but a trap (a launch error) instead of a hang when the phase never completes (2 s;
// the clock is read only once the first poll failed); CLUSTER_ACQ: acquire at cluster scope (a
// barrier that also gets a peer block's arrivals)
template <bool CLUSTER_ACQ = false>
__device__ __forceinline__ void mbar_wait_or_trap(u32 bar, u32 parity) {
    u32 done, t0 = 0;
    bool timed = false;
    do {
        done = CLUSTER_ACQ ? mbar_try_wait_cluster(bar, parity) : mbar_try_wait(bar, parity);
        if (!done) {
            if (!timed) { t0 = globaltimer_lo(); timed = true; }
            else if (globaltimer_lo() - t0 > 2000000000u) device_trap();
        }
    } while (!done);
}

// until *p >= v (acquire at gpu scope), a trap (a launch error) instead of a hang after 2 s
__device__ __forceinline__ void flag_wait_or_trap(const int* p, int v) {
    u32 t0 = 0;
    bool timed = false;
    while (flag_acquire(p) < v) {
        if (!timed) { t0 = globaltimer_lo(); timed = true; }
        else if (globaltimer_lo() - t0 > 2000000000u) device_trap();
    }
}

// o / l at three FMAs per quotient: div.rn.f32's fast path with the refined reciprocal made once per
// divisor (rcp_refined) instead of once per quotient. Here l is ~1 or more (the row max's term is
// exp2(~0)) and the quotient is correctly rounded while the residual fma(-l, q, o) stays a normal
// float: |o| above ~2^-100. Below that the flushed residual can leave it 1 ulp off __fdiv_rn (which
// takes its slow path there); a -0 dividend gives +0. __fdiv_rn inlined 128 times (reciprocal,
// range check, branch each) took ~9 % of version 3's samples (its epilogue: ncu,
// results/h200-2026-12-02-s6 run 2).
__device__ __forceinline__ float rcp_refined(float l) {
    const float r0 = rcp_approx(l);
    return fmaf(r0, fmaf(-l, r0, 1.0f), r0);
}
__device__ __forceinline__ float div_rn_by(float o, float l, float r) {
    const float q = fmaf(o, r, 0.0f);
    return fmaf(r, fmaf(-l, q, o), q);
}

// The MLA forwards' bf16 out (64 rows x 512), staged in shared memory at `ost` (64 KiB): each
// consumer thread stores its packed pairs (stage_out_bf16: row r, 16-byte chunk c of the row at slot
// c ^ (r % 8), conflict-free for the fragments' stores and for the copy's loads), then the 256
// consumer threads send whole rows in 16-byte stores (copy_out_bf16; row_of as attend_block_row).
// The fragments' own 4-byte global stores had stalled on the store queue (ncu: lg, ~4 % of version
// 3's samples, results/h200-2026-12-02-s6 run 3).
__device__ __forceinline__ void stage_out_bf16(u32 ost, int r, int chunk, int tig, u32 packed) {
    st_shared_u32(ost + (u32)(r * 1024) + ((u32)(chunk ^ (r & 7)) << 4) + (u32)(tig * 4), packed);
}
template <typename RowOf>
__device__ __forceinline__ void copy_out_bf16(u32 ost, RowOf row_of, unsigned short* out, int tid) {
#pragma unroll 4
    for (int i = tid; i < 64 * 64; i += 256) {                            // 64 chunks per row
        const int r = i >> 6, c = i & 63;
        long long row;
        if (!row_of(r, row)) continue;
        const uint4 v = ld_shared_v4(ost + (u32)(r * 1024) + ((u32)(c ^ (r & 7)) << 4));
        *reinterpret_cast<uint4*>(out + row * 512 + c * 8) = v;
    }
}

// The MLA forwards' out for one of a consumer thread's two rows (h: r0 or r1 of the 64 x 256
// accumulator fragment o, columns 256 c ..): O / l, bf16 staged at `ost` for copy_out_bf16, float
// written to its row of `out` ([., 512]); l = 0 (no key): zeros.
template <bool OUT_BF16>
__device__ __forceinline__ void attend_out_row(const float (&o)[128], int h, int r, long long row, float l, int c,
                                               int tig, u32 ost, void* out) {
    const float rl = l > 0.0f ? rcp_refined(l) : 0.0f;
#pragma unroll
    for (int nb = 0; nb < 32; ++nb) {
        const float x0 = l > 0.0f ? div_rn_by(o[4 * nb + 2 * h], l, rl) : 0.0f;
        const float x1 = l > 0.0f ? div_rn_by(o[4 * nb + 2 * h + 1], l, rl) : 0.0f;
        if (OUT_BF16)
            stage_out_bf16(ost, r, c * 32 + nb, tig, pack_bf16x2(x0, x1));
        else
            *reinterpret_cast<float2*>(reinterpret_cast<float*>(out) + row * 512 + c * 256 + nb * 8 + tig * 2) =
                make_float2(x0, x1);
    }
}

// Row r of an attention block (the MLA forwards, 64 rows): QPT 1, head h0 + r of query t; QPT 2 (a
// query pair, Hq <= 32), head r % Hq of query 2t + r / Hq. Its row of q / out / lse in `row`;
// false: a zero row (past the heads, or the absent second query of an odd n).
template <int QPT>
__device__ __forceinline__ bool attend_block_row(int t, int h0, int r, int Hq, int n, long long& row) {
    if (QPT == 1) {
        row = (long long)t * Hq + h0 + r;
        return h0 + r < Hq;
    }
    const int j = r / Hq, tq = 2 * t + j;
    row = (long long)tq * Hq + (r - j * Hq);
    return j < 2 && tq < n;
}

}  // namespace wgp
}  // namespace hytopk
