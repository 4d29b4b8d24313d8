// The general-graph lowering's internals (graph_lowering.cc: the driver, element-wise ops, pools, softmax, concat,
// reshape; graph_lowering_gemm.cc: convolutions, matmuls, GEMM emission and its epilogue fusions). Not an API:
// scheduler/graph_lowering.h is.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "scheduler/pass_builder.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler::graph_lowering_internal {

using graph::OpDef;
using graph::TensorDef;

constexpr uint64_t kMinElementsPerInstruction = 1024;
constexpr uint32_t kPackRows = 16;    // PACK_ROWS rows per instruction, at least (a warp per row)
constexpr uint32_t kImToColRows = 4;  // IM2COL rows per instruction, at least (all threads share the rows' chunks)
constexpr uint32_t kNone = isa::kNoTensor;
constexpr uint32_t kMaxKSplits = 16;       // of a GEMM with few output tiles
constexpr uint32_t kMinSlabsPerSplit = 2;  // K slabs (of 64) each split multiplies, at least
// A convolution split over K has its sum copied to bf16 (NHWC_BF16, a stage of its own) for the convolutions
// reading it when one of them multiplies at least this many K slabs an instruction: a slab gathered as bf16 saves
// ~0.5 us against f32, the copy's stage costs ~3 us (H100, ResNet-18: batch 8's readers take 7-9 slabs and gain
// 8%, batch 1's take 2-4.5 and lost 13% with a copy each; docs/history/performance_log.md).
constexpr uint32_t kMinSlabsForBf16Copy = 6;

inline std::vector<uint64_t> ShapeOf(const TensorDef& t) { return {t.shape().begin(), t.shape().end()}; }
inline uint64_t Product(const std::vector<uint64_t>& s, size_t from = 0) {
  uint64_t p = 1;
  for (size_t i = from; i < s.size(); ++i) p *= s[i];
  return p;
}
inline std::vector<uint64_t> ContiguousStrides(const std::vector<uint64_t>& shape) {
  std::vector<uint64_t> strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) strides[i] = Product(shape, i + 1);
  return strides;
}
// Element strides of an operand of shape `in` broadcast (numpy rules, aligned right) to `out`.
inline std::vector<uint64_t> BroadcastStrides(const std::vector<uint64_t>& in, const std::vector<uint64_t>& out) {
  const std::vector<uint64_t> contiguous = ContiguousStrides(in);
  std::vector<uint64_t> strides(out.size(), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t j = static_cast<int64_t>(i) - static_cast<int64_t>(out.size() - in.size());
    if (j >= 0 && !(in[j] == 1 && out[i] != 1)) strides[i] = contiguous[j];
  }
  return strides;
}

// An output shape walked with an element stride per operand (0: broadcast), outermost dimension first.
struct StridedDims {
  std::vector<uint64_t> size;
  std::vector<std::vector<uint64_t>> strides;  // [operand][dimension]
};
// Drops size-1 dimensions and merges neighbours every operand walks contiguously; nullopt if more than
// kElementwiseDims remain (otherwise padded to exactly that many).
inline std::optional<StridedDims> Collapse(const StridedDims& d) {
  StridedDims out;
  out.strides.resize(d.strides.size());
  for (size_t i = 0; i < d.size.size(); ++i) {
    if (d.size[i] == 1) continue;
    bool merge = !out.size.empty();
    for (size_t o = 0; merge && o < d.strides.size(); ++o) merge = out.strides[o].back() == d.strides[o][i] * d.size[i];
    if (merge)
      out.size.back() *= d.size[i];
    else
      out.size.push_back(d.size[i]);
    for (size_t o = 0; o < d.strides.size(); ++o) {
      if (merge)
        out.strides[o].back() = d.strides[o][i];
      else
        out.strides[o].push_back(d.strides[o][i]);
    }
  }
  if (out.size.size() > isa::kElementwiseDims) return std::nullopt;
  while (out.size.size() < isa::kElementwiseDims) {
    out.size.insert(out.size.begin(), 1);
    for (auto& s : out.strides) s.insert(s.begin(), 0);
  }
  return out;
}

// A prefill pass of a decoder without attention (decode graph: batch-1 rows): what it extends and how many rows.
struct PrefillTarget {
  IoBinding io;          // the decode schedule's tokens, step state and logits
  uint32_t max_seq = 0;  // of the decode loop
  uint32_t rows = 0;     // prompt rows
};

class NnLowering {
 public:
  // A general graph's pass.
  NnLowering(const graph::Graph& graph, const CompileOptions& options) : g_(graph), o_(options) {}
  // A prefill pass over `decode`'s tensors (its weights, STATE tensors, token buffer), scratch past its arena.
  NnLowering(const graph::Graph& graph, const CompileOptions& options, PassBuilder decode, const PrefillTarget& target);

  absl::StatusOr<Schedule> Run(const std::string& model);
  // The prefill pass: every row-wise op over `rows` rows (those only the last row's logits need, over that row),
  // CONV1D continuing from the decode's state, ARGMAX writing the next token as a decode step's end does.
  absl::StatusOr<Schedule> RunPrefill(const std::string& model);

  // Ops a prefill pass covers (nullptr), or the first it does not.
  static const OpDef* FirstNotPrefillable(const graph::Graph& graph);

 private:
  bool prefill() const { return target_.rows > 0; }
  // A scratch tensor of this pass (named with the pass's prefix, as `view_of` is).
  uint32_t Scratch(const std::string& name, graph::DType dtype, std::vector<int64_t> shape,
                   const std::string& view_of = "", uint64_t view_offset = 0) {
    return b_.Scratch(prefix_ + name, dtype, std::move(shape), view_of.empty() ? "" : prefix_ + view_of,
                      view_offset);
  }
  absl::Status LowerEmbedding(const OpDef& op);  // a prefill pass's prompt rows, or a general graph's lookup
  absl::Status LowerArgmax(const OpDef& op);
  // Prefill: the graph tensor holding the last row of `name` (which has every prompt row): a view of it, or of a
  // deferred RMSNorm the same norm over its input's last row.
  std::string LastRow(const std::string& name);

  absl::Status Lower(const OpDef& op);

  absl::Status Unsupported(const OpDef& op, const std::string& why) const {
    return absl::UnimplementedError(absl::StrCat("op '", op.name(), "' (", graph::OpType_Name(op.type()), "): ", why));
  }

  // A graph tensor's definition (in a prefill pass: with the rows it has there).
  const TensorDef& T(const std::string& name) const {
    if (auto it = rows_defs_.find(name); it != rows_defs_.end()) return it->second;
    return g_.tensor(name);
  }

  // The f32 arena tensor of a graph tensor (an i32 input's: i32), created on first use in the graph's shape (a
  // prefill pass's STATE tensors and logits are the decode schedule's).
  uint32_t Arena(const std::string& name) {
    if (auto it = arena_.find(name); it != arena_.end()) return it->second;
    if (prefill() && T(name).kind() == graph::STATE) {
      absl::StatusOr<uint32_t> found = b_.Find(name);
      if (found.ok()) return arena_[name] = *found;
    }
    if (prefill() && name == logits_) return arena_[name] = target_.io.logits();
    const std::vector<uint64_t> shape = ShapeOf(T(name));
    const graph::DType dtype = T(name).dtype() == graph::I32 ? graph::I32 : graph::F32;  // (i32: embedding ids)
    const uint32_t id = Scratch(name, dtype, std::vector<int64_t>(shape.begin(), shape.end()));
    arena_[name] = id;
    return id;
  }

  // A copy of `name` (input-backed) in a tensor of its own, by an ELEMENTWISE copy.
  uint32_t CopyOut(const std::string& name);

  // An f32 operand: an activation's arena tensor, or a weight's exact f32 copy.
  absl::StatusOr<uint32_t> Operand(const OpDef& op, const std::string& name);

  // The stages to wait for before reading `names` (inputs and weights: none).
  std::vector<uint32_t> ReadyOf(const std::vector<std::string>& names) const {
    std::vector<uint32_t> stages;
    for (const std::string& n : names) {
      auto it = stage_.find(n);
      if (it != stage_.end() && std::find(stages.begin(), stages.end(), it->second) == stages.end()) {
        stages.push_back(it->second);
      }
    }
    return stages;
  }

  void Emit(isa::Instruction inst, uint32_t stage, const std::vector<uint32_t>& after, const std::string& name) {
    inst.num_waits = static_cast<uint8_t>(after.size());
    for (size_t i = 0; i < after.size(); ++i) inst.waits[i] = {after[i], 0};
    b_.EmitRaw(inst, stage, name);
  }
  template <typename Args>
  static isa::Instruction Make(isa::Opcode op, const Args& args) {
    isa::Instruction inst{};
    inst.opcode = static_cast<uint8_t>(op);
    inst.as<Args>() = args;
    return inst;
  }

  // [begin, end) chunks of `total` elements: about two instructions per SM, none tiny.
  std::vector<std::pair<uint64_t, uint64_t>> Chunks(uint64_t total, uint64_t granule) const {
    uint64_t per = std::max<uint64_t>(kMinElementsPerInstruction, (total + 2 * o_.num_sms() - 1) / (2 * o_.num_sms()));
    per = (per + granule - 1) / granule * granule;
    std::vector<std::pair<uint64_t, uint64_t>> chunks;
    for (uint64_t b = 0; b < total; b += per) chunks.emplace_back(b, std::min(total, b + per));
    return chunks;
  }

  // [begin, end) chunks of `outputs` elements that each reduce a window of `window` inputs (POOL, DWCONV): about
  // two instructions per SM by work (outputs x window), whole multiples of 64 outputs.
  std::vector<std::pair<uint64_t, uint64_t>> WindowChunks(uint64_t outputs, uint64_t window) const {
    const uint64_t per = std::max<uint64_t>(
        64, (std::max<uint64_t>(kMinElementsPerInstruction * 4, outputs * window / (2 * o_.num_sms())) / window + 63) /
                64 * 64);
    std::vector<std::pair<uint64_t, uint64_t>> chunks;
    for (uint64_t b = 0; b < outputs; b += per) chunks.emplace_back(b, std::min(outputs, b + per));
    return chunks;
  }

  // What a GEMM computing `op`'s output writes: that output, or (taking over the ops as its epilogue) the output
  // of a following residual ADD and / or RELU that are the only readers of what they read.
  struct Epilogue {
    std::string out;
    uint32_t residual = kNone;
    std::vector<std::string> residual_names;
    bool relu = false;
    std::string ops;
    bool bf16 = false;  // a convolution's: a bf16 copy too (other convolutions read it; split over K: NHWC_BF16's)
    bool f32 = true;    // stored as f32 (some reader needs it, or it is an output)
  };
  Epilogue FuseEpilogue(const OpDef& op);

  // ELEMENTWISE instructions over a contiguous f32 tensor of `elements`, out = f(a) elementwise, signalling
  // `stage` (a new one unless given); returns the stage.
  uint32_t EmitMap(uint32_t func, uint32_t a, uint32_t out, uint64_t elements, const std::vector<uint32_t>& after,
                   const std::string& name, std::optional<uint32_t> into = std::nullopt);

  // C = A·Wᵀ (+ bias) into the epilogue's output: every output tile, m-tiles inside n-tiles (concurrent SMs share
  // W tiles in L2), waiting for A's stage and the residual's. A GEMM of fewer tiles than half the SMs is split
  // over K as well: each split stores its part (the first one with the bias), and a SUM_SPLITS stage adds the
  // residual (or nothing) and the parts in part order, then the ReLU.
  // `siblings` GEMMs of this shape run side by side (a batched MATMUL's, all signalling `into`): the split over K
  // counts all their tiles.
  // What it multiplies: an operand image (ready once `ready`, its packing stage, is), or a convolution's patches,
  // gathered from the input by CONV_GEMM (the geometry in `conv`; ready once the input's stages are).
  struct GemmA {
    uint32_t image = kNone;
    std::vector<uint32_t> ready;
    std::optional<isa::ConvGemmArgs> conv;
  };
  void EmitGemm(const Epilogue& e, const GemmA& a, uint32_t weight, uint32_t bias, uint32_t m, uint32_t n, uint32_t k,
                std::optional<uint32_t> into = std::nullopt, uint32_t siblings = 1);

  // The ways a GEMM of `tiles` output tiles and `slabs` K slabs is split over K (1: not split), `siblings` GEMMs of
  // its shape beside it.
  uint32_t KSplits(uint32_t tiles, uint32_t slabs, uint32_t siblings) const;
  // Whether a split convolution's output `name` is worth a bf16 copy for its readers (kMinSlabsForBf16Copy).
  bool Bf16CopyPays(const std::string& name) const;

  // Rows of an operand image per IM2COL / PACK_ROWS instruction: about two instructions per SM, at least
  // `granule` rows (PACK_ROWS: a warp per row).
  uint32_t RowsPerInstruction(uint32_t m, uint32_t granule) const;

  // Groups 1: one CONV_GEMM (implicit GEMM, with the epilogue fusions). Groups g: per group a CONV_GEMM over its input
  // channels against its rows of the weight into a scratch [M, OC / g], and a strided copy into its columns of the
  // output. With CompileOptions.conv_im2col (or a geometry CONV_GEMM cannot pack), each CONV_GEMM is an IM2COL of
  // the patches into an operand image + a GEMM.
  absl::Status LowerConv(const OpDef& op);
  // Depthwise (one input channel per group): DWCONV, direct.
  absl::Status LowerDepthwise(const OpDef& op);
  // A CONV2D's geometry as IM2COL's args (no tensors, first group), and whether it lowers to CONV_GEMM.
  isa::ImToColArgs ConvGeometry(const OpDef& op) const;
  bool ImplicitConv(const OpDef& op) const;
  // Whether `reader` is a convolution that gathers `name` as bf16 when a bf16 copy exists (conv_bf16_activations).
  bool ReadsBf16(const OpDef& reader, const std::string& name) const;
  // Sets e.bf16 / e.f32 for a convolution's epilogue output from its readers.
  void ChooseConvOutputs(Epilogue& e) const;
  // A convolution whose channels are not a multiple of 8 (a 3-channel image): its input copied by NHWC_BF16 into
  // bf16 with the channels zero-padded to the next multiple of 8 (the returned count; 0: not so lowered), its
  // weight packed with the same zero channels, so it gathers bf16 16-byte chunks (conv_bf16_activations).
  uint32_t PaddedChannels(const OpDef& conv) const;
  // The NHWC_BF16 copy of `op`'s input with `channels` channels (a deferred transpose's source read through its
  // strides): the bf16 tensor and its stage.
  absl::StatusOr<std::pair<uint32_t, uint32_t>> PadChannels(const OpDef& op, uint32_t channels);
  // NHWC_BF16 instructions over a's pixels (everything but begin / count set), in a stage of their own waiting for
  // `after`; returns the stage.
  uint32_t EmitNhwcBf16(isa::NhwcBf16Args a, const std::vector<uint32_t>& after, const std::string& name);

  // LINEAR (x [..., K], w [N, K] [, bias]) and MATMUL (a [..., M, K], a constant b [K, N]): the rows of x packed
  // into an operand image, then a GEMM.
  absl::Status LowerMatmul(const OpDef& op);
  struct GateUp {
    const OpDef* gate;
    const OpDef* up;
    const OpDef* silu;
  };
  std::optional<GateUp> FindGateUp(const OpDef& op) const;

  // MATMUL whose right-hand side is not a constant matrix (two activations: attention's Q·Kᵀ and P·V): B
  // transposed into a scratch by ELEMENTWISE, every batch's A and Bᵀ packed into operand images, a GEMM per batch
  // into its slice of the output (numpy batch broadcasting: one image per distinct batch of each operand).
  absl::Status LowerBatchedMatmul(const OpDef& op);

  // An f32 arena tensor holding `name` (a weight is copied in first: views need an arena tensor), ready at the
  // returned stage (or none).
  absl::StatusOr<std::pair<std::string, std::vector<uint32_t>>> ArenaCopy(const OpDef& op, const std::string& name);

  // LAYER_NORM and RMS_NORM (per-head too: rows of group_size): NORM_ROWS, a warp per row.
  absl::Status LowerNorm(const OpDef& op);

  // CONV1D (depthwise causal, with state): CONV1D instructions over channel ranges, the state updated in place.
  absl::Status LowerConv1d(const OpDef& op);

  static uint32_t FuncOf(const OpDef& op) {
    switch (op.type()) {
      case graph::RELU:
        return isa::kEwRelu;
      case graph::SIGMOID:
        return isa::kEwSigmoid;
      case graph::GELU:
        return op.gelu().tanh() ? isa::kEwGeluTanh : isa::kEwGelu;
      case graph::ERF:
        return isa::kEwErf;
      case graph::TANH:
        return isa::kEwTanh;
      case graph::EXP:
        return isa::kEwExp;
      case graph::SQRT:
        return isa::kEwSqrt;
      case graph::LOG:
        return isa::kEwLog;
      case graph::HARD_SIGMOID:
        return isa::kEwHardSigmoid;
      case graph::HARD_SWISH:
        return isa::kEwHardSwish;
      case graph::RELU6:
        return isa::kEwRelu6;
      case graph::MAXIMUM:
        return isa::kEwMax;
      case graph::MINIMUM:
        return isa::kEwMin;
      case graph::GREATER:
        return isa::kEwGreater;
      case graph::LESS:
        return isa::kEwLess;
      case graph::EQUAL:
        return isa::kEwEqual;
      case graph::GREATER_EQUAL:
        return isa::kEwGreaterEqual;
      case graph::LESS_EQUAL:
        return isa::kEwLessEqual;
      case graph::KEEP:
        return isa::kEwKeep;
      case graph::ADD:
        return isa::kEwAdd;
      case graph::SUB:
        return isa::kEwSub;
      case graph::MUL:
        return isa::kEwMul;
      case graph::DIV:
        return isa::kEwDiv;
      case graph::SILU_MUL:
        return isa::kEwSiluMul;
      default:
        return isa::kEwCopy;  // TRANSPOSE, EXPAND
    }
  }

  absl::Status LowerElementwise(const OpDef& op);

  // ELEMENTWISE instructions over `dims` (strides: each operand's, then out's) into `out`, signalling `stage`.
  absl::Status EmitStrided(const OpDef& op, uint32_t func, const std::vector<uint32_t>& operands, uint32_t out,
                           const StridedDims& dims, uint32_t stage, const std::vector<uint32_t>& after);

  // Each input copied into its slice of the output (a view of it from the slice's first element), strided.
  absl::Status LowerConcat(const OpDef& op);
  absl::Status LowerSlice(const OpDef& op);
  absl::Status LowerPad(const OpDef& op);

  absl::Status LowerPool(const OpDef& op);

  absl::Status LowerSoftmax(const OpDef& op);

  // The same f32 elements under the output's shape: a view of the input's arena tensor.
  absl::Status LowerReshape(const OpDef& op);

  const graph::Graph& g_;
  const CompileOptions& o_;
  PassBuilder b_;
  PrefillTarget target_;
  std::string prefix_;                                       // of scratch names ("prefill." in a prefill pass)
  absl::flat_hash_map<std::string, TensorDef> rows_defs_;    // prefill: tensors that have every prompt row
  uint32_t pass_state_ = kNone;                              // prefill: the pass's step state
  std::string logits_;                                       // prefill: what the ARGMAX reads (decode's logits)
  absl::flat_hash_map<std::string, uint32_t> arena_;  // graph tensor -> its schedule tensor
  absl::flat_hash_map<std::string, uint32_t> stage_;  // graph tensor -> the stage that writes it
  absl::flat_hash_set<std::string> consumed_;         // ops a GEMM's epilogue took over
  absl::flat_hash_set<std::string> input_backed_;     // inputs and views of them
  absl::flat_hash_map<std::string, uint32_t> bf16_;  // graph tensor -> its bf16 copy (a CONV_GEMM epilogue's)
  // Graph tensor -> the stage of its bf16 copy where that is not the tensor's own (NHWC_BF16 after a convolution
  // split over K): what its bf16 readers wait for.
  absl::flat_hash_map<std::string, uint32_t> bf16_stage_;
  // TRANSPOSEs read only by a convolution whose NHWC_BF16 copy reads their input through the permuted strides
  // (nothing emitted for them): output -> (input, the input's strides in the output's dimension order).
  absl::flat_hash_map<std::string, std::pair<std::string, std::vector<uint64_t>>> deferred_transposes_;
  // Operand images of matmul inputs already packed: the image and its stage.
  absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> images_;
  // RMSNorms read only by LINEARs: applied by PACK_ROWS as it packs their input.
  struct DeferredNorm {
    std::string x, weight;
    float eps;
  };
  absl::flat_hash_map<std::string, DeferredNorm> deferred_norms_;
};

}  // namespace loom::scheduler::graph_lowering_internal
