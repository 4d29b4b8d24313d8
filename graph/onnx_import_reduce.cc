// The ONNX reductions (ReduceMean, ReduceSum, ReduceMax, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum,
// ReduceLogSumExp) and LogSoftmax, as global pools of the IR and element-wise ops around them.
#include <algorithm>
#include <cmath>

#include "graph/onnx_importer.h"

namespace loom::graph::onnx_internal {

// The reductions as global pools, no new op. Over every spatial axis of NCHW / NCL (what AdaptiveAvgPool2d(1) and
// AdaptiveMaxPool2d(1) export to): GlobalAveragePool or GlobalMaxPool. Over other axes (a hand-written norm's
// `x.mean(-1, keepdim=True)`, a whole tensor's `x.sum()`): the reduced axes transposed to the end where they are not
// there already, then the input viewed as NHWC [rows, 1, reduced elements, 1], one pool window per row. A sum is the
// mean times the count (one MUL: the pool averages in f32); the sums of squares and of magnitudes (max(x, -x)) are
// sums of x * x or |x|, ReduceL2 their square root, ReduceLogSum the log of the sum; ReduceLogSumExp subtracts the
// maximum first (log(sum(exp(x - m))) + m: no overflow where exp(x) alone would). Then a reshape to the kept or
// dropped axes (a rank-0 result as [1], as rank-0 inputs are). Axes: an attribute before opset 18 (ReduceSum: 13),
// then a constant input; none means all of them unless noop_with_empty_axes.
absl::Status Importer::Reduce(const onnx::NodeProto& n, Attrs& a) {
  const std::string& t = n.op_type();
  const std::string out = n.output(0);
  absl::StatusOr<std::string> x = Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const int64_t rank = static_cast<int64_t>(Shapes(*x).size());
  const int64_t axes_input_from = t == "ReduceSum" ? 13 : 18;
  absl::StatusOr<std::vector<int64_t>> axes_or = AxesOf(n, a, axes_input_from);
  if (!axes_or.ok()) return axes_or.status();
  const bool keepdims = a.Int("keepdims", 1) != 0;
  const bool noop_if_empty = opset_ >= axes_input_from && a.Int("noop_with_empty_axes", 0) != 0;
  std::vector<int64_t> axes;
  for (int64_t axis : *axes_or) {
    if (axis < -rank || axis >= rank) return Refuse(absl::StrCat("axis ", axis, " of a rank-", rank, " input"));
    axes.push_back(axis < 0 ? axis + rank : axis);
  }
  if (axes.empty()) {
    if (noop_if_empty) {  // the input itself
      alias_[out] = *x;
      return absl::OkStatus();
    }
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  absl::StatusOr<std::string> y;
  if (t == "ReduceLogSumExp") {
    absl::StatusOr<ShiftedLogSumExp> lse = LogSumExp(*x, axes, out);
    y = lse.ok() ? Emit(ADD, {lse->log_sum_exp, lse->max}, out + "/logsumexp", [](OpDef&) {}) : lse.status();
    if (y.ok() && !keepdims) y = ReduceAxes("Reshape", *y, axes, false, out);
  } else if (t == "ReduceLogSum") {
    y = ReduceAxes("ReduceSum", *x, axes, true, out + "/sum");
    if (y.ok()) y = Emit(LOG, {*y}, out + "/log", [](OpDef&) {});
    if (y.ok() && !keepdims) y = ReduceAxes("Reshape", *y, axes, false, out);
  } else {
    y = ReduceAxes(t, *x, axes, keepdims, out);
  }
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// LogSoftmax along an axis (opset 13's), or over the flattened axes [axis, rank) before it: x - m - log(sum(exp(x -
// m))) with m the maximum (log of a softmax would be -inf where the softmax underflows).
absl::Status Importer::LogSoftmax(const onnx::NodeProto& n, Attrs& a) {
  const std::string out = n.output(0);
  absl::StatusOr<std::string> x = Activation(n.input(0), "input");
  if (!x.ok()) return x.status();
  const int64_t rank = static_cast<int64_t>(Shapes(*x).size());
  int64_t axis = a.Int("axis", opset_ >= 13 ? -1 : 1);
  if (axis < -rank || axis >= rank) return Refuse(absl::StrCat("axis ", axis, " of a rank-", rank, " input"));
  if (axis < 0) axis += rank;
  std::vector<int64_t> axes = {axis};
  for (int64_t d = axis + 1; opset_ < 13 && d < rank; ++d) axes.push_back(d);
  absl::StatusOr<ShiftedLogSumExp> lse = LogSumExp(*x, axes, out);
  absl::StatusOr<std::string> y =
      lse.ok() ? Emit(SUB, {lse->shifted, lse->log_sum_exp}, out, [](OpDef&) {}) : lse.status();
  if (!y.ok()) return y.status();
  alias_[out] = *y;
  return absl::OkStatus();
}

// Over `axes` (kept as 1s): m = max(x), x - m, and log(sum(exp(x - m))): ReduceLogSumExp and LogSoftmax's shared part.
absl::StatusOr<Importer::ShiftedLogSumExp> Importer::LogSumExp(const std::string& x, const std::vector<int64_t>& axes,
                                                               const std::string& out) {
  absl::StatusOr<std::string> m = ReduceAxes("ReduceMax", x, axes, true, out + "/max");
  absl::StatusOr<std::string> d = m.ok() ? Emit(SUB, {x, *m}, out + "/shifted", [](OpDef&) {}) : m;
  absl::StatusOr<std::string> e = d.ok() ? Emit(EXP, {*d}, out + "/exp", [](OpDef&) {}) : d;
  absl::StatusOr<std::string> s = e.ok() ? ReduceAxes("ReduceSum", *e, axes, true, out + "/sum") : e;
  absl::StatusOr<std::string> l = s.ok() ? Emit(LOG, {*s}, out + "/log", [](OpDef&) {}) : s;
  if (!l.ok()) return l.status();
  return ShiftedLogSumExp{*m, *d, *l};
}

// Value `x` reduced over `axes` (in range, any order) as `kind` (ReduceMean, ReduceSum, ReduceMax, ReduceSumSquare,
// ReduceL1, ReduceL2; "Reshape": only the reshape of an already reduced keepdims value to the dropped axes).
absl::StatusOr<std::string> Importer::ReduceAxes(const std::string& kind, const std::string& x,
                                                 std::vector<int64_t> axes, bool keepdims, const std::string& out) {
  const Shape in = Shapes(x);
  const int64_t rank = static_cast<int64_t>(in.size());
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  Shape kept, dropped;
  for (int64_t d = 0; d < rank; ++d) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), d);
    kept.push_back(reduced ? 1 : in[d]);
    if (!reduced) dropped.push_back(in[d]);
  }
  if (dropped.empty()) dropped = {1};
  const Shape& shape = keepdims ? kept : dropped;
  if (kind == "Reshape") return Reshape(x, shape, out);
  std::vector<int64_t> spatial;
  for (int64_t d = 2; d < rank; ++d) spatial.push_back(d);
  const bool suffix = axes.back() == rank - 1 && axes.back() - axes.front() + 1 == static_cast<int64_t>(axes.size());
  const bool is_spatial = (rank == 3 || rank == 4) && axes == spatial;
  const bool sum = kind != "ReduceMean" && kind != "ReduceMax";  // a sum of x, x * x or |x|
  absl::StatusOr<std::string> terms = x;  // what is pooled: x, x * x or |x|
  if (kind == "ReduceSumSquare" || kind == "ReduceL2") {
    terms = Emit(MUL, {x, x}, out + "/squares", [](OpDef&) {});
  } else if (kind == "ReduceL1") {
    absl::StatusOr<std::string> minus = Emit(MUL, {x, NewWeight(out + "/minus_one", {1}, {-1.0f})}, out + "/minus",
                                             [](OpDef&) {});
    if (!minus.ok()) return minus.status();
    terms = Emit(MAXIMUM, {x, *minus}, out + "/magnitudes", [](OpDef&) {});
  }
  if (!terms.ok()) return terms.status();
  if (!is_spatial && !suffix) {  // the reduced axes moved to the end, the kept ones in their order before them
    std::vector<int> perm;
    for (int64_t d = 0; d < rank; ++d) {
      if (!std::binary_search(axes.begin(), axes.end(), d)) perm.push_back(static_cast<int>(d));
    }
    for (int64_t d : axes) perm.push_back(static_cast<int>(d));
    terms = Transpose(*terms, perm, out + "/reduced_last");
    if (!terms.ok()) return terms.status();
  }
  int64_t count = 1;
  for (int64_t d : axes) count *= in[d];
  absl::StatusOr<std::string> pooled;
  if (is_spatial) {
    onnx::NodeProto pool;
    pool.set_op_type(kind == "ReduceMax" ? "GlobalMaxPool" : "GlobalAveragePool");
    pool.set_name(node_name_);
    pool.add_input(*terms);
    pool.add_output(out + "/pooled");
    Attrs none(pool);
    if (absl::Status s = Spatial(pool, none); !s.ok()) return s;
    pooled = Activation(out + "/pooled", "input");
  } else {
    absl::StatusOr<std::string> rows = Reshape(*terms, {Elements(in) / count, 1, count, 1}, out + "/rows");
    if (!rows.ok()) return rows.status();
    if (kind == "ReduceMax") {
      pooled = Emit(MAX_POOL, {*rows}, out + "/pooled", [&](OpDef& op) {
        op.mutable_pool()->set_kernel_h(1);
        op.mutable_pool()->set_kernel_w(static_cast<int32_t>(count));
      });
    } else {
      pooled = Emit(GLOBAL_AVG_POOL, {*rows}, out + "/pooled", [](OpDef&) {});
    }
  }
  if (!pooled.ok()) return pooled.status();
  if (sum) {
    pooled = Emit(MUL, {*pooled, NewWeight(out + "/count", {1}, {static_cast<float>(count)})}, out + "/sum",
                  [](OpDef&) {});
    if (!pooled.ok()) return pooled.status();
  }
  if (kind == "ReduceL2") {
    pooled = Emit(SQRT, {*pooled}, out + "/l2", [](OpDef&) {});
    if (!pooled.ok()) return pooled.status();
  }
  if (Shapes(*pooled) == shape) return pooled;  // (a global pool's NCHW result kept as it is)
  return Reshape(*pooled, shape, out);
}

}  // namespace loom::graph::onnx_internal
