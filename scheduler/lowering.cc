// The decode graph's lowering: the step's tensors, barriers and instruction stream, and the op-by-op walk (Run);
// each op family's lowering is in lowering_<family>.cc (matvec, vector, attention, conv), the stem of its
// instructions/<family>.h.
#include "scheduler/lowering.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/dtype.h"
#include "graph/rope.h"
#include "scheduler/data_waits.h"
#include "scheduler/lowering_internal.h"

namespace loom::scheduler {
namespace lowering_internal {

uint32_t Lowering::AddTensor(const std::string& name, graph::DType dtype, std::vector<int64_t> shape,
                             Region region) {
  Tensor t;
  t.set_name(name);
  t.set_dtype(dtype);
  uint64_t elements = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    elements *= d;
  }
  t.set_region(region);
  t.set_bytes(elements * graph::DTypeSize(dtype));
  uint64_t& end = region_bytes_[region];
  t.set_offset(end);
  end = (end + t.bytes() + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  p_.tensors.push_back(t);
  const uint32_t id = static_cast<uint32_t>(p_.tensors.size() - 1);
  tensor_ids_[name] = id;
  return id;
}

uint32_t Lowering::ArenaTensorFor(const std::string& name) {
  if (auto it = tensor_ids_.find(name); it != tensor_ids_.end()) return it->second;
  const graph::TensorDef& t = graph_.tensor(name);
  return AddTensor(name, t.dtype(), {t.shape().begin(), t.shape().end()}, ARENA);
}

uint32_t Lowering::PackedWeightFor(const std::vector<std::string>& sources, RowOrder order, uint32_t head_dim,
                                   uint32_t num_kv_heads, bool allow_quantized) {
  // Quantized sources stay so where every source is one of a kind (and the reader has a quantized form:
  // allow_quantized); otherwise they are widened to bf16 as they are packed.
  const graph::TensorDef& first = graph_.tensor(sources[0]);
  int64_t rows = 0;
  const int64_t cols = first.shape_size() == 1 ? 1 : first.shape(first.shape_size() - 1);
  for (const std::string& s : sources) rows += graph::NumElements(graph_.tensor(s)) / cols;
  bool fp8 = allow_quantized && !has_int4_;
  bool w4 = allow_quantized && first.dtype() == graph::I4 && rows % isa::kMatvecW4BandRows == 0;
  for (const std::string& s : sources) {
    fp8 = fp8 && graph_.tensor(s).dtype() == graph::F8E4M3;
    w4 = w4 && graph_.tensor(s).dtype() == graph::I4 && graph_.tensor(s).group_size() == first.group_size();
  }
  const char* kind = fp8 ? "-fp8:" : w4 ? "-w4:" : ":";
  const std::string key = absl::StrCat(RowOrder_Name(order), kind, absl::StrJoin(sources, "+"));
  if (auto it = packed_ids_.find(key); it != packed_ids_.end()) return it->second;
  // A vector [n] packs as a column (cols 1); a matrix's rows are padded to the matvec row stride.
  const int64_t stride = first.shape_size() == 1 ? 1
                         : fp8                   ? isa::MatvecFp8RowStride(static_cast<uint32_t>(cols))
                         : w4                    ? isa::MatvecW4RowStride(static_cast<uint32_t>(cols))
                                                 : isa::MatvecRowStride(static_cast<uint32_t>(cols));
  const std::string name = absl::StrCat("packed", kind, absl::StrJoin(sources, "+"));
  const uint32_t id = w4    ? AddTensor(name, graph::I4, {rows, stride / 2}, WEIGHTS)
                      : fp8 ? AddTensor(name, graph::F8E4M3, {rows, stride}, WEIGHTS)
                            : AddTensor(name, graph::BF16, {rows, stride}, WEIGHTS);
  PackedWeight pw;
  pw.set_tensor(name);
  for (const std::string& s : sources) pw.add_sources(s);
  pw.set_order(order);
  pw.set_cols(cols);
  pw.set_row_stride(stride);
  pw.set_head_dim(head_dim);
  pw.set_num_kv_heads(num_kv_heads);
  if (fp8) pw.set_dtype(graph::F8E4M3);
  if (w4) pw.set_dtype(graph::I4), pw.set_group_size(first.group_size());
  p_.packing.push_back(pw);
  packed_ids_[key] = id;
  if (fp8) {  // the rows' scales beside them, in the same order
    const std::string scales = absl::StrCat("scales:", absl::StrJoin(sources, "+"));
    fp8_scales_[id] = AddTensor(scales, graph::F32, {rows}, WEIGHTS);
    PackedWeight ps = pw;
    ps.set_tensor(scales);
    ps.set_dtype(graph::F32);
    ps.set_row_scales(true);
    ps.set_cols(1);
    ps.set_row_stride(1);
    p_.packing.push_back(ps);
  }
  if (w4) {  // the rows' groups beside them, in band order
    const uint32_t shift = static_cast<uint32_t>(std::countr_zero(first.group_size()));
    const std::string meta = absl::StrCat("meta:", absl::StrJoin(sources, "+"));
    const int64_t words = rows * isa::MatvecW4Groups(static_cast<uint32_t>(cols), shift);
    w4_meta_[id] = {AddTensor(meta, graph::I32, {words}, WEIGHTS), shift};
    PackedWeight pm = pw;
    pm.set_tensor(meta);
    pm.set_dtype(graph::I32);
    pm.set_int4_meta(true);
    p_.packing.push_back(pm);
  }
  return id;
}

uint32_t Lowering::RopeTable(const graph::RopeAttrs& rope) {
  const std::string key = rope.SerializeAsString();
  if (auto it = rope_tables_.find(key); it != rope_tables_.end()) return it->second;
  const std::string name = absl::StrCat("rope.table.", rope_tables_.size());
  const std::vector<float> table = graph::RopeTable(rope);
  const uint32_t id = AddTensor(name, graph::F32, {static_cast<int64_t>(table.size())}, WEIGHTS);
  Constant c;
  c.set_tensor(name);
  c.mutable_values()->Add(table.begin(), table.end());
  p_.constants.push_back(c);
  rope_tables_[key] = id;
  return id;
}

uint32_t Lowering::NewBarrier(const std::string& name, const std::vector<isa::Wait>& waits) {
  Barrier b;
  b.set_name(name);
  p_.barriers.push_back(b);
  absl::flat_hash_set<uint32_t> implied;
  for (const isa::Wait& w : waits) {
    if (w.previous_step()) continue;
    implied.insert(w.barrier());
    implied.insert(implied_[w.barrier()].begin(), implied_[w.barrier()].end());
  }
  implied_.push_back(std::move(implied));
  return static_cast<uint32_t>(p_.barriers.size() - 1);
}

// Full-count waits on `barriers`, dropping any that another one already implies.
std::vector<isa::Wait> Lowering::WaitsFor(const std::vector<uint32_t>& barriers) const {
  std::vector<uint32_t> unique;
  for (uint32_t b : barriers) {
    if (std::find(unique.begin(), unique.end(), b) == unique.end()) unique.push_back(b);
  }
  std::vector<isa::Wait> waits;
  for (uint32_t b : unique) {
    bool implied = false;
    for (uint32_t other : unique) implied |= other != b && implied_[other].contains(b);
    if (!implied) waits.push_back({b, 0});  // count/stride filled when the schedule is finalised
  }
  return waits;
}

std::vector<uint32_t> Lowering::ReadyBarriers(const std::string& tensor) const {
  auto it = ready_.find(tensor);
  return it == ready_.end() ? std::vector<uint32_t>{} : it->second.barriers;
}

int Lowering::NewGroup(const std::string& name) {
  p_.groups.push_back(name);
  return static_cast<int>(p_.groups.size() - 1);
}

void Lowering::Emit(const Instruction& inst, uint32_t signal, const std::vector<isa::Wait>& waits,
                    const std::string& op, int group) {
  if (waits.size() > static_cast<size_t>(isa::kMaxWaits)) {
    if (error_.ok()) {
      error_ = absl::UnimplementedError(absl::StrCat("'", op, "' would need ", waits.size(), " waits; an instruction has ",
                                                     isa::kMaxWaits));
    }
    return;
  }
  Node node;
  node.inst = inst;
  node.inst.signal = signal;
  node.inst.num_waits = static_cast<uint8_t>(waits.size());
  for (size_t i = 0; i < waits.size(); ++i) node.inst.waits[i] = waits[i];
  node.op = op;
  node.group = group;
  p_.barriers[signal].set_signals_per_step(p_.barriers[signal].signals_per_step() + 1);
  p_.nodes.push_back(std::move(node));
}

bool Lowering::OnlyConsumer(const std::string& tensor, const OpDef& consumer) const {
  if (graph_.tensor(tensor).is_output()) return false;
  const std::vector<const OpDef*> consumers = graph_.consumers(tensor);
  return consumers.size() == 1 && consumers[0]->name() == consumer.name();
}

absl::StatusOr<Program> Lowering::Run() {
  // Ops no lowering covers yet (the general tensor ops an ONNX graph brings) are refused by name first.
  for (int index : graph_.topological_order()) {
    const OpDef& op = graph_.def().ops(index);
    switch (op.type()) {
      case graph::EMBEDDING: case graph::RMS_NORM: case graph::LINEAR: case graph::ROPE: case graph::ATTENTION:
      case graph::SILU_MUL: case graph::ADD: case graph::ARGMAX: case graph::CONV1D:
        break;
      default:
        return Unsupported(op, "has no lowering to instructions yet: the graph imports and runs on the op-by-op "
                               "oracle; the decode lowering covers Llama-family decoders and causal CONV1D blocks");
    }
  }
  // The decode loop's inputs: the token (read by the embedding) and the position.
  for (const graph::TensorDef* t : graph_.TensorsOfKind(graph::INPUT)) {
    bool is_token = false, is_pos = false;
    for (const OpDef* c : graph_.consumers(t->name())) {
      is_token |= c->type() == graph::EMBEDDING && c->inputs(1) == t->name();
      is_pos |= c->type() == graph::ROPE || c->type() == graph::ATTENTION;
    }
    if (is_token && token_input_.empty()) {
      token_input_ = t->name();
    } else if (is_pos && !is_token && pos_input_.empty() && t->dtype() == graph::I32 && graph::NumElements(*t) == 1) {
      pos_input_ = t->name();
    } else {
      return absl::UnimplementedError(absl::StrCat("input '", t->name(),
                                                   "' is neither the token nor the position of a decode graph"));
    }
  }
  if (token_input_.empty()) return absl::UnimplementedError("the graph has no EMBEDDING of a token input");
  uint32_t max_seq = 0, vocab = 0;
  for (const graph::TensorDef* t : graph_.TensorsOfKind(graph::STATE)) {
    max_seq = std::max<uint32_t>(max_seq, t->shape_size() == 3 ? static_cast<uint32_t>(t->shape(1)) : 0);
  }
  for (const OpDef& op : graph_.def().ops()) {
    if (op.type() == graph::EMBEDDING) vocab = static_cast<uint32_t>(graph_.tensor(op.inputs(0)).shape(0));
  }
  // A decoder without attention (causal CONV1D blocks) has no KV cache: the graph says how far it may decode.
  if (max_seq == 0) max_seq = static_cast<uint32_t>(std::max(0, graph_.def().max_seq()));
  if (max_seq == 0) {
    return absl::UnimplementedError("the graph has neither a KV cache nor max_seq to size the decode loop");
  }
  p_.max_seq = max_seq;
  p_.vocab_size = vocab;

  NewBarrier("step", {});  // kStepBarrier
  tokens_ = AddTensor("io.tokens", graph::I32, {max_seq + 1}, ARENA);
  step_state_ = AddTensor("io.step_state", graph::I32, {isa::kStepStateWords}, ARENA);
  p_.io.set_tokens(tokens_);
  p_.io.set_step_state(step_state_);

  for (int index : graph_.topological_order()) {
    const OpDef& op = graph_.def().ops(index);
    if (consumed_.contains(op.name())) continue;
    absl::Status s;
    switch (op.type()) {
      case graph::EMBEDDING: s = LowerEmbedding(op); break;
      case graph::RMS_NORM: s = LowerRmsNorm(op); break;
      case graph::LINEAR: s = LowerLinear(op); break;
      case graph::ATTENTION: s = LowerAttention(op); break;
      case graph::ADD:
      case graph::SILU_MUL: s = LowerElementwise(op); break;
      case graph::CONV1D: s = LowerConv1d(op); break;
      case graph::ROPE: s = Unsupported(op, "RoPE is lowered only together with the attention it feeds"); break;
      case graph::ARGMAX: {
        const graph::TensorDef& logits = graph_.tensor(op.inputs(0));
        const int64_t n = graph::NumElements(logits);
        const std::vector<isa::Wait> waits = WaitsFor(ReadyBarriers(op.inputs(0)));
        const int group = NewGroup(absl::StrCat(op.name(), ".partial"));
        const uint32_t barrier = NewBarrier(absl::StrCat(op.name(), ".partial"), waits);
        const uint32_t tiles = static_cast<uint32_t>((n + o_.elementwise_chunk() - 1) / o_.elementwise_chunk());
        const uint32_t partials = AddTensor(absl::StrCat(op.name(), ".partials"), graph::F32, {tiles, 2}, ARENA);
        const uint32_t in = ArenaTensorFor(op.inputs(0));
        for (uint32_t t = 0; t < tiles; ++t) {
          const uint32_t begin = t * o_.elementwise_chunk();
          isa::ArgmaxPartialArgs a{in, begin, static_cast<uint32_t>(std::min<int64_t>(o_.elementwise_chunk(), n - begin)),
                                   partials, t};
          Emit(Make(Opcode::ARGMAX_PARTIAL, a), barrier, waits, op.name(), group);
        }
        p_.io.set_logits(in);
        s = LowerArgmax(op, partials, tiles, {barrier});
        break;
      }
      default:
        s = Unsupported(op, "has no decode lowering yet");
    }
    if (!s.ok()) return s;
    if (!error_.ok()) return error_;
  }
  if (p_.barriers[kStepBarrier].signals_per_step() != 1) {
    return absl::UnimplementedError("the decode graph must end in exactly one ARGMAX of the logits");
  }
  // Waits count every signal of their barrier in the step.
  for (Node& node : p_.nodes) {
    for (int i = 0; i < node.inst.num_waits; ++i) {
      isa::Wait& w = node.inst.waits[i];
      const uint32_t stride = p_.barriers[w.barrier()].signals_per_step();
      w.count_and_stride = stride | (stride << 16);
    }
  }
  if (o_.data_waits()) {
    std::vector<isa::Instruction*> step;
    for (Node& node : p_.nodes) step.push_back(&node.inst);
    MarkDataWaits(step, TensorElements(p_.tensors));
  }
  p_.weight_bytes = region_bytes_[WEIGHTS];
  p_.arena_bytes = region_bytes_[ARENA];
  return std::move(p_);
}

}  // namespace lowering_internal

std::vector<std::vector<int>> NodePredecessors(const Program& program) {
  std::vector<std::vector<int>> signalers(program.barriers.size());
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const uint32_t s = program.nodes[i].inst.signal;
    if (s < signalers.size()) signalers[s].push_back(static_cast<int>(i));
  }
  std::vector<std::vector<int>> preds(program.nodes.size());
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const isa::Instruction& inst = program.nodes[i].inst;
    for (int w = 0; w < inst.num_waits; ++w) {
      const isa::Wait& wait = inst.waits[w];
      if (wait.previous_step() || wait.barrier() >= signalers.size() || wait.count() != wait.stride()) continue;
      preds[i].insert(preds[i].end(), signalers[wait.barrier()].begin(), signalers[wait.barrier()].end());
    }
  }
  return preds;
}

absl::StatusOr<Program> LowerDecodeGraph(const graph::Graph& graph, const CompileOptions& options) {
  return lowering_internal::Lowering(graph, options).Run();
}

}  // namespace loom::scheduler
