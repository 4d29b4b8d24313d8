// Arguments of the GEMM family (the one-pass prefill's and the general graphs' GEMMs on the tensor cores),
// included by instruction.h (same rules: 32-bit words, tensor ids, kFields). Host side: ops_gemm.cc; device:
// megakernel/ops/gemm.cuh, pack_rows.cuh and sum_splits.cuh.
//   GEMM        an output tile of C = A · Wᵀ from swizzled bf16 operand images (wgmma), with its epilogues
//   PACK_ROWS   f32 rows (optionally RMS-normed) into a GEMM's bf16 operand image
//   SUM_SPLITS  the parts of a GEMM split over K added in a fixed order (deterministic split-K)
#pragma once

#include <math.h>

namespace loom::isa {

// One output tile of C = A · Wᵀ on the tensor cores: rows [m_tile * 128, +128)
// and columns [n_tile * 128, +128) of C (fewer at the edges; `tile` holds both, GemmTileOf), K streamed in
// 64-wide slabs. A [m, k] (activations) and W [n, k] (weights) are bf16 images
// in the 128-byte swizzled K-major layout (isa::PackSwizzled with 128-row
// tiles: for each 128-row tile, its ceil(k / 64) slabs of 16 KB, zeros past m,
// n and k), so every slab is one bulk copy into one page. out[r, c] = (A·Wᵀ)[r, c]
// (+ bias[c]) (+ residual[r, c]), f32 row-major [m, n].
inline constexpr uint32_t kGemmTileM = 128;
inline constexpr uint32_t kGemmTileN = 128;
inline constexpr uint32_t kGemmSlabK = 64;                        // bf16 of K per 128-byte swizzled row
inline constexpr uint32_t kGemmSlabBytes = kGemmTileM * kGemmSlabK * 2;  // 16 KB: one page
static_assert(kGemmTileM == kGemmTileN, "A and W slabs are the same page size");
struct GemmArgs {
  uint32_t a;       // bf16 swizzled image of A (ARENA)
  uint32_t weight;  // bf16 swizzled image of W (WEIGHTS)
  uint32_t out;     // f32 [m, n]
  uint32_t m;
  uint32_t n;
  uint32_t k;
  uint32_t tile;      // m_tile | n_tile << 16 (GemmTileOf; the argument words are all taken)
  uint32_t bias;      // bf16 [n] or kNoTensor
  uint32_t residual;  // f32 [m, n] or kNoTensor
  uint32_t epilogue;  // GemmEpilogue
  // kGemmRopeKvAppend only (as MATVEC's kEpilogueRopeKvAppend, one row per token):
  uint32_t k_cache;     // f32 [kv_heads, max_seq, head_dim]
  uint32_t v_cache;
  uint32_t step_state;  // row r is the token at position state[position] + r
  uint32_t rope_table;  // f32 [head_dim / 2 + 1]
  // bf16 [2, head_dim]: per-head RMSNorm weights of q then k, applied before RoPE (Qwen3), or kNoTensor. Each
  // 128-column tile holds whole heads (head_dim divides 128), so a head's norm is a reduction inside the tile.
  uint32_t qk_norm;
  uint32_t num_kv_heads;  // query heads per KV head: n / (num_kv_heads * head_dim) - 2 (GemmHeadsPerGroup)
  uint32_t head_dim;
  uint32_t max_seq;
  // Split K: this instruction multiplies K slabs [begin, begin + count) only, `slabs` = begin | count << 16
  // (count 0: all of them from begin; GemmSlabsOf), for kGemmPartialF32, which stores its part of the product.
  uint32_t slabs;
  float norm_eps;  // qk_norm's epsilon
  // 1: the tile is kGemmWideTileN (256) columns wide, n_tile counting such tiles: W's 128-row tiles 2 n_tile and
  // 2 n_tile + 1 side by side in one ring page with the A slab (pages of kGemmWideStepBytes or more), one
  // m64n256 wgmma per k16 step and warpgroup. Half the L2 traffic of W per FLOP (docs/history/performance_log.md "GEMM
  // opcode"). The f32 and SiLU-image epilogues only. 0: 128 columns.
  uint32_t wide;
  // f32 [m, kRowNormSlots] or kNoTensor: A is the image of a deferred RMSNorm's rows, x * w unscaled (PACK_ROWS
  // with its own row_norm), and row r of the product is scaled by RowNormScale(row_norm[r]) before any epilogue:
  // the norm's scale is one number per row, so (x * scale * w) · Wᵀ = scale * ((x * w) · Wᵀ).
  uint32_t row_norm = kNoTensor;
  static constexpr const char* kFields[] = {"a", "weight", "out", "m", "n", "k", "tile", "bias", "residual",
                                            "epilogue", "k_cache", "v_cache", "step_state", "rope_table",
                                            "qk_norm", "num_kv_heads", "head_dim", "max_seq", "slabs", "norm_eps",
                                            "wide", "row_norm"};
};
template <>
inline constexpr uint32_t kFloatWords<GemmArgs> = FloatWord(offsetof(GemmArgs, norm_eps));
LOOM_HD uint32_t GemmTileOf(uint32_t m_tile, uint32_t n_tile) { return m_tile | n_tile << 16; }
LOOM_HD uint32_t GemmMTile(const GemmArgs& g) { return g.tile & 0xffffu; }
LOOM_HD uint32_t GemmNTile(const GemmArgs& g) { return g.tile >> 16; }

// A deferred RMSNorm's statistics: each row's slots hold, per column slice s of `slices` (PACK_ROWS with
// row_norm), sum(x²) over the slice / k + eps / slices, and zeros past the slices, so that their sum is
// mean(x²) + eps. 16 slots: a row's are one 64-byte line, four per lane of the accumulator's quad (GemmArgs).
inline constexpr uint32_t kRowNormSlots = 16;
// The row's scale, its slots added in this fixed order (each quad lane's four in order, then the lanes in pairs, as
// the device's two quad shuffles add them), so the VM's and the device's scale are the same float.
LOOM_HD float RowNormLane(const float* s) { return ((s[0] + s[1]) + s[2]) + s[3]; }
LOOM_HD float RowNormScale(const float* slots) {
  const float low = RowNormLane(slots) + RowNormLane(slots + 4);
  const float high = RowNormLane(slots + 8) + RowNormLane(slots + 12);
  const float total = low + high;
  return 1.0f / sqrtf(total);
}
inline constexpr uint32_t kGemmWideTileN = 2 * kGemmTileN;
inline constexpr uint32_t kGemmWideStepBytes = 3 * kGemmSlabBytes;  // a K step's A slab and two W slabs
LOOM_HD uint32_t GemmTileColumns(const GemmArgs& g) { return g.wide ? kGemmWideTileN : kGemmTileN; }
// Output tiles of an n-column product `wide` or not.
LOOM_HD uint32_t GemmColumnTiles(uint32_t n, bool wide) {
  const uint32_t width = wide ? kGemmWideTileN : kGemmTileN;
  return (n + width - 1) / width;
}
LOOM_HD uint32_t GemmPackSlabs(uint32_t begin, uint32_t count) { return begin | count << 16; }
template <typename Args>
LOOM_HD uint32_t GemmHeadsPerGroup(const Args& g) {
  const uint32_t kv_rows = g.num_kv_heads * g.head_dim;
  return kv_rows == 0 || g.n / kv_rows < 2 ? 0 : g.n / kv_rows - 2;
}
enum GemmEpilogue : uint32_t {
  kGemmStoreF32 = 0,         // out f32 [m, n] as above
  kGemmSiluMulToImage = 1,   // W rows interleave (gate, up) pairs (ROWS_INTERLEAVE_PAIRS): out is the bf16 A
                             // image (PackSwizzled, 128-row tiles) of silu(gate) * up, [m, n / 2], for the next GEMM
  kGemmRopeKvAppend = 2,     // W rows in the grouped QKV layout (QkvGroupedRow): per token row, q rotated into
                             // out f32 [m, heads * head_dim], k rotated and v into the caches at its position
  kGemmPartialF32 = 3,       // out f32 [m, n] = this instruction's K slabs' product (+ bias from the split holding
                             // slab 0): one part of a product split over K, each part its own tensor (views of one
                             // SumSplitsArgs::parts), added by SUM_SPLITS in part order. Not float atomics into one
                             // output: their order, and so the sum's last bits, would vary from run to run.
  kGemmStoreF32Relu = 4,     // as kGemmStoreF32, then max(0, .): bias, residual, ReLU (a conv block's epilogue)
  kNumGemmEpilogues = 5,
};
LOOM_HD uint32_t GemmSlabs(uint32_t k) { return (k + kGemmSlabK - 1) / kGemmSlabK; }
// The K slabs one GEMM instruction multiplies: [begin, begin + count).
struct GemmSlabRange {
  uint32_t begin, count;
};
// The packed `slabs` word as written: the first K slab, and the count (0: all from the first).
LOOM_HD uint32_t GemmSplitBegin(const GemmArgs& g) { return g.slabs & 0xffffu; }
LOOM_HD uint32_t GemmSplitCount(const GemmArgs& g) { return g.slabs >> 16; }
LOOM_HD GemmSlabRange GemmSlabsOf(const GemmArgs& g) {
  const uint32_t begin = GemmSplitBegin(g), count = GemmSplitCount(g);
  return {begin, count == 0 ? GemmSlabs(g.k) - begin : count};
}
LOOM_HD uint32_t GemmTiles(uint32_t rows) { return (rows + kGemmTileM - 1) / kGemmTileM; }
// The rows of each of the tile's A slabs the loader copies: its rows of A (the last tile's may be fewer than 128)
// rounded up to the 128-byte swizzle's 8-row atom, which keeps the copied bytes a prefix of the slab.
LOOM_HD uint32_t GemmSlabRowsLoaded(const GemmArgs& g) {
  const uint32_t row0 = GemmMTile(g) * kGemmTileM, rows = g.m > row0 ? g.m - row0 : 0;
  const uint32_t live = rows < kGemmTileM ? rows : kGemmTileM;
  return (live + 7) / 8 * 8;
}
// Bytes of an image of `rows` x k (whole 128-row tiles of whole slabs).
LOOM_HD uint64_t GemmImageBytes(uint32_t rows, uint32_t k) {
  return uint64_t{GemmTiles(rows)} * GemmSlabs(k) * kGemmSlabBytes;
}

// The parts of a product split over K (kGemmPartialF32) added up: for the elements i in [begin, +count) of an f32
// tensor of `elements`, out[i] = base[i] + parts[0 * elements + i] + ... + parts[(splits - 1) * elements + i], in
// that order whichever part was stored first, so a split product is bitwise the same every run. base kNoTensor:
// the sum starts from the first part; base may be out (the residual stream added to in place). flags: max(0, .) of
// the base as it is read (a ReLU its producer left pending) and / or of the sum.
enum SumSplitsFlags : uint32_t {
  kSumReluBase = 1,
  kSumReluOut = 2,
};
inline constexpr uint32_t kMaxSumSplits = 64;  // parts a thread adds (the lowerings split 16 ways at most)
struct SumSplitsArgs {
  uint32_t parts;  // f32 [splits, elements]
  uint32_t base;   // f32 [elements] or kNoTensor
  uint32_t out;    // f32 [elements]
  uint32_t elements;
  uint32_t splits;
  uint32_t begin;
  uint32_t count;
  uint32_t flags;  // SumSplitsFlags
  static constexpr const char* kFields[] = {"parts", "base", "out", "elements", "splits", "begin", "count", "flags"};
};
// The base as the sum starts from it.
LOOM_HD float SumSplitsBase(const SumSplitsArgs& a, float base) {
  return (a.flags & kSumReluBase) && base < 0.0f ? 0.0f : base;
}
// The device stages the rows it adds (the base, then each part) through the instruction's activation slot in rounds,
// two buffers of kSumStageBytes / 2: a round's copies (cp.async) all in flight, the next round's issued before this
// one is added, so an SM's L2 bandwidth bounds the sum, not its latency (loads into registers kept 4-16 KB in
// flight and spilled the tensor-core variants). 48 KB: FLASH_ATTN's slot at head_dim 64 is 49 KB, so a prefill
// pass's ring does not grow. 16-byte chunks.
inline constexpr uint32_t kSumStageBytes = 49152;
LOOM_HD uint32_t SumRoundChunks(uint32_t rows) { return kSumStageBytes / 2 / 16 / rows; }
// The slot of a staged sum of `rows` rows (base and parts) over `elements` f32 (0: not staged, elements not whole
// chunks): one round's buffer, or two.
LOOM_HD uint32_t SumStageBytes(uint32_t rows, uint64_t elements) {
  if (elements % 4 != 0) return 0;
  const uint64_t chunks = elements / 4, round = SumRoundChunks(rows);
  return static_cast<uint32_t>((chunks <= round ? chunks : 2 * round) * rows * 16);
}
LOOM_HD uint32_t SumSplitsActivationBytes(const SumSplitsArgs& a) {
  if (a.elements % 4 != 0 || a.begin % 4 != 0) return 0;
  return SumStageBytes(a.splits + (a.base != kNoTensor ? 1 : 0), a.count);
}

// Rows of an f32 matrix [m, k] as the bf16 operand image a GEMM reads as A
// (isa::PackSwizzled layout: 128-byte swizzle, 128-row tiles, zeros past m and
// k): rows [row_begin, row_begin + rows) of it (rows past m, up to the last
// tile's end, written as zeros), each row optionally RMS-normalised first
// (x * rsqrt(mean(x²) + eps) * norm_weight), so a norm and the layout change a
// prefill GEMM needs are one instruction; a pass spreads a matrix over many.
// With `splits` (2 or more), the rows first take the parts of a product split
// over K that adds into them (kGemmPartialF32's, [splits, m, k]): input[r] =
// input[r] + parts[0][r] + ... in part order, as SUM_SPLITS adds them, written
// back to input; the residual stream's sum and the next norm in one pass.
// With row_norm (a norm_weight's RMSNorm deferred to the GEMM that reads the
// image, GemmArgs::row_norm), the instruction takes the columns [col_begin,
// +cols) of its rows only, so a short prompt's rows spread over many SMs (one SM
// reading a whole row and its parts is the pass's longest instruction): the
// parts added into the slice, the image of x * w unscaled, and the slice's slot
// row_norm[r, col_begin / cols] = sum(x²) / k + eps / slices (the first slice
// zeroes the slots past the last). Rows past m: zeros in the image, no slot.
struct PackRowsArgs {
  uint32_t input;        // f32 [m, k]
  uint32_t out;          // bf16 image of GemmImageBytes(m, k)
  uint32_t m;
  uint32_t k;
  uint32_t row_begin;
  uint32_t rows;
  uint32_t norm_weight;  // bf16 [k] or kNoTensor
  float norm_eps;
  uint32_t parts;   // f32 [splits, m, k] when splits >= 2
  uint32_t splits;  // 0: no parts to add
  uint32_t row_norm = kNoTensor;  // f32 [m, kRowNormSlots], or kNoTensor: whole rows (normed when norm_weight)
  uint32_t col_begin;  // with row_norm: slice col_begin / cols of the ceil(k / cols) slices of a row
  uint32_t cols;
  static constexpr const char* kFields[] = {"input", "out", "m", "k", "row_begin", "rows", "norm_weight",
                                            "norm_eps", "parts", "splits", "row_norm", "col_begin", "cols"};
};
template <>
inline constexpr uint32_t kFloatWords<PackRowsArgs> = FloatWord(offsetof(PackRowsArgs, norm_eps));
// Column slices of a row (the last may be narrower).
LOOM_HD uint32_t PackRowsSlices(const PackRowsArgs& a) { return a.cols == 0 ? 1 : (a.k + a.cols - 1) / a.cols; }
// The columns one instruction reads and writes: its slice, or the whole row.
LOOM_HD uint32_t PackRowsColumns(const PackRowsArgs& a) {
  if (a.row_norm == kNoTensor) return a.k;
  return a.col_begin + a.cols < a.k ? a.cols : a.k - a.col_begin;
}
// The slot of its parts' sum (the input's rows, then each part's), staged as SUM_SPLITS's.
// A slice (row_norm) stages its rows' x and parts and the slice of the norm weight in one round of one buffer:
// its 16-byte chunks of x, then of each part, then the weights.
LOOM_HD uint32_t PackSliceStageBytes(const PackRowsArgs& a) {
  return a.rows * (PackRowsColumns(a) / 4) * (a.splits + 1) * 16 + PackRowsColumns(a) * 2;
}
LOOM_HD uint32_t PackRowsActivationBytes(const PackRowsArgs& a) {
  if (a.row_norm != kNoTensor) return PackSliceStageBytes(a);
  if (a.splits == 0 || a.k % 4 != 0 || a.row_begin >= a.m) return 0;
  const uint32_t end = a.row_begin + a.rows < a.m ? a.row_begin + a.rows : a.m;
  return SumStageBytes(a.splits + 1, uint64_t{end - a.row_begin} * a.k);
}

// GEMM's RoPE epilogue stages the f32 tile through its activation slot: 128 rows of kGemmStageStride floats (8
// floats of padding: the accumulator fragment's float2 stores hit no bank twice in a half-warp).
inline constexpr uint32_t kGemmStageStride = kGemmTileN + 8;
// A deferred norm's slots of the tile's rows (GemmArgs::row_norm, 8 KB) follow the RoPE stage in the slot: copied
// at the instruction's start, read after the K loop, so no register holds them through it (held in registers, they
// cost the pass 0.5-1.7% with the norm not deferred at all: the K loop's code).
inline constexpr uint32_t kGemmRowNormBytes = kGemmTileM * kRowNormSlots * 4;
LOOM_HD uint32_t GemmRowNormOffset(const GemmArgs& g) {
  return g.epilogue == kGemmRopeKvAppend ? kGemmTileM * kGemmStageStride * 4 : 0;
}
LOOM_HD uint32_t GemmActivationBytes(const GemmArgs& g) {
  return GemmRowNormOffset(g) + (g.row_norm != kNoTensor ? kGemmRowNormBytes : 0);
}

}  // namespace loom::isa
