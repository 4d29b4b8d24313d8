// Lowering of the decode graph's convolutions: CONV1D (a causal depthwise convolution carrying its state from step
// to step), its weights packed as f32.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/lowering_internal.h"

namespace loom::scheduler::lowering_internal {

uint32_t Lowering::F32WeightFor(const std::string& weight) {
  const std::string name = absl::StrCat("f32:", weight);
  if (auto it = tensor_ids_.find(name); it != tensor_ids_.end()) return it->second;
  const graph::TensorDef& t = graph_.tensor(weight);
  const int64_t elements = graph::NumElements(t), cols = t.shape_size() <= 1 ? 1 : t.shape(t.shape_size() - 1);
  const uint32_t id = AddTensor(name, graph::F32, {elements / cols, cols}, WEIGHTS);
  PackedWeight pw;
  pw.set_tensor(name);
  pw.add_sources(weight);
  pw.set_order(ROWS_IDENTITY);
  pw.set_cols(cols);
  pw.set_row_stride(cols);
  pw.set_dtype(graph::F32);
  p_.packing.push_back(pw);
  return id;
}

absl::Status Lowering::LowerConv1d(const OpDef& op) {
  const graph::TensorDef& x = graph_.tensor(op.inputs(0));
  isa::Conv1dArgs a{};
  a.rows = static_cast<uint32_t>(x.shape(0));
  a.channels = static_cast<uint32_t>(x.shape(1));
  a.k = static_cast<uint32_t>(graph_.tensor(op.inputs(1)).shape(1));
  if (a.rows != 1) return Unsupported(op, "only batch-1 rows are lowered");
  const graph::TensorDef* state = a.k > 1 ? &graph_.tensor(op.inputs(2)) : nullptr;
  if (state != nullptr && (state->kind() != graph::STATE || state->dtype() != graph::F32)) {
    return Unsupported(op, absl::StrCat("the state '", op.inputs(2), "' must be an f32 STATE tensor"));
  }
  const std::vector<isa::Wait> waits = WaitsFor(ReadyBarriers(op.inputs(0)));
  const int group = NewGroup(op.name());
  const uint32_t barrier = NewBarrier(op.name(), waits);
  a.input = ArenaTensorFor(op.inputs(0));
  a.weight = F32WeightFor(op.inputs(1));
  a.state = a.k > 1 ? ArenaTensorFor(op.inputs(2)) : isa::kNoTensor;
  a.bias = op.inputs_size() > 3 ? F32WeightFor(op.inputs(3)) : isa::kNoTensor;
  a.out = ArenaTensorFor(op.outputs(0));
  // One instruction per elementwise chunk of channels (each owns its channels' state).
  for (uint32_t c = 0; c < a.channels; c += o_.elementwise_chunk()) {
    a.c_begin = c;
    a.c_count = std::min<uint32_t>(o_.elementwise_chunk(), a.channels - c);
    Emit(Make(Opcode::CONV1D, a), barrier, waits, op.name(), group);
  }
  ready_[op.outputs(0)] = {{barrier}};
  return absl::OkStatus();
}

}  // namespace loom::scheduler::lowering_internal
