#include "scheduler/lowering.h"

#include <algorithm>
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
                                   uint32_t num_kv_heads) {
  const std::string key = absl::StrCat(RowOrder_Name(order), ":", absl::StrJoin(sources, "+"));
  if (auto it = packed_ids_.find(key); it != packed_ids_.end()) return it->second;
  // A vector [n] packs as a column (cols 1); a matrix's rows are padded to the matvec row stride.
  int64_t rows = 0;
  const graph::TensorDef& first = graph_.tensor(sources[0]);
  const int64_t cols = first.shape_size() == 1 ? 1 : first.shape(first.shape_size() - 1);
  const int64_t stride = first.shape_size() == 1 ? 1 : isa::MatvecRowStride(static_cast<uint32_t>(cols));
  for (const std::string& s : sources) rows += graph::NumElements(graph_.tensor(s)) / cols;
  const std::string name =
      sources.size() == 1 ? absl::StrCat("packed:", sources[0]) : absl::StrCat("packed:", absl::StrJoin(sources, "+"));
  const uint32_t id = AddTensor(name, graph::BF16, {rows, stride}, WEIGHTS);
  PackedWeight pw;
  pw.set_tensor(name);
  for (const std::string& s : sources) pw.add_sources(s);
  pw.set_order(order);
  pw.set_cols(cols);
  pw.set_row_stride(stride);
  pw.set_head_dim(head_dim);
  pw.set_num_kv_heads(num_kv_heads);
  p_.packing.push_back(pw);
  packed_ids_[key] = id;
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

void Lowering::SetMatvecInput(const std::string& x, isa::MatvecArgs* args, std::vector<uint32_t>* ready) {
  if (auto it = deferred_norms_.find(x); it != deferred_norms_.end()) {
    args->input = ArenaTensorFor(it->second.x);
    args->prologue = isa::kPrologueRmsNorm;
    args->norm_weight = PackedWeightFor({it->second.weight}, ROWS_IDENTITY);
    args->norm_eps = it->second.eps;
    *ready = ReadyBarriers(it->second.x);
  } else {
    args->input = ArenaTensorFor(x);
    args->prologue = isa::kPrologueNone;
    *ready = ReadyBarriers(x);
  }
}

std::vector<uint32_t> Lowering::EmitMatvec(MatvecGroup& g, bool chunk_barriers) {
  if (g.k % 4 != 0 && error_.ok()) {
    error_ = absl::UnimplementedError(absl::StrCat("'", g.op, "': a matvec over ", g.k,
                                                   " columns; the input vector is copied in 16-byte units, so the "
                                                   "column count must be a multiple of 4"));
  }
  if (isa::MatvecActivationBytes(g.granule, g.k) > o_.smem().activation_bytes() && error_.ok()) {
    error_ = absl::UnimplementedError(absl::StrCat(
        "'", g.op, "': its input of ", g.k, " floats needs ", isa::MatvecActivationBytes(g.granule, g.k),
        " bytes of activation ring; smem.activation_bytes is ", o_.smem().activation_bytes()));
  }
  const int group = NewGroup(g.name);
  const std::vector<isa::Wait> waits = WaitsFor(g.ready);
  if (g.chunks.empty()) g.chunks = {0, g.rows};
  uint64_t rows_per_tile = o_.matvec_rows();
  if (rows_per_tile == 0) {
    const uint64_t tiles = uint64_t{o_.num_sms()} * o_.matvec_tiles_per_sm();
    rows_per_tile = (g.rows + tiles - 1) / tiles;
  }
  rows_per_tile = std::max<uint64_t>(g.granule, (rows_per_tile + g.granule - 1) / g.granule * g.granule);
  // A tile's input vector and partial sums must fit an SM's activation buffer.
  const uint64_t per_row = isa::MatvecActivationBytes(1, g.k) - isa::MatvecActivationBytes(0, g.k);
  const uint64_t fit = o_.smem().activation_bytes() > isa::MatvecActivationBytes(0, g.k)
                           ? (o_.smem().activation_bytes() - isa::MatvecActivationBytes(0, g.k)) / per_row
                           : 0;
  rows_per_tile = std::min(rows_per_tile, std::max<uint64_t>(g.granule, fit / g.granule * g.granule));

  std::vector<uint32_t> barriers;
  uint32_t tile_index = 0;
  uint32_t shared_barrier = isa::kNoBarrier;
  for (size_t c = 0; c + 1 < g.chunks.size(); ++c) {
    uint32_t barrier;
    if (chunk_barriers) {
      barrier = NewBarrier(absl::StrCat(g.name, ".chunk", c), waits);
    } else {
      if (shared_barrier == isa::kNoBarrier) shared_barrier = NewBarrier(g.name, waits);
      barrier = shared_barrier;
    }
    if (barriers.empty() || barriers.back() != barrier) barriers.push_back(barrier);
    const uint64_t chunk_rows = g.chunks[c + 1] - g.chunks[c];
    const std::vector<uint64_t> bounds =
        SplitEven(g.chunks[c], g.chunks[c + 1], (chunk_rows + rows_per_tile - 1) / rows_per_tile, g.granule);
    for (size_t t = 0; t + 1 < bounds.size(); ++t) {
      isa::MatvecArgs a = g.args;
      a.weight = g.weight;
      a.k = g.k;
      a.row_begin = static_cast<uint32_t>(bounds[t]);
      a.rows = static_cast<uint32_t>(bounds[t + 1] - bounds[t]);
      a.tile_index = tile_index++;
      Emit(Make(Opcode::MATVEC, a), barrier, waits, g.op, group);
    }
  }
  return barriers;
}

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

// gate and up LINEARs of one input, read only by SILU_MUL(gate, up): one interleaved matvec.
std::optional<absl::Status> Lowering::TryGateUp(const OpDef& linear) {
  const std::vector<const OpDef*> consumers = graph_.consumers(linear.outputs(0));
  if (!o_.fusion().silu_mul() || consumers.size() != 1 || consumers[0]->type() != graph::SILU_MUL) {
    return std::nullopt;
  }
  const OpDef& silu = *consumers[0];
  const OpDef* gate = graph_.producer(silu.inputs(0));
  const OpDef* up = graph_.producer(silu.inputs(1));
  if (gate == nullptr || up == nullptr || gate->type() != graph::LINEAR || up->type() != graph::LINEAR ||
      gate->inputs(0) != up->inputs(0) || gate->inputs_size() != up->inputs_size() ||
      !OnlyConsumer(gate->outputs(0), silu) || !OnlyConsumer(up->outputs(0), silu) || gate == up) {
    return std::nullopt;
  }
  MatvecGroup g;
  g.name = absl::StrCat(gate->name(), "+", up->name());
  g.op = absl::StrCat(gate->name(), ",", up->name(), ",", silu.name());
  g.weight = PackedWeightFor({gate->inputs(1), up->inputs(1)}, ROWS_INTERLEAVE_PAIRS);
  if (gate->inputs_size() == 3) g.args.bias = PackedWeightFor({gate->inputs(2), up->inputs(2)}, ROWS_INTERLEAVE_PAIRS);
  g.rows = 2 * static_cast<uint64_t>(graph_.tensor(gate->inputs(1)).shape(0));
  g.k = static_cast<uint32_t>(graph_.tensor(gate->inputs(1)).shape(1));
  g.granule = 2;
  SetMatvecInput(gate->inputs(0), &g.args, &g.ready);
  g.args.epilogue = isa::kEpilogueSiluMul;
  g.args.out = ArenaTensorFor(silu.outputs(0));
  ready_[silu.outputs(0)] = {EmitMatvec(g, false)};
  consumed_.insert(gate->name());
  consumed_.insert(up->name());
  consumed_.insert(silu.name());
  return absl::OkStatus();
}

absl::Status Lowering::LowerLinear(const OpDef& op) {
  if (graph_.tensor(op.inputs(0)).shape(0) != 1) return Unsupported(op, "only batch-1 (decode) LINEARs are lowered");
  if (graph_.tensor(op.inputs(1)).kind() != graph::WEIGHT || graph_.tensor(op.inputs(1)).dtype() != graph::BF16) {
    return Unsupported(op, "the matvec weight must be a bf16 weight");
  }
  if (std::optional<absl::Status> s = TryQkv(op)) return *s;
  if (consumed_.contains(op.name())) return absl::OkStatus();
  if (std::optional<absl::Status> s = TryGateUp(op)) return *s;

  const std::string& out = op.outputs(0);
  MatvecGroup g;
  g.name = op.name();
  g.op = op.name();
  g.weight = PackedWeightFor({op.inputs(1)}, ROWS_IDENTITY);
  g.rows = static_cast<uint64_t>(graph_.tensor(op.inputs(1)).shape(0));
  g.k = static_cast<uint32_t>(graph_.tensor(op.inputs(1)).shape(1));
  if (op.inputs_size() == 3) g.args.bias = PackedWeightFor({op.inputs(2)}, ROWS_IDENTITY);
  SetMatvecInput(op.inputs(0), &g.args, &g.ready);
  g.args.epilogue = isa::kEpilogueStore;
  std::string result = out;

  const std::vector<const OpDef*> consumers = graph_.consumers(out);
  const OpDef* argmax = nullptr;
  for (const OpDef* c : consumers) {
    if (c->type() == graph::ARGMAX) argmax = c;
  }
  if (o_.fusion().residual_add() && consumers.size() == 1 && consumers[0]->type() == graph::ADD &&
      !graph_.tensor(out).is_output()) {
    const OpDef& add = *consumers[0];
    const std::string& residual = add.inputs(0) == out ? add.inputs(1) : add.inputs(0);
    g.args.epilogue = isa::kEpilogueResidualAdd;
    g.args.residual = ArenaTensorFor(residual);
    const std::vector<uint32_t> residual_ready = ReadyBarriers(residual);
    g.ready.insert(g.ready.end(), residual_ready.begin(), residual_ready.end());
    g.op = absl::StrCat(op.name(), ",", add.name());
    result = add.outputs(0);
    consumed_.insert(add.name());
  } else if (o_.fusion().lm_head_argmax() && argmax != nullptr && consumers.size() == 1) {
    g.args.epilogue = isa::kEpilogueArgmaxPartial;
    g.op = absl::StrCat(op.name(), ",", argmax->name(), ".partial");
  }
  g.args.out = ArenaTensorFor(result);
  if (g.args.epilogue == isa::kEpilogueArgmaxPartial) {
    // Partials are sized after tiling: emit into a placeholder, then size the tensor.
    const uint32_t first = static_cast<uint32_t>(p_.nodes.size());
    const std::vector<uint32_t> barriers = EmitMatvec(g, false);
    const uint32_t tiles = static_cast<uint32_t>(p_.nodes.size()) - first;
    const uint32_t partials = AddTensor(absl::StrCat(argmax->name(), ".partials"), graph::F32, {tiles, 2}, ARENA);
    for (uint32_t i = first; i < p_.nodes.size(); ++i) p_.nodes[i].inst.as<isa::MatvecArgs>().partials = partials;
    ready_[out] = {barriers};
    p_.io.set_logits(g.args.out);
    consumed_.insert(argmax->name());
    return LowerArgmax(*argmax, partials, tiles, barriers);
  }
  ready_[result] = {EmitMatvec(g, false)};
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
