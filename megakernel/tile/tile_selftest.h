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

// One query tile of causal flash attention on the tile layer, for tests: for 64 queries at positions
// q0 .. q0 + 63 and keys 0 .. keys - 1 (a multiple of 64), query i sees keys [0, q0 + i]. Key tiles of 64 are
// streamed with an online softmax in registers: S = Q·Kᵀ on wgmma, the causal mask from the accumulator's
// columns, running row max and sum with the output rescaled, P as bf16 A fragments, O += P·V on wgmma with A
// from registers; tiles past the diagonal are skipped. head_dim 64. q_image: PackSwizzled(q [64, 64], 64,
// 128B); k_image: PackSwizzled(k [keys, 64], 64, 128B); vt_image: PackSwizzled(Vᵀ [64, keys], 64, 128B).
absl::StatusOr<std::vector<float>> RunAttentionTile(const std::vector<uint16_t>& q_image,
                                                    const std::vector<uint16_t>& k_image,
                                                    const std::vector<uint16_t>& vt_image, uint32_t keys,
                                                    uint32_t q0, float scale);

}  // namespace loom::megakernel::tile
