// Thread-block clusters, distributed shared memory and the bulk copy (sm_90), each behind one small
// inline function: the only PTX of the cluster table kernel (table_v2.cu hytopk_table_cluster).
// The CPU emulation (tests/table_emulation/cuda_emu.h defines HYTOPK_CPU_EMULATION) supplies its
// own versions of exactly these functions.
#pragma once
#include "hytopk_order.cuh"

#ifndef HYTOPK_CPU_EMULATION
// their own namespace: hytopk::wgp has mbarrier wrappers of the same names (shared-memory addresses
// as u32), which these (pointers) must not hide
namespace hytopk {
namespace cl {

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// This block's rank in its cluster (%cluster_ctarank).
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster: writes before it (shared, distributed shared,
// global) are seen by every thread of the cluster after it. Called uniformly by all threads; the
// .aligned forms need the warp converged (lanes leave mbar_wait's spin at different times).
__device__ __forceinline__ void cluster_sync() {
    __syncwarp();
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The same shared-memory object in block `rank` of the cluster, as a generic pointer (ordinary
// loads, stores and atomics reach the other block's shared memory through it).
template <class T>
__device__ __forceinline__ T* cluster_map(T* p, u32 rank) {
    u64 r;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(reinterpret_cast<u64>(p)), "r"(rank));
    return reinterpret_cast<T*>(r);
}

// An mbarrier in this block's shared memory expecting `count` arrivals per phase; the fence makes
// the initialisation visible to the async proxy (the bulk copies) and the cluster.
__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also expects `bytes` more of transaction (the bulk copies that follow).
__device__ __forceinline__ void mbar_arrive_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Waits until the phase of parity `parity` of the mbarrier has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
    const u32 a = smem_u32(bar);
    u32 done = 0u;
    while (!done) {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
    }
}

// bytes (a multiple of 16, both addresses 16-byte aligned) from global to this block's shared
// memory by the copy engine; completes `bytes` of the mbarrier's transaction count.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

}  // namespace cl
}  // namespace hytopk
#endif
