// The ONNX importer's internals (graph/onnx_import.h is its interface): the Importer, shared by onnx_import.cc
// (the model, the node dispatch, the one-to-one ops) and onnx_import_ops.cc (the ops that become several IR ops:
// the spatial ops in NHWC, Gemm, LayerNormalization, BatchNormalization).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/nn_ops.h"
#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"  // generated from libonnx-dev's onnx.proto (graph/CMakeLists.txt)

namespace loom::graph::onnx_internal {

// The opsets of the default domain Loom reads: up to 27, onnx 1.22's. Of the ops Loom maps, those with versions past
// 18 changed only their element types (new ones are refused by FromTensorProto, by name), but for AveragePool-19
// (`dilations`, read as Conv's and MaxPool's are), Cast-19 and -24 (`saturate`, `round_mode`: float8 and float4
// targets only, which Cast refuses), MaxPool-22 and AveragePool-22 (a last window starting in the right padding is
// dropped: graph::PoolOut's rule already), Pad-19 (the wrap mode, refused), Resize-19 (half_pixel_symmetric,
// refused; the output size's rounding, the same for the whole factors Loom takes), Range-27 (stash_type: float16 /
// bfloat16 inputs only) and the new Gelu-20. onnx 1.23's opset 28 changes none of them but is not released.
inline constexpr int64_t kMinOpset = 1, kMaxOpset = 27;

inline std::string Str(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }
inline int64_t Elements(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>()); }

// A tensor known at import time: an initializer or a Constant node's value.
struct Constant {
  Shape shape;
  std::vector<float> f;    // FLOAT
  std::vector<int64_t> i;  // INT64 / INT32 (shapes, axes)
  bool is_int = false;
};
// Element `at` of constant `from` appended to `to` (of the same element type).
inline void AppendElement(Constant& to, const Constant& from, int64_t at) {
  if (to.is_int) {
    to.i.push_back(from.i[at]);
  } else {
    to.f.push_back(from.f[at]);
  }
}
absl::StatusOr<Constant> FromTensorProto(const onnx::TensorProto& t, const std::string& what);
// The shape Squeeze (`unsqueeze` false) or Unsqueeze gives `in` with `axes`, or why not (onnx_import.cc).
absl::StatusOr<Shape> SqueezedShape(const Shape& in, const std::vector<int64_t>& axes, bool unsqueeze);
// Parses a ModelProto, refusing bytes that are not a model (empty, unparsable, no graph); `name` is the file.
absl::Status ParseModel(const std::string& bytes, const std::string& name, onnx::ModelProto* m);

// A node's attributes, read by name and type; what is left unread is refused by Done().
class Attrs {
 public:
  explicit Attrs(const onnx::NodeProto& n) {
    for (const onnx::AttributeProto& a : n.attribute()) attrs_[a.name()] = &a;
  }
  int64_t Int(const std::string& name, int64_t fallback) { return Get(name) ? Get(name)->i() : fallback; }
  float Float(const std::string& name, float fallback) { return Get(name) ? Get(name)->f() : fallback; }
  std::string String(const std::string& name, const std::string& fallback) {
    return Get(name) ? Get(name)->s() : fallback;
  }
  std::vector<float> Floats(const std::string& name) {
    const onnx::AttributeProto* a = Get(name);
    return a ? std::vector<float>(a->floats().begin(), a->floats().end()) : std::vector<float>{};
  }
  std::vector<int64_t> Ints(const std::string& name) {
    const onnx::AttributeProto* a = Get(name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
  }
  const onnx::AttributeProto* Get(const std::string& name) {
    auto it = attrs_.find(name);
    if (it == attrs_.end()) return nullptr;
    read_.insert(name);
    return it->second;
  }
  // The first attribute nobody read, or "".
  std::string Unread() const {
    for (const auto& [name, a] : attrs_) {
      if (!read_.contains(name)) return name;
    }
    return "";
  }

 private:
  std::map<std::string, const onnx::AttributeProto*> attrs_;
  std::set<std::string> read_;
};

class Importer {
 public:
  Importer(std::string file, bool cancel_transposes)
      : file_(std::move(file)), cancel_transposes_(cancel_transposes) {}

  absl::StatusOr<OnnxModel> Run(const onnx::ModelProto& m);

 private:
  absl::Status Fail(const std::string& why) const { return absl::InvalidArgumentError(absl::StrCat(file_, ": ", why)); }
  absl::Status Refuse(const std::string& why) const {
    return absl::UnimplementedError(absl::StrCat(file_, ": node '", node_name_, "' (", node_type_, "): ", why));
  }

  TensorDef* Declare(const std::string& name, const Shape& shape, TensorKind kind) {
    TensorDef* t = def_.add_tensors();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_dtype(F32);
    t->set_kind(kind);
    index_[name] = def_.tensors_size() - 1;
    return t;
  }
  const TensorDef& Tensor(const std::string& name) const { return def_.tensors(index_.at(name)); }
  TensorDef* Mutable(const std::string& name) { return def_.mutable_tensors(index_.at(name)); }
  Shape Shapes(const std::string& name) const {
    const TensorDef& t = Tensor(name);
    return Shape(t.shape().begin(), t.shape().end());
  }
  std::string Fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; index_.contains(name); ++k) name = absl::StrCat(base, "#", k);
    return name;
  }
  // A float constant as a WEIGHT tensor of the graph (declared once).
  // A float constant as a weight. A rank-0 one (what exporters write for every Python scalar: `x / sqrt(2)`,
  // `1 / sqrt(d)`) is a one-element vector [1]: under numpy broadcasting it is the same operand, and every IR tensor
  // has a shape.
  std::string WeightOf(const std::string& name, const Constant& c) {
    if (index_.contains(name)) return name;
    const Shape shape = c.shape.empty() ? Shape{1} : c.shape;
    Declare(name, shape, WEIGHT);
    weights_[name] = HostTensor::FromF32(shape, c.f);
    return name;
  }
  std::string NewWeight(const std::string& base, const Shape& shape, std::vector<float> values) {
    const std::string name = Fresh(base);
    Declare(name, shape, WEIGHT);
    weights_[name] = HostTensor::FromF32(shape, std::move(values));
    return name;
  }
  // The IR tensor of ONNX value `name`: an activation or input, or a float constant as a weight.
  absl::StatusOr<std::string> Activation(const std::string& name, const std::string& what) {
    auto alias = alias_.find(name);
    const std::string& n = alias == alias_.end() ? name : alias->second;
    if (index_.contains(n)) return n;
    auto c = consts_.find(n);
    if (c != consts_.end()) {
      if (c->second.is_int) return Refuse(absl::StrCat(what, " '", name, "' is an integer tensor (float32 only)"));
      return WeightOf(n, c->second);
    }
    return Refuse(absl::StrCat(what, " '", name, "' is not defined before it is used"));
  }
  const Constant* ConstantOf(const std::string& name) const {
    auto alias = alias_.find(name);
    auto c = consts_.find(alias == alias_.end() ? name : alias->second);
    return c == consts_.end() ? nullptr : &c->second;
  }

  // Appends an op; its output (named `out`, made unique) gets the shape nn_ops infers.
  template <typename SetAttrs>
  // An op of the general tensor ops (graph/nn_ops) whose inputs are all constants is folded: evaluated here by
  // the oracle's reference, its output a constant (exporters write mask and scale arithmetic on constants, and
  // shapes' square roots; computed once at import instead of on every run, and in f32).
  absl::StatusOr<std::string> Emit(OpType type, const std::vector<std::string>& inputs, const std::string& out,
                                   SetAttrs set_attrs, const Shape& declared = {}) {
    OpDef op;
    op.set_name(Fresh(out));
    op.set_type(type);
    // (A RESHAPE is no arithmetic, and a graph output that is a weight becomes an op's output through one.)
    bool constant = IsNnOp(type) && type != RESHAPE && !inputs.empty();
    for (const std::string& i : inputs) {
      if (!index_.contains(i)) {  // a float constant not yet a weight (a folded op's output)
        auto c = consts_.find(i);
        if (c != consts_.end() && !c->second.is_int) WeightOf(i, c->second);
      }
      constant = constant && weights_.contains(i);
      op.add_inputs(i);
    }
    set_attrs(op);
    Shape shape = declared;
    if (IsNnOp(type)) {
      std::vector<Shape> shapes;
      for (const std::string& i : inputs) shapes.push_back(Shapes(i));
      absl::StatusOr<Shape> s = InferNnShape(op, shapes, declared);
      if (!s.ok()) return Refuse(std::string(s.status().message()));
      shape = *s;
    }
    const std::string name = Fresh(out);
    if (constant) {
      std::vector<const HostTensor*> values;
      for (const std::string& i : inputs) values.push_back(&weights_.at(i));
      HostTensor result = HostTensor::FromF32(shape, std::vector<float>(Elements(shape)));
      if (absl::Status s = EvalNnOp(op, values, &result); !s.ok()) return Refuse(std::string(s.message()));
      consts_[name] = Constant{shape, std::move(result.f32), {}, false};
      return WeightOf(name, consts_.at(name));
    }
    op.add_outputs(name);
    Declare(name, shape, ACTIVATION);
    *def_.add_ops() = std::move(op);
    return name;
  }
  absl::StatusOr<std::string> Transpose(const std::string& x, const std::vector<int>& perm, const std::string& out) {
    return Emit(TRANSPOSE, {x}, out, [&](OpDef& op) {
      for (int p : perm) op.mutable_transpose()->add_perm(p);
    });
  }
  absl::StatusOr<std::string> Reshape(const std::string& x, const Shape& shape, const std::string& out) {
    return Emit(RESHAPE, {x}, out, [](OpDef&) {}, shape);
  }

  absl::Status Node(const onnx::NodeProto& n, int index);
  // Shape, and Gather / Unsqueeze / Squeeze / Concat / Cast on integer constants, folded to constants (true: done).
  absl::StatusOr<bool> FoldShapeArithmetic(const onnx::NodeProto& n, Attrs& a);
  // ConstantOfShape, Range, Equal, Not, Where and GatherElements on constants (onnx_import_constants.cc): true when
  // folded.
  absl::StatusOr<bool> FoldConstantOps(const onnx::NodeProto& n, Attrs& a);
  // A node's axes: its `axes` attribute before `input_from_opset`, then its constant int64 second input (empty when
  // it has none).
  absl::StatusOr<std::vector<int64_t>> AxesOf(const onnx::NodeProto& n, Attrs& a, int64_t input_from_opset);
  // Refuses a graph with op types the importer does not map, naming every one of them (see onnx_import.cc).
  absl::Status RefuseUnsupportedOps(const onnx::GraphProto& g) const;
  absl::Status Spatial(const onnx::NodeProto& n, Attrs& a);
  absl::Status Gemm(const onnx::NodeProto& n, Attrs& a);
  absl::Status LayerNorm(const onnx::NodeProto& n, Attrs& a);
  absl::Status Gelu(const onnx::NodeProto& n, Attrs& a);
  absl::Status Clamp(const onnx::NodeProto& n, Attrs& a);
  // Elu, Selu, Celu, Softplus, Softsign, Mish (onnx_import_elementwise.cc).
  absl::Status Exponential(const onnx::NodeProto& n, Attrs& a);
  // Greater, Less, Equal, GreaterOrEqual, LessOrEqual, Not, And, Or, Xor, Where, ThresholdedRelu and IsNaN on
  // activations.
  absl::Status Logic(const onnx::NodeProto& n, Attrs& a);
  // Slice, Split and Gather (a constant's, folded; an activation's: the IR's SLICE).
  absl::Status Slicing(const onnx::NodeProto& n, Attrs& a);
  absl::Status Expand(const onnx::NodeProto& n);
  absl::Status Pad(const onnx::NodeProto& n, Attrs& a);
  absl::Status ConvTranspose(const onnx::NodeProto& n, Attrs& a);
  absl::Status Resize(const onnx::NodeProto& n, Attrs& a);
  absl::Status ResizeLinear(const onnx::NodeProto& n, const std::string& x, const Shape& out_shape,
                            const std::vector<float>& scales, const std::string& coordinates);
  // The Reduce* ops, LogSoftmax, and the reduction of a value over axes they share (onnx_import_ops.cc).
  absl::Status Reduce(const onnx::NodeProto& n, Attrs& a);
  absl::Status LogSoftmax(const onnx::NodeProto& n, Attrs& a);
  struct ShiftedLogSumExp {
    std::string max, shifted, log_sum_exp;
  };
  absl::StatusOr<ShiftedLogSumExp> LogSumExp(const std::string& x, const std::vector<int64_t>& axes,
                                             const std::string& out);
  absl::StatusOr<std::string> ReduceAxes(const std::string& kind, const std::string& x, std::vector<int64_t> axes,
                                         bool keepdims, const std::string& out);
  // Value `in` (a constant or an activation) sliced per axis (first element, step, count) into ONNX value `out`.
  absl::Status SliceInto(const std::string& in, const Shape& starts, const Shape& steps, const Shape& counts,
                         const std::string& out);
  absl::Status BatchNorm(const onnx::NodeProto& n, Attrs& a);
  // Pads [begin_h, begin_w, end_h, end_w] of a 2-D spatial op from pads / auto_pad.
  absl::StatusOr<std::array<int64_t, 4>> Pads(Attrs& a, const Shape& nchw, const std::vector<int64_t>& kernel,
                                              const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                                              bool one_d);

  std::string file_;
  bool cancel_transposes_;
  std::string node_name_, node_type_;
  int64_t opset_ = 0;
  GraphDef def_;
  WeightStore weights_;
  absl::flat_hash_map<std::string, int> index_;
  absl::flat_hash_map<std::string, std::string> alias_;  // ONNX value -> the IR tensor holding it
  absl::flat_hash_map<std::string, Constant> consts_;
  absl::flat_hash_map<std::string, int> uses_;             // ONNX value -> readers (nodes and graph outputs)
  absl::flat_hash_map<std::string, const OpDef*> conv_of_;  // ONNX output of a Conv -> its CONV2D op
  absl::flat_hash_set<std::string> int_inputs_;              // int64 / int32 graph inputs read as ids (I32 in the IR)
  // ONNX values of integer or bool type that Loom holds as float32 (Importer::IntegerValued): int64 / int32 graph
  // inputs read in arithmetic, the comparisons' and logic ops' results, casts and views of these.
  absl::flat_hash_set<std::string> int_valued_;
};

}  // namespace loom::graph::onnx_internal
