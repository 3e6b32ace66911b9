// Order keys (docs/CONTRACT.md §2) and small integer helpers shared by every kernel.
// Every comparison of scores goes through the 32-bit key: integer compares are
// immune to flush-to-zero, NaN and signed zero.
#pragma once

namespace hytopk {

typedef unsigned int u32;
typedef unsigned long long u64;

// bits of a float32 score -> order key (bigger key = better score).
// -0.0 ranks as +0.0; every NaN gets key 0 (below -inf).
// Branch-free (selects): it sits in the hot loop of the fused filters.
__device__ __forceinline__ u32 order_key_bits(u32 bits) {
    u32 key = bits ^ ((u32)((int)bits >> 31) | 0x80000000u);  // sign 1: ~bits; sign 0: bits ^ 0x80000000
    key = bits == 0x80000000u ? 0x80000000u : key;           // -0.0 -> key of +0.0
    return (bits & 0x7fffffffu) > 0x7f800000u ? 0u : key;    // NaN, any payload
}

__device__ __forceinline__ u32 order_key(float x) { return order_key_bits(__float_as_uint(x)); }

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31u; }

__device__ __forceinline__ u32 lanes_below_mask() { return (1u << lane_id()) - 1u; }

// Warp-aggregated append: every lane with `take` gets a distinct slot from one
// atomicAdd on *counter. All 32 lanes of the warp must call it together.
__device__ __forceinline__ int warp_append_slot(bool take, int* counter) {
    const u32 mask = __ballot_sync(0xffffffffu, take);
    if (mask == 0u) return -1;
    const int leader = __ffs(mask) - 1;
    int base = 0;
    if ((int)lane_id() == leader) base = atomicAdd(counter, __popc(mask));
    base = __shfl_sync(0xffffffffu, base, leader);
    return take ? base + __popc(mask & lanes_below_mask()) : -1;
}

// Warp-aggregated reservation of `mine` consecutive slots per lane from one
// atomicAdd on *counter (global or shared): returns this lane's first slot; no
// atomic at all when the warp wants nothing. All 32 lanes must call it together.
__device__ __forceinline__ int warp_reserve(int mine, int* counter) {
    if (__ballot_sync(0xffffffffu, mine != 0) == 0u) return 0;
    int incl = mine;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if ((int)lane_id() >= off) incl += y;
    }
    int base = 0;
    if (lane_id() == 31u) base = atomicAdd(counter, incl);
    base = __shfl_sync(0xffffffffu, base, 31);
    return base + incl - mine;
}

}  // namespace hytopk
