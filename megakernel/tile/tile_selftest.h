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

// One query tile of attention on the tile layer, for tests: O = softmax(Q·Kᵀ · scale) · V for 64 queries,
// 64 keys and head_dim 64, with S = Q·Kᵀ on wgmma, the softmax on the accumulator rows (RowMax, Exp2Rows,
// RowSum), P converted to bf16 A fragments in registers and O = P·V on wgmma with A from registers. q_image
// and k_image: PackSwizzled(q or k [64, 64], tile_rows 64, 128B); vt_image: the same of Vᵀ [64 dims, 64 keys].
absl::StatusOr<std::vector<float>> RunAttentionTile(const std::vector<uint16_t>& q_image,
                                                    const std::vector<uint16_t>& k_image,
                                                    const std::vector<uint16_t>& vt_image, float scale);

}  // namespace loom::megakernel::tile
