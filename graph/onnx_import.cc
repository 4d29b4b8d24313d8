#include "graph/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"

#include "graph/layout_pass.h"
#include "graph/onnx_importer.h"

namespace loom::graph {
namespace onnx_internal {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ONNX ops that are one IR op each, with their input count.
struct OneToOne {
  OpType type;
  int inputs;
};
const std::map<std::string, OneToOne>& OneToOneOps() {
  static const auto* ops = new std::map<std::string, OneToOne>{
      {"Relu", {RELU, 1}}, {"Sigmoid", {SIGMOID, 1}}, {"Erf", {ERF, 1}}, {"Tanh", {TANH, 1}},
      {"Exp", {EXP, 1}},   {"Sqrt", {SQRT, 1}},       {"Log", {LOG, 1}},
      {"Add", {ADD, 2}},   {"Sub", {SUB, 2}},         {"Mul", {MUL, 2}}, {"Div", {DIV, 2}},   {"MatMul", {MATMUL, 2}}};
  return *ops;
}
// The ops mapped by hand (attributes, layouts, several IR ops).
constexpr const char* kComposedOps[] = {"Abs", "AveragePool", "BatchNormalization", "Celu", "Clip", "Concat", "Constant", "Conv",
                                        "ConvTranspose", "Dropout", "Elu", "Expand", "Flatten", "Gelu", "Gemm",
                                        "GlobalAveragePool", "GlobalMaxPool", "Mish", "Selu", "Softplus", "Softsign",
                                        "And", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Or",
                                        "IsNaN", "ThresholdedRelu", "Xor",
                                        "HardSigmoid",
                                        "HardSwish", "Identity", "LayerNormalization", "LeakyRelu", "Max", "MaxPool", "Min", "Neg",
                                        "Pad", "PRelu",
                                        "LogSoftmax", "Pow", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                        "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceSum", "ReduceSumSquare",
                                        "Reshape", "Resize", "Slice", "Softmax", "Split",
                                        "Squeeze", "Transpose", "Unsqueeze", "Upsample",
                                        // shape arithmetic on constants (Importer::FoldShapeArithmetic)
                                        "Cast", "Gather", "Shape",
                                        // on constants (Importer::FoldConstantOps)
                                        "ConstantOfShape", "Equal", "GatherElements", "Not", "Range", "Where"};

}  // namespace

absl::StatusOr<Constant> FromTensorProto(const onnx::TensorProto& t, const std::string& what) {
  Constant c;
  c.shape.assign(t.dims().begin(), t.dims().end());
  const int64_t n = Elements(c.shape);
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {  // (ImportOnnx reads it in before this)
    return absl::UnimplementedError(
        absl::StrCat(what, ": external tensor data is read only for a model loaded from its file (its folder)"));
  }
  switch (t.data_type()) {
    case onnx::TensorProto::FLOAT:
      if (t.has_raw_data()) {
        if (t.raw_data().size() != static_cast<size_t>(n) * 4) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": raw data holds ", t.raw_data().size(),
                                                         " bytes for ", n, " floats"));
        }
        c.f.resize(n);
        std::memcpy(c.f.data(), t.raw_data().data(), n * 4);
      } else {
        if (t.float_data_size() != n) return absl::InvalidArgumentError(absl::StrCat(what, ": wrong element count"));
        c.f.assign(t.float_data().begin(), t.float_data().end());
      }
      return c;
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::BOOL: {  // (a bool as 0 / 1: masks and comparisons folded at import)
      c.is_int = true;
      const bool i64 = t.data_type() == onnx::TensorProto::INT64, b = t.data_type() == onnx::TensorProto::BOOL;
      if (t.has_raw_data()) {
        const size_t width = i64 ? 8 : b ? 1 : 4;
        if (t.raw_data().size() != static_cast<size_t>(n) * width) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": raw data of the wrong size"));
        }
        for (int64_t k = 0; k < n; ++k) {
          int64_t v = 0;
          if (i64) {
            std::memcpy(&v, t.raw_data().data() + k * 8, 8);
          } else if (b) {
            v = t.raw_data()[k] != 0 ? 1 : 0;
          } else {
            int32_t v32;
            std::memcpy(&v32, t.raw_data().data() + k * 4, 4);
            v = v32;
          }
          c.i.push_back(v);
        }
      } else if (i64) {
        c.i.assign(t.int64_data().begin(), t.int64_data().end());
      } else {
        c.i.assign(t.int32_data().begin(), t.int32_data().end());
      }
      if (static_cast<int64_t>(c.i.size()) != n) return absl::InvalidArgumentError(absl::StrCat(what, ": wrong element count"));
      return c;
    }
    default:
      return absl::UnimplementedError(absl::StrCat(what, ": element type ",
                                                   onnx::TensorProto::DataType_Name(
                                                       static_cast<onnx::TensorProto::DataType>(t.data_type())),
                                                   " is not supported (float32 only)"));
  }
}

absl::StatusOr<OnnxModel> Importer::Run(const onnx::ModelProto& m) {
  def_.set_name(m.graph().name().empty() ? "onnx" : m.graph().name());
  for (const onnx::OperatorSetIdProto& o : m.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") opset_ = o.version();
  }
  if (opset_ < kMinOpset || opset_ > kMaxOpset) {
    return Fail(absl::StrCat("opset ", opset_, " of the default domain: Loom reads opsets ", kMinOpset, "-",
                             kMaxOpset));
  }
  const onnx::GraphProto& g = m.graph();
  if (absl::Status s = RefuseUnsupportedOps(g); !s.ok()) return s;
  for (const onnx::TensorProto& t : g.initializer()) {
    absl::StatusOr<Constant> c = FromTensorProto(t, absl::StrCat(file_, ": initializer '", t.name(), "'"));
    if (!c.ok()) return c.status();
    consts_[t.name()] = *std::move(c);
  }
  OnnxModel out;
  for (const onnx::ValueInfoProto& v : g.input()) {
    if (consts_.contains(v.name())) continue;  // an initializer listed as an input (older exporters)
    const onnx::TypeProto& type = v.type();
    const int elem = type.has_tensor_type() ? type.tensor_type().elem_type() : 0;
    const bool integer = elem == onnx::TensorProto::INT64 || elem == onnx::TensorProto::INT32;
    if (elem != onnx::TensorProto::FLOAT && !integer) {
      return Fail(absl::StrCat("input '", v.name(), "': only float32 and int64 / int32 tensors are supported"));
    }
    // An integer input is read as int32 where it indexes a Gather (embedding ids: Importer::Slicing; the runtime
    // refuses values outside the table), or as float32 values where arithmetic reads it (an attention mask; the
    // runtime refuses values past 2^24, which float32 does not hold exactly); not both.
    bool ids = false, arithmetic = false;
    for (const onnx::NodeProto& n : g.node()) {
      for (int k = 0; k < n.input_size(); ++k) {
        if (n.input(k) != v.name() || n.op_type() == "Shape") continue;
        (n.op_type() == "Gather" && k == 1 ? ids : arithmetic) = true;
      }
    }
    if (integer && ids && arithmetic) {
      return Fail(absl::StrCat("input '", v.name(), "': read both as a Gather's indices and in arithmetic (Loom reads "
                               "an integer input one way)"));
    }
    Shape shape;
    for (const onnx::TensorShapeProto::Dimension& d : type.tensor_type().shape().dim()) {
      if (!d.has_dim_value()) {
        return Fail(absl::StrCat("input '", v.name(), "': dimension ", shape.size(), " is symbolic ('",
                                 d.dim_param(), "'); Loom compiles static shapes"));
      }
      shape.push_back(d.dim_value());
    }
    if (shape.empty()) shape = {1};  // a scalar fed at run time (Clip's bounds): [1], as rank-0 constants are
    TensorDef* in = Declare(v.name(), shape, INPUT);
    if (integer && ids) {
      in->set_dtype(I32);
      int_inputs_.insert(v.name());
    } else if (integer) {
      int_valued_.insert(v.name());
    }
    out.inputs.push_back(v.name());
  }
  // How often each value is read (node inputs and graph outputs): a BatchNormalization folds into the Conv before
  // it only when it is that Conv's one reader.
  for (const onnx::NodeProto& n : g.node()) {
    for (const std::string& in : n.input()) ++uses_[in];
  }
  for (const onnx::ValueInfoProto& v : g.output()) ++uses_[v.name()];
  for (int i = 0; i < g.node_size(); ++i) {
    if (absl::Status s = Node(g.node(i), i); !s.ok()) return s;
  }
  for (const onnx::ValueInfoProto& v : g.output()) {
    absl::StatusOr<std::string> t = Activation(v.name(), "graph output");
    if (!t.ok()) return t.status();
    // An output that is an input or weight itself becomes an op's output (a RESHAPE to its own shape).
    const TensorKind kind = Tensor(*t).kind();
    if (kind != ACTIVATION) {
      absl::StatusOr<std::string> copy = Emit(RESHAPE, {*t}, v.name() + "/copy", [](OpDef&) {}, Shapes(*t));
      if (!copy.ok()) return copy.status();
      t = copy;
    }
    Mutable(*t)->set_is_output(true);
    out.outputs.push_back(*t);
  }
  if (cancel_transposes_) {
    absl::StatusOr<int> removed = CancelTransposes(&def_, &weights_);
    if (!removed.ok()) return Fail(std::string(removed.status().message()));
  }
  absl::StatusOr<Graph> graph = Graph::Create(def_);
  if (!graph.ok()) return Fail(std::string(graph.status().message()));
  out.graph = *std::move(graph);
  out.weights = std::move(weights_);
  out.opset = opset_;
  return out;
}

absl::Status Importer::RefuseUnsupportedOps(const onnx::GraphProto& g) const {
  // Every op type (or domain) the importer does not map, named at once before any node is imported: a file is
  // refused once with all that it lacks, not one op at a time. Per type: how many nodes, and the first.
  const std::vector<std::string> supported = OnnxSupportedOps();
  std::map<std::string, std::pair<int, std::string>> missing;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    const bool other_domain = !n.domain().empty() && n.domain() != "ai.onnx";
    if (!other_domain && std::binary_search(supported.begin(), supported.end(), n.op_type())) continue;
    auto [it, first] = missing.try_emplace(other_domain ? absl::StrCat(n.domain(), ".", n.op_type()) : n.op_type(),
                                           0, n.name().empty() ? absl::StrCat("#", i, n.output_size() ? " -> " + n.output(0)
                                                                                                       : "")
                                                               : n.name());
    ++it->second.first;
  }
  if (missing.empty()) return absl::OkStatus();
  const std::string list = absl::StrJoin(supported, ", ");
  if (missing.size() == 1 && missing.begin()->second.first == 1) {  // one node: named as every node refusal is
    const auto& [type, node] = *missing.begin();
    return absl::UnimplementedError(absl::StrCat(file_, ": node '", node.second, "' (", type,
                                                 "): op type not supported (supported: ", list, ")"));
  }
  std::vector<std::string> parts;
  for (const auto& [type, node] : missing) {
    parts.push_back(node.first == 1 ? absl::StrCat(type, " (node '", node.second, "')")
                                    : absl::StrCat(type, " (", node.first, " nodes, the first '", node.second, "')"));
  }
  return absl::UnimplementedError(absl::StrCat(file_, ": ", missing.size(), " op types are not supported: ",
                                               absl::StrJoin(parts, ", "), " (supported: ", list, ")"));
}

// The shape Squeeze (`unsqueeze` false) or Unsqueeze gives `in` with `axes` (normalized against the output's rank
// for Unsqueeze, the input's for Squeeze; Squeeze without axes drops every dimension of size 1), or why not.
absl::StatusOr<Shape> SqueezedShape(const Shape& in, const std::vector<int64_t>& axes, bool unsqueeze) {
  const int64_t rank = static_cast<int64_t>(in.size()) + (unsqueeze ? static_cast<int64_t>(axes.size()) : 0);
  if (unsqueeze && axes.empty()) return absl::InvalidArgumentError("needs its axes");
  std::vector<bool> marked(rank, false);
  for (int64_t axis : axes) {
    const int64_t at = axis < 0 ? axis + rank : axis;
    if (at < 0 || at >= rank || marked[at]) {
      return absl::InvalidArgumentError(absl::StrCat("axis ", axis, " is out of range or repeated"));
    }
    if (!unsqueeze && in[at] != 1) {
      return absl::InvalidArgumentError(absl::StrCat("axis ", axis, " has size ", in[at], ", not 1"));
    }
    marked[at] = true;
  }
  Shape shape;
  for (int64_t d = 0, from = 0; d < rank; ++d) {
    if (unsqueeze) {
      shape.push_back(marked[d] ? 1 : in[from++]);
    } else if (!(axes.empty() ? in[d] == 1 : marked[d])) {
      shape.push_back(in[d]);
    }
  }
  return shape;
}

absl::StatusOr<std::vector<int64_t>> Importer::AxesOf(const onnx::NodeProto& n, Attrs& a, int64_t input_from_opset) {
  if (opset_ < input_from_opset) return a.Ints("axes");
  if (n.input_size() < 2 || n.input(1).empty()) return std::vector<int64_t>{};
  const Constant* c = ConstantOf(n.input(1));
  if (c == nullptr || !c->is_int) return Refuse("the axes must be a constant int64 tensor (an initializer)");
  return c->i;
}

absl::Status Importer::Node(const onnx::NodeProto& n, int index) {
  node_type_ = n.op_type();
  node_name_ = n.name().empty() ? absl::StrCat("#", index, n.output_size() ? " -> " + n.output(0) : "") : n.name();
  if (!n.domain().empty() && n.domain() != "ai.onnx") return Refuse(absl::StrCat("domain '", n.domain(), "'"));
  if (n.output_size() < 1 || n.output(0).empty()) return Refuse("no output");
  Attrs a(n);
  // Attributes of opsets before 7 that change nothing at inference: memory-reuse hints and the test-mode flag.
  a.Get("consumed_inputs");
  a.Get("is_test");
  const std::string& t = n.op_type();
  const std::string out = n.output(0);
  absl::Status s = absl::OkStatus();
  // Integers held as float32 (int_valued_) go through casts, views, comparisons and logic, which give the integer
  // result exactly; integer arithmetic (Div truncates, Mul may pass 2^24) is refused, not computed in float.
  static const auto* kIntegerSafe = new std::set<std::string>{
      "Cast", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Slice", "Split", "Gather", "Transpose", "Flatten",
      "Identity", "Concat", "Shape", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or",
      "Xor", "Where"};
  bool integer_in = false;
  for (int k = 0; k < n.input_size(); ++k) {
    if (!int_valued_.contains(n.input(k))) continue;
    if (!kIntegerSafe->contains(t) || (t == "Where" && k > 0)) {
      return Refuse(absl::StrCat("integer arithmetic on '", n.input(k), "' (Loom holds integers as float32: it reads "
                                 "them through casts, views, comparisons and logic only)"));
    }
    integer_in = true;
  }
  // A view of integers holds integers (an attention mask unsqueezed and expanded); Cast and the logic ops mark
  // their own outputs.
  if (integer_in && (t == "Unsqueeze" || t == "Squeeze" || t == "Reshape" || t == "Expand" || t == "Slice" ||
                     t == "Split" || t == "Gather" || t == "Transpose" || t == "Flatten" || t == "Identity" ||
                     t == "Concat")) {
    for (const std::string& o : n.output()) int_valued_.insert(o);
  }
  absl::StatusOr<bool> folded = FoldShapeArithmetic(n, a);
  if (!folded.ok()) return folded.status();
  if (*folded) {
    if (const std::string unread = a.Unread(); !unread.empty()) {
      return Refuse(absl::StrCat("attribute '", unread, "' is not supported"));
    }
    return absl::OkStatus();
  }
  auto unary = [&](OpType type) -> absl::Status {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    absl::StatusOr<std::string> y = Emit(type, {*x}, out, [](OpDef&) {});
    if (!y.ok()) return y.status();
    alias_[out] = *y;
    return absl::OkStatus();
  };
  auto binary = [&](OpType type) -> absl::Status {
    if (n.input_size() != 2) return Refuse("takes 2 inputs");
    absl::StatusOr<std::string> x = Activation(n.input(0), "input A");
    if (!x.ok()) return x.status();
    absl::StatusOr<std::string> y = Activation(n.input(1), "input B");
    if (!y.ok()) return y.status();
    // Before opset 7, Add and Mul broadcast B only when `broadcast` says so, aligned at `axis` of A (default: its
    // trailing dims, as numpy); B is reshaped so numpy broadcasting means the same.
    const bool legacy = opset_ < 7 && a.Int("broadcast", 0) != 0;
    const onnx::AttributeProto* axis = legacy ? a.Get("axis") : nullptr;
    if (axis != nullptr) {
      const Shape sa = Shapes(*x), sb = Shapes(*y);
      int64_t at = axis->i() < 0 ? axis->i() + static_cast<int64_t>(sa.size()) : axis->i();
      if (at < 0 || at + static_cast<int64_t>(sb.size()) > static_cast<int64_t>(sa.size())) {
        return Refuse("legacy broadcast axis out of range");
      }
      Shape aligned = sb;
      aligned.resize(sa.size() - at, 1);
      absl::StatusOr<std::string> r = Reshape(*y, aligned, out + "/b_aligned");
      if (!r.ok()) return r.status();
      y = r;
    }
    absl::StatusOr<std::string> z = Emit(type, {*x, *y}, out, [](OpDef&) {});
    if (!z.ok()) return z.status();
    alias_[out] = *z;
    return absl::OkStatus();
  };
  if (t == "Identity" || t == "Dropout") {
    if (t == "Dropout") {
      if (n.output_size() > 1 && !n.output(1).empty()) return Refuse("the mask output");
      a.Float("ratio", 0.5f);  // inference: no dropout, so neither ratio nor seed matters
      a.Int("seed", 0);
      if (n.input_size() > 2 && !n.input(2).empty()) {
        const Constant* mode = ConstantOf(n.input(2));
        if (mode == nullptr || mode->f.size() + mode->i.size() != 1 || (mode->is_int ? mode->i[0] : mode->f[0]) != 0) {
          return Refuse("training_mode must be a constant false");
        }
      }
    }
    if (const Constant* c = ConstantOf(n.input(0)); c != nullptr) {
      Constant copy = *c;  // before inserting: a rehash of consts_ would move what c points to
      consts_[out] = std::move(copy);
    } else {
      absl::StatusOr<std::string> x = Activation(n.input(0), "input");
      if (!x.ok()) return x.status();
      alias_[out] = *x;
    }
  } else if (t == "Constant") {
    const onnx::AttributeProto* v = a.Get("value");
    if (v == nullptr) return Refuse("only the 'value' attribute (a tensor) is supported");
    absl::StatusOr<Constant> c = FromTensorProto(v->t(), absl::StrCat(file_, ": node '", node_name_, "' value"));
    if (!c.ok()) return c.status();
    consts_[out] = *std::move(c);
  } else if (auto one = OneToOneOps().find(t); one != OneToOneOps().end()) {
    s = one->second.inputs == 1 ? unary(one->second.type) : binary(one->second.type);
  } else if (t == "Gemm") {
    s = Gemm(n, a);
  } else if (t == "Softmax") {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    const Shape shape = Shapes(*x);
    int64_t axis = a.Int("axis", opset_ >= 13 ? -1 : 1);
    if (axis < 0) axis += static_cast<int64_t>(shape.size());
    if (axis < 0 || axis >= static_cast<int64_t>(shape.size())) return Refuse("axis out of range");
    absl::StatusOr<std::string> y;
    if (opset_ >= 13) {
      y = Emit(SOFTMAX, {*x}, out, [&](OpDef& op) { op.mutable_axis()->set_axis(static_cast<int>(axis)); });
    } else {  // before opset 13: over the flattened dims [axis, rank) of a 2-D view
      const Shape view{Elements(Shape(shape.begin(), shape.begin() + axis)),
                       Elements(Shape(shape.begin() + axis, shape.end()))};
      y = Reshape(*x, view, out + "/2d");
      if (y.ok()) y = Emit(SOFTMAX, {*y}, out + "/softmax", [](OpDef& op) { op.mutable_axis()->set_axis(1); });
      if (y.ok()) y = Reshape(*y, shape, out);
    }
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "Transpose") {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    std::vector<int64_t> perm = a.Ints("perm");
    if (perm.empty()) {
      for (int64_t d = static_cast<int64_t>(Shapes(*x).size()) - 1; d >= 0; --d) perm.push_back(d);
    }
    absl::StatusOr<std::string> y = Transpose(*x, std::vector<int>(perm.begin(), perm.end()), out);
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "Reshape" || t == "Flatten") {
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    const Shape in = Shapes(*x);
    Shape shape;
    if (t == "Flatten") {
      int64_t axis = a.Int("axis", 1);
      if (axis < 0) axis += static_cast<int64_t>(in.size());
      if (axis < 0 || axis > static_cast<int64_t>(in.size())) return Refuse("axis out of range");
      shape = {Elements(Shape(in.begin(), in.begin() + axis)), Elements(Shape(in.begin() + axis, in.end()))};
    } else {
      Constant legacy;  // before opset 5 the shape is an attribute
      if (opset_ < 5) {
        legacy.is_int = true;
        legacy.i = a.Ints("shape");
      }
      const Constant* c = opset_ < 5 ? &legacy : n.input_size() > 1 ? ConstantOf(n.input(1)) : nullptr;
      if (c == nullptr || !c->is_int) return Refuse("the shape must be a constant int64 tensor (an initializer)");
      const bool allow_zero = a.Int("allowzero", 0) != 0;
      int infer = -1;
      for (size_t d = 0; d < c->i.size(); ++d) {
        int64_t v = c->i[d];
        if (v == 0 && !allow_zero) {
          if (d >= in.size()) return Refuse("a 0 in the shape past the input's rank");
          v = in[d];
        } else if (v == -1) {
          if (infer >= 0) return Refuse("two -1 in the shape");
          infer = static_cast<int>(d);
          v = 1;
        } else if (v < 0) {
          return Refuse(absl::StrCat("shape value ", v));
        }
        shape.push_back(v);
      }
      if (infer >= 0) {
        const int64_t known = Elements(shape);
        if (known == 0 || Elements(in) % known != 0) return Refuse("cannot infer the -1 dimension");
        shape[infer] = Elements(in) / known;
      }
    }
    absl::StatusOr<std::string> y = Reshape(*x, shape, out);
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "ReduceMean" || t == "ReduceSum" || t == "ReduceMax" || t == "ReduceSumSquare" || t == "ReduceL1" ||
             t == "ReduceL2" || t == "ReduceLogSum" || t == "ReduceLogSumExp") {
    s = Reduce(n, a);
  } else if (t == "LogSoftmax") {
    s = LogSoftmax(n, a);
  } else if (t == "Neg" || t == "Reciprocal") {  // -x as x * -1 (exact, signed zeros too), 1 / x as a DIV
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    absl::StatusOr<std::string> y =
        t == "Neg" ? Emit(MUL, {*x, NewWeight(out + "/minus_one", {1}, {-1.0f})}, out, [](OpDef&) {})
                   : Emit(DIV, {NewWeight(out + "/one", {1}, {1.0f}), *x}, out, [](OpDef&) {});
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "Pow") {
    // A constant exponent of one element (what exporters write: GELU's tanh form cubes, norms square, `x ** 0.5`):
    // 1, 2, 3 and -1 as products and a quotient, 0.5 and -0.5 as a square root (and its reciprocal: pow differs only
    // at -inf, inf where sqrt gives NaN, and at -0, +0 where sqrt keeps the sign); any other is refused naming it
    // (the IR has no log).
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    const Constant* c = n.input_size() > 1 ? ConstantOf(n.input(1)) : nullptr;
    if (c == nullptr || Elements(c->shape) != 1 || c->shape.size() > Shapes(*x).size()) {
      return Refuse("the exponent must be a constant of one element");
    }
    const double e = c->is_int ? static_cast<double>(c->i[0]) : c->f[0];
    absl::StatusOr<std::string> y;
    if (e == 1) {
      y = Reshape(*x, Shapes(*x), out);
    } else if (e == 2 || e == 3) {
      y = Emit(MUL, {*x, *x}, e == 2 ? out : out + "/square", [](OpDef&) {});
      if (y.ok() && e == 3) y = Emit(MUL, {*y, *x}, out, [](OpDef&) {});
    } else if (e == -1) {
      y = Emit(DIV, {NewWeight(out + "/one", {1}, {1.0f}), *x}, out, [](OpDef&) {});
    } else if (e == 0.5 || e == -0.5) {
      y = Emit(SQRT, {*x}, e > 0 ? out : out + "/sqrt", [](OpDef&) {});
      if (y.ok() && e < 0) y = Emit(DIV, {NewWeight(out + "/one", {1}, {1.0f}), *y}, out, [](OpDef&) {});
    } else {
      return Refuse(absl::StrCat("exponent ", e, " (Loom raises to the powers 1, 2, 3, -1, 0.5 and -0.5)"));
    }
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "Squeeze" || t == "Unsqueeze") {
    // Static shapes: a RESHAPE. Axes: an attribute before opset 13, then a constant int64 input (Squeeze's
    // optional: every dimension of size 1).
    absl::StatusOr<std::string> x = Activation(n.input(0), "input");
    if (!x.ok()) return x.status();
    const Shape in = Shapes(*x);
    absl::StatusOr<std::vector<int64_t>> axes = AxesOf(n, a, 13);
    if (!axes.ok()) return axes.status();
    absl::StatusOr<Shape> squeezed = SqueezedShape(in, *axes, t == "Unsqueeze");
    if (!squeezed.ok()) return Refuse(std::string(squeezed.status().message()));
    Shape shape = *squeezed;
    if (shape.empty()) shape.push_back(1);  // a rank-0 result is a one-element vector (as rank-0 constants are)
    absl::StatusOr<std::string> y = Reshape(*x, shape, out);
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "Concat") {
    std::vector<std::string> inputs;
    for (int k = 0; k < n.input_size(); ++k) {
      absl::StatusOr<std::string> x = Activation(n.input(k), "input");
      if (!x.ok()) return x.status();
      inputs.push_back(*x);
    }
    const onnx::AttributeProto* axis = a.Get("axis");
    if (axis == nullptr && opset_ >= 4) return Refuse("needs the axis attribute");
    const int64_t at = axis != nullptr ? axis->i() : 1;  // before opset 4: 1 by default
    absl::StatusOr<std::string> y = Emit(CONCAT, inputs, out, [&](OpDef& op) {
      op.mutable_axis()->set_axis(static_cast<int>(at));
    });
    if (!y.ok()) return y.status();
    alias_[out] = *y;
  } else if (t == "Conv" || t == "MaxPool" || t == "AveragePool" || t == "GlobalAveragePool" || t == "GlobalMaxPool") {
    s = Spatial(n, a);
  } else if (t == "BatchNormalization") {
    s = BatchNorm(n, a);
  } else if (t == "LayerNormalization") {
    s = LayerNorm(n, a);
  } else if (t == "Gelu") {
    s = Gelu(n, a);
  } else if (t == "Clip" || t == "HardSigmoid" || t == "HardSwish" || t == "Max" || t == "Min" || t == "LeakyRelu" ||
             t == "PRelu" || t == "Abs") {
    s = Clamp(n, a);
  } else if (t == "Greater" || t == "Less" || t == "GreaterOrEqual" || t == "LessOrEqual" || t == "And" ||
             t == "Or" || t == "Xor" || t == "ThresholdedRelu" || t == "IsNaN") {
    s = Logic(n, a);
  } else if (t == "Elu" || t == "Selu" || t == "Celu" || t == "Softplus" || t == "Softsign" || t == "Mish") {
    s = Exponential(n, a);
  } else if (t == "Slice" || t == "Split" || t == "Gather") {
    s = Slicing(n, a);
  } else if (t == "Expand") {
    s = Expand(n);
  } else if (t == "Pad") {
    s = Pad(n, a);
  } else if (t == "ConvTranspose") {
    s = ConvTranspose(n, a);
  } else if (t == "Resize" || t == "Upsample") {
    s = Resize(n, a);
  } else {
    return Refuse("op type not supported (supported: " + absl::StrJoin(OnnxSupportedOps(), ", ") + ")");
  }
  if (!s.ok()) return s;
  if (const std::string unread = a.Unread(); !unread.empty()) {
    return Refuse(absl::StrCat("attribute '", unread, "' is not supported"));
  }
  return absl::OkStatus();
}

namespace {

namespace fs = std::filesystem;

// Bytes per element of the tensor types FromTensorProto reads (0: another type, refused there).
uint64_t ElementBytes(int32_t data_type) {
  switch (data_type) {
    case onnx::TensorProto::FLOAT:
    case onnx::TensorProto::INT32: return 4;
    case onnx::TensorProto::INT64: return 8;
    case onnx::TensorProto::BOOL: return 1;
    default: return 0;
  }
}

// Reads every tensor the model stores outside its file (initializers and Constant nodes' `value`, as exporters
// write them for models past 2 GB or with opset 18's default) into raw_data. A location is a path relative to the
// model's folder and must stay inside it (no absolute path, no "..", no link out of it); offset and length are
// checked against the file and the tensor's size before anything is read.
absl::Status ReadExternalData(const std::string& model_path, onnx::ModelProto* m) {
  const fs::path dir = fs::path(model_path).parent_path().empty() ? fs::path(".") : fs::path(model_path).parent_path();
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(model_path, ": cannot resolve its folder: ", ec.message()));
  std::map<std::string, std::string> files;  // location -> its bytes (read once)
  auto resolve = [&](onnx::TensorProto* t, const std::string& what) -> absl::Status {
    if (t->data_location() != onnx::TensorProto::EXTERNAL) return absl::OkStatus();
    std::string location;
    uint64_t offset = 0, length = 0;
    bool has_length = false;
    for (const onnx::StringStringEntryProto& e : t->external_data()) {
      if (e.key() == "location") {
        location = e.value();
      } else if (e.key() == "offset" || e.key() == "length") {
        uint64_t v = 0;
        if (!absl::SimpleAtoi(e.value(), &v)) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": external_data ", e.key(), " '", e.value(),
                                                         "' is not a byte count"));
        }
        (e.key() == "offset" ? offset : length) = v;
        has_length = has_length || e.key() == "length";
      } else if (e.key() != "checksum") {
        return absl::InvalidArgumentError(absl::StrCat(what, ": external_data key '", e.key(), "' is not read"));
      }
    }
    const fs::path rel(location);
    if (location.empty() || rel.is_absolute() || rel.has_root_name()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": external_data location '", location,
                                                     "' must be a file name relative to the model's folder"));
    }
    const fs::path path = fs::weakly_canonical(root / rel, ec);
    const auto [mismatch, unused] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
    if (ec || mismatch != root.end() || path == root) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": external_data location '", location,
                                                     "' leads out of the model's folder ", root.string()));
    }
    auto file = files.find(location);
    if (file == files.end()) {
      absl::StatusOr<std::string> bytes = ReadFile(path.string());
      if (!bytes.ok()) {
        return absl::NotFoundError(absl::StrCat(what, ": external_data file '", location, "': ",
                                                bytes.status().message()));
      }
      file = files.emplace(location, *std::move(bytes)).first;
    }
    const uint64_t size = file->second.size();
    const uint64_t element = ElementBytes(t->data_type());
    uint64_t expected = element;
    for (int64_t d : t->dims()) {
      if (d < 0 || (d > 0 && expected > (uint64_t{1} << 40) / static_cast<uint64_t>(d))) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": dimension ", d, " is out of range"));
      }
      expected *= static_cast<uint64_t>(d);
    }
    if (!has_length) length = offset <= size ? size - offset : 0;
    if (offset > size || length > size - offset) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": external_data bytes [", offset, ", +", length,
                                                     ") run past the end of '", location, "' (", size, " bytes)"));
    }
    if (element != 0 && length != expected) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": external_data holds ", length, " bytes, the tensor's ",
                                                     "shape and type need ", expected));
    }
    t->set_raw_data(file->second.substr(offset, length));
    t->clear_external_data();
    t->set_data_location(onnx::TensorProto::DEFAULT);
    return absl::OkStatus();
  };
  onnx::GraphProto* g = m->mutable_graph();
  for (onnx::TensorProto& t : *g->mutable_initializer()) {
    if (absl::Status s = resolve(&t, absl::StrCat(model_path, ": initializer '", t.name(), "'")); !s.ok()) return s;
  }
  for (onnx::NodeProto& n : *g->mutable_node()) {
    for (onnx::AttributeProto& a : *n.mutable_attribute()) {
      if (!a.has_t()) continue;
      if (absl::Status s = resolve(a.mutable_t(), absl::StrCat(model_path, ": node '", n.name(), "' attribute '",
                                                               a.name(), "'"));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

}  // namespace onnx_internal

using onnx_internal::Importer;

std::vector<std::string> OnnxSupportedOps() {
  std::vector<std::string> ops(std::begin(onnx_internal::kComposedOps), std::end(onnx_internal::kComposedOps));
  for (const auto& [name, op] : onnx_internal::OneToOneOps()) ops.push_back(name);
  std::sort(ops.begin(), ops.end());
  return ops;
}

namespace onnx_internal {
absl::Status ParseModel(const std::string& bytes, const std::string& name, onnx::ModelProto* m) {
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty file, not an ONNX model"));
  if (!m->ParseFromString(bytes)) return absl::InvalidArgumentError(absl::StrCat(name, ": not an ONNX model file"));
  // Bytes that happen to parse as a protobuf (a file of zeros, another message) are not a model: a model has a
  // graph.
  if (!m->has_graph()) return absl::InvalidArgumentError(absl::StrCat(name, ": not an ONNX model file (no graph)"));
  return absl::OkStatus();
}
}  // namespace onnx_internal

absl::StatusOr<OnnxModel> ImportOnnxBytes(const std::string& bytes, const std::string& name, bool cancel_transposes) {
  onnx::ModelProto m;
  if (absl::Status s = onnx_internal::ParseModel(bytes, name, &m); !s.ok()) return s;
  return Importer(name, cancel_transposes).Run(m);
}

absl::StatusOr<OnnxModel> ImportOnnx(const std::string& path) {
  absl::StatusOr<std::string> bytes = onnx_internal::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  onnx::ModelProto m;
  if (absl::Status s = onnx_internal::ParseModel(*bytes, path, &m); !s.ok()) return s;
  if (absl::Status s = onnx_internal::ReadExternalData(path, &m); !s.ok()) return s;
  return Importer(path, true).Run(m);
}

absl::StatusOr<HostTensor> ReadOnnxTensor(const std::string& path) {
  absl::StatusOr<std::string> bytes = onnx_internal::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  onnx::TensorProto t;
  if (!t.ParseFromString(*bytes)) return absl::InvalidArgumentError(absl::StrCat(path, ": not an ONNX tensor"));
  absl::StatusOr<onnx_internal::Constant> c = onnx_internal::FromTensorProto(t, path);
  if (!c.ok()) return c.status();
  if (c->is_int && t.data_type() == onnx::TensorProto::BOOL) {  // Loom's bools are 0 / 1 floats (comparisons)
    return HostTensor::FromF32(c->shape, std::vector<float>(c->i.begin(), c->i.end()));
  }
  if (c->is_int) {  // int64 / int32 values (embedding ids) as i32, as the graph's integer inputs are
    std::vector<int32_t> values;
    for (int64_t v : c->i) {
      if (v < INT32_MIN || v > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": value ", v, " is outside int32"));
      }
      values.push_back(static_cast<int32_t>(v));
    }
    return HostTensor::FromI32(c->shape, std::move(values));
  }
  return HostTensor::FromF32(c->shape, c->f);
}

}  // namespace loom::graph
