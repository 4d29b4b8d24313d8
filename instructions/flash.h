// Arguments of FLASH_ATTN (the one-pass prefill's causal attention over the KV cache on the tensor cores: a
// 128-row query tile a head), included by instruction.h after gemm.h (same rules). Host side: ops_flash.cc; device:
// megakernel/ops/flash.cuh.
#pragma once

namespace loom::isa {

// Causal flash attention of a prefill pass on the tensor cores: query rows
// [row_tile * 128, +128) of one query head (row r is the token at position
// state[position] + r) against every key at or before its position, read from
// the KV cache (which the pass's QKV GEMM has just appended to, and which holds
// whatever an earlier pass or decode put before it). The weight loader streams
// each 64-key tile of f32 K then V rows through the page ring (one page holds
// 16384 / (4 * head_dim) keys); the consumers convert each tile to bf16 K and
// Vᵀ slabs (double-buffered in the activation slot), then each warpgroup runs
// 64 query rows: S = Q·Kᵀ (Q as bf16 slabs in the slot), online softmax, O += P·V.
// out is the O-projection GEMM's A image (bf16, PackSwizzled layout, 128-row
// tiles) of [rows, num_heads * head_dim]: head h fills columns [h * hd, +hd).
inline constexpr uint32_t kFlashRows = 128;  // query rows per instruction: 64 per consumer warpgroup
inline constexpr uint32_t kFlashKeys = 64;   // keys per tile
struct FlashAttnArgs {
  uint32_t q;  // f32 [rows, num_heads * head_dim], rotated
  uint32_t k_cache;  // f32 [kv_heads, max_seq, head_dim]
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t out;
  uint32_t rows;
  uint32_t row_tile;
  uint32_t head;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;  // 64 or 128
  uint32_t max_seq;
  float scale;
  static constexpr const char* kFields[] = {"q", "k_cache", "v_cache", "step_state", "out", "rows", "row_tile",
                                            "head", "num_heads", "num_kv_heads", "head_dim", "max_seq", "scale"};
};
template <>
inline constexpr uint32_t kFloatWords<FlashAttnArgs> = FloatWord(offsetof(FlashAttnArgs, scale));
// One buffer of bf16 K [64 keys, hd] and Vᵀ [hd, 64 keys] slabs; the slot holds two, then the bf16 Q slabs of
// the 128 query rows [128, hd], aligned to the swizzle atom.
LOOM_HD uint32_t FlashBufferBytes(uint32_t head_dim) { return 2 * kFlashKeys * head_dim * 2; }
LOOM_HD uint32_t FlashQueryBytes(uint32_t head_dim) { return kFlashRows * head_dim * 2; }
inline constexpr uint32_t kSwizzleAtomAlign = 1024;
LOOM_HD uint32_t FlashActivationBytes(uint32_t head_dim) {
  return 2 * FlashBufferBytes(head_dim) + FlashQueryBytes(head_dim) + kSwizzleAtomAlign;
}
// Keys the tiles of one instruction cover: positions [0, last] with last the position of its last row.
LOOM_HD uint32_t FlashKeyTiles(uint32_t start, const FlashAttnArgs& a) {
  const uint32_t end_row = (a.row_tile + 1) * kFlashRows < a.rows ? (a.row_tile + 1) * kFlashRows : a.rows;
  return (start + end_row - 1) / kFlashKeys + 1;
}

}  // namespace loom::isa
