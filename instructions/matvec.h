// The matvec family's arguments (the decode step's weight-streaming opcode and the packed layouts its weights
// take), included by instruction.h (same rules). Host side: ops_matvec.cc; device: megakernel/ops/matvec.cuh.
#pragma once

namespace loom::isa {

enum MatvecPrologue : uint32_t { kPrologueNone = 0, kPrologueRmsNorm = 1 };
enum MatvecEpilogue : uint32_t {
  kEpilogueStore = 0,          // out[row_begin + r] = y[r]
  kEpilogueResidualAdd = 1,    // out[row_begin + r] = residual[row_begin + r] + y[r]
  kEpilogueRopeKvAppend = 2,   // rows in the grouped QKV layout (QkvGroupedRow): q -> out, k/v -> caches
  kEpilogueSiluMul = 3,        // rows are (gate, up) pairs: out[(row_begin + r) / 2] = silu(y[r]) * y[r + 1]
  kEpilogueArgmaxPartial = 4,  // out[row_begin + r] = y[r]; partials[tile] = (max y, its global row)
  kNumEpilogues = 5,
};

// y[r] = dot(W[row_begin + r, 0:k], x) (+ bias[row_begin + r]) for r in [0,
// rows): one tile of a packed bf16 weight whose rows are MatvecRowStride(k)
// elements apart (zeros past k), row-major, so the tile is one contiguous byte
// range. x = input, or RMSNorm(input) * norm_weight with the prologue.
struct MatvecArgs {
  uint32_t weight;
  uint32_t row_begin;
  uint32_t rows;
  uint32_t k;
  uint32_t input;        // f32 [k]
  uint32_t prologue;     // MatvecPrologue
  uint32_t norm_weight;  // bf16 [k]
  float norm_eps;
  uint32_t epilogue;     // MatvecEpilogue
  uint32_t out;          // f32: output vector (q for RoPE, logits for argmax)
  uint32_t residual;     // f32 (kEpilogueResidualAdd)
  uint32_t k_cache;      // f32 [kv_heads, max_seq, head_dim] (kEpilogueRopeKvAppend)
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t rope_table;   // f32 [head_dim / 2 + 1]: inverse frequencies, then the cos/sin factor
  uint32_t heads_per_group;  // query heads per KV head
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  uint32_t partials;    // f32 [tiles, 2] (kEpilogueArgmaxPartial)
  uint32_t tile_index;
  uint32_t bias;        // bf16 [total_rows] in the weight's row order, or kNoTensor
  static constexpr const char* kFields[] = {
      "weight", "row_begin", "rows", "k", "input", "prologue", "norm_weight", "norm_eps", "epilogue", "out",
      "residual", "k_cache", "v_cache", "step_state", "rope_table", "heads_per_group", "num_kv_heads", "head_dim", "max_seq",
      "partials", "tile_index", "bias"};
};
template <>
inline constexpr uint32_t kFloatWords<MatvecArgs> = FloatWord(offsetof(MatvecArgs, norm_eps));

// MATVEC_FP8: MATVEC over an FP8 weight, y[r] = scales[row_begin + r] * dot(e4m3 W[row_begin + r, 0:k], x) (+ bias):
// rows of MatvecFp8RowStride(k) bytes (zeros past k), one f32 scale per row in the weight's row order. The fields
// are MatvecArgs' (the device shares the prologue and epilogues), but for `scales` where MATVEC has `partials`: an
// FP8 tile has no argmax epilogue (the LM head stays bf16).
struct MatvecFp8Args {
  uint32_t weight;  // F8E4M3 bytes [total_rows, MatvecFp8RowStride(k)]
  uint32_t row_begin;
  uint32_t rows;
  uint32_t k;
  uint32_t input;
  uint32_t prologue;
  uint32_t norm_weight;
  float norm_eps;
  uint32_t epilogue;  // kEpilogueStore, kEpilogueResidualAdd, kEpilogueRopeKvAppend or kEpilogueSiluMul
  uint32_t out;
  uint32_t residual;
  uint32_t k_cache;
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t rope_table;
  uint32_t heads_per_group;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  uint32_t scales;  // f32 [total_rows]
  uint32_t tile_index;
  uint32_t bias;
  static constexpr const char* kFields[] = {
      "weight", "row_begin", "rows", "k", "input", "prologue", "norm_weight", "norm_eps", "epilogue", "out",
      "residual", "k_cache", "v_cache", "step_state", "rope_table", "heads_per_group", "num_kv_heads", "head_dim", "max_seq",
      "scales", "tile_index", "bias"};
};
template <>
inline constexpr uint32_t kFloatWords<MatvecFp8Args> = FloatWord(offsetof(MatvecFp8Args, norm_eps));

// MATVEC_W4: MATVEC over an int4 weight (graph dtype I4), y[r] = sum over the row's groups of s * sum (u - z) x (+ bias),
// with u a 4-bit value and s, z its group's scale and zero point, in f32 (the graph's int4 product, as FP8's: the
// scale after the group's sum, not each element rounded to bf16 first). The
// packed weight is bands of 16 rows, each band chunks of 64 columns (MatvecW4Byte), so a tile of whole bands is one
// contiguous byte range; `meta` holds each row's groups, and a tile's meta words (contiguous too) come through the page
// ring ahead of its weights. The fields are MatvecFp8Args' but for `meta` and `group_shift`. Tiles are whole bands
// (row_begin and rows multiples of 16).
struct MatvecW4Args {
  uint32_t weight;  // I4 bytes [total_rows / 16 bands][MatvecW4RowStride(k) / 64 chunks][512]
  uint32_t row_begin;
  uint32_t rows;
  uint32_t k;
  uint32_t input;
  uint32_t prologue;
  uint32_t norm_weight;
  float norm_eps;
  uint32_t epilogue;  // kEpilogueStore, kEpilogueResidualAdd, kEpilogueRopeKvAppend or kEpilogueSiluMul
  uint32_t out;
  uint32_t residual;
  uint32_t k_cache;
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t rope_table;
  uint32_t heads_per_group;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  // I32 words [total_rows / 16][MatvecW4Groups(k, group_shift)][16]: row 16 b + i's group g at (b, g, i), its scale
  // and zero point (MatvecW4MetaWord).
  uint32_t meta;
  uint32_t group_shift;  // log2 of the group's columns: 5 (32) or more
  uint32_t bias;
  static constexpr const char* kFields[] = {
      "weight", "row_begin", "rows", "k", "input", "prologue", "norm_weight", "norm_eps", "epilogue", "out",
      "residual", "k_cache", "v_cache", "step_state", "rope_table", "heads_per_group", "num_kv_heads", "head_dim", "max_seq",
      "meta", "group_shift", "bias"};
};
template <>
inline constexpr uint32_t kFloatWords<MatvecW4Args> = FloatWord(offsetof(MatvecW4Args, norm_eps));

// A matvec weight row holds k elements padded with zeros to a multiple of
// kMatvecRowAlign (the 256 columns a warp multiplies at once on the device), so
// every k a checkpoint has streams through the same page loop. The input x is
// padded with zeros the same way in the activation slot.
inline constexpr uint32_t kMatvecRowAlign = 256;
LOOM_HD uint32_t MatvecRowStride(uint32_t k) { return (k + kMatvecRowAlign - 1) / kMatvecRowAlign * kMatvecRowAlign; }

// A matvec's partial sums: one per `MatvecSlotElems(stride)` columns of each
// row (1024 when the padded row allows, else 256). The device keeps x[stride]
// and rows * stride / slot partials in its activation slot;
// MatvecActivationBytes is that size.
LOOM_HD uint32_t MatvecSlotElems(uint32_t stride) { return stride % 1024 == 0 ? 1024 : 256; }
LOOM_HD uint64_t MatvecActivationBytes(uint32_t rows, uint32_t k) {
  const uint32_t stride = MatvecRowStride(k);
  return 4ull * stride + 4ull * rows * (stride / MatvecSlotElems(stride));
}
// The device splits each page evenly between its 8 consumer warps, kMatvecRowAlign columns (bf16) a segment, and a
// warp sums a slot alone: a slot must not span two warps' shares. True for every slot with pages of a multiple of
// 16 KB; with 4-12 KB pages only for rows whose slot is 256 columns (the schedule verifier and the GPU runtime refuse
// the rest: two warps wrote one slot, wrong results).
inline constexpr uint32_t kMatvecPageSegmentBytes = 8 * kMatvecRowAlign * 2;  // a page's segment a warp, 4096 bytes
LOOM_HD bool MatvecSlotsFitPages(uint32_t k, uint32_t page_bytes) {
  const uint32_t warp_columns = page_bytes / kMatvecPageSegmentBytes * kMatvecRowAlign;
  return warp_columns > 0 && warp_columns % MatvecSlotElems(MatvecRowStride(k)) == 0;
}

// An FP8 row: k bytes padded with zeros to a multiple of kMatvecFp8RowAlign, the 512 columns a warp's 16-byte loads
// cover. A warp's share of a decode page (16 KB) is 2048 columns; partial sums are kept per 2048 columns where the
// padded row allows (a warp's whole share: one reduction a page), else per 512. MATVEC_FP8 runs with decode pages
// only (isa::CheckPageBytes).
inline constexpr uint32_t kMatvecFp8RowAlign = 512;
inline constexpr uint32_t kMatvecFp8WarpColumns = 2048;
LOOM_HD uint32_t MatvecFp8RowStride(uint32_t k) {
  return (k + kMatvecFp8RowAlign - 1) / kMatvecFp8RowAlign * kMatvecFp8RowAlign;
}
LOOM_HD uint32_t MatvecFp8SlotElems(uint32_t stride) {
  return stride % kMatvecFp8WarpColumns == 0 ? kMatvecFp8WarpColumns : kMatvecFp8RowAlign;
}
// Inside each 512-column run of a packed FP8 row, lane l's 16 bytes hold columns 128 q + 4 l + e at byte 16 l + 4 q
// + e (q, e in 0..3): the x values of its 4-byte word q are then one float4, and 8 lanes reading theirs read 128
// consecutive bytes of shared memory (no bank conflict; lanes 64 bytes apart, as plain order gives, would
// conflict 4-way). The byte of a run that holds column c of the run:
LOOM_HD uint32_t MatvecFp8Position(uint32_t c) { return (c % 128) / 4 * 16 + c / 128 * 4 + c % 4; }
LOOM_HD uint64_t MatvecFp8ActivationBytes(uint32_t rows, uint32_t k) {
  const uint32_t stride = MatvecFp8RowStride(k);
  return 4ull * stride + 4ull * rows * (stride / MatvecFp8SlotElems(stride));
}

// An int4 row: k values padded to a multiple of kMatvecW4ChunkColumns (the columns of one warp's 16-byte load per
// lane: four 16-column steps of a 16-row mma tile), two values a byte. Rows come in bands of kMatvecW4BandRows (the
// mma's M); a band's 64-column chunks are 512 bytes each, lane l's 16 bytes the A fragments of its four steps.
inline constexpr uint32_t kMatvecW4ChunkColumns = 64;
inline constexpr uint32_t kMatvecW4BandRows = 16;
inline constexpr uint32_t kMatvecW4ChunkBytes = kMatvecW4ChunkColumns * kMatvecW4BandRows / 2;  // 512
LOOM_HD uint32_t MatvecW4RowStride(uint32_t k) {
  return (k + kMatvecW4ChunkColumns - 1) / kMatvecW4ChunkColumns * kMatvecW4ChunkColumns;
}
// Groups a padded row holds (the padding's own group past k where 64 does not divide k).
LOOM_HD uint32_t MatvecW4Groups(uint32_t k, uint32_t group_shift) {
  return (MatvecW4RowStride(k) + (1u << group_shift) - 1) >> group_shift;
}
// A tile's meta words (bytes): its rows' groups, 4 bytes each.
LOOM_HD uint64_t MatvecW4MetaBytes(uint32_t rows, uint32_t k, uint32_t group_shift) {
  return 4ull * rows * MatvecW4Groups(k, group_shift);
}
// Partial sums of a row: where the padded row is a multiple of 2048 columns every 16 KB page holds 32 chunks of one
// band and a warp sums its chunks of a band over the band's pages, one slot a warp (8); else, where it is a multiple
// of 256, a warp's four chunks of a page are one band's consecutive columns, one slot a page (stride / 256); else
// one a chunk (stride / 64).
LOOM_HD uint32_t MatvecW4Slots(uint32_t stride) {
  return stride % 2048 == 0 ? 8 : stride % 256 == 0 ? stride / 256 : stride / kMatvecW4ChunkColumns;
}
// A padded row wider than kMatvecW4MaxPieceColumns that is a multiple of 2048 columns (whole pages a band) is
// multiplied in pieces: columns [p P, (p + 1) P) for P = MatvecW4PieceColumns (whole pages, at most the maximum; the
// last piece may be shorter), one piece's x image in the slot at a time, each piece's x read again from global
// memory, the piece's pages streamed band by band. The image takes 6 bytes a column: a 70B model's 28672-wide down
// projection needs 172 KB whole, which leaves an SM's ring 2 pages of 16 KB for the whole step; in pieces of 14336
// columns, 86 KB. A piece's x is its own (no prologue: an RMSNorm would need the whole row first).
inline constexpr uint32_t kMatvecW4MaxPieceColumns = 16384;
inline constexpr uint32_t kMatvecW4PageColumns = 2048;  // a 16 KB page of one band
LOOM_HD uint32_t MatvecW4PieceColumns(uint32_t stride) {
  if (stride <= kMatvecW4MaxPieceColumns || stride % kMatvecW4PageColumns != 0) return stride;
  const uint32_t pages = stride / kMatvecW4PageColumns, most = kMatvecW4MaxPieceColumns / kMatvecW4PageColumns;
  const uint32_t pieces = (pages + most - 1) / most;
  return (pages + pieces - 1) / pieces * kMatvecW4PageColumns;
}
LOOM_HD uint32_t MatvecW4Pieces(uint32_t stride) {
  const uint32_t piece = MatvecW4PieceColumns(stride);
  return (stride + piece - 1) / piece;
}
// A row's partial sums in all: its pieces' slots, piece after piece.
LOOM_HD uint32_t MatvecW4RowSlots(uint32_t stride) {
  return MatvecW4Pieces(stride) * MatvecW4Slots(MatvecW4PieceColumns(stride));
}
// Within a chunk, the byte (and nibble: 0 low, 1 high) holding row r (0..15) and column c (0..63). Lane l = 4 g + t
// holds, for step s (columns 16 s ..), the mma's A fragment as one 32-bit word: nibble i + 4 h is register i's half
// h, and register i is row g + 8 (i & 1), column 2 t + h + 8 (i >> 1) of the step. So (word >> 4i) & 0x000f000f puts
// register i's two values in the two halves of a bf16x2.
struct W4Nibble {
  uint32_t byte;
  uint32_t high;
};
LOOM_HD W4Nibble MatvecW4Byte(uint32_t r, uint32_t c) {
  const uint32_t step = c / 16, kk = c % 16;
  const uint32_t lane = (r % 8) * 4 + (kk % 8) / 2;
  const uint32_t nibble = (r / 8 + 2 * (kk / 8)) + 4 * (kk % 2);
  return {lane * 16 + step * 4 + nibble / 2, nibble % 2};
}
// A group's meta word: its scale as f32 bits whose low 13 bits are zero (a bf16 or float16 scale: both exact, so one
// device path serves both), its zero point z (0..15) in those low bits' first byte. The device takes the scale with
// one AND and 128 + z, a float, with one byte permute (bits 0x43 z 00 00); the word is invalid where the scale does
// not fit 19 bits (an f32 scale with more mantissa) or z > 15.
inline constexpr uint32_t kMatvecW4ScaleMask = 0xffffe000u;
LOOM_HD bool MatvecW4ScaleFits(uint32_t scale_bits) { return (scale_bits & ~kMatvecW4ScaleMask) == 0; }
LOOM_HD uint32_t MatvecW4MetaWord(uint32_t scale_bits, uint32_t zero) { return scale_bits | (zero & 15u); }
LOOM_HD uint32_t MatvecW4MetaScaleBits(uint32_t word) { return word & kMatvecW4ScaleMask; }
LOOM_HD uint32_t MatvecW4MetaZero(uint32_t word) { return word & 0xffu; }
// The columns of one sum of x the device keeps (x's sum over a group's part of a chunk: the zero point's term).
LOOM_HD uint32_t MatvecW4SumColumns(uint32_t group_shift) { return group_shift == 5 ? 32 : kMatvecW4ChunkColumns; }
// The device's activation slot for a tile: x's three bf16 pieces in the mma's B layout (6 bytes a column of a piece;
// x itself, f32, arrives in its last two thirds and is converted over itself) | 32 zero bytes | the tile's meta words
// | the partial sums | x's sums over MatvecW4SumColumns (of a piece).
LOOM_HD uint64_t MatvecW4ActivationBytes(uint32_t rows, uint32_t k, uint32_t group_shift) {
  const uint32_t stride = MatvecW4RowStride(k);
  const uint64_t piece = MatvecW4PieceColumns(stride);
  return 6 * piece + 32 + 4ull * rows * MatvecW4Groups(k, group_shift) + 4ull * rows * MatvecW4RowSlots(stride) +
         4 * (piece / MatvecW4SumColumns(group_shift));
}

// The grouped QKV layout of a fused QKV weight: for each KV head g, the rows of
// its query heads, then its k head, then its v head ((heads_per_group + 2) *
// head_dim rows per group). Inside q and k heads, packed row 2j is original
// dimension j and 2j+1 is j + head_dim/2, so the pairs a rotation mixes are
// adjacent and a tile holding whole pairs can apply RoPE on its own.
enum QkvKind : uint32_t { kQkvQ = 0, kQkvK = 1, kQkvV = 2 };
struct QkvRow {
  uint32_t kind;  // QkvKind
  uint32_t head;  // q head index (kind q) or kv head index (k, v)
  uint32_t dim;   // dimension inside the head, in the original order
};
LOOM_HD QkvRow QkvGroupedRow(uint32_t packed_row, uint32_t heads_per_group, uint32_t head_dim) {
  const uint32_t group_rows = (heads_per_group + 2) * head_dim;
  const uint32_t g = packed_row / group_rows, r = packed_row % group_rows;
  const uint32_t block = r / head_dim, local = r % head_dim;
  const uint32_t paired = local % 2 == 0 ? local / 2 : local / 2 + head_dim / 2;
  if (block < heads_per_group) return {kQkvQ, g * heads_per_group + block, paired};
  if (block == heads_per_group) return {kQkvK, g, paired};
  return {kQkvV, g, local};
}

}  // namespace loom::isa
