#include "graph/onnx_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <array>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/layout_pass.h"
#include "graph/nn_ops.h"
#include "onnx/onnx.pb.h"  // generated from libonnx-dev's onnx.proto (graph/CMakeLists.txt)

namespace loom::graph {
namespace {

constexpr int64_t kMinOpset = 1, kMaxOpset = 18;

std::string Str(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }
int64_t Elements(const Shape& s) { return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>()); }

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A tensor known at import time: an initializer or a Constant node's value.
struct Constant {
  Shape shape;
  std::vector<float> f;    // FLOAT
  std::vector<int64_t> i;  // INT64 / INT32 (shapes, axes)
  bool is_int = false;
};

absl::StatusOr<Constant> FromTensorProto(const onnx::TensorProto& t, const std::string& what) {
  Constant c;
  c.shape.assign(t.dims().begin(), t.dims().end());
  const int64_t n = Elements(c.shape);
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    return absl::UnimplementedError(absl::StrCat(what, ": external tensor data is not supported"));
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
    case onnx::TensorProto::INT32: {
      c.is_int = true;
      const bool i64 = t.data_type() == onnx::TensorProto::INT64;
      if (t.has_raw_data()) {
        const size_t width = i64 ? 8 : 4;
        if (t.raw_data().size() != static_cast<size_t>(n) * width) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": raw data of the wrong size"));
        }
        for (int64_t k = 0; k < n; ++k) {
          int64_t v = 0;
          if (i64) {
            std::memcpy(&v, t.raw_data().data() + k * 8, 8);
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

// ONNX ops that are one IR op each, with their input count.
struct OneToOne {
  OpType type;
  int inputs;
};
const std::map<std::string, OneToOne>& OneToOneOps() {
  static const auto* ops = new std::map<std::string, OneToOne>{
      {"Relu", {RELU, 1}}, {"Sigmoid", {SIGMOID, 1}}, {"Erf", {ERF, 1}}, {"Tanh", {TANH, 1}}, {"Exp", {EXP, 1}},
      {"Add", {ADD, 2}},   {"Sub", {SUB, 2}},         {"Mul", {MUL, 2}}, {"Div", {DIV, 2}},   {"MatMul", {MATMUL, 2}}};
  return *ops;
}
// The ops mapped by hand (attributes, layouts, several IR ops).
constexpr const char* kComposedOps[] = {"AveragePool", "BatchNormalization", "Concat", "Constant", "Conv",
                                        "Dropout", "Flatten", "Gemm", "GlobalAveragePool", "Identity",
                                        "LayerNormalization", "MaxPool", "Reshape", "Softmax", "Transpose"};

class Importer {
 public:
  Importer(std::string file, bool cancel_transposes)
      : file_(std::move(file)), cancel_transposes_(cancel_transposes) {}

  absl::StatusOr<OnnxModel> Run(const onnx::ModelProto& m) {
    def_.set_name(m.graph().name().empty() ? "onnx" : m.graph().name());
    for (const onnx::OperatorSetIdProto& o : m.opset_import()) {
      if (o.domain().empty() || o.domain() == "ai.onnx") opset_ = o.version();
    }
    if (opset_ < kMinOpset || opset_ > kMaxOpset) {
      return Fail(absl::StrCat("opset ", opset_, " of the default domain: Loom reads opsets ", kMinOpset, "-",
                               kMaxOpset));
    }
    const onnx::GraphProto& g = m.graph();
    for (const onnx::TensorProto& t : g.initializer()) {
      absl::StatusOr<Constant> c = FromTensorProto(t, absl::StrCat(file_, ": initializer '", t.name(), "'"));
      if (!c.ok()) return c.status();
      consts_[t.name()] = *std::move(c);
    }
    OnnxModel out;
    for (const onnx::ValueInfoProto& v : g.input()) {
      if (consts_.contains(v.name())) continue;  // an initializer listed as an input (older exporters)
      const onnx::TypeProto& type = v.type();
      if (!type.has_tensor_type() || type.tensor_type().elem_type() != onnx::TensorProto::FLOAT) {
        return Fail(absl::StrCat("input '", v.name(), "': only float32 tensors are supported"));
      }
      Shape shape;
      for (const onnx::TensorShapeProto::Dimension& d : type.tensor_type().shape().dim()) {
        if (!d.has_dim_value()) {
          return Fail(absl::StrCat("input '", v.name(), "': dimension ", shape.size(), " is symbolic ('",
                                   d.dim_param(), "'); Loom compiles static shapes"));
        }
        shape.push_back(d.dim_value());
      }
      Declare(v.name(), shape, INPUT);
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
  std::string WeightOf(const std::string& name, const Constant& c) {
    if (index_.contains(name)) return name;
    Declare(name, c.shape, WEIGHT);
    weights_[name] = HostTensor::FromF32(c.shape, c.f);
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
  absl::StatusOr<std::string> Emit(OpType type, const std::vector<std::string>& inputs, const std::string& out,
                                   SetAttrs set_attrs, const Shape& declared = {}) {
    OpDef op;
    op.set_name(Fresh(out));
    op.set_type(type);
    for (const std::string& i : inputs) op.add_inputs(i);
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
  absl::Status Spatial(const onnx::NodeProto& n, Attrs& a);
  absl::Status Gemm(const onnx::NodeProto& n, Attrs& a);
  absl::Status LayerNorm(const onnx::NodeProto& n, Attrs& a);
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
};

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

// Conv, MaxPool, AveragePool, GlobalAveragePool: NCHW around Loom's NHWC op.
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
  for (int k = 1; k < n.output_size(); ++k) {
    if (!n.output(k).empty()) return Refuse("the Mean and InvStdDev outputs");
  }
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
      consts_[out] = *c;
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
  } else if (t == "Conv" || t == "MaxPool" || t == "AveragePool" || t == "GlobalAveragePool") {
    s = Spatial(n, a);
  } else if (t == "BatchNormalization") {
    s = BatchNorm(n, a);
  } else if (t == "LayerNormalization") {
    s = LayerNorm(n, a);
  } else {
    return Refuse("op type not supported (supported: " + absl::StrJoin(OnnxSupportedOps(), ", ") + ")");
  }
  if (!s.ok()) return s;
  if (const std::string unread = a.Unread(); !unread.empty()) {
    return Refuse(absl::StrCat("attribute '", unread, "' is not supported"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> OnnxSupportedOps() {
  std::vector<std::string> ops(std::begin(kComposedOps), std::end(kComposedOps));
  for (const auto& [name, op] : OneToOneOps()) ops.push_back(name);
  std::sort(ops.begin(), ops.end());
  return ops;
}

absl::StatusOr<OnnxModel> ImportOnnxBytes(const std::string& bytes, const std::string& name, bool cancel_transposes) {
  onnx::ModelProto m;
  if (!m.ParseFromString(bytes)) return absl::InvalidArgumentError(absl::StrCat(name, ": not an ONNX model file"));
  return Importer(name, cancel_transposes).Run(m);
}

absl::StatusOr<OnnxModel> ImportOnnx(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return ImportOnnxBytes(*bytes, path);
}

absl::StatusOr<HostTensor> ReadOnnxTensor(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  onnx::TensorProto t;
  if (!t.ParseFromString(*bytes)) return absl::InvalidArgumentError(absl::StrCat(path, ": not an ONNX tensor"));
  absl::StatusOr<Constant> c = FromTensorProto(t, path);
  if (!c.ok()) return c.status();
  if (c->is_int) return absl::UnimplementedError(absl::StrCat(path, ": an integer tensor (float32 only)"));
  return HostTensor::FromF32(c->shape, c->f);
}

}  // namespace loom::graph
