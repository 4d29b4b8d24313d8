// Prefill: a prompt of P tokens in ONE pass of tensor-core instructions, which
// fills the KV cache and produces the first new token; decode then carries on
// from it. Per layer:
//
//   PACK_ROWS (RMSNorm)          x [P, hidden] f32 -> bf16 operand image
//   GEMM q|k|v, RoPE + KV append  -> rotated q [P, heads * hd], K / V rows into the cache
//   FLASH_ATTN                    -> the O-projection's operand image
//   GEMM o + residual             -> x (in place)
//   PACK_ROWS (RMSNorm)
//   GEMM gate|up, SiLU-mul        -> the down-projection's operand image
//   GEMM down + residual          -> x (in place)
//
// then the last row's final norm + LM head as MATVEC tiles with argmax partials
// and ARGMAX_REDUCE, as a decode step ends. The weights each GEMM streams are
// packed at compile time (AddPrefillWeights: operand images beside the decode
// weights); the pass itself is lowered at run time for the prompt's exact length
// (LowerPrefill), as a Schedule whose tensor table extends the decode
// schedule's (same weights, same KV cache, scratch past the decode arena).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/program.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// OK when the decode graph has a prefill lowering; otherwise why not, naming the op or shape.
absl::Status PrefillSupported(const graph::Graph& graph);

// Compile time: adds what a prefill pass streams (GEMM operand images of the projections, their biases in the
// images' row order) to a lowered decode program's WEIGHTS and packing plan.
absl::Status AddPrefillWeights(const graph::Graph& graph, const CompileOptions& options, Program* program);

// True when `decode` was compiled with the prefill weights.
bool HasPrefillWeights(const Schedule& decode);
// The bytes of the WEIGHTS region those operand images take (0 without them).
uint64_t PrefillWeightBytes(const Schedule& decode);

struct PrefillOptions {
  // Also write every row's logits to the pass's tensor "prefill.logits" [rows, vocab] (the LM head streamed once
  // per row: a diagnostic for comparing prompt positions, not for speed).
  bool all_logits = false;
  // Run VerifySchedule on the pass (tensors, every instruction's arguments, deadlock freedom): about as long as
  // the rest of the lowering. The tests verify passes of every shape they run; `loom run` skips it unless --check.
  bool verify = true;
  // One barrier per 128-row tile in every stage but the QKV projection, so a stage's work on some rows starts
  // when the previous stage has finished those rows (no idle tail between stages), or one barrier per stage.
  // kAuto: per-tile barriers for prompts of at most kMaxRowTilesForTileBarriers row tiles. Measured on the H100
  // (random:llama-3.2-1b, docs/history/performance_log.md): TTFT 2.74 / 3.98 / 13.28 ms with them at P = 128 / 512
  // / 2048 against 2.79 / 4.16 / 12.99 without (at 2048 the SMs' queue order, not the stage tails, decides).
  enum class RowTileBarriers { kAuto, kOn, kOff };
  RowTileBarriers row_tile_barriers = RowTileBarriers::kAuto;
  // Ring page size of the pass: 32 KB (two 16 KB pieces per page: a GEMM's A and W slab of one K step, or 64 keys
  // of FLASH_ATTN's K or V; one wait and one release each), 16 KB (one piece per page), or 0: 32 KB where at least
  // 4 such pages fit beside the activation ring (head_dim 64), else 16 KB (head_dim 128: FLASH_ATTN's 97 KB slot
  // leaves room for 3). Measured on the H100 (random:llama-3.2-1b TTFT at P = 128 / 512 / 2048): 2.78 / 4.03 /
  // 12.63 ms with 32 KB pages against 2.77 / 4.13 / 13.21 with 16 KB. 48 KB (isa::kGemmWideStepBytes): every GEMM
  // but the QKV projection (its RoPE epilogue) takes 128 x 256 tiles (isa::GemmArgs::wide: a K step's A slab and two
  // W slabs a page); auto takes them where the pass's widest GEMM (gate/up) has kMinWideTileWaves waves of wide
  // tiles, the O- and down-projections' n (hidden) fills them, and kMinWideTilePages fit. Measured (H100,
  // docs/history/performance_log.md "GEMM opcode"): random:llama-3.2-1b TTFT 2.83 / 3.34 / 5.46 / 10.43 ms at
  // P = 128 / 512 / 1024 / 2048 (0.5 / 1.9 / 3.9 / 7.8 waves) against 2.09 / 3.18 / 5.56 / 11.02 with 32 KB pages
  // (wide tiles halve the tiles: with few, SMs idle); giving wide tiles only to GEMMs with a wave of them measured
  // worse at every P (their 128-column neighbours then use 32 KB of each 48 KB page); the rule picked the faster
  // page size at 12 of 12 points of three shapes (Llama-3.2-1B, TinyLlama, Qwen2.5-0.5B at P = 768 ... 2048).
  uint32_t page_bytes = 0;
  // Prompt rows per PACK_ROWS instruction that adds a split projection's parts into x as it packs (each such row
  // reads splits + 1 rows of x's width): 0 auto (as many as read at most kFoldBytesPerInstruction, at least one;
  // padding rows past the prompt take the usual pack's count).
  uint32_t fold_rows = 0;
  // A fold whose norm can be deferred (hidden a multiple of 64) is spread over the SMs by column slices (PACK_ROWS
  // with row_norm: each instruction adds its slice's parts and packs x * w unscaled, and the GEMM reading the
  // image scales each row, isa::GemmArgs::row_norm): a whole-row fold reads (splits + 1) rows on one SM, the
  // pass's longest instruction at short prompts. false: whole rows (fold_rows).
  bool slice_folds = true;
  // The most ways a residual projection with few tiles is split over K (0: kMaxKSplits): fewer splits trade the K
  // loop's spread for fewer parts to add.
  uint32_t max_splits = 0;
};
inline constexpr uint64_t kFoldBytesPerInstruction = 128 * 1024;
inline constexpr uint32_t kMinWideTileWaves = 3;
inline constexpr uint32_t kMinWideTilePages = 3;
inline constexpr uint32_t kMaxRowTilesForTileBarriers = 8;

// Run time: the prefill pass of `rows` prompt rows (positions [state.position, +rows) of `decode`'s step
// state) for a decode schedule compiled from `graph` with the prefill weights. A pass depends on the row count
// only (not the tokens or the start position): a runtime may keep one per prompt length.
absl::StatusOr<Schedule> LowerPrefill(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                                        const PrefillOptions& options = {});
// The same into `out` (empty), which may live on a protobuf Arena: a runtime lowering a pass while the user waits
// for the first token spends no heap allocation per instruction message (at 2048 rows, ~40,000 of them: the
// allocator took about half of LowerPrefill's time).
absl::Status LowerPrefillInto(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                              const PrefillOptions& options, Schedule* out);

// Prompts are lowered in buckets: a pass of PrefillBucketRows(rows, room) rows serves every prompt whose rows end in
// its last 128-row tile (the rows past the prompt are padding, computed and never read: each row's projections and
// attention are its own, and the GEMM and FLASH_ATTN tiles are 128 rows anyway), so prompts of 100 and 128 tokens
// share one lowering. Below the tile the buckets are powers of two from kPrefillMinBucketRows (16, 32, 64, 128):
// a short pass's fold and attention scale with its rows (Llama-3.2-1B on an H200: 20 rows 1.47 ms in their own
// pass, 1.93 in one of 128), and four buckets cost four lowerings. `room`: the rows the KV cache holds from the
// pass's start (the padding rows' K and V go there too, overwritten by the decode steps that reach them).
inline constexpr uint32_t kPrefillMinBucketRows = 16;
uint32_t PrefillBucketRows(uint32_t rows, uint32_t room);
// Every bucket a prompt of 2 to max_rows rows meets (PrefillBucketRows with the same room), ascending: what a runtime
// lowers ahead of its first prompts (runtime::Session::LowerAhead).
std::vector<uint32_t> PrefillBuckets(uint32_t max_rows, uint32_t room);
// A decoder's prompt of more rows than this runs as passes of this many rows at successive positions (runtime::
// StartOptions::chunk_rows): one lowering serves any length. Llama-3.2-1B on an H200, 8192 rows: chunks of 2048 run
// in 57.5 ms of kernel against one pass's 56.7 (+1.5%), lowered in 40 ms against 206 (and 39,557 instructions against
// 157,829); a pass of 2048 rows already reaches 425 TFLOP/s.
inline constexpr uint32_t kDefaultPrefillChunkRows = 2048;
// Whether `graph`'s passes come in buckets: a decoder with attention (DecoderPrefill's passes). Not the gated-conv
// LM's, whose conv states would carry the padding rows on to the next token.
bool PrefillInBuckets(const graph::Graph& graph);
// A pass run for `rows` of its rows (a bucket's, PrefillBucketRows): the tensor-table entry its LM head reads the last
// row through ("prefill.last_row") moved to row rows - 1 of "prefill.x", for a runtime to write into the pass's
// table before it runs (and the pass state's position, start + rows - 1). Refused where the rows do not end in the
// pass's last row tile (the LM head waits for that tile only) and for a pass that keeps every row's logits.
struct PrefillLastRow {
  uint32_t tensor = 0;  // index into the pass's tensor table
  uint64_t offset = 0;  // its offset for `rows` rows
};
absl::StatusOr<PrefillLastRow> PrefillLastRowFor(const Schedule& pass, uint32_t rows);

}  // namespace loom::scheduler
