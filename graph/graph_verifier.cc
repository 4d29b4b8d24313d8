// VerifyGraph: structural checks (names, kinds, definitions, cycles) and the
// shape/dtype rule of every op type. Every error names the op and the tensor.
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "graph/nn_ops.h"

namespace loom::graph {
namespace {

Shape ShapeOf(const TensorDef& t) { return Shape(t.shape().begin(), t.shape().end()); }

std::string Str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? "," : "", s[i]);
  return out + "]";
}

// Shape/dtype checking of one op; `t(i)` is its i-th input, `o(i)` its i-th output.
class OpChecker {
 public:
  OpChecker(const OpDef& op, const absl::flat_hash_map<std::string, const TensorDef*>& tensors)
      : op_(op), tensors_(tensors) {}

  absl::Status Check() {
    switch (op_.type()) {
      case EMBEDDING: return CheckEmbedding();
      case RMS_NORM: return CheckNorm(/*with_bias=*/false);
      case LAYER_NORM: return CheckNorm(/*with_bias=*/true);
      case LINEAR: return CheckLinear();
      case ROPE: return CheckRope();
      case ATTENTION: return CheckAttention();
      case SILU_MUL: return CheckElementwise();
      case CONV1D: return CheckConv1d();
      case ARGMAX: return CheckArgmax();
      default:
        if (IsNnOp(op_.type())) return CheckNnOp();
        return Error("has no op type");
    }
  }

 private:
  absl::Status Error(const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrCat("op '", op_.name(), "' (", OpType_Name(op_.type()), "): ", why));
  }
  absl::Status Arity(int min_in, int max_in, int outs) const {
    if (op_.inputs_size() < min_in || op_.inputs_size() > max_in) {
      return Error(absl::StrCat("takes ", min_in == max_in ? absl::StrCat(min_in) : absl::StrCat(min_in, "-", max_in),
                                " inputs, has ", op_.inputs_size()));
    }
    if (op_.outputs_size() != outs) return Error(absl::StrCat("has ", op_.outputs_size(), " outputs, needs ", outs));
    return absl::OkStatus();
  }
  const TensorDef& In(int i) const { return *tensors_.at(op_.inputs(i)); }
  const TensorDef& Out(int i) const { return *tensors_.at(op_.outputs(i)); }
  absl::Status Expect(const TensorDef& t, const Shape& shape, std::initializer_list<DType> dtypes) const {
    if (ShapeOf(t) != shape) {
      return Error(absl::StrCat("tensor '", t.name(), "' has shape ", Str(ShapeOf(t)), ", expected ", Str(shape)));
    }
    for (DType d : dtypes) {
      if (t.dtype() == d) return absl::OkStatus();
    }
    return Error(absl::StrCat("tensor '", t.name(), "' has dtype ", DTypeName(t.dtype()), ", not allowed here"));
  }
  absl::Status Rank(const TensorDef& t, int rank) const {
    if (t.shape_size() != rank) {
      return Error(absl::StrCat("tensor '", t.name(), "' has rank ", t.shape_size(), ", expected ", rank));
    }
    return absl::OkStatus();
  }
  absl::Status Kind(const TensorDef& t, TensorKind kind) const {
    if (t.kind() != kind) {
      return Error(absl::StrCat("tensor '", t.name(), "' is ", TensorKind_Name(t.kind()), ", expected ",
                                TensorKind_Name(kind)));
    }
    return absl::OkStatus();
  }

#define LOOM_RETURN_IF_ERROR(expr)          \
  do {                                      \
    if (absl::Status _s = (expr); !_s.ok()) \
      return _s;                            \
  } while (0)

  absl::Status CheckEmbedding() {
    LOOM_RETURN_IF_ERROR(Arity(2, 2, 1));
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    // The ids in any shape (a general graph's [batch, sequence] input), a row of the output each, in order.
    if (In(1).shape_size() < 1) return Error(absl::StrCat("tensor '", In(1).name(), "' has rank 0, expected 1 or more"));
    LOOM_RETURN_IF_ERROR(Expect(In(1), ShapeOf(In(1)), {I32}));
    LOOM_RETURN_IF_ERROR(Expect(In(0), ShapeOf(In(0)), {BF16, F32}));
    int64_t ids = 1;
    for (int64_t d : In(1).shape()) ids *= d;
    return Expect(Out(0), {ids, In(0).shape(1)}, {F32});
  }
  absl::Status CheckNorm(bool with_bias) {
    LOOM_RETURN_IF_ERROR(Arity(with_bias ? 3 : 2, with_bias ? 3 : 2, 1));
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    if (!op_.has_norm() || !(op_.norm().eps() > 0)) return Error("needs norm attrs with eps > 0");
    const int64_t group = op_.norm().group_size();
    if (group < 0 || (group > 0 && In(0).shape(1) % group != 0)) {
      return Error(absl::StrCat("group_size ", group, " does not divide the row of ", In(0).shape(1)));
    }
    const int64_t d = group > 0 ? group : In(0).shape(1);
    LOOM_RETURN_IF_ERROR(Expect(In(0), ShapeOf(In(0)), {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(1), {d}, {BF16, F32}));
    if (with_bias) LOOM_RETURN_IF_ERROR(Expect(In(2), {d}, {BF16, F32}));
    return Expect(Out(0), ShapeOf(In(0)), {F32});
  }
  absl::Status CheckLinear() {
    LOOM_RETURN_IF_ERROR(Arity(2, 3, 1));
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    LOOM_RETURN_IF_ERROR(Rank(In(1), 2));
    LOOM_RETURN_IF_ERROR(Expect(In(0), ShapeOf(In(0)), {F32}));
    const int64_t t = In(0).shape(0), k = In(0).shape(1), n = In(1).shape(0);
    LOOM_RETURN_IF_ERROR(Expect(In(1), {n, k}, {BF16, F32, F8E4M3, I4}));
    if (op_.inputs_size() == 3) LOOM_RETURN_IF_ERROR(Expect(In(2), {n}, {BF16, F32}));
    return Expect(Out(0), {t, n}, {F32});
  }
  absl::Status CheckRope() {
    LOOM_RETURN_IF_ERROR(Arity(2, 2, 1));
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    LOOM_RETURN_IF_ERROR(Expect(In(0), ShapeOf(In(0)), {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(1), {1}, {I32}));
    if (!op_.has_rope()) return Error("needs rope attrs");
    const int hd = op_.rope().head_dim();
    if (hd <= 0 || hd % 2 != 0 || In(0).shape(1) % hd != 0) {
      return Error(absl::StrCat("head_dim ", hd, " must be even and divide ", In(0).shape(1)));
    }
    const RopeAttrs& r = op_.rope();
    if (!(r.theta() > 0)) return Error("rope theta must be > 0");
    if (r.has_llama3_scaling() + (r.linear_factor() != 0) + r.has_yarn() > 1) {
      return Error("at most one rope scaling (llama3, linear, yarn) may be set");
    }
    if (r.linear_factor() < 0) return Error("rope linear_factor must be > 0");
    if (r.has_yarn() && !(r.yarn().factor() > 0 && r.yarn().original_max_position() > 0 && r.yarn().beta_fast() > 0 &&
                          r.yarn().beta_slow() > 0 && r.yarn().attention_factor() > 0)) {
      return Error("yarn needs positive factor, original_max_position, beta_fast, beta_slow and attention_factor");
    }
    return Expect(Out(0), ShapeOf(In(0)), {F32});
  }
  absl::Status CheckAttention() {
    LOOM_RETURN_IF_ERROR(Arity(6, 6, 1));
    if (!op_.has_attention()) return Error("needs attention attrs");
    const AttentionAttrs& a = op_.attention();
    if (a.num_heads() <= 0 || a.num_kv_heads() <= 0 || a.head_dim() <= 0 || a.num_heads() % a.num_kv_heads() != 0) {
      return Error("num_heads must be a positive multiple of num_kv_heads, head_dim > 0");
    }
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    LOOM_RETURN_IF_ERROR(Rank(In(3), 3));
    const int64_t t = In(0).shape(0), h = a.num_heads(), kv = a.num_kv_heads(), dh = a.head_dim();
    const int64_t s = In(3).shape(1);
    LOOM_RETURN_IF_ERROR(Expect(In(0), {t, h * dh}, {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(1), {t, kv * dh}, {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(2), {t, kv * dh}, {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(3), {kv, s, dh}, {F32, BF16}));
    LOOM_RETURN_IF_ERROR(Expect(In(4), {kv, s, dh}, {In(3).dtype()}));
    LOOM_RETURN_IF_ERROR(Kind(In(3), STATE));
    LOOM_RETURN_IF_ERROR(Kind(In(4), STATE));
    LOOM_RETURN_IF_ERROR(Expect(In(5), {1}, {I32}));
    return Expect(Out(0), {t, h * dh}, {F32});
  }
  absl::Status CheckElementwise() {
    LOOM_RETURN_IF_ERROR(Arity(2, 2, 1));
    LOOM_RETURN_IF_ERROR(Expect(In(0), ShapeOf(In(0)), {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(1), ShapeOf(In(0)), {F32}));
    return Expect(Out(0), ShapeOf(In(0)), {F32});
  }
  absl::Status CheckConv1d() {
    LOOM_RETURN_IF_ERROR(Arity(3, 4, 1));
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    LOOM_RETURN_IF_ERROR(Rank(In(1), 2));
    const int64_t t = In(0).shape(0), c = In(0).shape(1), k = In(1).shape(1);
    LOOM_RETURN_IF_ERROR(Expect(In(0), {t, c}, {F32}));
    LOOM_RETURN_IF_ERROR(Expect(In(1), {c, k}, {BF16, F32}));
    if (k < 1) return Error("kernel size must be >= 1");
    if (k > 1) {
      LOOM_RETURN_IF_ERROR(Expect(In(2), {c, k - 1}, {F32}));
      LOOM_RETURN_IF_ERROR(Kind(In(2), STATE));
    }
    if (op_.inputs_size() == 4) LOOM_RETURN_IF_ERROR(Expect(In(3), {c}, {BF16, F32}));
    return Expect(Out(0), {t, c}, {F32});
  }
  // The tensor ops of graph/nn_ops: f32 activations (weights bf16 or f32), the declared output shape the op's.
  absl::Status CheckNnOp() {
    if (op_.outputs_size() != 1) return Error(absl::StrCat("has ", op_.outputs_size(), " outputs, needs 1"));
    std::vector<Shape> shapes;
    for (int i = 0; i < op_.inputs_size(); ++i) {
      const TensorDef& t = In(i);
      if (t.dtype() != F32 && !(t.kind() == WEIGHT && t.dtype() == BF16)) {
        return Error(absl::StrCat("tensor '", t.name(), "' is ", DType_Name(t.dtype()), ", needs F32 (or a BF16 weight)"));
      }
      shapes.push_back(ShapeOf(t));
    }
    absl::StatusOr<Shape> shape = InferNnShape(op_, shapes, ShapeOf(Out(0)));
    if (!shape.ok()) return Error(std::string(shape.status().message()));
    return Expect(Out(0), *shape, {F32});
  }
  absl::Status CheckArgmax() {
    LOOM_RETURN_IF_ERROR(Arity(1, 1, 1));
    LOOM_RETURN_IF_ERROR(Rank(In(0), 2));
    LOOM_RETURN_IF_ERROR(Expect(In(0), ShapeOf(In(0)), {F32}));
    return Expect(Out(0), {In(0).shape(0)}, {I32});
  }
#undef LOOM_RETURN_IF_ERROR

  const OpDef& op_;
  const absl::flat_hash_map<std::string, const TensorDef*>& tensors_;
};

}  // namespace

absl::Status VerifyGraph(const GraphDef& def, std::vector<int>* topological_order) {
  absl::flat_hash_map<std::string, const TensorDef*> tensors;
  for (const TensorDef& t : def.tensors()) {
    if (t.name().empty()) return absl::InvalidArgumentError("a tensor has no name");
    if (!tensors.emplace(t.name(), &t).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' is declared twice"));
    }
    if (t.dtype() == DTYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has no dtype"));
    }
    if (t.kind() == KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has no kind"));
    }
    if (t.shape_size() == 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has no shape"));
    for (int64_t d : t.shape()) {
      if (d <= 0 || d > (int64_t{1} << 40)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has dimension ", d));
      }
    }
  }

  // FP8 is a LINEAR weight's dtype (its HostTensor holds the e4m3 values and a scale per row).
  for (const TensorDef& t : def.tensors()) {
    if ((t.dtype() == F8E4M3 || t.dtype() == I4) && (t.kind() != WEIGHT || t.shape_size() != 2)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "': ", DTypeName(t.dtype()),
                                                     " is a dtype of 2-D weights only"));
    }
    const uint32_t g = t.group_size();
    if (t.dtype() == I4 && (g < 32 || (g & (g - 1)) != 0 || t.shape(1) % g != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "': int4 group_size ", g,
                                                     " must be a power of two of at least 32 dividing its ",
                                                     t.shape(1), " columns"));
    }
  }

  // Definitions: every ACTIVATION by exactly one op; nothing else by any op.
  absl::flat_hash_map<std::string, int> producer;
  absl::flat_hash_set<std::string> op_names;
  for (int i = 0; i < def.ops_size(); ++i) {
    const OpDef& op = def.ops(i);
    if (op.name().empty()) return absl::InvalidArgumentError(absl::StrCat("op #", i, " has no name"));
    if (!op_names.insert(op.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("op '", op.name(), "' is declared twice"));
    }
    for (const std::string& in : op.inputs()) {
      if (!tensors.contains(in)) {
        return absl::InvalidArgumentError(absl::StrCat("op '", op.name(), "' reads undeclared tensor '", in, "'"));
      }
    }
    for (const std::string& out : op.outputs()) {
      auto it = tensors.find(out);
      if (it == tensors.end()) {
        return absl::InvalidArgumentError(absl::StrCat("op '", op.name(), "' writes undeclared tensor '", out, "'"));
      }
      if (it->second->kind() != ACTIVATION) {
        return absl::InvalidArgumentError(absl::StrCat("op '", op.name(), "' writes tensor '", out, "' of kind ",
                                                       TensorKind_Name(it->second->kind()),
                                                       "; ops may only define ACTIVATION tensors"));
      }
      auto [pit, inserted] = producer.emplace(out, i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", out, "' is defined twice: by op '",
                                                       def.ops(pit->second).name(), "' and op '", op.name(), "'"));
      }
    }
  }
  for (const TensorDef& t : def.tensors()) {
    if (t.kind() == ACTIVATION && !producer.contains(t.name())) {
      return absl::InvalidArgumentError(absl::StrCat("activation tensor '", t.name(), "' is never defined (dangling)"));
    }
  }

  // Kahn's algorithm; whatever is left over sits on a cycle.
  std::vector<int> pending(def.ops_size(), 0);
  absl::flat_hash_map<std::string, std::vector<int>> readers;
  for (int i = 0; i < def.ops_size(); ++i) {
    for (const std::string& in : def.ops(i).inputs()) {
      if (producer.contains(in)) {
        ++pending[i];
        readers[in].push_back(i);
      }
    }
  }
  std::deque<int> ready;
  for (int i = 0; i < def.ops_size(); ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    const int i = ready.front();
    ready.pop_front();
    order.push_back(i);
    for (const std::string& out : def.ops(i).outputs()) {
      for (int reader : readers[out]) {
        if (--pending[reader] == 0) ready.push_back(reader);
      }
    }
  }
  if (static_cast<int>(order.size()) != def.ops_size()) {
    for (int i = 0; i < def.ops_size(); ++i) {
      if (pending[i] > 0) {
        return absl::InvalidArgumentError(absl::StrCat("op '", def.ops(i).name(), "' is on a cycle"));
      }
    }
  }

  for (int i : order) {
    if (absl::Status s = OpChecker(def.ops(i), tensors).Check(); !s.ok()) return s;
  }
  if (topological_order != nullptr) *topological_order = std::move(order);
  return absl::OkStatus();
}

}  // namespace loom::graph
