// ONNX ops Loom evaluates at import on constants: shape arithmetic (Shape, and Gather / Unsqueeze / Squeeze /
// Concat / Cast on integer constants), and what exporters write around masks and positions: ConstantOfShape,
// Range, Equal, Not and Where. A bool is an integer constant of 0 / 1. With a run-time operand Equal, Not and Where
// become the IR's comparisons (Importer::Logic; a Where whose constant condition is all true or all false is the
// operand it picks), the others are refused by name; a Cast of a float tensor to float is itself.
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

absl::StatusOr<bool> Importer::FoldShapeArithmetic(const onnx::NodeProto& n, Attrs& a) {
  // Shape arithmetic on static shapes, as exporters write a view or a flatten (Shape -> Gather -> Unsqueeze ->
  // Concat -> Reshape): folded to int64 constants here, so the Reshape after it reads a constant shape.
  const std::string& t = n.op_type();
  const std::string& out = n.output(0);
  auto int_const = [&](int k) -> const Constant* {
    if (k >= n.input_size() || n.input(k).empty()) return nullptr;
    const Constant* c = ConstantOf(n.input(k));
    return c != nullptr && c->is_int ? c : nullptr;
  };
  if (t == "Shape") {
    Shape in;
    if (const Constant* c = ConstantOf(n.input(0)); c != nullptr) {
      in = c->shape;
    } else {
      absl::StatusOr<std::string> x = Activation(n.input(0), "input");
      if (!x.ok()) return x.status();
      in = Shapes(*x);
    }
    const int64_t rank = static_cast<int64_t>(in.size());
    int64_t start = a.Int("start", 0), end = a.Int("end", rank);  // (opset 15; clamped as the spec says)
    start = std::clamp(start < 0 ? start + rank : start, int64_t{0}, rank);
    end = std::clamp(end < 0 ? end + rank : end, int64_t{0}, rank);
    Constant c;
    c.is_int = true;
    for (int64_t d = start; d < end; ++d) c.i.push_back(in[d]);
    c.shape = {static_cast<int64_t>(c.i.size())};
    consts_[out] = std::move(c);
    return true;
  }
  if (t == "Gather" && int_const(0) != nullptr) {
    const Constant& data = *int_const(0);
    const Constant* idx = int_const(1);
    if (idx == nullptr) return Refuse("shape arithmetic: the indices must be a constant int tensor");
    if (data.shape.size() != 1 || a.Int("axis", 0) != 0) return Refuse("shape arithmetic: gathers from a 1-D shape only");
    Constant c;
    c.is_int = true;
    c.shape = idx->shape;
    const int64_t size = static_cast<int64_t>(data.i.size());
    for (int64_t i : idx->i) {
      const int64_t at = i < 0 ? i + size : i;
      if (at < 0 || at >= size) return Refuse(absl::StrCat("shape arithmetic: index ", i, " of a shape of rank ", size));
      c.i.push_back(data.i[at]);
    }
    consts_[out] = std::move(c);
    return true;
  }
  if (t == "Gather") return false;  // from a float tensor: Importer::Slicing
  if ((t == "Unsqueeze" || t == "Squeeze") && int_const(0) != nullptr) {
    absl::StatusOr<std::vector<int64_t>> axes = AxesOf(n, a, 13);
    if (!axes.ok()) return axes.status();
    absl::StatusOr<Shape> shape = SqueezedShape(int_const(0)->shape, *axes, t == "Unsqueeze");
    if (!shape.ok()) return Refuse(std::string(shape.status().message()));
    Constant c = *int_const(0);
    c.shape = *shape;
    consts_[out] = std::move(c);
    return true;
  }
  if (t == "Concat" && n.input_size() > 0) {
    bool all = true;
    for (int k = 0; k < n.input_size(); ++k) all = all && int_const(k) != nullptr;
    if (!all) return false;
    Constant c;
    c.is_int = true;
    for (int k = 0; k < n.input_size(); ++k) {
      if (int_const(k)->shape.size() != 1) return Refuse("shape arithmetic: concatenates 1-D shapes only");
      c.i.insert(c.i.end(), int_const(k)->i.begin(), int_const(k)->i.end());
    }
    a.Int("axis", 0);
    c.shape = {static_cast<int64_t>(c.i.size())};
    consts_[out] = std::move(c);
    return true;
  }
  if (t == "Cast") {  // int64 / int32 shapes stay what they are; a float tensor cast to float is itself
    const int64_t to = a.Int("to", 0);
    a.Get("saturate"), a.Get("round_mode");  // (opsets 19 and 24: float8 / float4 targets only, refused below)
    const bool to_int = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32 || to == onnx::TensorProto::BOOL;
    if (int_const(0) != nullptr && to_int) {
      Constant c = *int_const(0);
      if (to == onnx::TensorProto::BOOL) {
        for (int64_t& v : c.i) v = v != 0 ? 1 : 0;
      }
      consts_[out] = std::move(c);
      return true;
    }
    if (int_const(0) != nullptr && to == onnx::TensorProto::FLOAT) {  // a mask or shape into float arithmetic
      Constant c;
      c.shape = int_const(0)->shape;
      for (int64_t v : int_const(0)->i) c.f.push_back(static_cast<float>(v));
      consts_[out] = std::move(c);
      return true;
    }
    if (const Constant* f = ConstantOf(n.input(0)); f != nullptr && !f->is_int && to_int) {  // truncated, as C's
      Constant c;
      c.is_int = true;
      c.shape = f->shape;
      for (float v : f->f) {
        if (!std::isfinite(v)) return Refuse(absl::StrCat("a cast of ", v, " to an integer"));
        c.i.push_back(to == onnx::TensorProto::BOOL ? (v != 0.0f ? 1 : 0) : static_cast<int64_t>(v));
      }
      consts_[out] = std::move(c);
      return true;
    }
    if (int_const(0) == nullptr && to == onnx::TensorProto::FLOAT) {
      if (const Constant* c = ConstantOf(n.input(0)); c != nullptr) {
        consts_[out] = *c;
        return true;
      }
      absl::StatusOr<std::string> x = Activation(n.input(0), "input");
      if (!x.ok()) return x.status();
      alias_[out] = *x;
      return true;
    }
    if (int_const(0) == nullptr && to_int && ConstantOf(n.input(0)) == nullptr) {
      // An activation holding integers (an integer input read in arithmetic, a comparison's 0 / 1) cast to an
      // integer type is the same values; to bool, x != 0 as 0 / 1.
      absl::StatusOr<std::string> x = Activation(n.input(0), "input");
      if (!x.ok()) return x.status();
      if (!int_valued_.contains(n.input(0))) {
        return Refuse("a cast of a float activation to an integer type (Loom casts integer-valued tensors only)");
      }
      absl::StatusOr<std::string> y = *x;
      if (to == onnx::TensorProto::BOOL) {
        const std::string zero = NewWeight(out + "/zero", {1}, {0.0f});
        y = Emit(EQUAL, {*x, zero}, out + "/is_zero", [](OpDef&) {});
        if (y.ok()) y = Emit(EQUAL, {*y, zero}, out, [](OpDef&) {});
        if (!y.ok()) return y.status();
      }
      alias_[out] = *y;
      int_valued_.insert(out);
      return true;
    }
    return Refuse(absl::StrCat("a cast to ", onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(to)),
                               " (Loom casts float to float and integer-valued tensors to integers)"));
  }
  return FoldConstantOps(n, a);
}

absl::StatusOr<bool> Importer::FoldConstantOps(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  if (t != "ConstantOfShape" && t != "Range" && t != "Equal" && t != "Not" && t != "Where" && t != "GatherElements") {
    return false;
  }
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
    if (t == "Equal" || t == "Not" || t == "Where") {  // on activations: the IR's comparisons
      if (absl::Status s = Logic(n, a); !s.ok()) return s;
      return true;
    }
    return Refuse("an operand computed at run time (Loom evaluates this op on constants only)");
  }
  Constant c;
  if (t == "GatherElements") {  // out[i] = data[i with its `axis` coordinate replaced by indices[i]]
    if (n.input_size() != 2 || !in[1]->is_int) return Refuse("takes a data tensor and constant integer indices");
    const Shape& shape = in[0]->shape;
    const int64_t rank = static_cast<int64_t>(shape.size());
    int64_t axis = a.Int("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || static_cast<int64_t>(in[1]->shape.size()) != rank) {
      return Refuse("the axis or the indices' rank does not match the data");
    }
    c.is_int = in[0]->is_int;
    c.shape = in[1]->shape;
    for (int64_t i = 0; i < Elements(c.shape); ++i) {
      int64_t rest = i, offset = 0, stride = 1;
      for (int64_t d = rank - 1; d >= 0; --d) {
        int64_t at = rest % c.shape[d];
        rest /= c.shape[d];
        if (d == axis) {
          at = in[1]->i[i] < 0 ? in[1]->i[i] + shape[d] : in[1]->i[i];
          if (at < 0 || at >= shape[d]) return Refuse(absl::StrCat("index ", in[1]->i[i], " of an axis of ", shape[d]));
        } else if (at >= shape[d]) {
          return Refuse("the indices are larger than the data off the axis");
        }
        offset += at * stride;
        stride *= shape[d];
      }
      AppendElement(c, *in[0], offset);
    }
    consts_[out] = std::move(c);
    return true;
  }
  if (t == "Range") {
    a.Get("stash_type");  // (opset 27: the precision of float16 / bfloat16 inputs, which Loom does not read)
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
        AppendElement(c, from, BroadcastAt(shape, i, from.shape));
      }
    }
  }
  consts_[out] = std::move(c);
  return true;
}

}  // namespace loom::graph::onnx_internal
