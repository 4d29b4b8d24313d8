// The 128-byte Loom instruction, shared verbatim by the host encoder, the CPU
// reference VM and the device interpreter (this header compiles under nvcc).
//
//   word  0      opcode (8) | flags (8) | num_waits (8) | reserved (8)
//   word  1      signal barrier id (kNoBarrier: none); +1 when the instruction is done
//   words 2..9   kMaxWaits waits: {barrier | in_data << 30 | previous_step << 31, count | stride << 16}
//   words 10..31 opcode arguments (an *Args struct below, or in instruction_tensor.h, conv.h, elementwise.h):
//                tensor ids and tile coordinates
//
// A wait in decode step e is satisfied when counter[barrier] reaches
//   (e - previous_step) * stride + count        (stride = the barrier's signals per step)
// so counters never reset between steps or launches (compared wrap-safe).
//
// Step tags (flags, in_data): a tensor whose writers carry kFlagTagOut holds f32 values whose lowest mantissa bit is
// the parity of the step that wrote them. A wait marked in_data is then observed in the data itself: the device
// skips the counter and the instruction reads its input until every value carries this step's tag (one round
// trip where the counter and then the input took two or three). Its meaning, and the VM's, is the plain wait's;
// scheduler/data_waits.h says which waits qualify and docs/architecture.md "Step tags" why it is sound.
#pragma once

#include <cstdint>

#include "instructions/opcodes.h"

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom::isa {

inline constexpr int kInstructionBytes = 128;
inline constexpr int kInstructionWords = kInstructionBytes / 4;
inline constexpr int kMaxWaits = 4;
inline constexpr int kHeaderWords = 2 + 2 * kMaxWaits;
inline constexpr int kArgWords = kInstructionWords - kHeaderWords;
inline constexpr uint32_t kNoBarrier = 0xffffffffu;
inline constexpr uint32_t kNoTensor = 0xffffffffu;  // an optional tensor argument that is absent
inline constexpr uint32_t kBarrierIdMask = 0x3fffffffu;
inline constexpr uint32_t kWaitInData = 0x40000000u;
inline constexpr uint32_t kWaitPreviousStep = 0x80000000u;

// Instruction::flags.
inline constexpr uint8_t kFlagTagOut = 1;         // stores its output with this step's tag (MATVEC, ATTN, EMBED)
inline constexpr uint8_t kFlagTaggedInput = 2;    // MATVEC, ATTN_REDUCE: reads its input until it has the step's tag
inline constexpr uint8_t kFlagTaggedResidual = 4; // MATVEC: the same for the residual its epilogue adds
inline constexpr uint32_t kMaxSignalsPerStep = 0xffffu;

enum class Opcode : uint8_t {
#define LOOM_OPCODE_ENUM(name, args) name,
  LOOM_OPCODE_LIST(LOOM_OPCODE_ENUM)
#undef LOOM_OPCODE_ENUM
      kCount
};
inline constexpr int kNumOpcodes = static_cast<int>(Opcode::kCount);

// Step state (an i32 tensor): where the decode loop is.
enum StepStateWord : uint32_t {
  kStatePosition = 0,     // position of the token being processed this step
  kStatePromptLength = 1, // tokens[0, prompt_length) are forced, not generated
  kStateOverflow = 2,     // set by ARGMAX_REDUCE when the KV cache is full
  kStepStateWords = 4,
};

// Tensors live in one of two regions: packed weights (read-only) or the arena.
enum Region : uint32_t { kWeightRegion = 0, kArenaRegion = 1, kNumRegions = 2 };

// One entry of the schedule's tensor table as the VM and device see it.
struct TensorDesc {
  uint64_t offset;  // bytes from the region's base
  uint64_t bytes;
  uint32_t region;
  uint32_t dtype;  // graph::DType
};
static_assert(sizeof(TensorDesc) == 24);

// Resolves tensor ids to addresses: the only way opcode code reaches memory.
struct MachineView {
  uint8_t* regions[kNumRegions];
  const TensorDesc* tensors;
  uint32_t num_tensors;

  template <typename T>
  LOOM_HD T* ptr(uint32_t tensor) const {
    const TensorDesc& t = tensors[tensor];
    // A select, not regions[t.region]: a run-time index would push the whole
    // view (and whatever holds it) into local memory on the GPU.
    static_assert(kNumRegions == 2, "MachineView::ptr selects between two regions");
    uint8_t* base = t.region == kArenaRegion ? regions[kArenaRegion] : regions[kWeightRegion];
    return reinterpret_cast<T*>(base + t.offset);
  }
};

struct Wait {
  uint32_t barrier_and_flags;
  uint32_t count_and_stride;

  LOOM_HD uint32_t barrier() const { return barrier_and_flags & kBarrierIdMask; }
  LOOM_HD bool previous_step() const { return (barrier_and_flags & kWaitPreviousStep) != 0; }
  LOOM_HD bool in_data() const { return (barrier_and_flags & kWaitInData) != 0; }
  LOOM_HD uint32_t count() const { return count_and_stride & 0xffffu; }
  LOOM_HD uint32_t stride() const { return count_and_stride >> 16; }
  // Counter value that satisfies this wait in decode step `step`.
  LOOM_HD uint32_t target(uint32_t step) const {
    return (step - (previous_step() ? 1u : 0u)) * stride() + count();
  }
};
static_assert(sizeof(Wait) == 8);

// Wrap-safe "counter has reached target".
LOOM_HD bool Reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

struct Instruction {
  uint8_t opcode;
  uint8_t flags;
  uint8_t num_waits;
  uint8_t reserved;
  uint32_t signal;
  Wait waits[kMaxWaits];
  uint32_t args[kArgWords];

  LOOM_HD Opcode op() const { return static_cast<Opcode>(opcode); }
  template <typename Args>
  LOOM_HD const Args& as() const {
    static_assert(sizeof(Args) <= sizeof(args));
    return *reinterpret_cast<const Args*>(args);
  }
  template <typename Args>
  LOOM_HD Args& as() {
    return *reinterpret_cast<Args*>(args);
  }
};
static_assert(sizeof(Instruction) == kInstructionBytes);

// ---------------------------------------------------------------------------
// Opcode arguments. All fields are 32-bit words; tensors are ids into the
// schedule's tensor table. kFields names them (for loom inspect and errors).
// ---------------------------------------------------------------------------

// out[r, 0:hidden] = table[tokens[state[position] + r], :] for r in [row_begin, row_begin + rows)  (bf16 -> f32)
// (decode: one row; a prefill pass embeds its prompt rows in chunks)
struct EmbedArgs {
  uint32_t table;  // bf16 [vocab, row_stride] (a packed weight, shared with a tied LM head)
  uint32_t tokens; // i32 [max_seq + 1]: token at each position
  uint32_t step_state;
  uint32_t out;  // f32 [row_begin + rows, hidden]
  uint32_t hidden;
  uint32_t vocab;
  uint32_t row_stride;  // elements between rows of the table (>= hidden)
  uint32_t row_begin;
  uint32_t rows;
  uint32_t folded = 0;  // 1: the step before's ARGMAX_REDUCE stored this row (its embed_out), so on the device it runs only
                        // in a launch's first step (the VM runs it every step: the same values)
  static constexpr const char* kFields[] = {"table", "tokens", "step_state", "out", "hidden", "vocab", "row_stride",
                                            "row_begin", "rows", "folded"};
};

// out = x * rsqrt(mean(x^2) + eps) * weight
struct RmsNormArgs {
  uint32_t input;   // f32 [n]
  uint32_t weight;  // bf16 [n]
  uint32_t out;     // f32 [n]
  uint32_t n;
  float eps;
  static constexpr const char* kFields[] = {"input", "weight", "out", "n", "eps"};
};

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

// Unfused RoPE + KV append: q_out = rope(q_in); caches[pos] = rope(k_in), v_in.
// With q_norm / k_norm (not kNoTensor), each q and k head is first RMS-normed
// over its head_dim with that weight (Qwen3's per-head norms).
struct RopeAppendArgs {
  uint32_t q_in;
  uint32_t k_in;
  uint32_t v_in;
  uint32_t q_out;
  uint32_t k_cache;
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t rope_table;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  uint32_t q_norm;  // bf16 [head_dim] or kNoTensor
  uint32_t k_norm;  // bf16 [head_dim] or kNoTensor
  float norm_eps;
  static constexpr const char* kFields[] = {"q_in", "k_in", "v_in", "q_out", "k_cache", "v_cache", "step_state",
                                            "rope_table", "num_heads", "num_kv_heads", "head_dim", "max_seq",
                                            "q_norm", "k_norm", "norm_eps"};
};

// Split-KV decode attention for one KV head and one split of the context
// [0, position]: for each of the group's query heads, unnormalised
// o = sum_p exp(s_p - m) v_p, with m = max s_p and l = sum exp(s_p - m).
// With `out` set, the split that finishes last of its KV head's num_splits
// (an arrival counter per KV head in `arrivals`, zero between steps: the last
// arriver resets it) also merges the group's partials into out, as ATTN_REDUCE
// does: no separate reduce instruction, no barrier hop.
struct AttnPartialArgs {
  uint32_t q;  // f32 [heads * head_dim] (rotated)
  uint32_t k_cache;
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t partial_o;   // f32 [splits, heads, head_dim]
  uint32_t partial_ml;  // f32 [splits, heads, 2]
  uint32_t kv_head;
  uint32_t split;
  uint32_t num_splits;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  float scale;
  uint32_t out;       // f32 [heads * head_dim], or kNoTensor (an ATTN_REDUCE merges the partials)
  uint32_t arrivals;  // i32 [num_kv_heads] splits of the step done so far (with out), or kNoTensor
  // Positions a non-empty split covers at least (0 or 1: none): short contexts then fill fewer splits, and the
  // fused reduce merges only those (a merge costs a round trip per batch of splits).
  uint32_t min_positions;
  static constexpr const char* kFields[] = {"q", "k_cache", "v_cache", "step_state", "partial_o", "partial_ml",
                                            "kv_head", "split", "num_splits", "num_heads", "num_kv_heads",
                                            "head_dim", "max_seq", "scale", "out", "arrivals", "min_positions"};
};

// Positions per split of a context of `length` positions.
LOOM_HD uint32_t SplitChunk(uint32_t length, uint32_t num_splits, uint32_t min_positions) {
  const uint32_t chunk = (length + num_splits - 1) / num_splits;
  return chunk > min_positions ? chunk : (min_positions > 0 ? min_positions : 1);
}
// Split s of a context of `length` positions covers [begin, end) (maybe empty).
LOOM_HD void SplitRange(uint32_t length, uint32_t split, uint32_t num_splits, uint32_t min_positions, uint32_t* begin,
                        uint32_t* end) {
  const uint32_t chunk = SplitChunk(length, num_splits, min_positions);
  const uint32_t b = split * chunk;
  *begin = b < length ? b : length;
  *end = b + chunk < length ? b + chunk : length;
}
// The splits that are not empty: the first ActiveSplits(...) of them.
LOOM_HD uint32_t ActiveSplits(uint32_t length, uint32_t num_splits, uint32_t min_positions) {
  const uint32_t chunk = SplitChunk(length, num_splits, min_positions);
  const uint32_t active = (length + chunk - 1) / chunk;
  return active < num_splits ? active : num_splits;
}

// ATTN_PARTIAL's activation slot on the device (byte offsets): q[group *
// head_dim], a score per (head, position), the partial outputs of
// kAttnThreads / head_dim position groups (each [group * head_dim]), and, when
// they fit, the split's K and V rows ([positions * head_dim] each).
inline constexpr uint32_t kAttnThreads = 256;
// Query heads per KV head that ATTN_PARTIAL keeps accumulators for.
inline constexpr uint32_t kAttnMaxGroupHeads = 8;
struct AttnPartialSlot {
  uint64_t q, scores, red, k, v, bytes;
};
LOOM_HD AttnPartialSlot AttnPartialLayout(uint32_t group, uint32_t head_dim, uint32_t positions, bool with_kv) {
  AttnPartialSlot s;
  s.q = 0;
  s.scores = 4ull * group * head_dim;
  s.red = s.scores + (4ull * group * positions + 15) / 16 * 16;
  s.k = s.red + 4ull * group * kAttnThreads;
  s.v = s.k + (with_kv ? 4ull * positions * head_dim : 0);
  s.bytes = s.v + (with_kv ? 4ull * positions * head_dim : 0);
  return s;
}
// Without K and V: what the slot must always have room for.
LOOM_HD uint64_t AttnPartialActivationBytes(uint32_t group, uint32_t head_dim, uint32_t positions) {
  return AttnPartialLayout(group, head_dim, positions, false).bytes;
}
// A split whose rows do not fit the slot takes them `chunk` positions at a time through kAttnChunkBuffers K and V
// buffers (the copies of the next kAttnChunkBuffers - 1 chunks fly while one is computed; a running maximum and sum
// across chunks): q, the chunk's scores, the position groups' partial outputs, a rescale factor per head,
// K[kAttnChunkBuffers][chunk * head_dim], V alike. Two: three and four buffers (smaller chunks, more of them) were
// 7% and 10% slower at context 4096 (docs/history/performance_log.md).
inline constexpr uint32_t kAttnChunkBuffers = 2;
struct AttnChunkSlot {
  uint64_t q, scores, red, alpha, k, v, bytes;
};
LOOM_HD AttnChunkSlot AttnChunkLayout(uint32_t group, uint32_t head_dim, uint32_t chunk) {
  AttnChunkSlot s;
  s.q = 0;
  s.scores = 4ull * group * head_dim;
  s.red = s.scores + (4ull * group * chunk + 15) / 16 * 16;
  s.alpha = s.red + 4ull * group * kAttnThreads;
  s.k = s.alpha + 4ull * kAttnMaxGroupHeads;
  s.v = s.k + 4ull * kAttnChunkBuffers * chunk * head_dim;
  s.bytes = s.v + 4ull * kAttnChunkBuffers * chunk * head_dim;
  return s;
}
// The positions of the largest chunk whose layout fits `bytes` (0: none of kAttnMinChunk does).
inline constexpr uint32_t kAttnMinChunk = 8;
LOOM_HD uint32_t AttnChunkPositions(uint32_t group, uint32_t head_dim, uint64_t bytes) {
  const uint64_t fixed = AttnChunkLayout(group, head_dim, 0).bytes + 16;
  const uint64_t per = 4ull * group + 8ull * kAttnChunkBuffers * head_dim;
  const uint64_t chunk = bytes > fixed ? (bytes - fixed) / per : 0;
  return chunk >= kAttnMinChunk ? static_cast<uint32_t>(chunk < 0xffffu ? chunk : 0xffffu) : 0;
}

// out[head] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s for heads [head_begin, +head_count).
// Step tags (decode): splits without the fused merge that carry kFlagTagOut store their partials tagged, every split
// every step (an empty one its -inf maxima); an ATTN_REDUCE with kFlagTaggedInput reads its heads' partials until
// they carry the step's tag, and with kFlagTagOut stores out tagged. Its activation slot holds the (max, sum) pairs.
struct AttnReduceArgs {
  uint32_t partial_o;
  uint32_t partial_ml;
  uint32_t out;  // f32 [heads * head_dim]
  uint32_t head_begin;
  uint32_t head_count;
  uint32_t num_splits;
  uint32_t num_heads;
  uint32_t head_dim;
  static constexpr const char* kFields[] = {"partial_o", "partial_ml", "out",     "head_begin",
                                            "head_count", "num_splits", "num_heads", "head_dim"};
};

// ATTN_REDUCE's slot: a (max, sum) float pair per split and head, [split][head], then 8 bytes a head.
LOOM_HD uint64_t AttnReduceActivationBytes(uint32_t num_splits, uint32_t head_count) {
  return 8ull * (num_splits + 1) * head_count;
}

// out[i] = silu(gate[i]) * up[i] for i in [begin, begin + count)
struct SiluMulArgs {
  uint32_t gate;
  uint32_t up;
  uint32_t out;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"gate", "up", "out", "begin", "count"};
};

// out[i] = a[i] + b[i] for i in [begin, begin + count)
struct AddArgs {
  uint32_t a;
  uint32_t b;
  uint32_t out;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"a", "b", "out", "begin", "count"};
};

// partials[tile_index] = (max logits[begin:begin+count], its index); lowest index wins ties.
struct ArgmaxPartialArgs {
  uint32_t logits;
  uint32_t begin;
  uint32_t count;
  uint32_t partials;  // f32 [tiles, 2]: value, index (exact in f32 below 2^24)
  uint32_t tile_index;
  static constexpr const char* kFields[] = {"logits", "begin", "count", "partials", "tile_index"};
};

// Picks the best partial, writes it as the token at position+1 (unless that
// position is still inside the prompt) and advances the position: the end of
// a decode step.
// With embed_out (the next step's EMBED folded in), the device also stores the next step's EMBED row a step early:
// table[the token at the new position] into embed_out, with the next step's tag where it carries kFlagTagOut; not in
// a launch's last step, and that EMBED (`folded`) then runs only in a launch's first step. The values are the EMBED's
// own, so the reference (the VM runs that EMBED every step) leaves embed_out alone. Sound because the step's last
// instruction depends on every other (the verifier's step order): no reader of this step's row is still reading.
struct ArgmaxReduceArgs {
  uint32_t partials;
  uint32_t num_partials;
  uint32_t step_state;
  uint32_t tokens;  // i32 [max_seq + 1]
  uint32_t max_seq;
  uint32_t embed_table = kNoTensor;  // bf16 [vocab, row_stride]: the folded EMBED's table
  uint32_t embed_out = kNoTensor;    // f32 [hidden]: its output (kNoTensor: no EMBED folded in)
  uint32_t hidden = 0;
  uint32_t vocab = 0;
  uint32_t row_stride = 0;
  static constexpr const char* kFields[] = {"partials", "num_partials", "step_state", "tokens", "max_seq",
                                            "embed_table", "embed_out", "hidden", "vocab", "row_stride"};
};

}  // namespace loom::isa

#include "instructions/instruction_tensor.h"  // GEMM, PACK_ROWS, FLASH_ATTN
#include "instructions/conv.h"         // CONV_GEMM, IM2COL, NHWC_BF16, DWCONV, POOL, CONV1D
#include "instructions/elementwise.h"  // ELEMENTWISE, SOFTMAX, NORM_ROWS
#include "instructions/kernel_variant.h"  // which variant compiles which opcode

namespace loom::isa {

// Bytes of an SM's activation ring one instruction takes on the device (0: the
// opcode reads its inputs from global memory), a multiple of 16.
LOOM_HD uint32_t ActivationBytes(const Instruction& inst) {
  uint64_t bytes = 0;
  if (inst.op() == Opcode::MATVEC) {
    const MatvecArgs& a = inst.as<MatvecArgs>();
    bytes = MatvecActivationBytes(a.rows, a.k);
  } else if (inst.op() == Opcode::ATTN_PARTIAL) {
    const AttnPartialArgs& a = inst.as<AttnPartialArgs>();
    const uint32_t group = a.num_kv_heads == 0 ? 0 : a.num_heads / a.num_kv_heads;
    const uint32_t chunk = a.num_splits == 0 ? 0 : SplitChunk(a.max_seq, a.num_splits, a.min_positions);
    bytes = AttnPartialActivationBytes(group, a.head_dim, chunk < a.max_seq ? chunk : a.max_seq);
  } else if (inst.op() == Opcode::ATTN_REDUCE) {
    const AttnReduceArgs& a = inst.as<AttnReduceArgs>();
    bytes = AttnReduceActivationBytes(a.num_splits, a.head_count);
  } else if (inst.op() == Opcode::FLASH_ATTN) {
    bytes = FlashActivationBytes(inst.as<FlashAttnArgs>().head_dim);
  } else if (inst.op() == Opcode::GEMM) {
    bytes = GemmActivationBytes(inst.as<GemmArgs>());
  } else if (inst.op() == Opcode::CONV_GEMM) {
    bytes = ConvGemmActivationBytes(inst.as<ConvGemmArgs>());
  } else if (inst.op() == Opcode::POOL) {
    bytes = PoolActivationBytes(inst.as<PoolArgs>());
  } else if (inst.op() == Opcode::SUM_SPLITS) {
    bytes = SumSplitsActivationBytes(inst.as<SumSplitsArgs>());
  } else if (inst.op() == Opcode::PACK_ROWS) {
    bytes = PackRowsActivationBytes(inst.as<PackRowsArgs>());
  }
  bytes = (bytes + 15) / 16 * 16;
  return bytes > 0xffffffffull ? 0xffffffffu : static_cast<uint32_t>(bytes);
}

#define LOOM_CHECK_ARGS(name, args)                                                    \
  static_assert(sizeof(args) <= kArgWords * 4, #args " does not fit an instruction"); \
  static_assert(sizeof(args) == sizeof(args::kFields) / sizeof(char*) * 4, #args " kFields out of date");
LOOM_OPCODE_LIST(LOOM_CHECK_ARGS)
#undef LOOM_CHECK_ARGS

}  // namespace loom::isa
