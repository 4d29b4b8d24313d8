// ONNX ops Loom evaluates at import on constants, as exporters write them around masks, positions and shapes:
// ConstantOfShape, Range, Equal, Not and Where. A bool is an integer constant of 0 / 1. With a run-time operand
// each is refused by name (none is an IR op), but a Where whose constant condition is all true or all false,
// which is one of its operands.
#include <algorithm>
#include <cmath>

#include "graph/onnx_importer.h"

namespace loom::graph::onnx_internal {
namespace {

// Row-major strides of `shape`.
Shape StridesOf(const Shape& shape) {
  Shape s(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// The element of `c` that broadcasts to index `i` of `out` (numpy's rules: trailing dims aligned, size 1 repeats).
int64_t BroadcastAt(const Shape& out, int64_t i, const Shape& in) {
  const Shape os = StridesOf(out), is = StridesOf(in);
  const size_t lead = out.size() - in.size();
  int64_t at = 0;
  for (size_t d = lead; d < out.size(); ++d) {
    const int64_t coord = i / os[d] % out[d];
    if (in[d - lead] != 1) at += coord * is[d - lead];
  }
  return at;
}

double ValueOf(const Constant& c, int64_t at) { return c.is_int ? static_cast<double>(c.i[at]) : c.f[at]; }

}  // namespace

absl::StatusOr<bool> Importer::FoldConstantOps(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  if (t != "ConstantOfShape" && t != "Range" && t != "Equal" && t != "Not" && t != "Where") return false;
  const std::string& out = n.output(0);
  std::vector<const Constant*> in;
  for (int k = 0; k < n.input_size(); ++k) in.push_back(n.input(k).empty() ? nullptr : ConstantOf(n.input(k)));
  const bool all_constant = !in.empty() && std::all_of(in.begin(), in.end(), [](const Constant* c) { return c; });
  if (t == "ConstantOfShape") {
    if (!all_constant || !in[0]->is_int || in[0]->shape.size() != 1) {
      return Refuse("the shape must be a constant 1-D integer tensor");
    }
    Constant value;  // the `value` attribute: one element, float 0 by default
    value.f = {0.0f};
    if (const onnx::AttributeProto* v = a.Get("value")) {
      absl::StatusOr<Constant> c = FromTensorProto(v->t(), absl::StrCat(file_, ": node '", node_name_, "' value"));
      if (!c.ok()) return c.status();
      if (Elements(c->shape) != 1) return Refuse("value must have one element");
      value = *std::move(c);
    }
    Constant c;
    c.is_int = value.is_int;
    c.shape = in[0]->i;
    for (int64_t d : c.shape) {
      if (d < 0) return Refuse(absl::StrCat("a negative dimension ", d));
    }
    if (c.is_int) {
      c.i.assign(Elements(c.shape), value.i[0]);
    } else {
      c.f.assign(Elements(c.shape), value.f[0]);
    }
    consts_[out] = std::move(c);
    return true;
  }
  if (!all_constant) {
    if (t == "Where" && in[0] != nullptr && in[0]->is_int) {  // a condition all true or all false picks an operand
      const bool all_true = std::all_of(in[0]->i.begin(), in[0]->i.end(), [](int64_t v) { return v != 0; });
      const bool all_false = std::none_of(in[0]->i.begin(), in[0]->i.end(), [](int64_t v) { return v != 0; });
      if (all_true || all_false) {
        absl::StatusOr<std::string> picked = Activation(n.input(all_true ? 1 : 2), "the operand picked");
        if (!picked.ok()) return picked.status();
        absl::StatusOr<std::string> other = Activation(n.input(all_true ? 2 : 1), "the other operand");
        if (!other.ok()) return other.status();
        absl::StatusOr<Shape> shape = BroadcastShapes(in[0]->shape, Shapes(*other));
        if (shape.ok()) shape = BroadcastShapes(*shape, Shapes(*picked));
        if (!shape.ok() || *shape != Shapes(*picked)) {
          return Refuse("the operand picked does not have the broadcast shape of all three");
        }
        alias_[out] = *picked;
        return true;
      }
    }
    return Refuse("an operand computed at run time (Loom evaluates this op on constants only)");
  }
  Constant c;
  if (t == "Range") {
    for (const Constant* v : in) {
      if (Elements(v->shape) != 1) return Refuse("start, limit and delta must be scalars");
    }
    c.is_int = in[0]->is_int;
    const double start = ValueOf(*in[0], 0), limit = ValueOf(*in[1], 0), delta = ValueOf(*in[2], 0);
    if (delta == 0) return Refuse("delta 0");
    const int64_t count = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((limit - start) / delta)));
    for (int64_t k = 0; k < count; ++k) {  // start + k * delta, as the spec's loop adds delta k times
      if (c.is_int) {
        c.i.push_back(in[0]->i[0] + k * in[2]->i[0]);
      } else {
        c.f.push_back(in[0]->f[0] + static_cast<float>(k) * in[2]->f[0]);
      }
    }
    c.shape = {count};
  } else if (t == "Not") {
    if (!in[0]->is_int) return Refuse("a float input (Not takes a bool)");
    c = *in[0];
    for (int64_t& v : c.i) v = v == 0 ? 1 : 0;
  } else {  // Equal, Where: numpy broadcasting
    Shape shape = in[0]->shape;
    for (size_t k = 1; k < in.size(); ++k) {
      absl::StatusOr<Shape> s = BroadcastShapes(shape, in[k]->shape);
      if (!s.ok()) return Refuse(std::string(s.status().message()));
      shape = *s;
    }
    c.shape = shape;
    if (t == "Equal") {
      if (in[0]->is_int != in[1]->is_int) return Refuse("compares an integer tensor with a float one");
      c.is_int = true;
      for (int64_t i = 0; i < Elements(shape); ++i) {
        c.i.push_back(ValueOf(*in[0], BroadcastAt(shape, i, in[0]->shape)) ==
                              ValueOf(*in[1], BroadcastAt(shape, i, in[1]->shape))
                          ? 1
                          : 0);
      }
    } else {  // Where
      if (!in[0]->is_int) return Refuse("a float condition (Where takes a bool)");
      if (in[1]->is_int != in[2]->is_int) return Refuse("picks between an integer tensor and a float one");
      c.is_int = in[1]->is_int;
      for (int64_t i = 0; i < Elements(shape); ++i) {
        const Constant& from = *in[in[0]->i[BroadcastAt(shape, i, in[0]->shape)] != 0 ? 1 : 2];
        const int64_t at = BroadcastAt(shape, i, from.shape);
        if (c.is_int) {
          c.i.push_back(from.i[at]);
        } else {
          c.f.push_back(from.f[at]);
        }
      }
    }
  }
  consts_[out] = std::move(c);
  return true;
}

}  // namespace loom::graph::onnx_internal
