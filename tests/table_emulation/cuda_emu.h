// A host emulation of the CUDA features the table kernels use: one std::thread per CUDA thread,
// blocks run one after another (the C blocks of a cluster together: launch_cluster), __syncthreads,
// the cluster barrier and every warp collective as std::barrier rendezvous; the cluster kernel's
// PTX wrappers (kernels_cuda/hytopk_cluster.cuh) as CPU functions. Slow, but it runs the real
// kernel source on a machine without a GPU.
#pragma once
#define HYTOPK_CPU_EMULATION 1          // hytopk_cluster.cuh: the wrappers below replace its PTX
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <memory>
#include <thread>
#include <cstddef>
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
#define __cluster_dims__(...)

struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct int2 { int x, y; };
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
    std::vector<unsigned char> dyn;         // its dynamic shared memory
};
struct Cluster {                            // the blocks of one cluster, running together
    std::unique_ptr<std::barrier<>> bar;    // barrier.cluster: every thread of every block
    std::vector<Block*> blocks;
};
inline thread_local emu_dim3 tidx, bidx;
inline emu_dim3 bdim, gdim;
inline thread_local Block* block = nullptr;
inline thread_local Cluster* cluster = nullptr;
inline thread_local unsigned crank = 0;    // %cluster_ctarank
inline unsigned* dyn_smem() { return reinterpret_cast<unsigned*>(block->dyn.data()); }

// The table (the driver's: its bytes, rows of L elements of esize bytes, contexts [lo, hi)): every L2
// prefetch (hytopk_table.cuh prefetch_l2) must be 16-byte aligned, a multiple of 16 bytes, and lie
// inside one row's context rounded out to 16-byte vectors (a hint on the GPU: nothing else would
// catch a prefetch of the wrong bytes).
inline const unsigned char* table_begin = nullptr;
inline const unsigned char* table_end = nullptr;
inline long long table_L = 0;
inline int table_esize = 4;
inline const int* table_lo = nullptr;
inline const int* table_hi = nullptr;
inline bool inside_context(long long row, long long e0, long long e1) {
    const long long rows = (table_end - table_begin) / table_esize / table_L;
    if (row < 0 || row >= rows) return false;
    const long long P = 16 / table_esize, row0 = row * table_L;
    const long long a = std::min(std::max<long long>(table_lo[row], 0), table_L);
    const long long c = std::min(std::max<long long>(table_hi[row], a), table_L) - a;
    return e0 >= (row0 + a) / P * P && e1 <= (row0 + a + c + P - 1) / P * P;
}
inline void check_prefetch(const void* p, unsigned bytes) {
    if (!table_begin) return;
    const auto* b = static_cast<const unsigned char*>(p);
    const long long off = b - table_begin, e0 = off / table_esize, e1 = (off + bytes) / table_esize;
    const bool ok = b >= table_begin && b + bytes <= table_end && reinterpret_cast<uintptr_t>(b) % 16 == 0 &&
                    bytes % 16 == 0 && bytes > 0 &&
                    (inside_context(e0 / table_L, e0, e1) || inside_context(e0 / table_L + 1, e0, e1));
    if (!ok) {
        std::fprintf(stderr, "prefetch_l2 of %u bytes at table byte %lld: unaligned, or outside every row's context\n",
                     bytes, off);
        std::abort();
    }
}

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

// grid.x / csize clusters one after another; the csize blocks of a cluster run together (one
// std::thread per CUDA thread of each); csize = 1: plain blocks.
template <class K>
inline void launch_cluster(emu_dim3 grid, unsigned csize, unsigned threads, size_t dyn_bytes, K kernel) {
    gdim = grid;
    bdim = {threads, 1, 1};
    for (unsigned b0 = 0; b0 < grid.x; b0 += csize) {
        Cluster cl;
        cl.bar = std::make_unique<std::barrier<>>((std::ptrdiff_t)(threads * csize));
        std::vector<std::unique_ptr<Block>> blks;
        for (unsigned r = 0; r < csize; ++r) {
            auto blk = std::make_unique<Block>();
            blk->bar = std::make_unique<std::barrier<>>((std::ptrdiff_t)threads);
            for (unsigned w = 0; w < threads / 32; ++w) blk->warps.push_back(std::make_unique<Warp>());
            blk->dyn.assign(dyn_bytes + 16, 0xAB);        // garbage, as real shared memory
            cl.blocks.push_back(blk.get());
            blks.push_back(std::move(blk));
        }
        std::vector<std::thread> ts;
        ts.reserve((size_t)threads * csize);
        for (unsigned r = 0; r < csize; ++r)
            for (unsigned t = 0; t < threads; ++t)
                ts.emplace_back([t, r, b0, &kernel, &cl] {
                    Block* blk = cl.blocks[r];
                    tidx = {t, 0, 0};
                    bidx = {b0 + r, 0, 0};
                    block = blk;
                    cluster = &cl;
                    crank = r;
                    kernel();
                    blk->warps[t / 32]->bar.arrive_and_drop();  // an exited thread never blocks the others
                    blk->bar->arrive_and_drop();
                    cl.bar->arrive_and_drop();
                });
        for (auto& th : ts) th.join();
    }
}

template <class K>
inline void launch(emu_dim3 grid, unsigned threads, size_t dyn_bytes, K kernel) {
    launch_cluster(grid, 1, threads, dyn_bytes, kernel);
}

// An mbarrier's 64 bits here: transaction bytes pending (0-31), arrivals pending (32-39), arrivals
// per phase (40-47), phases completed (48-63).
inline void mbar_update(unsigned long long* bar, long long dtx, int darrive) {
    std::atomic_ref<unsigned long long> a(*bar);
    unsigned long long o = a.load(), v;
    do {
        long long tx = (long long)(unsigned)(o & 0xffffffffu) + dtx;
        unsigned rem = (unsigned)((o >> 32) & 0xffu) - (unsigned)darrive;
        const unsigned expect = (unsigned)((o >> 40) & 0xffu);
        unsigned long long ph = o >> 48;
        if (rem == 0u && tx == 0) { rem = expect; ++ph; }
        v = (ph << 48) | ((unsigned long long)expect << 40) | ((unsigned long long)(rem & 0xffu) << 32) |
            (unsigned long long)(unsigned)tx;
    } while (!a.compare_exchange_weak(o, v));
}
}  // namespace emu

// The CPU versions of kernels_cuda/hytopk_cluster.cuh's wrappers (namespace hytopk::cl, as there).
namespace hytopk {
namespace cl {
inline unsigned cluster_rank() { return emu::crank; }
inline void cluster_sync() { emu::cluster->bar->arrive_and_wait(); }
template <class T>
inline T* cluster_map(T* p, unsigned rank) {
    const std::ptrdiff_t off = reinterpret_cast<unsigned char*>(p) - emu::block->dyn.data();
    return reinterpret_cast<T*>(emu::cluster->blocks[rank]->dyn.data() + off);
}
inline void mbar_init(unsigned long long* bar, unsigned count) {
    std::atomic_ref<unsigned long long>(*bar).store(((unsigned long long)count << 40) | ((unsigned long long)count << 32));
}
inline void mbar_arrive_tx(unsigned long long* bar, unsigned bytes) { emu::mbar_update(bar, (long long)bytes, 1); }
inline void mbar_wait(unsigned long long* bar, unsigned parity) {
    while (((std::atomic_ref<unsigned long long>(*bar).load() >> 48) & 1u) == parity) std::this_thread::yield();
}
inline void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    std::memcpy(dst, src, bytes);                 // the copy engine: done before its bytes complete the phase
    emu::mbar_update(bar, -(long long)bytes, 0);
}
}  // namespace cl
}  // namespace hytopk

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
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }
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
