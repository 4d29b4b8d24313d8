// The ONNX ops that are compositions of the IR's element-wise ops: Gelu; Clip, HardSigmoid, HardSwish, Max, Min,
// LeakyRelu, PRelu and Abs (maxima and minima); Elu, Selu, Celu, Softplus, Softsign and Mish (exponentials);
// comparisons, logic and Where on activations.
#include <cmath>
#include <map>
#include <optional>

#include "graph/onnx_importer.h"

namespace loom::graph::onnx_internal {

// Gelu (opset 20): the IR's GELU, the erf form (approximate "none") or the tanh approximation ("tanh").
absl::Status Importer::Gelu(const onnx::NodeProto& n, Attrs& a) {
  const std::string approximate = a.String("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return Refuse(absl::StrCat("approximate '", approximate, "' (the spec's are 'none' and 'tanh')"));
  }
  absl::StatusOr<std::string> x = Activation(n.input(0), "input X");
  if (!x.ok()) return x.status();
  const std::string out = n.output(0);
  absl::StatusOr<std::string> y =
      Emit(GELU, {*x}, out, [&](OpDef& op) { op.mutable_gelu()->set_tanh(approximate == "tanh"); });
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// The ops of maxima and minima, as MAXIMUM / MINIMUM (NaN propagating, numpy's) of the IR, in the spec's order:
// Clip, max(x, min) then min(., max) (np.clip: where min > max, max; constant bounds 0 and 6 are the IR's RELU6, one
// pass, the same values), its bounds attributes before opset 11 and optional inputs from it (constants or tensors);
// HardSigmoid, max(0, min(1, alpha * x + beta)); HardSwish, x times that with alpha 1/6 and beta 1/2 (with torch's
// alpha 1/6 and beta 1/2 both are one IR op, HARD_SIGMOID / HARD_SWISH, alpha * x + beta one fused multiply-add);
// Max and Min of any number of inputs, left to right; LeakyRelu and PRelu, max(x, 0) + slope * min(x, 0) (each x
// once a term, the other term a zero: the slope's product for x < 0, x for x >= 0, but that -0 becomes +0); Abs,
// max(x, -x).
absl::Status Importer::Clamp(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  const std::string out = n.output(0);
  auto scalar = [&](const std::string& name, float v) { return NewWeight(out + "/" + name, {1}, {v}); };
  auto emit = [&](OpType type, const std::string& lhs, const std::string& rhs, const std::string& name) {
    return Emit(type, {lhs, rhs}, name.empty() ? out : out + "/" + name, [](OpDef&) {});
  };
  absl::StatusOr<std::string> y;
  if (t == "Max" || t == "Min") {
    if (n.input_size() < 1) return Refuse("no inputs");
    y = Activation(n.input(0), "input 0");
    for (int k = 1; k < n.input_size() && y.ok(); ++k) {
      absl::StatusOr<std::string> b = Activation(n.input(k), absl::StrCat("input ", k));
      if (!b.ok()) return b.status();
      y = emit(t == "Max" ? MAXIMUM : MINIMUM, *y, *b, k + 1 == n.input_size() ? "" : absl::StrCat("partial", k));
    }
    if (y.ok() && n.input_size() == 1) y = Reshape(*y, Shapes(*y), out);
  } else if (t == "Clip") {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    // Constant bounds 0 and 6 (torch's ReLU6, MobileNet-v2's activation): one pass, the IR's RELU6.
    auto constant = [&](int k, float v) {
      const Constant* c = n.input_size() > k && !n.input(k).empty() ? ConstantOf(n.input(k)) : nullptr;
      return c != nullptr && !c->is_int && c->f.size() == 1 && c->f[0] == v;
    };
    if (opset_ >= 11 && constant(1, 0.0f) && constant(2, 6.0f)) {
      y = Emit(RELU6, {*x}, out, [](OpDef&) {});
      if (!y.ok()) return y.status();
      alias_[out] = *y;
      return absl::OkStatus();
    }
    // The bounds: attributes before opset 11 (absent: no bound), optional inputs from it ("" or missing: none).
    std::optional<std::string> lo, hi;
    if (opset_ < 11) {
      if (const onnx::AttributeProto* m = a.Get("min")) lo = scalar("min", m->f());
      if (const onnx::AttributeProto* m = a.Get("max")) hi = scalar("max", m->f());
    } else {
      for (int k = 1; k <= 2; ++k) {
        if (n.input_size() <= k || n.input(k).empty()) continue;
        absl::StatusOr<std::string> b = Activation(n.input(k), k == 1 ? "input min" : "input max");
        if (!b.ok()) return b.status();
        if (Elements(Shapes(*b)) != 1) return Refuse(absl::StrCat(k == 1 ? "min" : "max", " is not a scalar"));
        (k == 1 ? lo : hi) = *b;
      }
    }
    y = *x;
    if (lo) y = emit(MAXIMUM, *y, *lo, hi ? "low" : "");
    if (y.ok() && hi) y = emit(MINIMUM, *y, *hi, "");
    if (y.ok() && !lo && !hi) y = Reshape(*y, Shapes(*y), out);
  } else if (t == "LeakyRelu" || t == "PRelu" || t == "Abs") {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input X");
    if (!x.ok()) return x.status();
    if (t == "Abs") {
      absl::StatusOr<std::string> negated = emit(MUL, *x, scalar("minus_one", -1.0f), "negated");
      y = negated.ok() ? emit(MAXIMUM, *x, *negated, "") : negated;
    } else {
      absl::StatusOr<std::string> slope =
          t == "LeakyRelu" ? absl::StatusOr<std::string>(scalar("alpha", a.Float("alpha", 0.01f)))
                           : Activation(n.input(1), "input slope");
      if (!slope.ok()) return slope.status();
      // Before opset 7 a PRelu's 1-D slope of C elements is per channel (axis 1); from 7 it broadcasts as numpy's.
      const Shape xs = Shapes(*x), ss = Shapes(*slope);
      if (t == "PRelu" && opset_ < 7 && ss.size() == 1 && xs.size() >= 2 && ss[0] == xs[1] && ss[0] > 1) {
        Shape per_channel(xs.size() - 1, 1);
        per_channel[0] = ss[0];
        slope = Reshape(*slope, per_channel, out + "/per_channel");
        if (!slope.ok()) return slope.status();
      }
      absl::StatusOr<std::string> positive = emit(MAXIMUM, *x, scalar("zero", 0.0f), "positive");
      absl::StatusOr<std::string> negative = emit(MINIMUM, *x, scalar("zero_", 0.0f), "negative");
      if (!positive.ok() || !negative.ok()) return !positive.ok() ? positive.status() : negative.status();
      absl::StatusOr<std::string> scaled = emit(MUL, *slope, *negative, "scaled");
      y = scaled.ok() ? emit(ADD, *positive, *scaled, "") : scaled;
    }
  } else {  // HardSigmoid, HardSwish
    const bool swish = t == "HardSwish";
    const float alpha = swish ? 1.0f / 6.0f : a.Float("alpha", 0.2f), beta = swish ? 0.5f : a.Float("beta", 0.5f);
    absl::StatusOr<std::string> x = Activation(n.input(0), "input X");
    if (!x.ok()) return x.status();
    if (alpha == 1.0f / 6.0f && beta == 0.5f) {  // torch's: one pass (graph HARD_SIGMOID / HARD_SWISH)
      y = Emit(swish ? HARD_SWISH : HARD_SIGMOID, {*x}, out, [](OpDef&) {});
      if (!y.ok()) return y.status();
      alias_[out] = *y;
      return absl::OkStatus();
    }
    y = emit(MUL, scalar("alpha", alpha), *x, "scaled");
    if (y.ok()) y = emit(ADD, *y, scalar("beta", beta), "shifted");
    if (y.ok()) y = emit(MINIMUM, scalar("one", 1.0f), *y, "below_one");
    if (y.ok()) y = emit(MAXIMUM, scalar("zero", 0.0f), *y, swish ? "hard_sigmoid" : "");
    if (y.ok() && swish) y = emit(MUL, *x, *y, "");
  }
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// The exponential activations, in the IR's element-wise ops:
// - Elu(alpha), Celu(alpha) and Selu(alpha, gamma): max(x, 0) + min(alpha * (exp(x / s) - 1), 0) (s = alpha for Celu,
//   else 1), times gamma for Selu: for x < 0 the second term alone, as the spec writes it, for x >= 0 x plus a zero
//   (a positive exponential's term is clipped to 0; -0 becomes +0). Elu and Selu need alpha > 0 for that (the
//   term's sign); Celu divides by it. Other alphas are refused naming them.
// - Softplus: max(x, 0) + log(1 + exp(-|x|)), ln(exp(x) + 1) without its overflow past x = 88 (onnxruntime's form).
// - Softsign: x / (1 + |x|). Mish: x * tanh(softplus(x)).
absl::Status Importer::Exponential(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  const std::string out = n.output(0);
  auto scalar = [&](const std::string& name, float v) { return NewWeight(out + "/" + name, {1}, {v}); };
  auto emit = [&](OpType type, const std::vector<std::string>& in, const std::string& name) {
    return Emit(type, in, name.empty() ? out : out + "/" + name, [](OpDef&) {});
  };
  absl::StatusOr<std::string> x = Activation(n.input(0), "input X");
  if (!x.ok()) return x.status();
  absl::StatusOr<std::string> y;
  if (t == "Elu" || t == "Selu" || t == "Celu") {
    // The spec's defaults: Elu alpha 1; Selu alpha 1.67326319..., gamma 1.05070102...; Celu alpha 1.
    const float alpha = a.Float("alpha", t == "Selu" ? 1.67326319217681884765625f : 1.0f);
    const float gamma = t == "Selu" ? a.Float("gamma", 1.05070102214813232421875f) : 1.0f;
    if (!(alpha > 0)) return Refuse(absl::StrCat("alpha ", alpha, " (Loom's ", t, " needs alpha > 0)"));
    absl::StatusOr<std::string> arg = *x;
    if (t == "Celu") arg = emit(DIV, {*x, scalar("alpha_divisor", alpha)}, "scaled_input");
    absl::StatusOr<std::string> e = arg.ok() ? emit(EXP, {*arg}, "exp") : arg;
    if (e.ok()) e = emit(SUB, {*e, scalar("one", 1.0f)}, "exp_minus_one");
    if (e.ok()) e = emit(MUL, {scalar("alpha", alpha), *e}, "negative_branch");
    if (e.ok()) e = emit(MINIMUM, {*e, scalar("zero", 0.0f)}, "negative_part");
    absl::StatusOr<std::string> positive = emit(MAXIMUM, {*x, scalar("zero_", 0.0f)}, "positive_part");
    if (!e.ok() || !positive.ok()) return !e.ok() ? e.status() : positive.status();
    y = emit(ADD, {*positive, *e}, t == "Selu" ? "elu" : "");
    if (y.ok() && t == "Selu") y = emit(MUL, {scalar("gamma", gamma), *y}, "");
  } else if (t == "Softplus" || t == "Mish" || t == "Softsign") {
    absl::StatusOr<std::string> negated = emit(MUL, {*x, scalar("minus_one", -1.0f)}, "negated");
    absl::StatusOr<std::string> magnitude = negated.ok() ? emit(MAXIMUM, {*x, *negated}, "magnitude") : negated;
    if (!magnitude.ok()) return magnitude.status();
    if (t == "Softsign") {
      absl::StatusOr<std::string> d = emit(ADD, {scalar("one", 1.0f), *magnitude}, "divisor");
      y = d.ok() ? emit(DIV, {*x, *d}, "") : d;
    } else {
      absl::StatusOr<std::string> e = emit(MUL, {*magnitude, scalar("minus_one_", -1.0f)}, "minus_magnitude");
      if (e.ok()) e = emit(EXP, {*e}, "exp");
      if (e.ok()) e = emit(ADD, {scalar("one", 1.0f), *e}, "one_plus_exp");
      if (e.ok()) e = emit(LOG, {*e}, "log");
      absl::StatusOr<std::string> positive = emit(MAXIMUM, {*x, scalar("zero", 0.0f)}, "positive_part");
      if (!e.ok() || !positive.ok()) return !e.ok() ? e.status() : positive.status();
      y = emit(ADD, {*positive, *e}, t == "Mish" ? "softplus" : "");
      if (y.ok() && t == "Mish") y = emit(TANH, {*y}, "tanh");
      if (y.ok() && t == "Mish") y = emit(MUL, {*x, *y}, "");
    }
  } else {
    return Refuse("not an exponential activation");
  }
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// Comparisons and logic on activations, bools as 0 / 1 floats (on constants the importer folds them instead):
// Greater, Less, Equal, GreaterOrEqual, LessOrEqual as the IR's comparisons (a NaN compares false, as IEEE's); Not
// as x == 0; And as a product, Or as a maximum, Xor as (a == b) == 0; Where(c, x, y) as KEEP(x, c) + KEEP(y, c == 0)
// (the operand not picked never reaches the sum, NaN or infinite; a picked -0 becomes +0); ThresholdedRelu(alpha) as
// KEEP(x, x > alpha); IsNaN as (x == x) == 0 (a NaN alone is unequal to itself; scaled_dot_product_attention's
// export guards its softmax so).
absl::Status Importer::Logic(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  const std::string out = n.output(0);
  auto emit = [&](OpType type, const std::vector<std::string>& in, const std::string& name) {
    return Emit(type, in, name.empty() ? out : out + "/" + name, [](OpDef&) {});
  };
  std::vector<std::string> in;
  for (int k = 0; k < n.input_size(); ++k) {
    const Constant* c = ConstantOf(n.input(k));
    if (c != nullptr && c->is_int) {  // a bool (or integer) constant, as 0 / 1 floats: a causal mask's condition
      in.push_back(NewWeight(absl::StrCat(out, "/input", k), c->shape, std::vector<float>(c->i.begin(), c->i.end())));
      continue;
    }
    absl::StatusOr<std::string> v = Activation(n.input(k), absl::StrCat("input ", k));
    if (!v.ok()) return v.status();
    in.push_back(*v);
  }
  const size_t arity = t == "Not" || t == "ThresholdedRelu" || t == "IsNaN" ? 1 : t == "Where" ? 3 : 2;
  if (in.size() != arity) return Refuse(absl::StrCat(in.size(), " inputs (", t, " takes ", arity, ")"));
  static const auto* kCompare = new std::map<std::string, OpType>{{"Greater", GREATER},
                                                                   {"Less", LESS},
                                                                   {"Equal", EQUAL},
                                                                   {"GreaterOrEqual", GREATER_EQUAL},
                                                                   {"LessOrEqual", LESS_EQUAL},
                                                                   {"And", MUL},
                                                                   {"Or", MAXIMUM}};
  auto zero = [&] { return NewWeight(out + "/zero", {1}, {0.0f}); };  // (only the ops that compare with 0 make it)
  absl::StatusOr<std::string> y;
  if (auto c = kCompare->find(t); c != kCompare->end()) {
    y = emit(c->second, in, "");
  } else if (t == "Not") {
    y = emit(EQUAL, {in[0], zero()}, "");
  } else if (t == "IsNaN") {
    y = emit(EQUAL, {in[0], in[0]}, "ordered");
    if (y.ok()) y = emit(EQUAL, {*y, zero()}, "");
  } else if (t == "Xor") {
    y = emit(EQUAL, in, "equal");
    if (y.ok()) y = emit(EQUAL, {*y, zero()}, "");
  } else if (t == "Where") {
    absl::StatusOr<std::string> kept = emit(KEEP, {in[1], in[0]}, "picked_x");
    absl::StatusOr<std::string> other = emit(EQUAL, {in[0], zero()}, "not_condition");
    if (other.ok()) other = emit(KEEP, {in[2], *other}, "picked_y");
    if (!kept.ok() || !other.ok()) return !kept.ok() ? kept.status() : other.status();
    y = emit(ADD, {*kept, *other}, "");
  } else if (t == "ThresholdedRelu") {
    y = emit(GREATER, {in[0], NewWeight(out + "/alpha", {1}, {a.Float("alpha", 1.0f)})}, "above");
    if (y.ok()) y = emit(KEEP, {in[0], *y}, "");
  } else {
    return Refuse("not a comparison or logic op");
  }
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  if (t != "Where" && t != "ThresholdedRelu") int_valued_.insert(out);  // a bool: 0 / 1
  return absl::OkStatus();
}

}  // namespace loom::graph::onnx_internal
