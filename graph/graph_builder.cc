#include "graph/graph_builder.h"

namespace loom::graph {

GraphBuilder::GraphBuilder(std::string name) { def_.set_name(std::move(name)); }

std::string GraphBuilder::Declare(const std::string& name, std::vector<int64_t> shape, DType dtype,
                                  TensorKind kind) {
  index_[name] = def_.tensors_size();
  TensorDef* t = def_.add_tensors();
  t->set_name(name);
  for (int64_t d : shape) t->add_shape(d);
  t->set_dtype(dtype);
  t->set_kind(kind);
  return name;
}

std::vector<int64_t> GraphBuilder::ShapeOf(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return {};  // Build() reports the undeclared name
  const TensorDef& t = def_.tensors(it->second);
  return {t.shape().begin(), t.shape().end()};
}

// Shape of dimension `i` of `name`, or 1 when unknown (Verify reports the real error).
static int64_t Dim(const std::vector<int64_t>& shape, size_t i) { return i < shape.size() ? shape[i] : 1; }

OpDef* GraphBuilder::AddOp(const std::string& out, OpType type, std::vector<std::string> inputs) {
  OpDef* op = def_.add_ops();
  op->set_name(out);
  op->set_type(type);
  for (std::string& in : inputs) op->add_inputs(std::move(in));
  op->add_outputs(out);
  return op;
}

std::string GraphBuilder::Input(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  return Declare(name, std::move(shape), dtype, INPUT);
}
std::string GraphBuilder::Weight(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  return Declare(name, std::move(shape), dtype, WEIGHT);
}
std::string GraphBuilder::State(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  return Declare(name, std::move(shape), dtype, STATE);
}

std::string GraphBuilder::Embedding(const std::string& out, const std::string& table, const std::string& ids) {
  Declare(out, {Dim(ShapeOf(ids), 0), Dim(ShapeOf(table), 1)}, F32, ACTIVATION);
  AddOp(out, EMBEDDING, {table, ids});
  return out;
}

std::string GraphBuilder::RmsNorm(const std::string& out, const std::string& x, const std::string& weight,
                                  float eps, int group_size) {
  Declare(out, ShapeOf(x), F32, ACTIVATION);
  NormAttrs* attrs = AddOp(out, RMS_NORM, {x, weight})->mutable_norm();
  attrs->set_eps(eps);
  attrs->set_group_size(group_size);
  return out;
}

std::string GraphBuilder::LayerNorm(const std::string& out, const std::string& x, const std::string& weight,
                                    const std::string& bias, float eps) {
  Declare(out, ShapeOf(x), F32, ACTIVATION);
  AddOp(out, LAYER_NORM, {x, weight, bias})->mutable_norm()->set_eps(eps);
  return out;
}

std::string GraphBuilder::Linear(const std::string& out, const std::string& x, const std::string& weight,
                                 const std::string& bias) {
  Declare(out, {Dim(ShapeOf(x), 0), Dim(ShapeOf(weight), 0)}, F32, ACTIVATION);
  std::vector<std::string> inputs = {x, weight};
  if (!bias.empty()) inputs.push_back(bias);
  AddOp(out, LINEAR, std::move(inputs));
  return out;
}

std::string GraphBuilder::Rope(const std::string& out, const std::string& x, const std::string& pos,
                               const RopeAttrs& attrs) {
  Declare(out, ShapeOf(x), F32, ACTIVATION);
  *AddOp(out, ROPE, {x, pos})->mutable_rope() = attrs;
  return out;
}

std::string GraphBuilder::Attention(const std::string& out, const std::string& q, const std::string& k,
                                    const std::string& v, const std::string& k_cache, const std::string& v_cache,
                                    const std::string& pos, const AttentionAttrs& attrs) {
  Declare(out, ShapeOf(q), F32, ACTIVATION);
  *AddOp(out, ATTENTION, {q, k, v, k_cache, v_cache, pos})->mutable_attention() = attrs;
  return out;
}

std::string GraphBuilder::SiluMul(const std::string& out, const std::string& gate, const std::string& up) {
  Declare(out, ShapeOf(gate), F32, ACTIVATION);
  AddOp(out, SILU_MUL, {gate, up});
  return out;
}

std::string GraphBuilder::Add(const std::string& out, const std::string& a, const std::string& b) {
  Declare(out, ShapeOf(a), F32, ACTIVATION);
  AddOp(out, ADD, {a, b});
  return out;
}

std::string GraphBuilder::Conv1d(const std::string& out, const std::string& x, const std::string& weight,
                                 const std::string& state, const std::string& bias) {
  Declare(out, ShapeOf(x), F32, ACTIVATION);
  std::vector<std::string> inputs = {x, weight, state};
  if (!bias.empty()) inputs.push_back(bias);
  AddOp(out, CONV1D, std::move(inputs));
  return out;
}

std::string GraphBuilder::Conv2d(const std::string& out, const std::string& x, const std::string& weight,
                                 const std::string& bias, const Conv2dAttrs& attrs) {
  const std::vector<int64_t> xs = ShapeOf(x), ws = ShapeOf(weight);
  const int64_t sh = std::max(attrs.stride_h(), 1), sw = std::max(attrs.stride_w(), 1);
  const int64_t oh = (Dim(xs, 1) + 2 * attrs.pad_h() - Dim(ws, 1)) / sh + 1;
  const int64_t ow = (Dim(xs, 2) + 2 * attrs.pad_w() - Dim(ws, 2)) / sw + 1;
  Declare(out, {Dim(xs, 0), oh, ow, Dim(ws, 0)}, F32, ACTIVATION);
  std::vector<std::string> inputs = {x, weight};
  if (!bias.empty()) inputs.push_back(bias);
  *AddOp(out, CONV2D, std::move(inputs))->mutable_conv2d() = attrs;
  return out;
}

std::string GraphBuilder::Argmax(const std::string& out, const std::string& x) {
  Declare(out, {Dim(ShapeOf(x), 0)}, I32, ACTIVATION);
  AddOp(out, ARGMAX, {x});
  return out;
}

void GraphBuilder::MarkOutput(const std::string& name) {
  auto it = index_.find(name);
  if (it != index_.end()) def_.mutable_tensors(it->second)->set_is_output(true);
}

absl::StatusOr<Graph> GraphBuilder::Build() && { return Graph::Create(std::move(def_)); }

}  // namespace loom::graph
