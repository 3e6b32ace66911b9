// The one common header of kernels_cuda/: order keys, the lightning-indexer
// scoring routine with its two score sources, and the block radix helpers.
#pragma once
#include "hytopk_order.cuh"
#include "hytopk_score.cuh"
#include "hytopk_radix.cuh"

namespace hytopk {
constexpr int BLOCK = 256;            // threads per block of every kernel here
constexpr int WARPS = BLOCK / 32;
}
