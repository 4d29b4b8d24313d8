// ONNX ops that move a tensor's elements without arithmetic: Slice, Split, Gather at constant indices, Expand and
// Pad, folded at import where their input is a constant, else the IR's SLICE, EXPAND and PAD (graph/nn_ops,
// strided ELEMENTWISE copies once lowered).
#include <algorithm>
#include <numeric>

#include "graph/onnx_importer.h"

namespace loom::graph::onnx_internal {
absl::Status Importer::SliceInto(const std::string& in, const Shape& starts, const Shape& steps, const Shape& counts,
                                 const std::string& out) {
  if (const Constant* c = ConstantOf(in); c != nullptr) {  // folded: a constant's slice is a constant
    Constant r;
    r.is_int = c->is_int;
    r.shape = counts;
    const Shape in_strides = [&] {
      Shape s(c->shape.size(), 1);
      for (int d = static_cast<int>(s.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * c->shape[d + 1];
      return s;
    }();
    for (int64_t i = 0; i < Elements(counts); ++i) {
      int64_t src = 0, rest = i;
      for (int d = static_cast<int>(counts.size()) - 1; d >= 0; --d) {
        src += (starts[d] + rest % counts[d] * steps[d]) * in_strides[d];
        rest /= counts[d];
      }
      AppendElement(r, *c, src);
    }
    consts_[out] = std::move(r);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> x = Activation(in, "input");
  if (!x.ok()) return x.status();
  absl::StatusOr<std::string> y = Emit(SLICE, {*x}, out, [&](OpDef& op) {
    for (size_t d = 0; d < starts.size(); ++d) {
      op.mutable_slice()->add_starts(starts[d]);
      op.mutable_slice()->add_steps(steps[d]);
    }
  }, counts);
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// Slice (bounds attributes before opset 10, then constant inputs; positive steps, clamped as the spec says), Split
// (sizes an attribute before opset 13, then an optional input, or opset 18's num_outputs; else equal parts) and
// Gather (of a constant with constant indices: folded; of an activation at one constant index or a run of consecutive
// ones: a SLICE, then reshaped to the indices' shape; of a constant table at an integer input: an EMBEDDING).
absl::Status Importer::Slicing(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  const Constant* data_const = ConstantOf(n.input(0));
  Shape shape;
  if (data_const != nullptr) {
    shape = data_const->shape;
  } else {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    shape = Shapes(*x);
  }
  const int64_t rank = static_cast<int64_t>(shape.size());
  auto axis_of = [&](int64_t axis) -> absl::StatusOr<int64_t> {
    const int64_t at = axis < 0 ? axis + rank : axis;
    if (at < 0 || at >= rank) return Refuse(absl::StrCat("axis ", axis, " of a tensor of rank ", rank));
    return at;
  };
  auto ints = [&](int k, const std::string& what) -> absl::StatusOr<std::vector<int64_t>> {
    const Constant* c = n.input_size() > k && !n.input(k).empty() ? ConstantOf(n.input(k)) : nullptr;
    if (c == nullptr || !c->is_int) return Refuse(absl::StrCat(what, " must be a constant integer tensor"));
    return c->i;
  };
  Shape starts(rank, 0), steps(rank, 1), counts = shape;
  if (t == "Slice") {
    std::vector<int64_t> begin, end, axes, step;
    if (opset_ < 10) {
      begin = a.Ints("starts"), end = a.Ints("ends"), axes = a.Ints("axes");
    } else {
      absl::StatusOr<std::vector<int64_t>> s = ints(1, "starts"), e = ints(2, "ends");
      if (!s.ok() || !e.ok()) return !s.ok() ? s.status() : e.status();
      begin = *s, end = *e;
      if (n.input_size() > 3 && !n.input(3).empty()) {
        absl::StatusOr<std::vector<int64_t>> x = ints(3, "axes");
        if (!x.ok()) return x.status();
        axes = *x;
      }
      if (n.input_size() > 4 && !n.input(4).empty()) {
        absl::StatusOr<std::vector<int64_t>> x = ints(4, "steps");
        if (!x.ok()) return x.status();
        step = *x;
      }
    }
    if (axes.empty()) {
      for (int64_t d = 0; d < static_cast<int64_t>(begin.size()); ++d) axes.push_back(d);
    }
    if (begin.size() != end.size() || axes.size() != begin.size() || (!step.empty() && step.size() != begin.size())) {
      return Refuse("starts, ends, axes and steps of different lengths");
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      absl::StatusOr<int64_t> d = axis_of(axes[k]);
      if (!d.ok()) return d.status();
      const int64_t dim = shape[*d], by = step.empty() ? 1 : step[k];
      if (by < 1) return Refuse(absl::StrCat("step ", by, " (Loom slices forwards, steps of 1 or more)"));
      const int64_t from = std::clamp(begin[k] < 0 ? begin[k] + dim : begin[k], int64_t{0}, dim);
      const int64_t to = std::clamp(end[k] < 0 ? end[k] + dim : end[k], int64_t{0}, dim);
      if (to <= from) return Refuse(absl::StrCat("an empty slice of axis ", *d));
      starts[*d] = from, steps[*d] = by, counts[*d] = (to - from + by - 1) / by;
    }
    return SliceInto(n.input(0), starts, steps, counts, n.output(0));
  }
  if (t == "Split") {
    absl::StatusOr<int64_t> axis = axis_of(a.Int("axis", 0));
    if (!axis.ok()) return axis.status();
    const int64_t dim = shape[*axis], parts = n.output_size();
    std::vector<int64_t> sizes;
    if (opset_ < 13) {
      sizes = a.Ints("split");
    } else if (n.input_size() > 1 && !n.input(1).empty()) {
      absl::StatusOr<std::vector<int64_t>> s = ints(1, "split");
      if (!s.ok()) return s.status();
      sizes = *s;
    }
    const int64_t num_outputs = opset_ >= 18 ? a.Int("num_outputs", 0) : 0;
    if (sizes.empty() && num_outputs > 0) {  // ceil(dim / num_outputs) each, the last what is left
      if (num_outputs != parts) return Refuse(absl::StrCat("num_outputs ", num_outputs, " for ", parts, " outputs"));
      const int64_t each = (dim + parts - 1) / parts;
      for (int64_t k = 0; k < parts; ++k) sizes.push_back(std::max<int64_t>(0, std::min(each, dim - k * each)));
    } else if (sizes.empty()) {
      if (dim % parts != 0) return Refuse(absl::StrCat("axis of ", dim, " in ", parts, " equal parts"));
      sizes.assign(parts, dim / parts);
    }
    if (static_cast<int64_t>(sizes.size()) != parts || std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != dim) {
      return Refuse(absl::StrCat("split sizes ", Str(sizes), " for ", parts, " outputs of an axis of ", dim));
    }
    int64_t at = 0;
    for (int64_t k = 0; k < parts; ++k) {
      if (sizes[k] < 1) return Refuse(absl::StrCat("output ", k, " is empty"));
      starts[*axis] = at, counts[*axis] = sizes[k];
      at += sizes[k];
      if (n.output(k).empty()) continue;
      if (absl::Status s = SliceInto(n.input(0), starts, steps, counts, n.output(k)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // Gather
  absl::StatusOr<int64_t> axis = axis_of(a.Int("axis", 0));
  if (!axis.ok()) return axis.status();
  const Constant* idx = n.input_size() > 1 ? ConstantOf(n.input(1)) : nullptr;
  if (idx == nullptr && n.input_size() > 1 && int_inputs_.contains(n.input(1))) {
    // Rows of a constant table at an integer input's values (an embedding lookup): the IR's EMBEDDING, a row per
    // index in order, reshaped to the indices' shape and the row.
    if (data_const == nullptr || data_const->is_int || rank != 2 || *axis != 0) {
      return Refuse("a lookup by run-time indices is lowered from a constant float table [rows, width] on axis 0");
    }
    const std::string table = WeightOf(n.input(0), *data_const);
    const Shape ids = Shapes(n.input(1));
    absl::StatusOr<std::string> rows =
        Emit(EMBEDDING, {table, n.input(1)}, n.output(0) + "/rows", [](OpDef&) {}, {Elements(ids), shape[1]});
    if (!rows.ok()) return rows.status();
    Shape out_shape = ids;
    out_shape.push_back(shape[1]);
    absl::StatusOr<std::string> y = Reshape(*rows, out_shape, n.output(0));
    if (!y.ok()) return y.status();
    alias_[n.output(0)] = *y;
    return absl::OkStatus();
  }
  if (idx == nullptr || !idx->is_int) {
    return Refuse("the indices are not a constant (Loom looks up rows by run-time indices only where they are an "
                  "integer graph input)");
  }
  const int64_t dim = shape[*axis];
  std::vector<int64_t> at;
  for (int64_t i : idx->i) {
    if (i < -dim || i >= dim) return Refuse(absl::StrCat("index ", i, " of an axis of ", dim));
    at.push_back(i < 0 ? i + dim : i);
  }
  Shape out_shape(shape.begin(), shape.begin() + *axis);
  out_shape.insert(out_shape.end(), idx->shape.begin(), idx->shape.end());
  out_shape.insert(out_shape.end(), shape.begin() + *axis + 1, shape.end());
  const std::string out = n.output(0);
  if (data_const == nullptr && at.size() != 1) {
    // A run of consecutive indices is a slice (torch exports an identity as_strided as a Gather of every index in
    // order); any other choice of an activation's elements is not lowered.
    for (size_t k = 1; k < at.size(); ++k) {
      if (at[k] != at[0] + static_cast<int64_t>(k)) {
        return Refuse(absl::StrCat(at.size(), " indices of an activation, not consecutive (Loom gathers a run)"));
      }
    }
    if (at.empty()) return Refuse("no indices");
    starts[*axis] = at[0], counts[*axis] = static_cast<int64_t>(at.size());
    if (absl::Status s = SliceInto(n.input(0), starts, steps, counts, out + "/run"); !s.ok()) return s;
    absl::StatusOr<std::string> x = Activation(out + "/run", "slice");
    if (!x.ok()) return x.status();
    absl::StatusOr<std::string> y = Reshape(*x, out_shape, out);
    if (!y.ok()) return y.status();
    alias_[out] = *y;
    return absl::OkStatus();
  }
  const std::string sliced = at.size() == 1 && idx->shape == Shape{1} ? out : out + "/one";
  if (at.size() == 1) {
    starts[*axis] = at[0], counts[*axis] = 1;
    if (absl::Status s = SliceInto(n.input(0), starts, steps, counts, sliced); !s.ok()) return s;
    if (sliced == out) return absl::OkStatus();
    if (const Constant* c = ConstantOf(sliced); c != nullptr) {  // (a constant: its shape)
      Constant r = *c;
      r.shape = out_shape;
      consts_[out] = std::move(r);
      return absl::OkStatus();
    }
    absl::StatusOr<std::string> x = Activation(sliced, "slice");
    if (!x.ok()) return x.status();
    absl::StatusOr<std::string> y = Reshape(*x, out_shape, out);
    if (!y.ok()) return y.status();
    alias_[out] = *y;
    return absl::OkStatus();
  }
  // Several indices of a constant: each one's slice in order.
  Constant r;
  r.is_int = data_const->is_int;
  r.shape = out_shape;
  const int64_t outer = Elements(Shape(shape.begin(), shape.begin() + *axis));
  const int64_t inner = Elements(Shape(shape.begin() + *axis + 1, shape.end()));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i : at) {
      const int64_t base = (o * dim + i) * inner;
      for (int64_t k = 0; k < inner; ++k) {
        AppendElement(r, *data_const, base + k);
      }
    }
  }
  consts_[out] = std::move(r);
  return absl::OkStatus();
}

// Expand (opsets 8 and 13): the input broadcast with the constant shape, both ways (numpy's rules: the output is
// their broadcast). A constant's folded (ViT's class token, `expand(n, -1, -1)`), an activation's the IR's EXPAND.
absl::Status Importer::Expand(const onnx::NodeProto& n) {
  const Constant* target = n.input_size() > 1 ? ConstantOf(n.input(1)) : nullptr;
  if (target == nullptr || !target->is_int || target->shape.size() != 1) {
    return Refuse("the shape must be a constant 1-D integer tensor");
  }
  const Constant* c = ConstantOf(n.input(0));
  absl::StatusOr<std::string> x = c != nullptr ? absl::StatusOr<std::string>("") : Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const Shape in = c != nullptr ? c->shape : Shapes(*x);
  absl::StatusOr<Shape> shape = BroadcastShapes(in, target->i);
  if (!shape.ok()) return Refuse(std::string(shape.status().message()));
  const std::string out = n.output(0);
  if (c != nullptr) {
    Constant r;
    r.is_int = c->is_int;
    r.shape = *shape;
    const int64_t rank = static_cast<int64_t>(shape->size()), lead = rank - static_cast<int64_t>(in.size());
    for (int64_t i = 0; i < Elements(*shape); ++i) {
      int64_t src = 0, rest = i, stride = 1;
      for (int64_t d = rank - 1; d >= lead; --d) {  // the input's dims, innermost first; size-1 ones repeat
        const int64_t coord = rest % (*shape)[d];
        rest /= (*shape)[d];
        const int64_t dim = in[d - lead];
        src += (dim == 1 ? 0 : coord) * stride;
        stride *= dim;
      }
      AppendElement(r, *c, src);
    }
    consts_[out] = std::move(r);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> y = Emit(EXPAND, {*x}, out, [](OpDef&) {}, *shape);
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// Pad in constant mode (every opset's form: `paddings` / `pads` and `value` attributes before opset 11, then the pads,
// constant_value and opset 18's axes as constant inputs): begin and end counts per axis, none negative. A
// constant's folded; an activation's the IR's PAD.
absl::Status Importer::Pad(const onnx::NodeProto& n, Attrs& a) {
  const std::string mode = a.String("mode", "constant");
  if (mode != "constant") return Refuse(absl::StrCat("mode '", mode, "' (Loom pads with a constant)"));
  const Constant* c = ConstantOf(n.input(0));
  absl::StatusOr<std::string> x = c != nullptr ? absl::StatusOr<std::string>("") : Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const Shape in = c != nullptr ? c->shape : Shapes(*x);
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> pads, axes;
  float value = 0.0f;
  auto constant_ints = [&](int k, const std::string& what) -> absl::StatusOr<std::vector<int64_t>> {
    const Constant* v = ConstantOf(n.input(k));
    if (v == nullptr || !v->is_int) return Refuse(absl::StrCat(what, " must be a constant integer tensor"));
    return v->i;
  };
  if (opset_ < 11) {
    pads = a.Ints(opset_ < 2 ? "paddings" : "pads");
    value = a.Float("value", 0.0f);
  } else {
    absl::StatusOr<std::vector<int64_t>> p = constant_ints(1, "pads");
    if (!p.ok()) return p.status();
    pads = *p;
    if (n.input_size() > 2 && !n.input(2).empty()) {
      const Constant* v = ConstantOf(n.input(2));
      if (v == nullptr || v->is_int || v->f.size() != 1) return Refuse("constant_value must be a constant float scalar");
      value = v->f[0];
    }
    if (n.input_size() > 3 && !n.input(3).empty()) {
      absl::StatusOr<std::vector<int64_t>> ax = constant_ints(3, "axes");
      if (!ax.ok()) return ax.status();
      axes = *ax;
    }
  }
  if (axes.empty()) {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  if (pads.size() != 2 * axes.size()) {
    return Refuse(absl::StrCat(pads.size(), " pads for ", axes.size(), " axes (a begin and an end each)"));
  }
  Shape begin(rank, 0), shape = in;
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t d = axes[k] < 0 ? axes[k] + rank : axes[k];
    if (d < 0 || d >= rank) return Refuse(absl::StrCat("axis ", axes[k], " of a tensor of rank ", rank));
    const int64_t before = pads[k], after = pads[k + axes.size()];
    if (before < 0 || after < 0) return Refuse(absl::StrCat("negative pads on axis ", d, " (a crop: use Slice)"));
    begin[d] = before;
    shape[d] = in[d] + before + after;
  }
  const std::string out = n.output(0);
  if (c != nullptr) {  // folded
    if (c->is_int) return Refuse("pads an integer constant");
    Constant r;
    r.shape = shape;
    r.f.assign(Elements(shape), value);
    for (int64_t i = 0; i < Elements(in); ++i) {
      int64_t at = 0, rest = i, stride = 1;
      for (int64_t d = rank - 1; d >= 0; --d) {
        at += (rest % in[d] + begin[d]) * stride;
        rest /= in[d];
        stride *= shape[d];
      }
      r.f[at] = c->f[i];
    }
    consts_[out] = std::move(r);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> y = Emit(PAD, {*x, NewWeight(out + "/value", {1}, {value})}, out, [&](OpDef& op) {
    for (int64_t b : begin) op.mutable_pad()->add_begin(b);
  }, shape);
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// ConvTranspose (1-D and 2-D, constant weights) as the convolution it is the gradient of: the input spread out by
// the strides (stride - 1 zeros between elements: the IR's PAD with interior steps) and padded by dilation (k - 1)
// - pad on each side (+ output_padding at the end), then a stride-1 Conv with the kernel flipped and its channels'
// roles swapped per group (W[C_in, C_out / g, k...] -> W'[C_out, C_in / g, k...]). auto_pad other than NOTSET,
// output_shape and pads larger than dilation (k - 1) (a crop) are refused by name.
absl::Status Importer::ConvTranspose(const onnx::NodeProto& n, Attrs& a) {
  const Constant* w = n.input_size() > 1 ? ConstantOf(n.input(1)) : nullptr;
  if (w == nullptr || w->is_int || (w->shape.size() != 3 && w->shape.size() != 4)) {
    return Refuse("the weight W must be a float constant [C_in, C_out / group, k...] (1-D or 2-D)");
  }
  if (a.String("auto_pad", "NOTSET") != "NOTSET") return Refuse("auto_pad other than NOTSET");
  if (const std::vector<int64_t> k = a.Ints("kernel_shape");
      !k.empty() && k != std::vector<int64_t>(w->shape.begin() + 2, w->shape.end())) {
    return Refuse(absl::StrCat("kernel_shape ", Str(k), " for a weight ", Str(w->shape)));
  }
  if (!a.Ints("output_shape").empty()) return Refuse("output_shape (give pads and output_padding)");
  absl::StatusOr<std::string> x = Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const Shape xs = Shapes(*x);
  const size_t spatial = w->shape.size() - 2;
  if (xs.size() != spatial + 2) return Refuse(absl::StrCat("input ", Str(xs), " for a weight ", Str(w->shape)));
  const int64_t groups = a.Int("group", 1), c_in = w->shape[0], cog = w->shape[1];
  if (groups < 1 || c_in % groups != 0 || xs[1] != c_in) {
    return Refuse(absl::StrCat("input channels ", xs[1], ", weight ", Str(w->shape), ", group ", groups));
  }
  auto per_axis = [&](const std::string& name, int64_t fallback, size_t count) {
    std::vector<int64_t> v = a.Ints(name);
    if (v.empty()) v.assign(count, fallback);
    return v;
  };
  const std::vector<int64_t> strides = per_axis("strides", 1, spatial), dilations = per_axis("dilations", 1, spatial);
  const std::vector<int64_t> pads = per_axis("pads", 0, 2 * spatial), extra = per_axis("output_padding", 0, spatial);
  if (strides.size() != spatial || dilations.size() != spatial || pads.size() != 2 * spatial || extra.size() != spatial) {
    return Refuse("strides, dilations, pads and output_padding of the wrong lengths");
  }
  // The spread, padded input.
  Shape begin(xs.size(), 0), interior(xs.size(), 1), padded = xs;
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t k = w->shape[2 + d], reach = dilations[d] * (k - 1);
    if (strides[d] < 1 || dilations[d] < 1 || pads[d] > reach || pads[d + spatial] > reach + extra[d]) {
      return Refuse(absl::StrCat("axis ", d, ": pads ", pads[d], " and ", pads[d + spatial], " beyond the kernel's reach ",
                                 reach, " (a crop), or a stride or dilation below 1"));
    }
    begin[2 + d] = reach - pads[d];
    interior[2 + d] = strides[d];
    padded[2 + d] = begin[2 + d] + (xs[2 + d] - 1) * strides[d] + 1 + reach - pads[d + spatial] + extra[d];
  }
  const std::string out = n.output(0);
  absl::StatusOr<std::string> spread = Emit(PAD, {*x, NewWeight(out + "/zero", {1}, {0.0f})}, out + "/spread",
                                            [&](OpDef& op) {
                                              for (size_t d = 0; d < xs.size(); ++d) {
                                                op.mutable_pad()->add_begin(begin[d]);
                                                op.mutable_pad()->add_interior(interior[d]);
                                              }
                                            },
                                            padded);
  if (!spread.ok()) return spread.status();
  // The flipped kernel with its channels' roles swapped, per group.
  Constant flipped;
  const int64_t cig = c_in / groups, c_out = cog * groups;
  const int64_t taps = Elements(Shape(w->shape.begin() + 2, w->shape.end()));
  flipped.shape = w->shape;
  flipped.shape[0] = c_out, flipped.shape[1] = cig;
  flipped.f.resize(w->f.size());
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < cig; ++i) {
      for (int64_t o = 0; o < cog; ++o) {
        for (int64_t t = 0; t < taps; ++t) {
          flipped.f[((g * cog + o) * cig + i) * taps + (taps - 1 - t)] = w->f[((g * cig + i) * cog + o) * taps + t];
        }
      }
    }
  }
  const std::string kernel = Fresh(out + "/flipped");
  consts_[kernel] = std::move(flipped);
  onnx::NodeProto conv;
  conv.set_op_type("Conv");
  conv.set_name(n.name());
  conv.add_input(*spread);
  conv.add_input(kernel);
  if (n.input_size() > 2 && !n.input(2).empty()) conv.add_input(n.input(2));
  conv.add_output(out);
  onnx::AttributeProto* dil = conv.add_attribute();
  dil->set_name("dilations"), dil->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : dilations) dil->add_ints(v);
  onnx::AttributeProto* grp = conv.add_attribute();
  grp->set_name("group"), grp->set_type(onnx::AttributeProto::INT), grp->set_i(groups);
  Attrs conv_attrs(conv);
  if (absl::Status s = Spatial(conv, conv_attrs); !s.ok()) return s;
  return absl::OkStatus();
}

// Resize (opsets 10-19) and Upsample (7-9) in nearest mode by whole factors of the spatial axes, where the
// coordinate and rounding modes make output index o read input index floor(o / s): asymmetric with floor, and
// half_pixel / pytorch_half_pixel with either round_prefer mode (x = (o + 0.5) / s - 0.5 is never halfway between
// two inputs). Each axis from the last spatial one in is one EXPAND between RESHAPEs ([..., d, 1] -> [..., d, s] ->
// [..., d * s]); other modes, factors and the antialias / exclude_outside / axes attributes are refused by name.
absl::Status Importer::Resize(const onnx::NodeProto& n, Attrs& a) {
  const std::string mode = a.String("mode", "nearest");
  if (mode != "nearest" && mode != "linear") {
    return Refuse(absl::StrCat("mode '", mode, "' (Loom resizes by nearest or linear)"));
  }
  const bool linear = mode == "linear";
  // Upsample (opsets 7-9) has neither attribute: its nearest mode reads input floor(o / s), its linear mode o / s.
  const bool upsample = n.op_type() == "Upsample";
  const std::string coordinates = upsample ? "asymmetric" : a.String("coordinate_transformation_mode", "half_pixel");
  const std::string rounding = upsample ? "floor" : a.String("nearest_mode", "round_prefer_floor");
  const bool floor_of_quotient = (coordinates == "asymmetric" && rounding == "floor") ||
                                 ((coordinates == "half_pixel" || coordinates == "pytorch_half_pixel") &&
                                  (rounding == "round_prefer_floor" || rounding == "round_prefer_ceil"));
  if (linear ? coordinates != "half_pixel" && coordinates != "pytorch_half_pixel" && coordinates != "align_corners" &&
                   coordinates != "asymmetric"
             : !floor_of_quotient) {
    return Refuse(linear ? absl::StrCat("coordinate_transformation_mode '", coordinates, "' in linear mode")
                         : absl::StrCat("coordinate_transformation_mode '", coordinates, "' with nearest_mode '",
                                        rounding, "'"));
  }
  a.Float("cubic_coeff_a", -0.75f), a.Float("extrapolation_value", 0.0f);  // (other modes' parameters)
  if (a.Int("antialias", 0) != 0 || a.Int("exclude_outside", 0) != 0) return Refuse("antialias or exclude_outside");
  if (!a.Ints("axes").empty()) return Refuse("axes (give scales for every axis)");
  if (a.String("keep_aspect_ratio_policy", "stretch") != "stretch") return Refuse("keep_aspect_ratio_policy");
  absl::StatusOr<std::string> x = Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const Shape in = Shapes(*x);
  // The output's shape: from scales (Upsample's attribute before opset 9, then input 1; Resize's input 1 at opset
  // 10, input 2 from 11) or sizes (Resize's input 3 from 11).
  std::vector<float> scales;
  Shape out_shape;
  if (n.op_type() == "Upsample" && opset_ < 9) {
    for (float v : a.Floats("scales")) scales.push_back(v);
  } else {
    const int k = n.op_type() == "Upsample" || opset_ < 11 ? 1 : 2;
    if (const Constant* c = n.input_size() > k && !n.input(k).empty() ? ConstantOf(n.input(k)) : nullptr) {
      if (c->is_int) return Refuse("scales must be float");
      scales = c->f;
    }
    if (scales.empty() && n.input_size() > 3 && !n.input(3).empty()) {
      const Constant* c = ConstantOf(n.input(3));
      if (c == nullptr || !c->is_int) return Refuse("sizes must be a constant integer tensor");
      out_shape = c->i;
    }
  }
  if (out_shape.empty()) {
    if (scales.size() != in.size()) return Refuse("scales or sizes must be constants of the input's rank");
    for (size_t d = 0; d < in.size(); ++d) out_shape.push_back(static_cast<int64_t>(std::floor(in[d] * scales[d])));
  }
  if (out_shape.size() != in.size() || in.size() < 3) return Refuse(absl::StrCat("output ", Str(out_shape), " for ", Str(in)));
  if (linear) return ResizeLinear(n, *x, out_shape, scales, coordinates);
  std::vector<int64_t> factor(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    if (out_shape[d] % in[d] != 0 || out_shape[d] < in[d] || (d < 2 && out_shape[d] != in[d])) {
      return Refuse(absl::StrCat("axis ", d, " from ", in[d], " to ", out_shape[d], " (whole factors of the spatial "
                                 "axes only)"));
    }
    factor[d] = out_shape[d] / in[d];
  }
  const std::string out = n.output(0);
  std::string y = *x;
  Shape shape = in;
  for (size_t d = in.size(); d-- > 2;) {  // innermost spatial axis first
    if (factor[d] == 1) continue;
    // [outer, dim, inner] -> [outer, dim, 1, inner] -> [outer, dim, s, inner] -> [outer, dim * s, inner]
    const int64_t outer = Elements(Shape(shape.begin(), shape.begin() + d)), inner = Elements(Shape(shape.begin() + d + 1, shape.end()));
    absl::StatusOr<std::string> r = Reshape(y, {outer, shape[d], 1, inner}, absl::StrCat(out, "/axis", d));
    if (r.ok()) {
      r = Emit(EXPAND, {*r}, absl::StrCat(out, "/repeat", d), [](OpDef&) {},
               Shape{outer, shape[d], factor[d], inner});
    }
    shape[d] *= factor[d];
    if (r.ok()) r = Reshape(*r, shape, absl::StrCat(out, "/resized", d));
    if (!r.ok()) return r.status();
    y = *r;
  }
  absl::StatusOr<std::string> r = Reshape(y, shape, out);  // (a view: no instruction)
  if (!r.ok()) return r.status();
  alias_[out] = *r;
  return absl::OkStatus();
}

// Resize in linear mode: separable, so each resized spatial axis is a product with a constant interpolation matrix
// A [out, in] built here from the spec's coordinate transformation (x = (o + 0.5) / scale - 0.5 for half_pixel, and
// pytorch_half_pixel but at a length of 1; o (in - 1) / (out - 1) for align_corners, out being in * scale unrounded
// where scales are given; o / scale for asymmetric) and
// its linear coefficients (1 - r at floor(x), r at floor(x) + 1, indices past the edges clamped to them, as the
// reference pads by the edge values): the axis moved last where it is not, a MATMUL by Aᵀ, moved back. Any ratio,
// up or down (no antialias). The batch and channel axes keep their lengths.
absl::Status Importer::ResizeLinear(const onnx::NodeProto& n, const std::string& x, const Shape& out_shape,
                                    const std::vector<float>& scales, const std::string& coordinates) {
  const Shape in = Shapes(x);
  const int64_t rank = static_cast<int64_t>(in.size());
  const std::string out = n.output(0);
  std::string y = x;
  Shape shape = in;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < 2 && out_shape[d] != in[d]) return Refuse(absl::StrCat("axis ", d, " from ", in[d], " to ", out_shape[d]));
    if (out_shape[d] < 1) return Refuse(absl::StrCat("axis ", d, " resized to ", out_shape[d]));
  }
  for (int64_t d = 2; d < rank; ++d) {
    const int64_t li = in[d], lo = out_shape[d];
    const double scale = !scales.empty() ? scales[d] : static_cast<double>(lo) / static_cast<double>(li);
    if (lo == li && scale == 1.0) continue;
    std::vector<float> at(static_cast<size_t>(li * lo), 0.0f);  // Aᵀ [in, out]
    for (int64_t o = 0; o < lo; ++o) {
      double xo;
      if (coordinates == "align_corners") {  // the resized length is in * scale, unrounded, where scales are given
        const double resized = !scales.empty() ? li * scale : static_cast<double>(lo);
        xo = resized <= 1.0 ? 0.0 : static_cast<double>(o) * (li - 1) / (resized - 1);
      } else if (coordinates == "asymmetric") {
        xo = o / scale;
      } else if (coordinates == "pytorch_half_pixel" && lo == 1) {
        xo = 0.0;
      } else {
        xo = (o + 0.5) / scale - 0.5;
      }
      const double f = std::floor(xo), r = xo - f;
      const int64_t i0 = std::clamp<int64_t>(static_cast<int64_t>(f), 0, li - 1);
      const int64_t i1 = std::clamp<int64_t>(static_cast<int64_t>(f) + 1, 0, li - 1);
      at[static_cast<size_t>(i0 * lo + o)] += static_cast<float>(1.0 - r);
      at[static_cast<size_t>(i1 * lo + o)] += static_cast<float>(r);
    }
    std::vector<int> perm(static_cast<size_t>(rank));
    for (int64_t k = 0; k < rank; ++k) perm[k] = static_cast<int>(k);
    std::swap(perm[d], perm[rank - 1]);
    absl::StatusOr<std::string> v = y;
    if (d != rank - 1) v = Transpose(y, perm, absl::StrCat(out, "/axis", d, "_last"));
    if (v.ok()) {
      v = Emit(MATMUL, {*v, NewWeight(absl::StrCat(out, "/interpolation", d), {li, lo}, std::move(at))},
               absl::StrCat(out, "/resized", d), [](OpDef&) {});
    }
    if (v.ok() && d != rank - 1) v = Transpose(*v, perm, absl::StrCat(out, "/axis", d, "_back"));
    if (!v.ok()) return v.status();
    y = *v;
    shape[d] = lo;
  }
  absl::StatusOr<std::string> r = Reshape(y, shape, out);
  if (!r.ok()) return r.status();
  alias_[out] = *r;
  return absl::OkStatus();
}

}  // namespace loom::graph::onnx_internal
