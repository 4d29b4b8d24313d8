// A stand-alone kernel over the tile layer, for tests: C[M, N] = A[M, K] · B[N, K]ᵀ
// with A and B given as swizzled slab images (isa::PackSwizzled, tile_rows M
// and N), M = 64 per warpgroup, everything in one block's shared memory.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "instructions/swizzle.h"

namespace loom::megakernel::tile {

// warpgroups 1 or 2 (M = 64 or 128); n 64, 128 or 256; k a multiple of the swizzle's row.
absl::StatusOr<std::vector<float>> RunTileProduct(const std::vector<uint16_t>& a_image,
                                                  const std::vector<uint16_t>& b_image, uint32_t warpgroups,
                                                  uint32_t n, uint32_t k, isa::Swizzle swizzle);

}  // namespace loom::megakernel::tile
