#include "graph/nn_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::graph {
namespace {

std::string Str(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }
int64_t Elements(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>()); }
absl::Status Bad(const std::string& why) { return absl::InvalidArgumentError(why); }

// Row-major strides of `s`.
Shape Strides(const Shape& s) {
  Shape st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

absl::StatusOr<int> Axis(int axis, size_t rank) {
  const int r = static_cast<int>(rank);
  if (axis < -r || axis >= r) return Bad(absl::StrCat("axis ", axis, " outside a tensor of rank ", r));
  return axis < 0 ? axis + r : axis;
}

int Positive(int v) { return v <= 0 ? 1 : v; }

struct ConvGeometry {
  int64_t n, h, w, c, oc, kh, kw, groups, sh, sw, pt, pl, pb, pr, dh, dw, oh, ow;
};
absl::StatusOr<ConvGeometry> Conv(const Conv2dAttrs& a, const Shape& x, const Shape& w) {
  if (x.size() != 4 || w.size() != 4) return Bad("needs x [N,H,W,C] and w [OC,KH,KW,C/groups]");
  ConvGeometry g{};
  g.n = x[0], g.h = x[1], g.w = x[2], g.c = x[3], g.oc = w[0], g.kh = w[1], g.kw = w[2];
  g.groups = Positive(a.groups()), g.sh = a.stride_h(), g.sw = a.stride_w(), g.pt = a.pad_h(), g.pl = a.pad_w();
  g.pb = a.has_pad_bottom() ? a.pad_bottom() : a.pad_h();
  g.pr = a.has_pad_right() ? a.pad_right() : a.pad_w();
  g.dh = Positive(a.dilation_h()), g.dw = Positive(a.dilation_w());
  if (g.sh < 1 || g.sw < 1 || g.pt < 0 || g.pl < 0 || g.pb < 0 || g.pr < 0) return Bad("bad stride or padding");
  if (g.c % g.groups != 0 || g.oc % g.groups != 0 || w[3] * g.groups != g.c) {
    return Bad(absl::StrCat(g.groups, " groups: x has ", g.c, " channels, w ", Str(w), " needs C/groups = ", w[3]));
  }
  g.oh = (g.h + g.pt + g.pb - ((g.kh - 1) * g.dh + 1)) / g.sh + 1;
  g.ow = (g.w + g.pl + g.pr - ((g.kw - 1) * g.dw + 1)) / g.sw + 1;
  if (g.oh < 1 || g.ow < 1) return Bad("kernel larger than the padded input");
  return g;
}

struct PoolGeometry {
  int64_t n, h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, oh, ow;
};
int64_t PoolOut(int64_t in, int64_t pads, int64_t k, int64_t s, bool ceil_mode) {
  const int64_t span = in + pads - k;
  return (ceil_mode ? (span + s - 1) / s : span / s) + 1;
}
absl::StatusOr<PoolGeometry> Pool(const PoolAttrs& a, const Shape& x) {
  if (x.size() != 4) return Bad("needs x [N,H,W,C]");
  PoolGeometry g{};
  g.n = x[0], g.h = x[1], g.w = x[2], g.c = x[3], g.kh = a.kernel_h(), g.kw = a.kernel_w();
  g.sh = Positive(a.stride_h()), g.sw = Positive(a.stride_w()), g.pt = a.pad_top(), g.pl = a.pad_left();
  g.pb = a.pad_bottom(), g.pr = a.pad_right(), g.dh = Positive(a.dilation_h()), g.dw = Positive(a.dilation_w());
  if (g.kh < 1 || g.kw < 1 || g.pt < 0 || g.pl < 0 || g.pb < 0 || g.pr < 0) return Bad("bad kernel or padding");
  g.oh = PoolOut(g.h, g.pt + g.pb, (g.kh - 1) * g.dh + 1, g.sh, a.ceil_mode());
  g.ow = PoolOut(g.w, g.pl + g.pr, (g.kw - 1) * g.dw + 1, g.sw, a.ceil_mode());
  if (a.ceil_mode()) {  // a last window must start inside the input or its leading padding
    if ((g.oh - 1) * g.sh >= g.h + g.pt) --g.oh;
    if ((g.ow - 1) * g.sw >= g.w + g.pl) --g.ow;
  }
  if (g.oh < 1 || g.ow < 1) return Bad("kernel larger than the padded input");
  return g;
}

// numpy matmul shapes: a [..., M, K] (or [K]), b [..., K, N] (or [K]).
struct MatmulGeometry {
  Shape batch, a_batch, b_batch;
  int64_t m, k, n;
  bool a_vector, b_vector;
};
absl::StatusOr<MatmulGeometry> Matmul(const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) return Bad("matmul of a scalar");
  MatmulGeometry g{};
  g.a_vector = a.size() == 1, g.b_vector = b.size() == 1;
  const Shape a2 = g.a_vector ? Shape{1, a[0]} : a, b2 = g.b_vector ? Shape{b[0], 1} : b;
  g.m = a2[a2.size() - 2], g.k = a2.back(), g.n = b2.back();
  if (b2[b2.size() - 2] != g.k) return Bad(absl::StrCat("matmul of ", Str(a), " and ", Str(b), ": inner dims differ"));
  g.a_batch = Shape(a2.begin(), a2.end() - 2), g.b_batch = Shape(b2.begin(), b2.end() - 2);
  absl::StatusOr<Shape> batch = BroadcastShapes(g.a_batch, g.b_batch);
  if (!batch.ok()) return batch.status();
  g.batch = *batch;
  return g;
}

// The flat index into a tensor of shape `in` (right-aligned, broadcast dims of size 1) of output index `out`.
int64_t BroadcastIndex(const Shape& out_shape, const Shape& out_strides, const Shape& in, const Shape& in_strides,
                       int64_t flat) {
  int64_t index = 0;
  const size_t offset = out_shape.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t coord = (flat / out_strides[d + offset]) % out_shape[d + offset];
    if (in[d] != 1) index += coord * in_strides[d];
  }
  return index;
}

std::vector<float> Floats(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.size()));
  for (int64_t i = 0; i < t.size(); ++i) v[i] = t.Get(i);
  return v;
}

}  // namespace

bool IsUnaryElementwise(OpType type) {
  return type == RELU || type == SIGMOID || type == GELU || type == ERF || type == TANH || type == EXP || type == SQRT ||
         type == LOG || type == HARD_SIGMOID || type == HARD_SWISH || type == RELU6;
}

bool IsBinaryElementwise(OpType type) {
  return type == ADD || type == MUL || type == SUB || type == DIV || type == MAXIMUM || type == MINIMUM ||
         type == GREATER || type == LESS || type == EQUAL || type == GREATER_EQUAL || type == LESS_EQUAL || type == KEEP;
}

bool IsNnOp(OpType type) {
  switch (type) {
    case CONV2D: case RELU: case SIGMOID: case GELU: case ADD: case MUL: case MATMUL: case SOFTMAX:
    case TRANSPOSE: case RESHAPE: case CONCAT: case MAX_POOL: case AVG_POOL: case GLOBAL_AVG_POOL: case SUB:
    case DIV: case ERF: case TANH: case EXP: case SQRT: case MAXIMUM: case MINIMUM: case SLICE: case EXPAND: case PAD:
    case LOG: case GREATER: case LESS: case EQUAL: case GREATER_EQUAL: case LESS_EQUAL: case KEEP:
    case HARD_SIGMOID: case HARD_SWISH: case RELU6:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1) return Bad(absl::StrCat("shapes ", Str(a), " and ", Str(b), " do not broadcast"));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

absl::StatusOr<Shape> InferNnShape(const OpDef& op, const std::vector<Shape>& in, const Shape& declared) {
  auto arity = [&](size_t lo, size_t hi) -> absl::Status {
    if (in.size() < lo || in.size() > hi) return Bad(absl::StrCat("takes ", lo, "-", hi, " inputs, has ", in.size()));
    return absl::OkStatus();
  };
  const OpType type = op.type();
  if (IsUnaryElementwise(type)) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    return in[0];
  }
  if (IsBinaryElementwise(type)) {
    if (absl::Status s = arity(2, 2); !s.ok()) return s;
    return BroadcastShapes(in[0], in[1]);
  }
  if (type == MATMUL) {
    if (absl::Status s = arity(2, 2); !s.ok()) return s;
    absl::StatusOr<MatmulGeometry> g = Matmul(in[0], in[1]);
    if (!g.ok()) return g.status();
    Shape out = g->batch;
    if (!g->a_vector) out.push_back(g->m);
    if (!g->b_vector) out.push_back(g->n);
    return out;
  }
  if (type == SOFTMAX) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    absl::StatusOr<int> axis = Axis(op.axis().axis(), in[0].size());
    if (!axis.ok()) return axis.status();
    return in[0];
  }
  if (type == TRANSPOSE) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    std::vector<int> perm(op.transpose().perm().begin(), op.transpose().perm().end());
    if (perm.size() != in[0].size()) {
      return Bad(absl::StrCat("perm of ", perm.size(), " dims for a tensor of rank ", in[0].size()));
    }
    std::vector<bool> seen(perm.size(), false);
    Shape out;
    for (int p : perm) {
      if (p < 0 || p >= static_cast<int>(perm.size()) || seen[p]) return Bad("perm is not a permutation");
      seen[p] = true;
      out.push_back(in[0][p]);
    }
    return out;
  }
  if (type == PAD) {
    if (absl::Status s = arity(2, 2); !s.ok()) return s;
    const auto& begin = op.pad().begin();
    if (Elements(in[1]) != 1) return Bad(absl::StrCat("the padding value is ", Str(in[1]), ", not one element"));
    if (begin.size() != static_cast<int>(in[0].size()) || declared.size() != in[0].size()) {
      return Bad(absl::StrCat("begin and the output must have the input's rank ", in[0].size()));
    }
    const auto& interior = op.pad().interior();
    if (!interior.empty() && interior.size() != begin.size()) return Bad("interior must have the input's rank");
    for (size_t d = 0; d < in[0].size(); ++d) {
      const int64_t step = interior.empty() ? 1 : interior[d];
      if (step < 1 || begin[d] < 0 || declared[d] < begin[d] + (in[0][d] - 1) * step + 1) {
        return Bad(absl::StrCat("axis ", d, ": ", in[0][d], " elements from ", begin[d], " by ", step,
                                " do not lie in ", declared[d]));
      }
    }
    return declared;
  }
  if (type == EXPAND) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    absl::StatusOr<Shape> out = BroadcastShapes(in[0], declared);
    if (!out.ok()) return out.status();
    if (*out != declared) return Bad(absl::StrCat(Str(in[0]), " does not broadcast to ", Str(declared)));
    return declared;
  }
  if (type == SLICE) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    const auto& starts = op.slice().starts();
    const auto& steps = op.slice().steps();
    if (starts.size() != static_cast<int>(in[0].size()) || steps.size() != starts.size() ||
        declared.size() != in[0].size()) {
      return Bad(absl::StrCat("starts, steps and the output must have the input's rank ", in[0].size()));
    }
    for (size_t d = 0; d < in[0].size(); ++d) {
      if (starts[d] < 0 || steps[d] < 1 || declared[d] < 1 || starts[d] + (declared[d] - 1) * steps[d] >= in[0][d]) {
        return Bad(absl::StrCat("axis ", d, ": ", declared[d], " elements from ", starts[d], " by ", steps[d],
                                " do not lie in ", in[0][d]));
      }
    }
    return declared;
  }
  if (type == RESHAPE) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    if (Elements(declared) != Elements(in[0])) {
      return Bad(absl::StrCat("cannot reshape ", Str(in[0]), " to ", Str(declared)));
    }
    return declared;
  }
  if (type == CONCAT) {
    if (in.empty()) return Bad("takes at least one input");
    absl::StatusOr<int> axis = Axis(op.axis().axis(), in[0].size());
    if (!axis.ok()) return axis.status();
    Shape out = in[0];
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i].size() != out.size()) return Bad("inputs of different ranks");
      for (size_t d = 0; d < out.size(); ++d) {
        if (static_cast<int>(d) != *axis && in[i][d] != out[d]) {
          return Bad(absl::StrCat("input ", i, " ", Str(in[i]), " differs from ", Str(in[0]), " off the axis"));
        }
      }
      out[*axis] += in[i][*axis];
    }
    return out;
  }
  if (type == CONV2D) {
    if (absl::Status s = arity(2, 3); !s.ok()) return s;
    absl::StatusOr<ConvGeometry> g = Conv(op.conv2d(), in[0], in[1]);
    if (!g.ok()) return g.status();
    if (in.size() == 3 && in[2] != Shape{g->oc}) return Bad(absl::StrCat("bias ", Str(in[2]), " needs [", g->oc, "]"));
    return Shape{g->n, g->oh, g->ow, g->oc};
  }
  if (type == MAX_POOL || type == AVG_POOL) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    absl::StatusOr<PoolGeometry> g = Pool(op.pool(), in[0]);
    if (!g.ok()) return g.status();
    return Shape{g->n, g->oh, g->ow, g->c};
  }
  if (type == GLOBAL_AVG_POOL) {
    if (absl::Status s = arity(1, 1); !s.ok()) return s;
    if (in[0].size() != 4) return Bad("needs x [N,H,W,C]");
    return Shape{in[0][0], 1, 1, in[0][3]};
  }
  return Bad(absl::StrCat(OpType_Name(type), " is not a tensor op of nn_ops"));
}

absl::Status EvalNnOp(const OpDef& op, const std::vector<const HostTensor*>& inputs, HostTensor* out) {
  std::vector<Shape> shapes;
  for (const HostTensor* t : inputs) shapes.push_back(t->shape);
  absl::StatusOr<Shape> shape = InferNnShape(op, shapes, out->shape);
  if (!shape.ok()) return shape.status();
  if (*shape != out->shape) return Bad(absl::StrCat("output ", Str(out->shape), ", the op makes ", Str(*shape)));
  std::vector<float>& y = out->f32;
  const std::vector<float> x = Floats(*inputs[0]);
  switch (op.type()) {
    case RELU:
      for (size_t i = 0; i < y.size(); ++i) y[i] = std::max(x[i], 0.0f);
      return absl::OkStatus();
    case SIGMOID:
      for (size_t i = 0; i < y.size(); ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
      return absl::OkStatus();
    case ERF:
      for (size_t i = 0; i < y.size(); ++i) y[i] = std::erf(x[i]);
      return absl::OkStatus();
    case TANH:
      for (size_t i = 0; i < y.size(); ++i) y[i] = std::tanh(x[i]);
      return absl::OkStatus();
    case EXP:
      for (size_t i = 0; i < y.size(); ++i) y[i] = std::exp(x[i]);
      return absl::OkStatus();
    case SQRT:
      for (size_t i = 0; i < y.size(); ++i) y[i] = std::sqrt(x[i]);
      return absl::OkStatus();
    case LOG:
      for (size_t i = 0; i < y.size(); ++i) y[i] = std::log(x[i]);
      return absl::OkStatus();
    case HARD_SIGMOID:
    case HARD_SWISH:
      for (size_t i = 0; i < y.size(); ++i) {
        float h = std::fma(x[i], 1.0f / 6.0f, 0.5f);  // (a fused multiply-add here as on the device: the same bits)
        h = h > 1.0f ? 1.0f : h;                     // (comparisons false for NaN: a NaN stays NaN)
        h = h < 0.0f ? 0.0f : h;
        y[i] = op.type() == HARD_SWISH ? x[i] * h : h;
      }
      return absl::OkStatus();
    case RELU6:
      for (size_t i = 0; i < y.size(); ++i) {
        const float h = x[i] < 0.0f ? 0.0f : x[i];  // (as MAXIMUM(x, 0) then MINIMUM(., 6): -0 and NaN kept)
        y[i] = h > 6.0f ? 6.0f : h;
      }
      return absl::OkStatus();
    case GELU:
      for (size_t i = 0; i < y.size(); ++i) {
        const float v = x[i];
        y[i] = op.gelu().tanh()
                   ? 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                   : 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
      }
      return absl::OkStatus();
    case ADD:
    case MUL:
    case SUB:
    case DIV:
    case MAXIMUM:
    case MINIMUM:
    case GREATER:
    case LESS:
    case EQUAL:
    case GREATER_EQUAL:
    case LESS_EQUAL:
    case KEEP: {
      const std::vector<float> b = Floats(*inputs[1]);
      const bool same = shapes[0] == out->shape && shapes[1] == out->shape;  // the decode graphs' residual adds
      const Shape os = Strides(out->shape), as = Strides(shapes[0]), bs = Strides(shapes[1]);
      for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
        const float va = same ? x[i] : x[BroadcastIndex(out->shape, os, shapes[0], as, i)];
        const float vb = same ? b[i] : b[BroadcastIndex(out->shape, os, shapes[1], bs, i)];
        switch (op.type()) {
          case ADD: y[i] = va + vb; break;
          case MUL: y[i] = va * vb; break;
          case SUB: y[i] = va - vb; break;
          // NaN in either operand is the result (numpy's); the device's isa::EwApply writes them the same way.
          case MAXIMUM: y[i] = va < vb || vb != vb ? vb : va; break;
          case MINIMUM: y[i] = va > vb || vb != vb ? vb : va; break;
          case GREATER: y[i] = va > vb ? 1.0f : 0.0f; break;
          case LESS: y[i] = va < vb ? 1.0f : 0.0f; break;
          case EQUAL: y[i] = va == vb ? 1.0f : 0.0f; break;
          case GREATER_EQUAL: y[i] = va >= vb ? 1.0f : 0.0f; break;
          case LESS_EQUAL: y[i] = va <= vb ? 1.0f : 0.0f; break;
          case KEEP: y[i] = vb != 0.0f ? va : 0.0f; break;
          default: y[i] = va / vb; break;
        }
      }
      return absl::OkStatus();
    }
    case MATMUL: {
      const MatmulGeometry g = *Matmul(shapes[0], shapes[1]);
      const std::vector<float> b = Floats(*inputs[1]);
      const Shape bst = Strides(g.batch), abs = Strides(g.a_batch), bbs = Strides(g.b_batch);
      const int64_t batches = Elements(g.batch);
      for (int64_t q = 0; q < batches; ++q) {
        const float* pa = x.data() + BroadcastIndex(g.batch, bst, g.a_batch, abs, q) * g.m * g.k;
        const float* pb = b.data() + BroadcastIndex(g.batch, bst, g.b_batch, bbs, q) * g.k * g.n;
        float* py = y.data() + q * g.m * g.n;
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < g.n; ++j) {
            float acc = 0.0f;
            for (int64_t k = 0; k < g.k; ++k) acc += pa[i * g.k + k] * pb[k * g.n + j];
            py[i * g.n + j] = acc;
          }
      }
      return absl::OkStatus();
    }
    case SOFTMAX: {
      const int axis = *Axis(op.axis().axis(), shapes[0].size());
      const int64_t len = shapes[0][axis], inner = Strides(shapes[0])[axis];
      const int64_t outer = Elements(shapes[0]) / (len * inner);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t in = 0; in < inner; ++in) {
          const int64_t base = o * len * inner + in;
          float m = -INFINITY, sum = 0.0f;
          for (int64_t i = 0; i < len; ++i) m = std::max(m, x[base + i * inner]);
          for (int64_t i = 0; i < len; ++i) sum += (y[base + i * inner] = std::exp(x[base + i * inner] - m));
          for (int64_t i = 0; i < len; ++i) y[base + i * inner] /= sum;
        }
      return absl::OkStatus();
    }
    case TRANSPOSE: {
      const Shape is = Strides(shapes[0]), os = Strides(out->shape);
      const auto& perm = op.transpose().perm();
      for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
        int64_t src = 0;
        for (size_t d = 0; d < out->shape.size(); ++d) src += ((i / os[d]) % out->shape[d]) * is[perm[d]];
        y[i] = x[src];
      }
      return absl::OkStatus();
    }
    case RESHAPE:
      std::copy(x.begin(), x.end(), y.begin());
      return absl::OkStatus();
    case PAD: {
      std::fill(y.begin(), y.end(), Floats(*inputs[1])[0]);
      const Shape os = Strides(out->shape), is = Strides(shapes[0]);
      for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
        int64_t at = 0;
        for (size_t d = 0; d < shapes[0].size(); ++d) {
          const int64_t step = op.pad().interior().empty() ? 1 : op.pad().interior(d);
          at += ((i / is[d]) % shapes[0][d] * step + op.pad().begin(d)) * os[d];
        }
        y[at] = x[i];
      }
      return absl::OkStatus();
    }
    case EXPAND: {
      const Shape os = Strides(out->shape), is = Strides(shapes[0]);
      for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) y[i] = x[BroadcastIndex(out->shape, os, shapes[0], is, i)];
      return absl::OkStatus();
    }
    case SLICE: {
      const Shape is = Strides(shapes[0]), os = Strides(out->shape);
      for (int64_t i = 0; i < static_cast<int64_t>(y.size()); ++i) {
        int64_t src = 0;
        for (size_t d = 0; d < out->shape.size(); ++d) {
          src += (op.slice().starts(d) + (i / os[d]) % out->shape[d] * op.slice().steps(d)) * is[d];
        }
        y[i] = x[src];
      }
      return absl::OkStatus();
    }
    case CONCAT: {
      const int axis = *Axis(op.axis().axis(), out->shape.size());
      const int64_t inner = Strides(out->shape)[axis], outer = Elements(out->shape) / (out->shape[axis] * inner);
      int64_t at = 0;
      for (size_t t = 0; t < inputs.size(); ++t) {
        const std::vector<float> v = t == 0 ? x : Floats(*inputs[t]);
        const int64_t chunk = shapes[t][axis] * inner;
        for (int64_t o = 0; o < outer; ++o) {
          std::copy(v.begin() + o * chunk, v.begin() + (o + 1) * chunk, y.begin() + o * out->shape[axis] * inner + at);
        }
        at += chunk;
      }
      return absl::OkStatus();
    }
    case CONV2D: {
      const ConvGeometry g = *Conv(op.conv2d(), shapes[0], shapes[1]);
      const std::vector<float> w = Floats(*inputs[1]);
      const std::vector<float> bias = inputs.size() == 3 ? Floats(*inputs[2]) : std::vector<float>(g.oc, 0.0f);
      const int64_t cg = g.c / g.groups, og = g.oc / g.groups;
      for (int64_t b = 0; b < g.n; ++b)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          for (int64_t ox = 0; ox < g.ow; ++ox)
            for (int64_t o = 0; o < g.oc; ++o) {
              const int64_t c0 = (o / og) * cg;
              float acc = bias[o];
              for (int64_t ky = 0; ky < g.kh; ++ky) {
                const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
                if (iy < 0 || iy >= g.h) continue;
                for (int64_t kx = 0; kx < g.kw; ++kx) {
                  const int64_t ix = ox * g.sw - g.pl + kx * g.dw;
                  if (ix < 0 || ix >= g.w) continue;
                  const float* px = x.data() + ((b * g.h + iy) * g.w + ix) * g.c + c0;
                  const float* pw = w.data() + ((o * g.kh + ky) * g.kw + kx) * cg;
                  for (int64_t ci = 0; ci < cg; ++ci) acc += px[ci] * pw[ci];
                }
              }
              y[((b * g.oh + oy) * g.ow + ox) * g.oc + o] = acc;
            }
      return absl::OkStatus();
    }
    case MAX_POOL:
    case AVG_POOL: {
      const PoolGeometry g = *Pool(op.pool(), shapes[0]);
      const bool max = op.type() == MAX_POOL;
      for (int64_t b = 0; b < g.n; ++b)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          for (int64_t ox = 0; ox < g.ow; ++ox)
            for (int64_t c = 0; c < g.c; ++c) {
              float acc = max ? -INFINITY : 0.0f;
              int64_t count = 0, padded = 0;
              for (int64_t ky = 0; ky < g.kh; ++ky) {
                const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
                for (int64_t kx = 0; kx < g.kw; ++kx) {
                  const int64_t ix = ox * g.sw - g.pl + kx * g.dw;
                  // Positions in the explicit padding count for count_include_pad; past it (ceil_mode) never.
                  if (iy >= -g.pt && iy < g.h + g.pb && ix >= -g.pl && ix < g.w + g.pr) ++padded;
                  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                  const float v = x[((b * g.h + iy) * g.w + ix) * g.c + c];
                  acc = max ? std::max(acc, v) : acc + v;
                  ++count;
                }
              }
              if (!max) acc /= static_cast<float>(op.pool().count_include_pad() ? padded : std::max<int64_t>(count, 1));
              y[((b * g.oh + oy) * g.ow + ox) * g.c + c] = acc;
            }
      return absl::OkStatus();
    }
    case GLOBAL_AVG_POOL: {
      const int64_t n = shapes[0][0], hw = shapes[0][1] * shapes[0][2], c = shapes[0][3];
      for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < c; ++ch) {
          float acc = 0.0f;
          for (int64_t p = 0; p < hw; ++p) acc += x[(b * hw + p) * c + ch];
          y[b * c + ch] = acc / static_cast<float>(hw);
        }
      return absl::OkStatus();
    }
    default:
      return Bad(absl::StrCat(OpType_Name(op.type()), " is not a tensor op of nn_ops"));
  }
}

}  // namespace loom::graph
