// The ONNX ops that become several IR ops: Conv, MaxPool, AveragePool and GlobalAveragePool (NCHW around Loom's
// NHWC ops; 1-D ones as 2-D over a height of 1), Gemm, LayerNormalization, BatchNormalization. The element-wise
// compositions: onnx_import_elementwise.cc; the reductions: onnx_import_reduce.cc.
#include <cmath>
#include <optional>

#include "graph/onnx_importer.h"

namespace loom::graph::onnx_internal {

absl::StatusOr<std::array<int64_t, 4>> Importer::Pads(Attrs& a, const Shape& nchw, const std::vector<int64_t>& kernel,
                                                      const std::vector<int64_t>& strides,
                                                      const std::vector<int64_t>& dilations, bool one_d) {
  const std::string auto_pad = a.String("auto_pad", "NOTSET");
  std::vector<int64_t> pads = a.Ints("pads");
  if (one_d && pads.size() == 2) pads = {0, pads[0], 0, pads[1]};
  if (auto_pad == "NOTSET") {
    if (pads.empty()) pads.assign(4, 0);
    if (pads.size() != 4) return Refuse(absl::StrCat("pads of ", pads.size(), " values (2-D ops take 4)"));
    return std::array<int64_t, 4>{pads[0], pads[1], pads[2], pads[3]};
  }
  if (!pads.empty()) return Refuse("both pads and auto_pad");
  if (auto_pad == "VALID") return std::array<int64_t, 4>{0, 0, 0, 0};
  if (auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER") return Refuse(absl::StrCat("auto_pad '", auto_pad, "'"));
  std::array<int64_t, 4> p{};
  for (int d = 0; d < 2; ++d) {
    const int64_t in = nchw[2 + d], s = strides[d], ek = (kernel[d] - 1) * dilations[d] + 1;
    const int64_t total = std::max<int64_t>(((in + s - 1) / s - 1) * s + ek - in, 0);
    const int64_t small = total / 2, large = total - small;
    p[d] = auto_pad == "SAME_UPPER" ? small : large;
    p[2 + d] = auto_pad == "SAME_UPPER" ? large : small;
  }
  return p;
}

// Conv, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool: NCHW around Loom's NHWC op.
absl::Status Importer::Spatial(const onnx::NodeProto& n, Attrs& a) {
  absl::StatusOr<std::string> x = Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const std::string out = n.output(0);
  // 1-D ops ([N, C, L]) run as 2-D ones over [N, C, 1, L]: every per-dimension attribute gains a leading H entry.
  const Shape in_shape = Shapes(*x);
  const bool one_d = in_shape.size() == 3;
  if (in_shape.size() != 4 && !one_d) {
    return Refuse(absl::StrCat("input ", Str(in_shape), ": 1-D and 2-D spatial ops only (NCL or NCHW)"));
  }
  if (one_d) {
    x = Reshape(*x, {in_shape[0], in_shape[1], 1, in_shape[2]}, out + "/nc1l");
    if (!x.ok()) return x.status();
  }
  const Shape nchw = Shapes(*x);
  auto widen = [&](std::vector<int64_t> v, int64_t h) {  // [w] -> [h, w]; pads [b, e] -> [0, b, 0, e]
    if (!one_d || v.empty()) return v;
    if (v.size() == 2 && h == 0) return std::vector<int64_t>{0, v[0], 0, v[1]};
    v.insert(v.begin(), h);
    return v;
  };
  absl::StatusOr<std::string> nhwc = Transpose(*x, {0, 2, 3, 1}, out + "/nhwc_in");
  if (!nhwc.ok()) return nhwc.status();
  absl::StatusOr<std::string> y;
  const std::string& type = n.op_type();
  if (type == "GlobalAveragePool") {
    y = Emit(GLOBAL_AVG_POOL, {*nhwc}, out + "/nhwc", [](OpDef&) {});
  } else if (type == "GlobalMaxPool") {  // a max pool whose one window is the whole image
    const Shape s = Shapes(*nhwc);
    y = Emit(MAX_POOL, {*nhwc}, out + "/nhwc", [&](OpDef& op) {
      PoolAttrs* p = op.mutable_pool();
      p->set_kernel_h(static_cast<int32_t>(s[1])), p->set_kernel_w(static_cast<int32_t>(s[2]));
    });
  } else {
    const Constant* w = type == "Conv" ? ConstantOf(n.input(1)) : nullptr;
    if (w != nullptr && (w->is_int || w->shape.size() != (one_d ? 3u : 4u))) {
      return Refuse("the weight W must be float [OC, C/group, KH, KW]");
    }
    Shape w_shape;  // OIHW
    if (type == "Conv") {
      if (w != nullptr) {
        w_shape = w->shape;
      } else {
        absl::StatusOr<std::string> wv = Activation(n.input(1), "weight W");
        if (!wv.ok()) return wv.status();
        w_shape = Shapes(*wv);
      }
      if (one_d && w_shape.size() == 3) w_shape.insert(w_shape.begin() + 2, 1);
      if (w_shape.size() != 4) return Refuse("the weight W must be [OC, C/group, KH, KW] (or [OC, C/group, K])");
    }
    std::vector<int64_t> kernel = widen(a.Ints("kernel_shape"), 1);
    if (type == "Conv" && kernel.empty()) kernel = {w_shape[2], w_shape[3]};
    std::vector<int64_t> strides = widen(a.Ints("strides"), 1), dilations = widen(a.Ints("dilations"), 1);
    if (strides.empty()) strides = {1, 1};
    if (dilations.empty()) dilations = {1, 1};
    if (kernel.size() != 2 || strides.size() != 2 || dilations.size() != 2) {
      return Refuse("kernel_shape, strides and dilations of 2 values (2-D ops only)");
    }
    absl::StatusOr<std::array<int64_t, 4>> pads = Pads(a, nchw, kernel, strides, dilations, one_d);
    if (!pads.ok()) return pads.status();
    const auto [pt, pl, pb, pr] = *pads;
    if (type == "Conv") {
      const int64_t groups = a.Int("group", 1), oc = w_shape[0], cg = w_shape[1], kh = w_shape[2], kw = w_shape[3];
      if (kernel[0] != kh || kernel[1] != kw) return Refuse("kernel_shape disagrees with the weight");
      std::vector<std::string> inputs = {*nhwc};
      if (w != nullptr) {  // OIHW -> OHWI at import
        std::vector<float> ohwi(w->f.size());
        for (int64_t o = 0; o < oc; ++o)
          for (int64_t i = 0; i < cg; ++i)
            for (int64_t y0 = 0; y0 < kh; ++y0)
              for (int64_t x0 = 0; x0 < kw; ++x0) {
                ohwi[((o * kh + y0) * kw + x0) * cg + i] = w->f[((o * cg + i) * kh + y0) * kw + x0];
              }
        inputs.push_back(NewWeight(n.input(1) + "/ohwi", {oc, kh, kw, cg}, std::move(ohwi)));
      } else {  // a weight computed or fed at run time: permuted by a TRANSPOSE
        absl::StatusOr<std::string> wv = Activation(n.input(1), "weight W");
        if (wv.ok() && one_d) wv = Reshape(*wv, w_shape, out + "/w_oi1k");
        if (!wv.ok()) return wv.status();
        absl::StatusOr<std::string> wt = Transpose(*wv, {0, 2, 3, 1}, out + "/w_ohwi");
        if (!wt.ok()) return wt.status();
        inputs.push_back(*wt);
      }
      if (n.input_size() > 2 && !n.input(2).empty()) {
        if (const Constant* b = ConstantOf(n.input(2)); b != nullptr) {
          if (b->is_int) return Refuse("the bias B must be float");
          inputs.push_back(NewWeight(n.input(2) + "/bias", b->shape, b->f));
        } else {
          absl::StatusOr<std::string> bv = Activation(n.input(2), "bias B");
          if (!bv.ok()) return bv.status();
          inputs.push_back(*bv);
        }
      } else {
        inputs.push_back(NewWeight(out + "/bias", {oc}, std::vector<float>(oc, 0.0f)));  // BN folding adds to it
      }
      y = Emit(CONV2D, inputs, out + "/nhwc", [&](OpDef& op) {
        Conv2dAttrs* c = op.mutable_conv2d();
        c->set_stride_h(strides[0]), c->set_stride_w(strides[1]);
        c->set_pad_h(pt), c->set_pad_w(pl), c->set_pad_bottom(pb), c->set_pad_right(pr);
        c->set_dilation_h(dilations[0]), c->set_dilation_w(dilations[1]), c->set_groups(groups);
      });
    } else {
      if (a.Int("storage_order", 0) != 0) return Refuse("storage_order 1 (column-major indices)");
      if (n.output_size() > 1 && !n.output(1).empty()) return Refuse("the Indices output");
      const bool ceil = a.Int("ceil_mode", 0) != 0, include = a.Int("count_include_pad", 0) != 0;
      y = Emit(type == "MaxPool" ? MAX_POOL : AVG_POOL, {*nhwc}, out + "/nhwc", [&](OpDef& op) {
        PoolAttrs* p = op.mutable_pool();
        p->set_kernel_h(kernel[0]), p->set_kernel_w(kernel[1]), p->set_stride_h(strides[0]);
        p->set_stride_w(strides[1]), p->set_pad_top(pt), p->set_pad_left(pl), p->set_pad_bottom(pb);
        p->set_pad_right(pr), p->set_dilation_h(dilations[0]), p->set_dilation_w(dilations[1]);
        p->set_ceil_mode(ceil), p->set_count_include_pad(include);
      });
    }
  }
  if (!y.ok()) return y.status();
  absl::StatusOr<std::string> back = Transpose(*y, {0, 3, 1, 2}, one_d ? out + "/nc1l_out" : out);
  if (back.ok() && one_d) {
    const Shape s4 = Shapes(*back);
    back = Reshape(*back, {s4[0], s4[1], s4[3]}, out);
  }
  if (!back.ok()) return back.status();
  const OpDef& conv = def_.ops(def_.ops_size() - (one_d ? 3 : 2));
  if (type == "Conv" && ConstantOf(n.input(1)) != nullptr && weights_.contains(conv.inputs(2))) {
    conv_of_[out] = &conv;  // weight and bias constants: a BatchNormalization can fold in
  }
  alias_[out] = *back;
  return absl::OkStatus();
}

// Gemm: Y = alpha * A' B' + beta * C as MATMUL (B' a weight when B is constant) then MUL / ADD.
absl::Status Importer::Gemm(const onnx::NodeProto& n, Attrs& a) {
  const float alpha = a.Float("alpha", 1.0f), beta = a.Float("beta", 1.0f);
  a.Int("broadcast", 0);  // before opset 7: C broadcasts only when set; numpy broadcasting covers both
  const bool ta = a.Int("transA", 0) != 0, tb = a.Int("transB", 0) != 0;
  const std::string out = n.output(0);
  absl::StatusOr<std::string> x = Activation(n.input(0), "input A");
  if (!x.ok()) return x.status();
  if (ta) x = Transpose(*x, {1, 0}, out + "/a_t");
  if (!x.ok()) return x.status();
  std::string b;
  if (const Constant* c = ConstantOf(n.input(1)); c != nullptr && !c->is_int && c->shape.size() == 2) {
    const int64_t r = c->shape[0], k = c->shape[1];
    std::vector<float> v(c->f.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < k; ++j) (tb ? v[j * r + i] : v[i * k + j]) = alpha * c->f[i * k + j];
    b = NewWeight(n.input(1) + "/gemm_b", tb ? Shape{k, r} : Shape{r, k}, std::move(v));
  } else {
    absl::StatusOr<std::string> bv = Activation(n.input(1), "input B");
    if (!bv.ok()) return bv.status();
    b = *bv;
    if (tb) {
      absl::StatusOr<std::string> t = Transpose(b, {1, 0}, out + "/b_t");
      if (!t.ok()) return t.status();
      b = *t;
    }
  }
  absl::StatusOr<std::string> y = Emit(MATMUL, {*x, b}, n.input_size() > 2 || alpha != 1.0f ? out + "/ab" : out,
                                       [](OpDef&) {});
  if (!y.ok()) return y.status();
  if (alpha != 1.0f && !ConstantOf(n.input(1))) {
    y = Emit(MUL, {*y, NewWeight(out + "/alpha", {1}, {alpha})}, out + "/alpha_ab", [](OpDef&) {});
    if (!y.ok()) return y.status();
  }
  if (n.input_size() > 2 && !n.input(2).empty()) {
    std::string c;
    if (const Constant* k = ConstantOf(n.input(2)); k != nullptr && !k->is_int) {
      std::vector<float> v = k->f;
      for (float& e : v) e *= beta;
      c = NewWeight(n.input(2) + "/gemm_c", k->shape, std::move(v));
    } else {
      absl::StatusOr<std::string> cv = Activation(n.input(2), "input C");
      if (!cv.ok()) return cv.status();
      c = *cv;
      if (beta != 1.0f) {
        absl::StatusOr<std::string> s = Emit(MUL, {c, NewWeight(out + "/beta", {1}, {beta})}, out + "/beta_c", [](OpDef&) {});
        if (!s.ok()) return s.status();
        c = *s;
      }
    }
    y = Emit(ADD, {*y, c}, out, [](OpDef&) {});
    if (!y.ok()) return y.status();
  }
  alias_[out] = *y;
  return absl::OkStatus();
}

// LayerNormalization over dims [axis, rank): LAYER_NORM of the [outer, inner] view, scale and bias by broadcasting
// when they are not constants.
absl::Status Importer::LayerNorm(const onnx::NodeProto& n, Attrs& a) {
  const float eps = a.Float("epsilon", 1e-5f);
  a.Int("stash_type", 1);
  absl::StatusOr<std::string> x = Activation(n.input(0), "input X");
  if (!x.ok()) return x.status();
  const Shape shape = Shapes(*x);
  int64_t axis = a.Int("axis", -1);
  if (axis < 0) axis += static_cast<int64_t>(shape.size());
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size())) return Refuse(absl::StrCat("axis out of range"));
  const int64_t outer = Elements(Shape(shape.begin(), shape.begin() + axis));
  const int64_t inner = Elements(Shape(shape.begin() + axis, shape.end()));
  const std::string out = n.output(0);
  const Constant* scale = ConstantOf(n.input(1));
  const Constant* bias = n.input_size() > 2 && !n.input(2).empty() ? ConstantOf(n.input(2)) : nullptr;
  const bool constant = scale != nullptr && !scale->is_int && Elements(scale->shape) == inner &&
                        (n.input_size() < 3 || n.input(2).empty() || (bias != nullptr && !bias->is_int));
  absl::StatusOr<std::string> flat = Reshape(*x, {outer, inner}, out + "/2d");
  if (!flat.ok()) return flat.status();
  const std::string w = NewWeight(out + "/scale", {inner}, constant ? scale->f : std::vector<float>(inner, 1.0f));
  const std::string b = NewWeight(out + "/bias", {inner},
                                  constant && bias != nullptr ? bias->f : std::vector<float>(inner, 0.0f));
  absl::StatusOr<std::string> y = Emit(LAYER_NORM, {*flat, w, b}, out + "/normed", [&](OpDef& op) {
    op.mutable_norm()->set_eps(eps);
  }, Shape{outer, inner});
  if (!y.ok()) return y.status();
  y = Reshape(*y, shape, constant ? out : out + "/nd");
  if (!y.ok()) return y.status();
  if (!constant) {  // scale and bias broadcast over the normalised dims
    absl::StatusOr<std::string> s = Activation(n.input(1), "input Scale");
    if (!s.ok()) return s.status();
    y = Emit(MUL, {*y, *s}, n.input_size() > 2 && !n.input(2).empty() ? out + "/scaled" : out, [](OpDef&) {});
    if (!y.ok()) return y.status();
    if (n.input_size() > 2 && !n.input(2).empty()) {
      absl::StatusOr<std::string> bb = Activation(n.input(2), "input B");
      if (!bb.ok()) return bb.status();
      y = Emit(ADD, {*y, *bb}, out, [](OpDef&) {});
      if (!y.ok()) return y.status();
    }
  }
  alias_[out] = *y;
  // The optional Mean and InvStdDev outputs, over the normalised axes kept as 1s: the mean, and 1 / sqrt(the mean
  // of (x - mean)^2 + epsilon), in float32 (stash_type 1), beside the LAYER_NORM that computes Y.
  const bool mean_out = n.output_size() > 1 && !n.output(1).empty();
  const bool inv_out = n.output_size() > 2 && !n.output(2).empty();
  if (mean_out || inv_out) {
    std::vector<int64_t> axes;
    for (int64_t d = axis; d < static_cast<int64_t>(shape.size()); ++d) axes.push_back(d);
    absl::StatusOr<std::string> mean = ReduceAxes("ReduceMean", *x, axes, true, out + "/mean");
    if (!mean.ok()) return mean.status();
    if (mean_out) alias_[n.output(1)] = *mean;
    if (inv_out) {
      absl::StatusOr<std::string> d = Emit(SUB, {*x, *mean}, out + "/centred", [](OpDef&) {});
      if (d.ok()) d = Emit(MUL, {*d, *d}, out + "/squares", [](OpDef&) {});
      if (d.ok()) d = ReduceAxes("ReduceMean", *d, axes, true, out + "/variance");
      if (d.ok()) d = Emit(ADD, {*d, NewWeight(out + "/epsilon", {1}, {eps})}, out + "/variance_eps", [](OpDef&) {});
      if (d.ok()) d = Emit(SQRT, {*d}, out + "/std_dev", [](OpDef&) {});
      if (d.ok()) d = Emit(DIV, {NewWeight(out + "/one", {1}, {1.0f}), *d}, out + "/inv_std_dev", [](OpDef&) {});
      if (!d.ok()) return d.status();
      alias_[n.output(2)] = *d;
    }
  }
  return absl::OkStatus();
}

// BatchNormalization (inference): folded into the Conv it alone follows, else a per-channel MUL and ADD.
absl::Status Importer::BatchNorm(const onnx::NodeProto& n, Attrs& a) {
  if (a.Int("training_mode", 0) != 0) return Refuse("training_mode 1 (inference only)");
  for (int k = 1; k < n.output_size(); ++k) {
    if (!n.output(k).empty()) return Refuse("the running mean / variance outputs (training)");
  }
  const float eps = a.Float("epsilon", 1e-5f);
  a.Float("momentum", 0.9f);
  if (a.Int("spatial", 1) != 1) return Refuse("spatial 0 (per-element statistics)");
  const Constant* p[4];
  for (int k = 0; k < 4; ++k) {
    p[k] = ConstantOf(n.input(k + 1));
    if (p[k] == nullptr || p[k]->is_int) return Refuse("scale, B, mean and var must be float initializers");
  }
  absl::StatusOr<std::string> x = Activation(n.input(0), "input X");
  if (!x.ok()) return x.status();
  const Shape shape = Shapes(*x);
  if (shape.size() < 2) return Refuse("input of rank < 2");
  const int64_t c = shape[1];
  for (int k = 0; k < 4; ++k) {
    if (Elements(p[k]->shape) != c) return Refuse(absl::StrCat("parameters of ", Elements(p[k]->shape), " for ", c, " channels"));
  }
  std::vector<float> mul(c), add(c);
  for (int64_t i = 0; i < c; ++i) {
    mul[i] = p[0]->f[i] / std::sqrt(p[3]->f[i] + eps);
    add[i] = p[1]->f[i] - p[2]->f[i] * mul[i];
  }
  const std::string out = n.output(0);
  auto conv = conv_of_.find(n.input(0));
  if (conv != conv_of_.end() && uses_[n.input(0)] == 1) {  // fold: w[o] *= mul[o], b[o] = b[o] * mul[o] + add[o]
    HostTensor& w = weights_.at(conv->second->inputs(1));
    HostTensor& b = weights_.at(conv->second->inputs(2));
    const int64_t per = w.size() / c;
    for (int64_t o = 0; o < c; ++o) {
      for (int64_t j = 0; j < per; ++j) w.f32[o * per + j] *= mul[o];
      b.f32[o] = b.f32[o] * mul[o] + add[o];
    }
    alias_[out] = *x;
    return absl::OkStatus();
  }
  Shape pshape(shape.size() - 1, 1);
  pshape[0] = c;
  absl::StatusOr<std::string> y = Emit(MUL, {*x, NewWeight(out + "/bn_scale", pshape, mul)}, out + "/scaled",
                                       [](OpDef&) {});
  if (!y.ok()) return y.status();
  y = Emit(ADD, {*y, NewWeight(out + "/bn_shift", pshape, add)}, out, [](OpDef&) {});
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

}  // namespace loom::graph::onnx_internal
