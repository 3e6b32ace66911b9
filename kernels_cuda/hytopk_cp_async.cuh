// Shared-memory addresses and cp.async (16-byte global -> shared copies), for
// the mma_sync (hytopk_mma_sync.cuh) and wgmma (hytopk_wgmma.cuh) cores.
// Every PTX use is one small wrapper here: with HYTOPK_EMU_PTX defined (the CPU
// emulation, tests/wgmma_emulation) the emulation supplies them instead.
#pragma once
#include "hytopk_order.cuh"

namespace hytopk {

#ifndef HYTOPK_EMU_PTX
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
// the same, L2 fetching the 256-byte block around it (the next row chunks' sectors)
__device__ __forceinline__ void cp_async16_l2pf(u32 dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
// all of this thread's cp.async, committed or not
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// L2 prefetch of `bytes` (a multiple of 16) from a 16-byte aligned global address: no destination,
// no completion to wait for; a later copy of the same bytes then hits in L2
__device__ __forceinline__ void prefetch_l2_bulk(const void* src, u32 bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
// one arrival on mbarrier `bar` once all of this thread's earlier cp.async have landed (counted in its init)
__device__ __forceinline__ void cp_async_arrive_noinc(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(u32 addr, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void ld_shared_f32x2(u32 addr, float& a, float& b) {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(a), "=f"(b) : "r"(addr) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}
#endif  // HYTOPK_EMU_PTX

}  // namespace hytopk
