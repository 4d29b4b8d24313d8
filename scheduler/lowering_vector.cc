// Lowering of the vector family: EMBEDDING (the step's token row), RMS_NORM, elementwise ADD / SILU_MUL in chunks,
// and ARGMAX as the LM head's partials reduced (with the next step's embedding folded in).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/lowering_internal.h"

namespace loom::scheduler::lowering_internal {

absl::Status Lowering::LowerEmbedding(const OpDef& op) {
  const std::string& table = op.inputs(0);
  const std::string& ids = op.inputs(1);
  if (ids != token_input_ || graph_.tensor(ids).shape(0) != 1) {
    return Unsupported(op, "the decode lowering needs the embedding to read the [1] token input");
  }
  if (graph_.tensor(table).kind() != graph::WEIGHT || graph_.tensor(table).dtype() != graph::BF16) {
    return Unsupported(op, "the embedding table must be a bf16 weight");
  }
  const int group = NewGroup(op.name());
  const std::vector<isa::Wait> waits = {{kStepBarrier | isa::kWaitPreviousStep, 0}};
  const uint32_t barrier = NewBarrier(op.name(), {});
  isa::EmbedArgs a{};
  a.table = PackedWeightFor({table}, ROWS_IDENTITY);
  a.tokens = tokens_;
  a.step_state = step_state_;
  a.out = ArenaTensorFor(op.outputs(0));
  a.hidden = static_cast<uint32_t>(graph_.tensor(table).shape(1));
  a.vocab = static_cast<uint32_t>(graph_.tensor(table).shape(0));
  a.row_stride = isa::MatvecRowStride(a.hidden);  // the table is packed as the (tied) LM head's matvec weight
  a.row_begin = 0;
  a.rows = 1;
  embed_node_ = p_.nodes.size();
  ++embeds_;
  Emit(Make(Opcode::EMBED, a), barrier, waits, op.name(), group);
  ready_[op.outputs(0)] = {{barrier}};
  return absl::OkStatus();
}

absl::Status Lowering::LowerRmsNorm(const OpDef& op) {
  const std::string& out = op.outputs(0);
  if (graph_.tensor(op.inputs(0)).shape(0) != 1) return Unsupported(op, "only batch-1 rows are lowered");
  if (op.norm().group_size() > 0) {  // lowered by the attention it feeds (ROPE_KV_APPEND's head norm)
    const std::vector<const OpDef*> consumers = graph_.consumers(out);
    if (consumers.size() == 1 && consumers[0]->type() == graph::ROPE && HeadNorm(*consumers[0]) == &op) {
      return absl::OkStatus();
    }
    return Unsupported(op, "an RMS_NORM per group is lowered only as the per-head q/k norm feeding a ROPE "
                           "(group_size = head_dim)");
  }
  bool all_linear = !graph_.tensor(out).is_output();
  for (const OpDef* c : graph_.consumers(out)) all_linear &= c->type() == graph::LINEAR && c->inputs(0) == out;
  if (o_.fusion().norm_into_matvec() && all_linear) {
    deferred_norms_[out] = {op.inputs(0), op.inputs(1), op.norm().eps()};
    return absl::OkStatus();
  }
  const int group = NewGroup(op.name());
  const std::vector<isa::Wait> waits = WaitsFor(ReadyBarriers(op.inputs(0)));
  const uint32_t barrier = NewBarrier(op.name(), waits);
  isa::RmsNormArgs a{};
  a.input = ArenaTensorFor(op.inputs(0));
  a.weight = PackedWeightFor({op.inputs(1)}, ROWS_IDENTITY);
  a.out = ArenaTensorFor(out);
  a.n = static_cast<uint32_t>(graph_.tensor(out).shape(1));
  a.eps = op.norm().eps();
  Emit(Make(Opcode::RMS_NORM, a), barrier, waits, op.name(), group);
  ready_[out] = {{barrier}};
  return absl::OkStatus();
}

absl::Status Lowering::LowerElementwise(const OpDef& op) {
  const int64_t n = graph::NumElements(graph_.tensor(op.outputs(0)));
  if (graph::NumElements(graph_.tensor(op.inputs(0))) != n || graph::NumElements(graph_.tensor(op.inputs(1))) != n) {
    return Unsupported(op, "a broadcasting elementwise op has no lowering yet");
  }
  std::vector<uint32_t> ready = ReadyBarriers(op.inputs(0));
  const std::vector<uint32_t> r1 = ReadyBarriers(op.inputs(1));
  ready.insert(ready.end(), r1.begin(), r1.end());
  const std::vector<isa::Wait> waits = WaitsFor(ready);
  const int group = NewGroup(op.name());
  const uint32_t barrier = NewBarrier(op.name(), waits);
  const uint32_t a = ArenaTensorFor(op.inputs(0)), b = ArenaTensorFor(op.inputs(1)), out = ArenaTensorFor(op.outputs(0));
  for (int64_t begin = 0; begin < n; begin += o_.elementwise_chunk()) {
    const uint32_t count = static_cast<uint32_t>(std::min<int64_t>(o_.elementwise_chunk(), n - begin));
    if (op.type() == graph::ADD) {
      Emit(Make(Opcode::ADD, isa::AddArgs{a, b, out, static_cast<uint32_t>(begin), count}), barrier, waits, op.name(),
           group);
    } else {
      Emit(Make(Opcode::SILU_MUL, isa::SiluMulArgs{a, b, out, static_cast<uint32_t>(begin), count}), barrier, waits,
           op.name(), group);
    }
  }
  ready_[op.outputs(0)] = {{barrier}};
  return absl::OkStatus();
}

absl::Status Lowering::LowerArgmax(const OpDef& op, uint32_t partials, uint32_t num_partials,
                                   const std::vector<uint32_t>& ready) {
  const int group = NewGroup(absl::StrCat(op.name(), ".reduce"));
  const std::vector<isa::Wait> waits = WaitsFor(ready);
  isa::ArgmaxReduceArgs a{partials, num_partials, step_state_, tokens_, p_.max_seq};
  // The next step's EMBED folded in (isa::ArgmaxReduceArgs): the step boundary loses its hop and EMBED's three
  // dependent reads (the barrier, the position, the token) in every step of a launch but its first.
  if (o_.fusion().next_embedding() && embeds_ == 1) {  // (one token, embedded once)
    isa::EmbedArgs& e = p_.nodes[embed_node_].inst.as<isa::EmbedArgs>();
    e.folded = 1;
    a.embed_table = e.table;
    a.embed_out = e.out;
    a.hidden = e.hidden;
    a.vocab = e.vocab;
    a.row_stride = e.row_stride;
  }
  Emit(Make(Opcode::ARGMAX_REDUCE, a), kStepBarrier, waits, op.name(), group);
  return absl::OkStatus();
}

}  // namespace loom::scheduler::lowering_internal
