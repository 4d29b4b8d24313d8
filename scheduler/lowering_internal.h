// The lowering's internals, shared by its files (lowering.cc: tables, barriers,
// matvecs and the driver; lowering_attention.cc: QKV fusion, head norms and
// attention). Not an API: scheduler/lowering.h is.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "instructions/isa.h"
#include "scheduler/lowering.h"

namespace loom::scheduler::lowering_internal {

using graph::OpDef;
using isa::Instruction;
using isa::Opcode;

constexpr uint64_t kTensorAlignment = 256;  // bulk copies need 16; 256 keeps rows cache-line aligned
constexpr uint32_t kStepBarrier = 0;        // signalled by ARGMAX_REDUCE: the end of a step

// Splits [begin, end) into `parts` near-equal pieces whose sizes are multiples of `granule`.
inline std::vector<uint64_t> SplitEven(uint64_t begin, uint64_t end, uint64_t parts, uint64_t granule) {
  const uint64_t units = (end - begin) / granule;
  parts = std::max<uint64_t>(1, std::min(parts, units));
  std::vector<uint64_t> bounds;
  for (uint64_t i = 0; i <= parts; ++i) bounds.push_back(begin + units * i / parts * granule);
  bounds.back() = end;
  return bounds;
}

// Heads an ATTN_REDUCE merges: CompileOptions.attention_reduce_heads, or two (one where a head is wider than half the
// consumer threads): heads of 64 in reduces of 2, not 4, spread the reduce over twice the SMs (TinyLlama -0.6% at
// 1024, 1B level: docs/history/performance_log.md); heads of 128 as before.
inline uint32_t AttnReduceHeads(uint32_t head_dim, const CompileOptions& o) {
  if (o.attention_reduce_heads() > 0) return o.attention_reduce_heads();
  return std::clamp<uint32_t>(isa::kAttnThreads / head_dim, 1, 2);
}
// The reduce the split-count rule prices: a consumer thread per output element whatever AttnReduceHeads is. Priced at
// two heads of 64 it picks 32 splits for TinyLlama, +2.3% at 1024 against 21 (the cost model's split misses what
// more splits cost on the chain).
inline uint32_t AttnReduceHeadsPriced(uint32_t head_dim) { return std::max<uint32_t>(1, isa::kAttnThreads / head_dim); }

// Decode attention's split count a KV head when CompileOptions.attention_splits is 0 (lowering_attention.cc), for
// a KV cache of kv_bytes an element (isa::KvBytes).
uint32_t AutoAttentionSplits(uint32_t heads, uint32_t kv, uint32_t head_dim, uint32_t max_seq, uint32_t min_positions,
                             const CompileOptions& o, uint32_t kv_bytes = 4);

// Which barriers make a tensor ready: one, or one per chunk (PER_CHUNK producers).
struct Producer {
  std::vector<uint32_t> barriers;
};

class Lowering {
 public:
  Lowering(const graph::Graph& graph, const CompileOptions& options) : graph_(graph), o_(options) {
    // A decode program runs in one kernel variant, which compiles one quantized matvec: where a graph holds int4 and
    // FP8 weights, the int4 ones stay (the larger saving) and the FP8 ones are widened to bf16.
    for (const graph::TensorDef& t : graph.def().tensors()) has_int4_ = has_int4_ || t.dtype() == graph::I4;
  }

  absl::StatusOr<Program> Run();

 private:
  // ---- tables ----
  uint32_t AddTensor(const std::string& name, graph::DType dtype, std::vector<int64_t> shape, Region region);
  uint32_t ArenaTensorFor(const std::string& graph_tensor);
  // The sources packed as one tensor in `order` (rows padded to the matvec row stride). Quantized weights stay so
  // when every source is one of the same kind and allow_quantized: FP8 (their scales in fp8_scales_), int4 of one
  // group size in whole bands of 16 rows (their meta in w4_meta_); else they are widened to bf16.
  uint32_t PackedWeightFor(const std::vector<std::string>& sources, RowOrder order, uint32_t head_dim = 0,
                           uint32_t num_kv_heads = 0, bool allow_quantized = true);
  uint32_t RopeTable(const graph::RopeAttrs& rope);

  // ---- barriers and waits ----
  uint32_t NewBarrier(const std::string& name, const std::vector<isa::Wait>& waits);
  std::vector<isa::Wait> WaitsFor(const std::vector<uint32_t>& barriers) const;
  std::vector<uint32_t> ReadyBarriers(const std::string& graph_tensor) const;
  int NewGroup(const std::string& name);
  void Emit(const Instruction& inst, uint32_t signal, const std::vector<isa::Wait>& waits, const std::string& op,
            int group);
  template <typename Args>
  static Instruction Make(Opcode op, const Args& args) {
    Instruction inst{};
    inst.opcode = static_cast<uint8_t>(op);
    inst.as<Args>() = args;
    return inst;
  }

  // ---- op lowerings ----
  absl::Status LowerEmbedding(const OpDef& op);
  absl::Status LowerRmsNorm(const OpDef& op);
  absl::Status LowerLinear(const OpDef& op);
  absl::Status LowerAttention(const OpDef& op);
  absl::Status LowerElementwise(const OpDef& op);
  // CONV1D (depthwise causal, its state in the arena): CONV1D instructions over channel ranges.
  absl::Status LowerConv1d(const OpDef& op);
  // An exact f32 copy of a weight (CONV1D's taps and bias).
  uint32_t F32WeightFor(const std::string& weight);
  absl::Status LowerArgmax(const OpDef& op, uint32_t partials, uint32_t num_partials,
                           const std::vector<uint32_t>& ready);

  static isa::MatvecArgs NoBias() {
    isa::MatvecArgs a{};
    a.bias = isa::kNoTensor;
    return a;
  }
  // The per-head q/k RMSNorm (group_size == head_dim) feeding `rope`'s input, if any.
  const OpDef* HeadNorm(const OpDef& rope) const;
  struct MatvecGroup {
    std::string name;
    std::string op;
    uint32_t weight = 0;
    uint64_t rows = 0;
    uint32_t k = 0;
    uint32_t granule = 1;
    std::vector<uint64_t> chunks;  // chunk boundaries; a chunk never shares a tile (and gets its barrier)
    isa::MatvecArgs args = NoBias();  // everything but row_begin / rows / tile_index
    std::vector<uint32_t> ready;   // barriers the input needs
  };
  // Emits the tiles; returns the barriers (one per chunk when chunked barriers are on).
  std::vector<uint32_t> EmitMatvec(MatvecGroup& group, bool chunk_barriers);
  // Input of a matvec: a plain tensor or a deferred RMSNorm (prologue).
  void SetMatvecInput(const std::string& x, isa::MatvecArgs* args, std::vector<uint32_t>* ready);

  std::optional<absl::Status> TryQkv(const OpDef& linear);
  std::optional<absl::Status> TryGateUp(const OpDef& linear);
  bool OnlyConsumer(const std::string& tensor, const OpDef& consumer) const;
  absl::Status Unsupported(const OpDef& op, const std::string& why) const {
    return absl::UnimplementedError(
        absl::StrCat("op '", op.name(), "' (", graph::OpType_Name(op.type()), "): ", why));
  }

  const graph::Graph& graph_;
  const CompileOptions& o_;
  Program p_;
  absl::flat_hash_map<std::string, uint32_t> tensor_ids_;
  absl::flat_hash_map<std::string, uint32_t> packed_ids_;
  absl::flat_hash_map<uint32_t, uint32_t> fp8_scales_;      // FP8 packed weight -> its rows' scales (f32)
  struct W4Meta {
    uint32_t meta;         // its rows' groups (I32 words)
    uint32_t group_shift;  // log2 of the group's columns
  };
  absl::flat_hash_map<uint32_t, W4Meta> w4_meta_;            // int4 packed weight -> its meta
  bool has_int4_ = false;                                    // the graph holds int4 weights
  absl::flat_hash_map<std::string, uint32_t> rope_tables_;  // by serialized RopeAttrs
  absl::Status error_;                                      // first problem found while emitting
  absl::flat_hash_map<std::string, Producer> ready_;
  std::vector<absl::flat_hash_set<uint32_t>> implied_;  // per barrier: barriers it transitively implies
  absl::flat_hash_set<std::string> consumed_;           // op names lowered as part of another op
  struct DeferredNorm {
    std::string x, weight;
    float eps;
  };
  absl::flat_hash_map<std::string, DeferredNorm> deferred_norms_;
  struct FusedQkv {
    uint32_t q;  // arena tensor of the rotated q
    std::vector<uint32_t> barriers;
  };
  absl::flat_hash_map<std::string, FusedQkv> fused_qkv_;  // by attention op name
  std::string token_input_, pos_input_;
  uint32_t tokens_ = 0, step_state_ = 0;
  size_t embed_node_ = 0, embeds_ = 0;  // the decode EMBED's node, and how many (ARGMAX_REDUCE may fold in one)
  uint64_t region_bytes_[2] = {0, 0};
};

}  // namespace loom::scheduler::lowering_internal
