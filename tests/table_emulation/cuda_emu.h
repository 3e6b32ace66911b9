// A host emulation of the CUDA features the table kernels use: one std::thread per CUDA thread,
// blocks run one after another, __syncthreads and every warp collective as std::barrier
// rendezvous. Slow, but it runs the real kernel source on a machine without a GPU.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static
#define __noinline__

struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct emu_dim3 { unsigned x, y, z; };

namespace emu {
struct Warp {
    std::barrier<> bar{32};
    unsigned long long v[32];
};
struct Block {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};
inline thread_local emu_dim3 tidx;
inline emu_dim3 bidx, bdim, gdim;
inline Block* block = nullptr;
inline std::vector<unsigned char> dyn;      // dynamic shared memory of the running block
inline unsigned* dyn_smem() { return reinterpret_cast<unsigned*>(dyn.data()); }

inline Warp& warp() { return *block->warps[tidx.x / 32]; }
inline unsigned lane() { return tidx.x & 31u; }

template <class T>
inline unsigned long long to_bits(T v) { unsigned long long b = 0; std::memcpy(&b, &v, sizeof(T)); return b; }
template <class T>
inline T from_bits(unsigned long long b) { T v; std::memcpy(&v, &b, sizeof(T)); return v; }

// every lane deposits one value; fn(all values, lane) is this lane's result
template <class Fn>
inline unsigned long long collective(unsigned long long mine, Fn fn) {
    Warp& w = warp();
    w.v[lane()] = mine;
    w.bar.arrive_and_wait();
    unsigned long long vals[32];
    std::memcpy(vals, w.v, sizeof vals);
    w.bar.arrive_and_wait();
    return fn(vals, lane());
}

template <class K>
inline void launch(emu_dim3 grid, unsigned threads, size_t dyn_bytes, K kernel) {
    gdim = grid;
    bdim = {threads, 1, 1};
    for (unsigned b = 0; b < grid.x; ++b) {
        bidx = {b, 0, 0};
        Block blk;
        blk.bar = std::make_unique<std::barrier<>>((std::ptrdiff_t)threads);
        for (unsigned w = 0; w < threads / 32; ++w) blk.warps.push_back(std::make_unique<Warp>());
        block = &blk;
        dyn.assign(dyn_bytes + 16, 0xAB);                 // garbage, as real shared memory
        std::vector<std::thread> ts;
        ts.reserve(threads);
        for (unsigned t = 0; t < threads; ++t)
            ts.emplace_back([t, &kernel, &blk] {
                tidx = {t, 0, 0};
                kernel();
                blk.warps[t / 32]->bar.arrive_and_drop();  // an exited thread never blocks the others
                blk.bar->arrive_and_drop();
            });
        for (auto& th : ts) th.join();
    }
}
}  // namespace emu

#define threadIdx (emu::tidx)
#define blockIdx (emu::bidx)
#define blockDim (emu::bdim)
#define gridDim (emu::gdim)

inline void __syncthreads() { emu::block->bar->arrive_and_wait(); }

template <class A, class B>
inline auto min(A a, B b) -> std::common_type_t<A, B> { return a < b ? a : b; }
template <class A, class B>
inline auto max(A a, B b) -> std::common_type_t<A, B> { return a > b ? a : b; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline float __uint_as_float(unsigned b) { float f; std::memcpy(&f, &b, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned b; std::memcpy(&b, &f, 4); return b; }
inline uint4 __ldcs(const uint4* p) { return *p; }
inline uint4 __ldg(const uint4* p) { return *p; }

template <class T>
inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }

inline unsigned __ballot_sync(unsigned, int pred) {
    return (unsigned)emu::collective(pred ? 1 : 0, [](const unsigned long long* v, unsigned) {
        unsigned m = 0;
        for (int i = 0; i < 32; ++i) m |= (unsigned)(v[i] & 1u) << i;
        return (unsigned long long)m;
    });
}
template <class T>
inline T __shfl_sync(unsigned, T x, int src) {
    return emu::from_bits<T>(emu::collective(emu::to_bits(x), [src](const unsigned long long* v, unsigned) {
        return v[src & 31];
    }));
}
template <class T>
inline T __shfl_up_sync(unsigned, T x, unsigned d) {
    return emu::from_bits<T>(emu::collective(emu::to_bits(x), [d](const unsigned long long* v, unsigned l) {
        return l >= d ? v[l - d] : v[l];
    }));
}
template <class T>
inline T __shfl_xor_sync(unsigned, T x, int m) {
    return emu::from_bits<T>(emu::collective(emu::to_bits(x), [m](const unsigned long long* v, unsigned l) {
        return v[(l ^ (unsigned)m) & 31];
    }));
}
template <class T>
inline unsigned __match_any_sync(unsigned, T x) {
    return (unsigned)emu::collective(emu::to_bits(x), [](const unsigned long long* v, unsigned l) {
        unsigned m = 0;
        for (int i = 0; i < 32; ++i) m |= (unsigned)(v[i] == v[l]) << i;
        return (unsigned long long)m;
    });
}
