// A decoder prefill's rules for the residual stream: the token embedding, RMSNorm (applied by the PACK_ROWS that
// packs its input for the GEMMs reading it), and LINEAR into GEMM: a projection added to the residual stream
// updates x in place (split over K where its tiles are few, the parts folded into the next pack), the gate and up
// projections of a SiLU-mul are one GEMM writing the down projection's operand image.
#include <algorithm>

#include "absl/strings/str_join.h"
#include "scheduler/prefill_lowering.h"

namespace loom::scheduler::prefill_internal {
namespace {

constexpr uint32_t kEmbedRowsPerInstruction = 4;
constexpr uint32_t kMaxKSplits = 16;
static_assert(isa::kGemmTileM % kEmbedRowsPerInstruction == 0, "instructions stay inside one 128-row tile");

// The columns of a sliced fold's instructions (PrefillOptions::slice_folds), each a slice of one prompt row. Sliced
// only where every row's slices take an SM each, one instruction per SM: a row in as many slices as there
// are SMs per prompt row (at most isa::kRowNormSlots, whole K slabs, each slice of a row one staging round of
// isa::kSumStageBytes: x, the parts, the weights). A second instruction on an SM doubles the stage, the pass's
// critical path. H100, random:llama-3.2-1b, TTFT ms against whole-row folds: P = 16 1.60 / 1.72 (8 slices), 64
// 1.75 / 1.82 (2), but 128 2.03 / 1.99 (2 slices, 2 instructions an SM), 512 3.23 / 3.06 (one row an instruction,
// four an SM), where a whole-row fold has about one row an SM already. nullopt: the whole-row fold.
std::optional<uint32_t> SliceColumns(uint32_t P, uint32_t hidden, uint32_t splits, uint32_t num_sms) {
  constexpr uint32_t kSlab = isa::kGemmSlabK;
  const uint32_t row_bytes_per_column = 4 * (splits + 1), slabs = hidden / kSlab;
  const uint32_t widest = isa::kSumStageBytes / (row_bytes_per_column + 2) / kSlab * kSlab;  // one row
  if (hidden % kSlab != 0 || widest == 0) return std::nullopt;
  const uint32_t fewest = (hidden + widest - 1) / widest;
  const uint32_t slices = std::min({std::max(fewest, num_sms / std::max(P, 1u)), isa::kRowNormSlots, slabs});
  if (slices < fewest || uint64_t{P} * slices > num_sms) return std::nullopt;
  return (slabs + slices - 1) / slices * kSlab;
}

std::string Names(std::initializer_list<const OpDef*> ops, const char* separator) {
  std::vector<std::string> names;
  for (const OpDef* op : ops) names.push_back(op->name());
  return absl::StrJoin(names, separator);
}

}  // namespace

// The prompt's token rows (positions [state.position, +rows) of the token buffer) into x, a few rows per
// instruction.
absl::Status DecoderPrefill::LowerEmbedding(const OpDef& op) {
  if (!current_.empty()) return Refuse(op, "a second token embedding");
  if (g_.tensor(op.inputs(0)).shape(1) != hidden_) return Refuse(op, "a table other than the pass's first");
  absl::StatusOr<uint32_t> table = Decode(absl::StrCat("packed:", op.inputs(0)));
  if (!table.ok()) return table.status();
  const StageRef stage = b_.Stages(op.name(), tiles_m_, tiled_);
  for (uint32_t r = 0; r < P_; r += kEmbedRowsPerInstruction) {
    const isa::EmbedArgs e{*table, d_.io.tokens(), d_.io.step_state(), x_, hidden_, vocab_,
                           isa::MatvecRowStride(hidden_), r, std::min(kEmbedRowsPerInstruction, P_ - r)};
    b_.Emit(isa::Opcode::EMBED, e, stage.Of(r / isa::kGemmTileM), std::nullopt, op.name());
  }
  current_ = op.outputs(0);
  ready_[current_] = stage;
  return absl::OkStatus();
}

// An RMSNorm of the residual stream read only by projections: nothing yet; the first GEMM reading it packs x
// normed (ImageOf).
absl::Status DecoderPrefill::LowerNorm(const OpDef& op) {
  if (op.norm().group_size() != 0) return Refuse(op, "a per-head RMSNorm other than of q or k before RoPE");
  if (op.inputs(0) != current_) return Refuse(op, "normalizes a tensor other than the residual stream's latest value");
  if (g_.tensor(op.outputs(0)).is_output()) return Refuse(op, "its output is a graph output");
  for (const OpDef* r : Readers(op.outputs(0))) {
    if (r->type() != graph::LINEAR || r->inputs(0) != op.outputs(0)) {
      return Refuse(op, absl::StrCat("its output is read by '", r->name(), "', not a projection"));
    }
  }
  deferred_norms_[op.outputs(0)] = &op;
  return absl::OkStatus();
}

absl::Status DecoderPrefill::LowerLinear(const OpDef& op) {
  if (g_.tensor(op.inputs(1)).kind() != graph::WEIGHT) return Refuse(op, "a weight computed at run time");
  if (const OpDef* attention = AttentionOf(op)) return LowerQkv(*attention);
  const std::vector<const OpDef*>& readers = Readers(op.outputs(0));
  if (readers.size() == 1 && readers[0]->type() == graph::SILU_MUL) {
    const OpDef& silu = *readers[0];
    const OpDef* gate = g_.producer(silu.inputs(0));
    const OpDef* up = g_.producer(silu.inputs(1));
    if (gate == nullptr || up == nullptr || gate == up || gate->type() != graph::LINEAR ||
        up->type() != graph::LINEAR || gate->inputs(0) != up->inputs(0)) {
      return Refuse(silu, "its inputs are not the gate and up projections of one input");
    }
    return LowerGateUp(*gate, *up, silu);
  }
  if (readers.size() == 1 && readers[0]->type() == graph::ADD) return LowerResidual(op, *readers[0]);
  if (readers.size() == 1 && readers[0]->type() == graph::ARGMAX) return LowerLmHead(op, *readers[0]);
  return Refuse(op, "its output is not q / k / v of an attention, gate / up of a SiLU-mul, added to the residual "
                    "stream or the logits of the argmax");
}

absl::StatusOr<DecoderPrefill::Image> DecoderPrefill::ImageOf(const OpDef& reader, const std::string& t) {
  if (auto it = images_.find(t); it != images_.end()) return Image{it->second, ready_.at(t), isa::kNoTensor};
  auto norm = deferred_norms_.find(t);
  if (norm == deferred_norms_.end()) {
    return Refuse(reader, absl::StrCat("reads '", t, "', which is neither a normed residual stream nor an attention's "
                                       "or SiLU-mul's output"));
  }
  if (packed_ != t) {
    if (norm->second->inputs(0) != current_) {
      return Refuse(reader, absl::StrCat("reads '", t, "', the norm of an earlier value of the residual stream"));
    }
    // The frame holds one normed image: the previous one's readers are all lowered before it is overwritten.
    if (!packed_.empty()) {
      for (const OpDef* r : Readers(packed_)) {
        if (!consumed_.contains(r->name())) {
          return Refuse(reader, absl::StrCat("reads '", t, "' while '", r->name(), "' has yet to read '", packed_, "'"));
        }
      }
    }
    pack_stage_ = Pack(*norm->second);
    packed_ = t;
    packed_norms_.insert(t);
  }
  return Image{image_h_, pack_stage_, deferred_};
}

// PACK_ROWS of x into the normed image (x * rsqrt(mean(x^2) + eps) * w, bf16), adding x's pending parts first.
StageRef DecoderPrefill::Pack(const OpDef& norm) {
  const std::string& name = norm.name();
  const uint32_t weight = Weight("vec:", {norm.inputs(1)}, ROWS_IDENTITY, hidden_, 1, false);
  const float eps = norm.norm().eps();
  const StageRef after = ready_.at(norm.inputs(0));
  const StageRef stage = b_.Stages(name, tiles_m_, tiled_);
  const std::optional<SplitParts> pending = pending_ ? std::optional<SplitParts>(pending_->parts) : std::nullopt;
  const std::optional<uint32_t> slice =
      pending && o_.slice_folds ? SliceColumns(P_, hidden_, static_cast<uint32_t>(pending->parts.size()), d_.num_sms)
                                : std::nullopt;
  deferred_ = slice ? row_norm_ : isa::kNoTensor;
  // Adding parts, a prompt row reads (splits + 1) rows: fewer rows an instruction (PrefillOptions.fold_rows).
  uint32_t fold = pack_rows_;
  if (pending) {
    const uint64_t row_bytes = uint64_t{hidden_} * 4 * (pending->parts.size() + 1);
    fold = o_.fold_rows != 0
               ? o_.fold_rows
               : static_cast<uint32_t>(std::clamp<uint64_t>(kFoldBytesPerInstruction / row_bytes, 1, pack_rows_));
  }
  // A sliced fold packs the prompt rows alone: the image's rows past P reach only accumulator rows no epilogue
  // stores (as the SiLU image's, which its GEMM never writes), and the GEMMs copy A only up to round8(P).
  const uint32_t rows_packed = slice ? P_ : tiles_m_ * isa::kGemmTileM;
  for (uint32_t r = 0; r < rows_packed;) {
    // Prompt rows by `fold` (or by slices), the padding after them by the usual count, neither across a row tile.
    const uint32_t tile_end = (r / isa::kGemmTileM + 1) * isa::kGemmTileM;
    if (slice) {  // a prompt row a slice
      for (uint32_t c = 0; c < hidden_; c += *slice) {
        isa::PackRowsArgs a{x_, image_h_, P_, hidden_, r, 1, weight, eps};
        a.parts = pending->all, a.splits = static_cast<uint32_t>(pending->parts.size());
        a.row_norm = row_norm_, a.col_begin = c, a.cols = *slice;
        b_.Emit(isa::Opcode::PACK_ROWS, a, stage.Of(r / isa::kGemmTileM), after.Of(r / isa::kGemmTileM), name);
      }
      ++r;
      continue;
    }
    const uint32_t rows = std::min(tile_end - r, pending && r < P_ ? std::min(fold, P_ - r) : pack_rows_);
    isa::PackRowsArgs a{x_, image_h_, P_, hidden_, r, rows, weight, eps};
    if (pending && r < P_) a.parts = pending->all, a.splits = static_cast<uint32_t>(pending->parts.size());
    b_.Emit(isa::Opcode::PACK_ROWS, a, stage.Of(r / isa::kGemmTileM), after.Of(r / isa::kGemmTileM), name);
    r += rows;
  }
  if (pending_) ready_[current_] = stage;  // x holds its sum from here
  pending_.reset();
  return stage;
}

// Every output tile of one GEMM, m-tiles inside n-tiles: concurrent SMs share W tiles in L2. A residual GEMM
// (x += A·Wᵀ in place) with fewer tiles than SMs is split over K as well (a short prompt's O- and down-proj
// would otherwise run on a few SMs through all of K): each split stores its part, and the next PACK_ROWS adds
// the parts to x in part order as it reads x for the next norm (before the LM head, a SUM_SPLITS stage), so the
// sum is the same every run (float atomics into x were not: logits moved by up to 0.05 and greedy tokens changed
// from run to run), and costs no stage of its own.
StageRef DecoderPrefill::Gemm(const std::string& name, const std::string& ops, isa::GemmArgs g, StageRef after,
                              bool tiled_stage) {
  const StageRef stage = b_.Stages(name, tiles_m_, tiled_stage);
  g.wide = wide_ && g.epilogue != isa::kGemmRopeKvAppend ? 1 : 0;
  const uint32_t tiles = isa::GemmTiles(g.m) * isa::GemmColumnTiles(g.n, g.wide), slabs = isa::GemmSlabs(g.k);
  auto emit = [&](const isa::GemmArgs& tile, uint32_t m) {
    b_.Emit(isa::Opcode::GEMM, tile, stage.Of(m), after.Of(m), ops);
  };
  // As many ways as keep every instruction in one wave (rounding up left some SMs two tiles' worth).
  const uint32_t splits =
      g.residual != x_ || g.out != x_ || 2 * tiles > d_.num_sms || slabs < 2
          ? 1
          : std::min({slabs, d_.num_sms / tiles, o_.max_splits != 0 ? o_.max_splits : kMaxKSplits});
  if (splits < 2) {
    ForEachGemmTile(g, 1, emit);
    return stage;
  }
  pending_ = Pending{AddSplitParts(b_, absl::StrCat("prefill.parts.", g.k), uint64_t{g.m} * g.n, splits), name, stage};
  g.epilogue = isa::kGemmPartialF32;
  g.residual = isa::kNoTensor;
  ForEachGemmTile(g, splits, emit, pending_->parts.parts);
  return stage;
}

// SiLU(gate) * up as one GEMM over interleaved (gate, up) rows whose epilogue writes the bf16 operand image of
// the projections reading it.
absl::Status DecoderPrefill::LowerGateUp(const OpDef& gate, const OpDef& up, const OpDef& silu) {
  for (const OpDef* p : {&gate, &up}) {
    if (Readers(p->outputs(0)).size() != 1 || g_.tensor(p->outputs(0)).is_output()) {
      return Refuse(*p, "its output is read by more than the SiLU-mul");
    }
    if (g_.tensor(p->inputs(1)).kind() != graph::WEIGHT) return Refuse(*p, "a weight computed at run time");
  }
  if (gate.inputs_size() != up.inputs_size()) return Refuse(silu, "gate and up must both have biases or neither");
  const uint32_t inter = static_cast<uint32_t>(g_.tensor(gate.inputs(1)).shape(0));
  const uint32_t k = static_cast<uint32_t>(g_.tensor(gate.inputs(1)).shape(1));
  if (g_.tensor(up.inputs(1)).shape(0) != inter || g_.tensor(up.inputs(1)).shape(1) != k) {
    return Refuse(silu, "gate and up weights of different shapes");
  }
  if (inter % isa::kGemmSlabK != 0) {
    return Refuse(silu, absl::StrCat("intermediate size ", inter, " is not a multiple of ", isa::kGemmSlabK,
                                     " (the SiLU-mul epilogue writes whole operand slabs)"));
  }
  if (g_.tensor(silu.outputs(0)).is_output()) return Refuse(silu, "its output is a graph output");
  for (const OpDef* r : Readers(silu.outputs(0))) {
    if (r->type() != graph::LINEAR || r->inputs(0) != silu.outputs(0)) {
      return Refuse(silu, absl::StrCat("its output is read by '", r->name(), "', not a projection"));
    }
  }
  absl::StatusOr<Image> a = ImageOf(gate, gate.inputs(0));
  if (!a.ok()) return a.status();
  isa::GemmArgs g{};
  g.a = a->image;
  g.weight = Weight("image:", {gate.inputs(1), up.inputs(1)}, ROWS_INTERLEAVE_PAIRS, 2ull * inter, k, true);
  g.out = image_s_;
  g.residual = isa::kNoTensor;
  g.m = P_;
  g.n = 2 * inter;
  g.k = k;
  g.bias = gate.inputs_size() > 2
               ? Weight("bias:", {gate.inputs(2), up.inputs(2)}, ROWS_INTERLEAVE_PAIRS, 2ull * inter, 1, false)
               : isa::kNoTensor;
  g.epilogue = isa::kGemmSiluMulToImage;
  g.row_norm = a->row_norm;
  const StageRef stage = Gemm(Names({&gate, &up}, "+"), Names({&gate, &up, &silu}, ","), g, a->stage, tiled_);
  Consume({&gate, &up, &silu});
  images_[silu.outputs(0)] = image_s_;
  ready_[silu.outputs(0)] = stage;
  return absl::OkStatus();
}

// x = x + A·Wᵀ (+ bias), in place: each element is read, then written, by the same thread.
absl::Status DecoderPrefill::LowerResidual(const OpDef& linear, const OpDef& add) {
  const std::string& residual = add.inputs(0) == linear.outputs(0) ? add.inputs(1) : add.inputs(0);
  if (residual != current_ || residual == linear.outputs(0)) {
    return Refuse(add, "adds a projection to a tensor other than the residual stream's latest value");
  }
  // Every other reader of the stream read it before it is overwritten: a norm already packed.
  for (const OpDef* r : Readers(residual)) {
    if (r != &add && !packed_norms_.contains(r->outputs(0))) {
      return Refuse(add, absl::StrCat("'", r->name(), "' reads the residual stream after this projection adds to it"));
    }
  }
  const uint32_t n = static_cast<uint32_t>(g_.tensor(linear.inputs(1)).shape(0));
  const uint32_t k = static_cast<uint32_t>(g_.tensor(linear.inputs(1)).shape(1));
  if (n != hidden_) return Refuse(linear, absl::StrCat("adds ", n, " columns to a residual stream of ", hidden_));
  absl::StatusOr<Image> a = ImageOf(linear, linear.inputs(0));
  if (!a.ok()) return a.status();
  if (pending_) FlushParts();
  isa::GemmArgs g{};
  g.a = a->image;
  g.weight = Weight("image:", {linear.inputs(1)}, ROWS_IDENTITY, n, k, true);
  g.out = x_;
  g.residual = x_;
  g.m = P_;
  g.n = n;
  g.k = k;
  g.bias = linear.inputs_size() > 2 ? Weight("bias:", {linear.inputs(2)}, ROWS_IDENTITY, n, 1, false) : isa::kNoTensor;
  g.epilogue = isa::kGemmStoreF32;
  g.row_norm = a->row_norm;
  // The stream the LM head alone reads (one row) signals one barrier: through it the pass's end depends on
  // every instruction.
  const StageRef stage = Gemm(linear.name(), Names({&linear, &add}, ","), g, a->stage,
                              tiled_ && !OnlyLmHeadReads(add.outputs(0)));
  Consume({&add});
  current_ = add.outputs(0);
  ready_[current_] = stage;
  return absl::OkStatus();
}

void DecoderPrefill::FlushParts() {
  const Pending pending = *pending_;
  pending_.reset();
  const std::string name = absl::StrCat(pending.op, "/sum");
  const StageRef sum = b_.Stages(name, tiles_m_, pending.stage.tiled);
  const uint64_t row = hidden_, elements = uint64_t{P_} * row;
  if (!pending.stage.tiled) {
    EmitSumSplits(b_, pending.parts, x_, x_, elements, 0, elements, SumChunk(elements, d_.num_sms), 0, sum.Of(0),
                  pending.stage.Of(0), name);
  } else {  // each row tile's sum after that tile's parts
    for (uint32_t m = 0; m < tiles_m_; ++m) {
      const uint64_t begin = uint64_t{m} * isa::kGemmTileM * row;
      const uint64_t end = std::min<uint64_t>(elements, begin + isa::kGemmTileM * row);
      EmitSumSplits(b_, pending.parts, x_, x_, elements, begin, end, SumChunk(end - begin, d_.num_sms / tiles_m_), 0,
                    sum.Of(m), pending.stage.Of(m), name);
    }
  }
  ready_[current_] = sum;
}

}  // namespace loom::scheduler::prefill_internal
