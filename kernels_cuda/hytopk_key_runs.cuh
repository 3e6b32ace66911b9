// How the blocks along grid.y split the keys into runs of tiles_per_block tiles of
// tile_keys keys, for the mma_sync and wgmma cores alike.
#pragma once
#include "hytopk_order.cuh"

namespace hytopk {

constexpr u32 NEG_INF_BITS = 0xff800000u;

// Scan kernels: run `run` (default blockIdx.y) of the union [glo, ghi) of the block's
// contexts is tiles [tile0, tile0 + ntiles), ntiles <= 0 when the union is shorter.
__device__ __forceinline__ void union_run(long long glo, long long ghi, int tile_keys, int tiles_per_block,
                                          long long& tile0, int& ntiles, int run = -1) {
    if (glo >= ghi) { tile0 = 0; ntiles = 0; return; }
    const long long first = glo / tile_keys, last = (ghi + tile_keys - 1) / tile_keys;
    tile0 = first + (long long)(run < 0 ? (int)blockIdx.y : run) * tiles_per_block;
    ntiles = (int)max(0LL, min((long long)tiles_per_block, last - tile0));
}

// Dense kernels: run `run` (default blockIdx.y) of [0, L). Its tiles [t0, t1) that meet the union
// [glo, ghi) are left to the scan (t0 = t1 when none); every other key of the run
// below L is set to -inf in the row of each query query(j) >= 0, j < nslots, by the
// whole block. false: the run starts past L (nothing to do).
template <class Query>
__device__ __forceinline__ bool dense_run(long long L, long long glo, long long ghi, int tile_keys, int tiles_per_block,
                                          int nslots, Query query, u32* out, long long& t0, long long& t1,
                                          int run = -1) {
    const long long all_tiles = (L + tile_keys - 1) / tile_keys;
    const long long b0 = (long long)(run < 0 ? (int)blockIdx.y : run) * tiles_per_block;
    const long long b1 = min(all_tiles, b0 + tiles_per_block);
    if (b0 >= b1) return false;
    t0 = t1 = b1;
    if (glo < ghi) {
        t0 = max(b0, glo / tile_keys);
        t1 = min(b1, (ghi + tile_keys - 1) / tile_keys);
        if (t0 >= t1) t0 = t1 = b1;
    }
    // t0 = b1: the whole run; both parts stop at L (the last tile may end past it)
    const long long f[2][2] = {{b0 * tile_keys, min(L, t0 * tile_keys)}, {t1 * tile_keys, min(L, b1 * tile_keys)}};
    for (int j = 0; j < nslots; ++j) {
        const long long tj = query(j);
        if (tj < 0) continue;
        for (int part = 0; part < 2; ++part)
            for (long long s = f[part][0] + threadIdx.x; s < f[part][1]; s += blockDim.x)
                out[tj * L + s] = NEG_INF_BITS;
    }
    return true;
}

}  // namespace hytopk
