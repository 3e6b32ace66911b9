// Shared-memory addresses and cp.async (16-byte global -> shared copies), for
// the mma_sync (hytopk_mma_sync.cuh) and wgmma (hytopk_wgmma.cuh) cores.
#pragma once
#include "hytopk_order.cuh"

namespace hytopk {

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared; valid = false zero-fills and reads nothing.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace hytopk
