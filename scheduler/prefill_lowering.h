// The one-pass prefill of a decoder with attention (scheduler/prefill.h), lowered op by op from the decode graph:
// the walk goes through the graph's ops in topological order and each op type has its rule, beside its family:
//   prefill.cc            the walk, the pass's policies (pages, tile widths, row-tile barriers) and its frame;
//   prefill_linear.cc     RMSNorm (deferred into the PACK_ROWS of its readers), LINEAR into GEMM (the residual
//                         stream updated in place, split over K with the parts folded into the next pack, the
//                         gated MLP's gate / up / SiLU-mul as one GEMM);
//   prefill_attention.cc  q / k / v LINEARs (+ per-head norms) and RoPE as one GEMM appending K / V to the cache,
//                         ATTENTION as FLASH_ATTN;
//   prefill_logits.cc     the last row's final norm + LM head as MATVEC tiles with argmax partials, ARGMAX.
// A graph whose ops these rules do not cover is refused with the first such op and the reason. Internal to
// scheduler/.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "instructions/isa.h"
#include "scheduler/pass_builder.h"
#include "scheduler/prefill.h"

namespace loom::scheduler::prefill_internal {

using graph::OpDef;

// What a pass extends: a decode schedule (run time), the decode program being compiled (compile time: the pass
// of one row names every weight a pass streams), or nothing (`check_only`: whether the graph has a lowering).
struct DecodeTarget {
  IoBinding io;
  uint32_t max_seq = 1, num_sms = 132;
  SmemConfig smem;                        // the decode's (the pass fits its own pages and slot)
  std::vector<const Constant*> constants;  // the decode's rope tables among them
  bool check_only = false;                 // decode tensors not found stand in as tensor 0
};

class DecoderPrefill {
 public:
  DecoderPrefill(const graph::Graph& graph, PassBuilder b, DecodeTarget decode, uint32_t rows,
                 const PrefillOptions& options);
  // The pass's program and its ring page size (0: FitPassSmem's choice), or the first op no rule lowers.
  absl::StatusOr<std::pair<Program, uint32_t>> Lower();
  uint32_t pass_state() const { return pass_state_; }

 private:
  absl::Status Refuse(const OpDef& op, const std::string& why) const {
    return absl::UnimplementedError(
        absl::StrCat("prefill: op '", op.name(), "' (", graph::OpType_Name(op.type()), "): ", why));
  }
  // A tensor of the decode schedule (its weights, KV caches, rope tables) by name.
  absl::StatusOr<uint32_t> Decode(const std::string& name) const;
  // A packed WEIGHTS tensor of the pass (found in the decode schedule, or added: then the schedule lacks it, and
  // Lower's caller refuses it).
  uint32_t Weight(const std::string& prefix, const std::vector<std::string>& sources, RowOrder order, uint64_t rows,
                  uint64_t cols, bool image, uint32_t head_dim = 0, uint32_t kv_heads = 0);
  // The graph's readers of `t`.
  std::vector<const OpDef*> Readers(const std::string& t) const { return g_.consumers(t); }
  // Marks ops lowered by another op's rule.
  void Consume(std::initializer_list<const OpDef*> ops) {
    for (const OpDef* op : ops) consumed_.insert(op->name());
  }

  // prefill.cc
  void Policies();

  // prefill_linear.cc
  absl::Status LowerEmbedding(const OpDef& op);
  absl::Status LowerNorm(const OpDef& op);
  absl::Status LowerLinear(const OpDef& op);
  // The operand image a GEMM reads for graph tensor `t`, the stage it waits for and the norm it applies
  // (GemmArgs::row_norm): an image a rule wrote (the attention output's, the SiLU-mul's), or a deferred RMSNorm's,
  // packed here (adding x's pending parts; sliced, the GEMM applies the norm).
  struct Image {
    uint32_t image;
    StageRef stage;
    uint32_t row_norm;
  };
  absl::StatusOr<Image> ImageOf(const OpDef& reader, const std::string& t);
  StageRef Pack(const OpDef& norm);
  // Every output tile of one GEMM, m-tiles inside n-tiles (concurrent SMs share W tiles in L2); a residual GEMM
  // with few tiles split over K (its parts pending until the next pack). Returns its stage.
  StageRef Gemm(const std::string& name, const std::string& ops, isa::GemmArgs g, StageRef after, bool tiled_stage);
  absl::Status LowerGateUp(const OpDef& gate, const OpDef& up, const OpDef& silu);
  absl::Status LowerResidual(const OpDef& linear, const OpDef& add);
  // x's pending parts added into x by a SUM_SPLITS stage (before a reader that does not fold them).
  void FlushParts();

  // prefill_attention.cc
  absl::Status LowerQkv(const OpDef& attention);
  absl::Status LowerAttention(const OpDef& op);
  // The ATTENTION a q / k / v LINEAR's output reaches (through a per-head RMSNorm and RoPE), if any.
  const OpDef* AttentionOf(const OpDef& linear) const;

  // prefill_logits.cc
  absl::Status LowerLmHead(const OpDef& linear, const OpDef& argmax);
  // Whether `t` is read only by the final norm of an LM head (the last row's logits).
  bool OnlyLmHeadReads(const std::string& t) const;

  const graph::Graph& g_;
  PassBuilder b_;
  DecodeTarget d_;
  const PrefillOptions o_;
  const uint32_t P_;

  // Policies (prefill.cc).
  uint32_t hidden_ = 0, vocab_ = 0, tiles_m_ = 0;
  uint32_t widest_q_ = 0, widest_inter_ = 0, widest_flash_ = 0;  // over the graph's attentions and MLPs
  bool tiled_ = false;       // a barrier per 128-row tile (PrefillOptions.row_tile_barriers)
  uint32_t pack_rows_ = 0;   // rows per PACK_ROWS instruction
  uint32_t page_bytes_ = 0;  // 0: FitPassSmem's choice
  bool wide_ = false;        // 128 x 256 GEMM tiles

  // The frame: scratch every layer reuses (prefill.cc).
  uint32_t x_ = isa::kNoTensor;           // the residual stream [P, hidden] f32, updated in place
  uint32_t image_h_ = isa::kNoTensor;     // a normed stream's operand image
  uint32_t q_rows_ = isa::kNoTensor;      // rotated q [P, heads * head_dim]
  uint32_t image_attn_ = isa::kNoTensor;  // attention's output image
  uint32_t image_s_ = isa::kNoTensor;     // the SiLU-mul output image
  uint32_t last_row_ = isa::kNoTensor;    // x's last row
  uint32_t pass_state_ = isa::kNoTensor;
  uint32_t row_norm_ = isa::kNoTensor;    // a sliced fold's per-row statistics [P, kRowNormSlots]

  // Walk state.
  absl::flat_hash_set<std::string> consumed_;           // ops another op's rule lowered
  absl::flat_hash_map<std::string, StageRef> ready_;    // graph tensor -> the stage after which it is written
  absl::flat_hash_map<std::string, uint32_t> images_;   // graph tensor -> its operand image (a rule's output)
  absl::flat_hash_map<std::string, const OpDef*> deferred_norms_;  // normed tensor -> its RMS_NORM
  struct Pending {
    SplitParts parts;
    std::string op;  // the GEMM that stored them
    StageRef stage;
  };
  std::optional<Pending> pending_;  // x's parts of a residual GEMM split over K, not added yet
  // The norm the next GEMM applies (GemmArgs::row_norm): row_norm_ after a sliced fold of the image it reads.
  uint32_t deferred_ = isa::kNoTensor;
  std::string packed_;  // the normed tensor image_h_ holds
  // What the QKV rule leaves its attention's FLASH_ATTN: the stage of q and the cache rows.
  absl::flat_hash_map<std::string, StageRef> qkv_stage_;
  std::string current_;        // the graph tensor x holds now
  absl::flat_hash_set<std::string> packed_norms_;  // deferred norms packed so far
  StageRef pack_stage_;        // of the image_h_ pack of packed_
  bool head_lowered_ = false;  // the LM head and its ARGMAX
};

}  // namespace loom::scheduler::prefill_internal
