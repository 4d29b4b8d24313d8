// The one-pass prefill of a decoder without attention (scheduler/graph_lowering.h): the general graph lowering run
// over the prompt's rows in prefill mode (NnLowering seeded with the decode schedule's tensors): which tensors need
// every row, the last-row views, the prompt's EMBED, the argmax that ends the pass, and the weights packed at
// compile time.
#include "scheduler/compiler.h"
#include "scheduler/graph_lowering.h"
#include "scheduler/graph_lowering_internal.h"
#include "scheduler/schedule_verifier.h"

namespace loom::scheduler {
namespace graph_lowering_internal {

NnLowering::NnLowering(const graph::Graph& graph, const CompileOptions& options, PassBuilder decode,
                       const PrefillTarget& target)
    : g_(graph), o_(options), b_(std::move(decode)), target_(target), prefix_("prefill.") {
  // Which tensors need every prompt row: read by a CONV1D (the sequence), or by a row-wise op whose output needs
  // them; the rest (the final norm, the LM head: what the last row's logits need) are computed for one row.
  absl::flat_hash_set<std::string> all_rows;
  const std::vector<int>& order = g_.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const OpDef& op = g_.def().ops(*it);
    const bool mixes = op.type() == graph::CONV1D || op.type() == graph::EMBEDDING;
    if (mixes) all_rows.insert(op.outputs(0));
    for (const std::string& in : op.inputs()) {
      const graph::TensorKind kind = g_.tensor(in).kind();
      if (kind != graph::ACTIVATION && kind != graph::INPUT) continue;
      if (op.type() == graph::CONV1D ? in == op.inputs(0) : all_rows.contains(op.outputs(0))) all_rows.insert(in);
    }
  }
  for (const OpDef& op : g_.def().ops()) {
    if (op.type() == graph::ARGMAX) logits_ = op.inputs(0);
  }
  for (const std::string& name : all_rows) {
    TensorDef t = g_.tensor(name);
    t.set_shape(0, t.shape(0) * target_.rows);
    rows_defs_[name] = std::move(t);
  }
}

const OpDef* NnLowering::FirstNotPrefillable(const graph::Graph& graph) {
  for (int index : graph.topological_order()) {
    const OpDef& op = graph.def().ops(index);
    switch (op.type()) {
      case graph::EMBEDDING:
      case graph::RMS_NORM:
      case graph::LAYER_NORM:
      case graph::LINEAR:
      case graph::SILU_MUL:
      case graph::ADD:
      case graph::MUL:
      case graph::SUB:
      case graph::RELU:
      case graph::SIGMOID:
      case graph::GELU:
      case graph::TANH:
      case graph::CONV1D:
      case graph::ARGMAX:
        break;
      default:
        return &op;
    }
  }
  return nullptr;
}

absl::StatusOr<Schedule> NnLowering::RunPrefill(const std::string& model) {
  const uint32_t P = target_.rows;
  pass_state_ = Scratch("state", graph::I32, {isa::kStepStateWords});
  for (int index : g_.topological_order()) {
    const OpDef& op = g_.def().ops(index);
    if (consumed_.contains(op.name())) continue;
    // An op over the last row only reads the last row of what has every row (a view of it; of a deferred
    // RMSNorm, the same norm of its input's last row).
    OpDef local = op;
    if (!rows_defs_.contains(op.outputs(0))) {
      for (int i = 0; i < local.inputs_size(); ++i) {
        if (rows_defs_.contains(op.inputs(i))) local.set_inputs(i, LastRow(op.inputs(i)));
      }
    }
    if (absl::Status s = Lower(local); !s.ok()) return s;
  }
  b_.FinishWaits();
  Program& p = b_.program();
  CompileOptions options = o_;
  FitPassSmem(p, 0, options.mutable_smem());
  p.io = target_.io;
  p.max_seq = target_.max_seq;
  Schedule s = AssembleSchedule(p, options, absl::StrCat(model, " prefill of ", P, " rows"));
  s.mutable_prefill()->set_rows(P);
  s.mutable_prefill()->set_state(pass_state_);
  return s;
}

std::string NnLowering::LastRow(const std::string& name) {
  const std::string last = absl::StrCat(name, "@last");
  if (rows_defs_.contains(last)) return last;
  TensorDef def = T(name);
  def.set_name(last);
  def.set_shape(0, 1);
  if (auto norm = deferred_norms_.find(name); norm != deferred_norms_.end()) {
    DeferredNorm d = norm->second;
    d.x = LastRow(d.x);
    deferred_norms_[last] = d;
  } else {
    const uint64_t row = Product(ShapeOf(T(name))) / target_.rows;
    Arena(name);
    arena_[last] = Scratch(last, graph::F32, {static_cast<int64_t>(row)}, name, (target_.rows - 1) * row * 4);
    if (auto st = stage_.find(name); st != stage_.end()) stage_[last] = st->second;
  }
  rows_defs_[last] = std::move(def);
  return last;
}

// Rows of a table looked up by EMBED, 4 rows an instruction: a prefill pass's prompt rows (positions [state.position,
// +rows) of the token buffer, the decode's packed table), or a general graph's ids input (its values in order, at
// position 0 of a constant zero step state, the table packed as bf16 rows; EMBED reads an id outside the table as
// row 0, so the runtime checks the ids before the pass: IoTensor.id_limit).
absl::Status NnLowering::LowerEmbedding(const OpDef& op) {
  const std::string& table = op.inputs(0);
  const uint64_t vocab = static_cast<uint64_t>(T(table).shape(0)), hidden = static_cast<uint64_t>(T(table).shape(1));
  uint64_t rows = target_.rows;
  isa::EmbedArgs e{};
  if (prefill()) {
    absl::StatusOr<uint32_t> packed = b_.Find(absl::StrCat("packed:", table));
    if (!packed.ok()) return packed.status();
    e.table = *packed, e.tokens = target_.io.tokens(), e.step_state = target_.io.step_state();
    e.row_stride = isa::MatvecRowStride(static_cast<uint32_t>(hidden));
  } else {
    const TensorDef& ids = T(op.inputs(1));
    if (ids.kind() != graph::INPUT) return Unsupported(op, "the ids are not a graph input (i32 inputs only)");
    rows = 1;
    for (int64_t d : ids.shape()) rows *= static_cast<uint64_t>(d);
    if (vocab > UINT32_MAX || hidden > UINT32_MAX || rows > UINT32_MAX) {
      return Unsupported(op, "a table or an ids tensor past 2^32 rows or columns");
    }
    e.table = b_.Packed(absl::StrCat("bf16:", table), {table}, ROWS_IDENTITY, vocab, hidden, false);
    e.step_state = b_.ConstantTensor("embedding.state", graph::I32, std::vector<float>(isa::kStepStateWords));
    e.tokens = Arena(op.inputs(1));
    e.row_stride = static_cast<uint32_t>(hidden);
  }
  e.out = Arena(op.outputs(0));
  e.hidden = static_cast<uint32_t>(hidden), e.vocab = static_cast<uint32_t>(vocab);
  const uint32_t stage = b_.Stage(op.name());
  constexpr uint32_t kRows = 4;
  for (uint32_t r = 0; r < rows; r += kRows) {
    e.row_begin = r;
    e.rows = std::min<uint32_t>(kRows, static_cast<uint32_t>(rows) - r);
    Emit(Make(isa::Opcode::EMBED, e), stage, {}, op.name());
  }
  stage_[op.outputs(0)] = stage;
  return absl::OkStatus();
}

// The last row's logits (written where decode writes them) -> argmax partials -> the next token, written to the
// token buffer and the pass's step state as a decode step's end does.
absl::Status NnLowering::LowerArgmax(const OpDef& op) {
  if (!prefill()) return Unsupported(op, "an ARGMAX outside a decoder's prefill");
  const std::string& x = op.inputs(0);
  const uint64_t vocab = Product(ShapeOf(T(x)));
  if (ShapeOf(T(x))[0] != 1) return Unsupported(op, "only the last row's argmax is lowered");
  absl::StatusOr<uint32_t> logits = Operand(op, x);
  if (!logits.ok()) return logits.status();
  const auto chunks = Chunks(vocab, 256);
  const uint32_t partials =
      Scratch(absl::StrCat(op.name(), ".partials"), graph::F32, {static_cast<int64_t>(chunks.size()), 2});
  const uint32_t stage = b_.Stage(absl::StrCat(op.name(), ".partial"));
  for (size_t t = 0; t < chunks.size(); ++t) {
    const isa::ArgmaxPartialArgs a{*logits, static_cast<uint32_t>(chunks[t].first),
                                   static_cast<uint32_t>(chunks[t].second - chunks[t].first), partials,
                                   static_cast<uint32_t>(t)};
    Emit(Make(isa::Opcode::ARGMAX_PARTIAL, a), stage, ReadyOf({x}), op.name());
  }
  const isa::ArgmaxReduceArgs r{partials, static_cast<uint32_t>(chunks.size()), pass_state_, target_.io.tokens(),
                                target_.max_seq};
  Emit(Make(isa::Opcode::ARGMAX_REDUCE, r), b_.Stage("next_token"), {stage}, op.name());
  return absl::OkStatus();
}

}  // namespace graph_lowering_internal

absl::Status GeneralPrefillSupported(const graph::Graph& graph) {
  if (const graph::OpDef* op = graph_lowering_internal::NnLowering::FirstNotPrefillable(graph)) {
    return absl::UnimplementedError(absl::StrCat("prefill: op '", op->name(), "' (", graph::OpType_Name(op->type()),
                                                 "): no one-pass prefill lowering for a decoder without attention"));
  }
  return absl::OkStatus();
}

absl::Status AddGeneralPrefillWeights(const graph::Graph& graph, const CompileOptions& options, Program* program) {
  if (absl::Status s = GeneralPrefillSupported(graph); !s.ok()) return s;
  // Any row count names the same weights: lower one row and keep what it added to the WEIGHTS region.
  graph_lowering_internal::PrefillTarget target{program->io, program->max_seq, 1};
  graph_lowering_internal::NnLowering lowering(graph, options, PassBuilder(*program), target);
  absl::StatusOr<Schedule> pass = lowering.RunPrefill(graph.def().name());
  if (!pass.ok()) return pass.status();
  for (int i = static_cast<int>(program->tensors.size()); i < pass->tensors_size(); ++i) {
    if (pass->tensors(i).region() == WEIGHTS) program->tensors.push_back(pass->tensors(i));
  }
  for (const PackedWeight& w : pass->packing()) program->packing.push_back(w);
  program->weight_bytes = pass->weight_bytes();
  return absl::OkStatus();
}

absl::StatusOr<Schedule> LowerGeneralPrefill(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                                               bool verify) {
  if (absl::Status s = GeneralPrefillSupported(graph); !s.ok()) return s;
  graph_lowering_internal::PrefillTarget target{decode.io(), decode.max_seq(), rows};
  graph_lowering_internal::NnLowering lowering(graph, decode.options(), PassBuilder(decode), target);
  absl::StatusOr<Schedule> pass = lowering.RunPrefill(decode.model());
  if (!pass.ok()) return pass.status();
  if (pass->weight_bytes() != decode.weight_bytes()) {
    return absl::FailedPreconditionError(
        "prefill: the schedule lacks the pass's weights (compiled without the prefill weights: "
        "CompileOptions.prefill)");
  }
  pass->set_vocab_size(decode.vocab_size());
  if (verify) {
    if (absl::Status st = VerifySchedule(*pass); !st.ok()) {
      return absl::InternalError(absl::StrCat("prefill pass failed verification: ", st.message()));
    }
  }
  return pass;
}

}  // namespace loom::scheduler
