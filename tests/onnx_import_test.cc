// The ONNX importer on small hand-built models (tests/onnx_builders.h): file features (external data, rank-0
// constants, opsets, every unsupported op named at once), the layout pass's transposes, BatchNormalization and
// LayerNormalization, and what folds at import (shape arithmetic, arithmetic on constants, masks), against the graph
// oracle. The op mappings: onnx_ops_test.cc; ONNX's own backend data: onnx_backend_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/evaluator.h"
#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"
#include "runtime/gpu_backend.h"
#include "runtime/graph_runner.h"
#include "scheduler/compiler.h"
#include "tests/onnx_builders.h"
#include "tests/onnx_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using namespace onnx_test;  // NOLINT: the tests' helpers

// Conv -> BatchNormalization folds into the Conv's weights and bias when the BN is the Conv's only reader: the same
// outputs as the unfolded form (the Conv's output also read elsewhere), and no MUL left in the graph.
TEST(OnnxImport, BatchNormFoldsIntoItsConv) {
  auto model = [](bool conv_is_output) {
    onnx::ModelProto p;
    p.add_opset_import()->set_version(13);
    onnx::GraphProto* g = p.mutable_graph();
    AddValue(g->add_input(), "x", {2, 3, 6, 5});
    *g->add_initializer() = FloatTensor("w", {4, 3, 3, 3}, Ramp(4 * 3 * 3 * 3, 0.37f, 0.0f));
    *g->add_initializer() = FloatTensor("b", {4}, {0.1f, -0.2f, 0.3f, 0.0f});
    *g->add_initializer() = FloatTensor("scale", {4}, {1.5f, 0.5f, -1.0f, 2.0f});
    *g->add_initializer() = FloatTensor("shift", {4}, {0.0f, 1.0f, -1.0f, 0.5f});
    *g->add_initializer() = FloatTensor("mean", {4}, {0.2f, -0.1f, 0.0f, 0.3f});
    *g->add_initializer() = FloatTensor("var", {4}, {1.0f, 0.5f, 2.0f, 0.25f});
    onnx::NodeProto* conv = g->add_node();
    conv->set_op_type("Conv");
    for (const char* i : {"x", "w", "b"}) conv->add_input(i);
    conv->add_output("c");
    onnx::AttributeProto* pads = conv->add_attribute();
    pads->set_name("pads");
    pads->set_type(onnx::AttributeProto::INTS);
    for (int v : {1, 0, 1, 2}) pads->add_ints(v);
    onnx::NodeProto* bn = g->add_node();
    bn->set_op_type("BatchNormalization");
    for (const char* i : {"c", "scale", "shift", "mean", "var"}) bn->add_input(i);
    bn->add_output("y");
    AddValue(g->add_output(), "y", {2, 4, 6, 6});
    if (conv_is_output) AddValue(g->add_output(), "c", {2, 4, 6, 6});
    return p.SerializeAsString();
  };
  absl::StatusOr<graph::OnnxModel> folded = graph::ImportOnnxBytes(model(false), "folded.onnx");
  absl::StatusOr<graph::OnnxModel> plain = graph::ImportOnnxBytes(model(true), "plain.onnx");
  ASSERT_TRUE(folded.ok()) << folded.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  int muls = 0;
  for (const graph::OpDef& op : folded->graph.def().ops()) muls += op.type() == graph::MUL;
  EXPECT_EQ(muls, 0);
  const graph::HostTensor x = graph::HostTensor::FromF32({2, 3, 6, 5}, Ramp(2 * 3 * 6 * 5, 0.11f, 0.5f));
  const std::vector<float> a = Evaluate(*folded, x, 0), b = Evaluate(*plain, x, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * (1 + std::fabs(b[i]))) << i;
}

// LayerNormalization with its Y output only (the backend cases all ask for Mean and InvStdDev as well), over the
// last two dims of [2, 3, 4], against the formula.
TEST(OnnxImport, LayerNormalizationOverTrailingDims) {
  onnx::ModelProto p;
  p.add_opset_import()->set_version(17);
  onnx::GraphProto* g = p.mutable_graph();
  AddValue(g->add_input(), "x", {2, 3, 4});
  *g->add_initializer() = FloatTensor("s", {3, 4}, Ramp(12, 0.5f, 1.0f));
  *g->add_initializer() = FloatTensor("b", {3, 4}, Ramp(12, 0.3f, 0.0f));
  onnx::NodeProto* n = g->add_node();
  n->set_op_type("LayerNormalization");
  for (const char* i : {"x", "s", "b"}) n->add_input(i);
  n->add_output("y");
  onnx::AttributeProto* axis = n->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  AddValue(g->add_output(), "y", {2, 3, 4});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(p.SerializeAsString(), "ln.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<float> xv = Ramp(24, 0.7f, 0.2f), s = Ramp(12, 0.5f, 1.0f), b = Ramp(12, 0.3f, 0.0f);
  const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 3, 4}, xv), 0);
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 12; ++i) mean += xv[r * 12 + i] / 12.0;
    for (int i = 0; i < 12; ++i) var += (xv[r * 12 + i] - mean) * (xv[r * 12 + i] - mean) / 12.0;
    for (int i = 0; i < 12; ++i) {
      const double want = (xv[r * 12 + i] - mean) / std::sqrt(var + 1e-5) * s[i] + b[i];
      EXPECT_NEAR(y[r * 12 + i], want, 1e-4) << r << "," << i;
    }
  }
}


onnx::NodeProto* AddNode(onnx::GraphProto* g, const std::string& type, std::vector<std::string> in,
                         const std::string& out) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(type);
  for (const std::string& i : in) n->add_input(i);
  n->add_output(out);
  return n;
}

// A residual block as ResNet has it (Conv, BatchNormalization, Relu, MaxPool, Conv, Add, Relu, GlobalAveragePool,
// Flatten, Gemm): after import the network is NHWC from its input's transpose on, with no other TRANSPOSE left,
// and computes exactly what the transposed-pair form does.
TEST(OnnxImport, TransposesCancelThroughAResidualBlock) {
  onnx::ModelProto p;
  p.add_opset_import()->set_version(13);
  onnx::GraphProto* g = p.mutable_graph();
  AddValue(g->add_input(), "x", {2, 4, 8, 8});
  *g->add_initializer() = FloatTensor("w1", {8, 4, 3, 3}, Ramp(8 * 4 * 9, 0.21f, 0.0f));
  *g->add_initializer() = FloatTensor("w2", {8, 8, 3, 3}, Ramp(8 * 8 * 9, 0.13f, -0.05f));
  *g->add_initializer() = FloatTensor("fc", {5, 8}, Ramp(40, 0.7f, 0.1f));
  *g->add_initializer() = FloatTensor("fc_b", {5}, Ramp(5, 1.1f, 0.0f));
  for (const char* name : {"s", "b", "m", "v"}) {
    *g->add_initializer() = FloatTensor(name, {8}, Ramp(8, 0.9f, std::string(name) == "v" ? 2.0f : 0.5f));
  }
  IntsAttr(AddNode(g, "Conv", {"x", "w1"}, "c1"), "pads", {1, 1, 1, 1});
  AddNode(g, "BatchNormalization", {"c1", "s", "b", "m", "v"}, "n1");
  AddNode(g, "Relu", {"n1"}, "r1");
  onnx::NodeProto* pool = AddNode(g, "MaxPool", {"r1"}, "p1");
  IntsAttr(pool, "kernel_shape", {2, 2});
  IntsAttr(pool, "strides", {2, 2});
  IntsAttr(AddNode(g, "Conv", {"p1", "w2"}, "c2"), "pads", {1, 1, 1, 1});
  AddNode(g, "Add", {"c2", "p1"}, "a");
  AddNode(g, "Relu", {"a"}, "r2");
  AddNode(g, "GlobalAveragePool", {"r2"}, "gap");
  AddNode(g, "Flatten", {"gap"}, "f");
  onnx::NodeProto* gemm = AddNode(g, "Gemm", {"f", "fc", "fc_b"}, "y");
  onnx::AttributeProto* tb = gemm->add_attribute();
  tb->set_name("transB");
  tb->set_type(onnx::AttributeProto::INT);
  tb->set_i(1);
  AddValue(g->add_output(), "y", {2, 5});
  absl::StatusOr<graph::OnnxModel> nhwc = graph::ImportOnnxBytes(p.SerializeAsString(), "block.onnx");
  absl::StatusOr<graph::OnnxModel> pairs = graph::ImportOnnxBytes(p.SerializeAsString(), "block.onnx", false);
  ASSERT_TRUE(nhwc.ok()) << nhwc.status();
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  auto count = [](const graph::OnnxModel& m, graph::OpType type) {
    int n = 0;
    for (const graph::OpDef& op : m.graph.def().ops()) n += op.type() == type;
    return n;
  };
  EXPECT_EQ(count(*pairs, graph::TRANSPOSE), 8);  // around two convolutions and two pools
  EXPECT_EQ(count(*nhwc, graph::TRANSPOSE), 1) << nhwc->graph.def().DebugString();  // the input's
  const graph::HostTensor x = graph::HostTensor::FromF32({2, 4, 8, 8}, Ramp(2 * 4 * 64, 0.05f, 0.0f));
  const std::vector<float> a = Evaluate(*nhwc, x, 0), b = Evaluate(*pairs, x, 0);
  ASSERT_EQ(a.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

// A transpose sinks past an ADD with a constant operand (a per-channel bias [C, 1, 1], permuted for NHWC) and a
// channel CONCAT, and twin transposes of one input merge, so Conv -> Add -> Mul -> Relu and a second Conv of the
// same input, concatenated, then MaxPool keep only the input's transpose and the output's.
TEST(OnnxImport, TransposesSinkPastConstantOperands) {
  onnx::ModelProto p;
  p.add_opset_import()->set_version(13);
  onnx::GraphProto* g = p.mutable_graph();
  AddValue(g->add_input(), "x", {1, 3, 6, 6});
  *g->add_initializer() = FloatTensor("w", {4, 3, 3, 3}, Ramp(4 * 27, 0.3f, 0.0f));
  *g->add_initializer() = FloatTensor("bias", {4, 1, 1}, {0.5f, -1.0f, 0.25f, 2.0f});
  *g->add_initializer() = FloatTensor("scale", {1, 4, 1, 1}, {1.0f, 2.0f, -1.0f, 0.5f});
  AddNode(g, "Conv", {"x", "w"}, "c");
  AddNode(g, "Add", {"c", "bias"}, "a");
  AddNode(g, "Mul", {"scale", "a"}, "m");  // the constant first
  AddNode(g, "Relu", {"m"}, "r");
  AddNode(g, "Conv", {"x", "w"}, "c2");
  onnx::NodeProto* cat = AddNode(g, "Concat", {"r", "c2"}, "cat");  // channels of two NHWC maps
  onnx::AttributeProto* axis = cat->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  onnx::NodeProto* pool = AddNode(g, "MaxPool", {"cat"}, "y");
  IntsAttr(pool, "kernel_shape", {2, 2});
  AddValue(g->add_output(), "y", {1, 8, 3, 3});
  absl::StatusOr<graph::OnnxModel> nhwc = graph::ImportOnnxBytes(p.SerializeAsString(), "bias.onnx");
  absl::StatusOr<graph::OnnxModel> pairs = graph::ImportOnnxBytes(p.SerializeAsString(), "bias.onnx", false);
  ASSERT_TRUE(nhwc.ok()) << nhwc.status();
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  int transposes = 0;
  for (const graph::OpDef& op : nhwc->graph.def().ops()) transposes += op.type() == graph::TRANSPOSE;
  EXPECT_EQ(transposes, 2) << nhwc->graph.def().DebugString();  // x's (one for both convolutions) and y's
  EXPECT_FALSE(nhwc->weights.contains("bias"));  // replaced by its permuted copy
  const graph::HostTensor x = graph::HostTensor::FromF32({1, 3, 6, 6}, Ramp(108, 0.17f, 0.0f));
  const std::vector<float> a = Evaluate(*nhwc, x, 0), b = Evaluate(*pairs, x, 0);
  ASSERT_EQ(a.size(), 72u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

// torch.onnx.export shares one initializer between convs through Identity nodes (ResNet-18's biases): every
// Identity of a constant is that constant, however many there are (each used to be copied out of the constants'
// hash map while inserting into it; a rehash left a garbage shape).
TEST(OnnxImport, ManyIdentitiesOfOneInitializer) {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(13);
  onnx::GraphProto* g = proto.mutable_graph();
  *g->add_initializer() = FloatTensor("b", {4}, {1, 2, 3, 4});
  AddValue(g->add_input(), "x", {4});
  constexpr int kIdentities = 200;
  for (int i = 0; i < kIdentities; ++i) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Identity");
    n->add_input("b");
    n->add_output(absl::StrCat("b", i));
  }
  onnx::NodeProto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input(absl::StrCat("b", kIdentities - 1));
  add->add_output("y");
  AddValue(g->add_output(), "y", {4});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "ids.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({4}, {10, 20, 30, 40}), 0), (std::vector<float>{11, 22, 33, 44}));
}

// Weights outside the model file (what torch.onnx.export writes with opset 18 or past 2 GB): an initializer and a
// Constant's value in `w.data` beside the model, at offsets; the same results as the weights inline. Every way a
// location or a byte range can lie is refused naming the tensor, before anything is read out of the folder.
TEST(OnnxImport, ExternalDataBesideTheModel) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("loom_onnx_external_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "m");
  const std::vector<float> b = {1, 2, 3, 4}, c = {0.5f, 0.25f, 2, 4};
  std::string data(16, '\x7f');  // 16 bytes of padding, then b, then c
  data.append(reinterpret_cast<const char*>(b.data()), 16);
  data.append(reinterpret_cast<const char*>(c.data()), 16);
  std::ofstream(dir / "m" / "w.data", std::ios::binary) << data;
  auto external = [](onnx::TensorProto* t, const std::string& location, const std::string& offset,
                     const std::string& length) {
    t->clear_float_data();
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* key, const std::string& value) {
      if (value.empty()) return;
      onnx::StringStringEntryProto* e = t->add_external_data();
      e->set_key(key);
      e->set_value(value);
    };
    add("location", location);
    add("offset", offset);
    add("length", length);
  };
  // y = (x + b) * c, b an initializer, c a Constant node's value.
  auto model = [&](const std::string& b_location, const std::string& b_offset, const std::string& b_length) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(18);
    onnx::GraphProto* g = proto.mutable_graph();
    onnx::TensorProto* bt = g->add_initializer();
    *bt = FloatTensor("b", {4}, b);
    if (!b_location.empty()) external(bt, b_location, b_offset, b_length);
    AddValue(g->add_input(), "x", {4});
    onnx::NodeProto* k = g->add_node();
    k->set_op_type("Constant");
    k->set_name("c");
    k->add_output("c");
    onnx::AttributeProto* v = k->add_attribute();
    v->set_name("value");
    v->set_type(onnx::AttributeProto::TENSOR);
    *v->mutable_t() = FloatTensor("c", {4}, c);
    external(v->mutable_t(), "w.data", "32", "");
    onnx::NodeProto* add = g->add_node();
    add->set_op_type("Add");
    add->add_input("x");
    add->add_input("b");
    add->add_output("s");
    onnx::NodeProto* mul = g->add_node();
    mul->set_op_type("Mul");
    mul->add_input("s");
    mul->add_input("c");
    mul->add_output("y");
    AddValue(g->add_output(), "y", {4});
    const fs::path path = dir / "m" / "model.onnx";
    std::ofstream(path, std::ios::binary) << proto.SerializeAsString();
    return graph::ImportOnnx(path.string());
  };
  absl::StatusOr<graph::OnnxModel> m = model("w.data", "16", "16");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({4}, {10, 20, 30, 40}), 0), (std::vector<float>{5.5f, 5.5f, 66, 176}));
  // The same bytes from the model's bytes alone (no folder): refused, not guessed.
  {
    onnx::ModelProto proto;
    std::ifstream in(dir / "m" / "model.onnx", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    absl::StatusOr<graph::OnnxModel> bytes_only = graph::ImportOnnxBytes(ss.str(), "bytes.onnx");
    ASSERT_FALSE(bytes_only.ok());
    EXPECT_NE(bytes_only.status().message().find("loaded from its file"), std::string::npos) << bytes_only.status();
  }
  std::ofstream(dir / "outside.data", std::ios::binary) << data;
  fs::create_symlink(dir / "outside.data", dir / "m" / "link.data");
  const std::vector<std::tuple<std::string, std::string, std::string, std::string>> bad = {
      {"../outside.data", "16", "16", "leads out of the model's folder"},
      {(dir / "outside.data").string(), "16", "16", "relative to the model's folder"},
      {"link.data", "16", "16", "leads out of the model's folder"},
      {"w.data", "40", "16", "run past the end of 'w.data' (48 bytes)"},
      {"w.data", "0", "12", "holds 12 bytes, the tensor's shape and type need 16"},
      {"w.data", "-4", "16", "offset '-4' is not a byte count"},
      {"missing.data", "0", "16", "external_data file 'missing.data'"},
  };
  for (const auto& [location, offset, length, why] : bad) {
    absl::StatusOr<graph::OnnxModel> r = model(location, offset, length);
    ASSERT_FALSE(r.ok()) << location;
    EXPECT_NE(r.status().message().find("initializer 'b'"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status();
  }
  fs::remove_all(dir);
}

// Rank-0 constants (an exporter's Python scalars: GELU's `x / sqrt(2)`, attention's `1 / sqrt(d)`), as an
// initializer and as a Constant node's value, broadcast as scalars.
TEST(OnnxImport, RankZeroConstantsAreScalars) {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(17);
  onnx::GraphProto* g = proto.mutable_graph();
  *g->add_initializer() = FloatTensor("two", {}, {2.0f});
  AddValue(g->add_input(), "x", {2, 3});
  onnx::NodeProto* k = g->add_node();
  k->set_op_type("Constant");
  k->add_output("half");
  onnx::AttributeProto* v = k->add_attribute();
  v->set_name("value");
  v->set_type(onnx::AttributeProto::TENSOR);
  *v->mutable_t() = FloatTensor("half", {}, {0.5f});
  onnx::NodeProto* div = g->add_node();
  div->set_op_type("Div");
  div->add_input("x");
  div->add_input("two");
  div->add_output("d");
  onnx::NodeProto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("half");
  add->add_input("d");
  add->add_output("y");
  AddValue(g->add_output(), "y", {2, 3});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "scalars.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({2, 3}, {2, 4, 6, 8, 10, 12}), 0),
            (std::vector<float>{1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f}));
}

// A file with several op types Loom does not map is refused once, naming every one (how many nodes, the first),
// other domains included, before any node is imported.
TEST(OnnxImport, EveryUnsupportedOpTypeIsNamedAtOnce) {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(17);
  onnx::GraphProto* g = proto.mutable_graph();
  AddValue(g->add_input(), "x", {4});
  auto node = [&](const std::string& type, const std::string& name, const std::string& in, const std::string& out,
                  const std::string& domain = "") {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(type);
    n->set_name(name);
    n->set_domain(domain);
    n->add_input(in);
    n->add_output(out);
  };
  node("Cos", "c1", "x", "a");
  node("Relu", "r", "a", "b");
  node("Cos", "c2", "b", "c");
  node("Sin", "", "c", "d");
  node("FusedGelu", "f", "d", "y", "com.microsoft");
  AddValue(g->add_output(), "y", {4});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "many.onnx");
  ASSERT_FALSE(m.ok());
  const std::string why(m.status().message());
  EXPECT_NE(why.find("many.onnx: 3 op types are not supported: Cos (2 nodes, the first 'c1'), Sin (node '#3 -> d'), "
                     "com.microsoft.FusedGelu (node 'f') (supported: "),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
}

// A view as exporters write it: y = x.reshape(x.shape[0], -1) through Shape -> Gather -> Unsqueeze -> Concat -> Cast
// -> Reshape, folded at import to a constant shape (a float Cast to float is the tensor itself); a Gather from a
// float tensor is refused naming what it is.
TEST(OnnxImport, ShapeArithmeticFoldsToConstants) {
  for (bool embedding : {false, true}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(13);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 3, 4});
    *g->add_initializer() = Int64Tensor("zero", {}, {0});
    *g->add_initializer() = Int64Tensor("axes0", {1}, {0});
    *g->add_initializer() = Int64Tensor("minus_one", {1}, {-1});
    auto node = [&](const std::string& type, std::vector<std::string> in, const std::string& out) {
      return AddNamedNode(g, type, in, out);
    };
    node("Shape", {"x"}, "shape");
    node("Gather", {embedding ? "x" : "shape", "zero"}, "batch");
    node("Unsqueeze", {"batch", "axes0"}, "batch1");
    node("Concat", {"batch1", "minus_one"}, "view")->add_attribute()->set_name("axis");
    onnx::AttributeProto* to = node("Cast", {"view"}, "view64")->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(onnx::TensorProto::INT64);
    onnx::AttributeProto* to_float = node("Cast", {"x"}, "xf")->add_attribute();
    to_float->set_name("to");
    to_float->set_type(onnx::AttributeProto::INT);
    to_float->set_i(onnx::TensorProto::FLOAT);
    node("Reshape", {"xf", "view64"}, "y");
    AddValue(g->add_output(), "y", {2, 12});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "view.onnx");
    if (embedding) {  // a gather from x itself is a slice of it, a float tensor the shape's Concat refuses
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'view' (Concat): input 'minus_one' is an integer tensor"),
                std::string::npos)
          << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << m.status();
    const graph::TensorDef& y = m->graph.tensor(m->outputs[0]);
    ASSERT_EQ(y.shape_size(), 2);
    EXPECT_EQ(y.shape(0), 2);
    EXPECT_EQ(y.shape(1), 12);
    std::vector<float> x(24);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
    EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({2, 3, 4}, x), 0), x);
  }
}

// Arithmetic on constants folds at import: y = x * (sqrt(c) + 1) keeps one op, the MUL by the folded constant
// (computed in f32 by the oracle's reference), and evaluates as written.
TEST(OnnxImport, ConstantSubexpressionsFoldAtImport) {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(13);
  onnx::GraphProto* g = proto.mutable_graph();
  AddValue(g->add_input(), "x", {2, 3});
  *g->add_initializer() = FloatTensor("c", {3}, {4.0f, 2.0f, 0.25f});
  *g->add_initializer() = FloatTensor("one", {}, {1.0f});
  auto node = [&](const std::string& type, std::vector<std::string> in, const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(type);
    n->set_name(out);
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
  };
  node("Sqrt", {"c"}, "root");
  node("Add", {"root", "one"}, "scale");
  node("Mul", {"x", "scale"}, "y");
  AddValue(g->add_output(), "y", {2, 3});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "fold.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->graph.def().ops_size(), 1) << "only the MUL by x is left";
  EXPECT_EQ(m->graph.def().ops(0).type(), graph::MUL);
  const std::vector<float> x = {1.0f, -2.0f, 3.0f, 0.5f, 0.0f, -8.0f};
  const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 3}, x), 0);
  const float scale[3] = {std::sqrt(4.0f) + 1.0f, std::sqrt(2.0f) + 1.0f, std::sqrt(0.25f) + 1.0f};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], x[i] * scale[i % 3]) << i;
}

// Mask and position arithmetic on constants folds at import (ConstantOfShape, Range, Equal, Not, Cast of a bool to
// float, Where): y = x * where(not(range(3) == 1), ones, 2) is one MUL by [1, 2, 1]; a Where whose constant condition
// is all true is its first operand; a mixed constant condition picking between activations is the IR's select
// (KEEP(x, c) + KEEP(x, c == 0): x again).
TEST(OnnxImport, MaskArithmeticOnConstantsFolds) {
  for (int form = 0; form < 3; ++form) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(17);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 3});
    auto node = [&](const std::string& type, std::vector<std::string> in, const std::string& out) {
      return AddNamedNode(g, type, in, out);
    };
    *g->add_initializer() = Int64Tensor("zero", {}, {0});
    *g->add_initializer() = Int64Tensor("three", {}, {3});
    *g->add_initializer() = Int64Tensor("one", {}, {1});
    *g->add_initializer() = Int64Tensor("shape", {2}, {2, 3});
    *g->add_initializer() = FloatTensor("two", {}, {2.0f});
    node("Range", {"zero", "three", "one"}, "positions");  // [0, 1, 2]
    node("Equal", {"positions", "one"}, "is_one");        // [0, 1, 0]
    node("Not", {"is_one"}, "keep");                       // [1, 0, 1]
    node("ConstantOfShape", {"shape"}, "zeros");           // float 0 by default
    onnx::NodeProto* ones = node("ConstantOfShape", {"shape"}, "ones");
    onnx::AttributeProto* value = ones->add_attribute();
    value->set_name("value"), value->set_type(onnx::AttributeProto::TENSOR);
    *value->mutable_t() = FloatTensor("v", {1}, {1.0f});
    if (form == 0) {
      node("Where", {"keep", "ones", "two"}, "scale");  // [1, 2, 1] per row
      node("Mul", {"x", "scale"}, "y");
    } else {
      node("Equal", {"positions", "positions"}, "all");  // all true
      node("Where", {form == 1 ? "all" : "keep", "x", form == 1 ? "zeros" : "x"}, "y");
    }
    AddValue(g->add_output(), "y", {2, 3});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "mask.onnx");
    ASSERT_TRUE(m.ok()) << form << ": " << m.status();
    const std::vector<float> x = {1.0f, -2.0f, 3.0f, 0.5f, 4.0f, -8.0f};
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 3}, x), 0);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], form == 0 ? x[i] * (i % 3 == 1 ? 2.0f : 1.0f) : x[i]) << i;
    if (form == 0) EXPECT_EQ(m->graph.def().ops_size(), 1) << "only the MUL by x is left";
  }
}

// Opsets past 18: a Conv-22, AveragePool-19 with dilations, Cast-21 with `saturate` on a shape and a Reshape-21,
// in one opset-27 file; the pool against its definition.
TEST(OnnxImport, OpsetsUpTo27) {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(27);
  onnx::GraphProto* g = proto.mutable_graph();
  AddValue(g->add_input(), "x", {1, 1, 5, 5});
  *g->add_initializer() = FloatTensor("w", {1, 1, 1, 1}, {2.0f});
  *g->add_initializer() = Int64Tensor("flat", {2}, {1, 9});
  auto node = [&](const std::string& type, std::vector<std::string> in, const std::string& out) {
    return AddNamedNode(g, type, in, out);
  };
  node("Conv", {"x", "w"}, "doubled");
  onnx::NodeProto* pool = node("AveragePool", {"doubled"}, "pooled");
  IntsAttr(pool, "kernel_shape", {2, 2});
  IntsAttr(pool, "dilations", {2, 2});
  onnx::NodeProto* cast = node("Cast", {"flat"}, "flat64");
  for (const auto& [name, value] : {std::pair<std::string, int64_t>{"to", onnx::TensorProto::INT64}, {"saturate", 1}}) {
    onnx::AttributeProto* a = cast->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }
  node("Reshape", {"pooled", "flat64"}, "y");
  AddValue(g->add_output(), "y", {1, 9});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "opset27.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<float> x(25);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i * i % 7);
  const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({1, 1, 5, 5}, x), 0);
  ASSERT_EQ(y.size(), 9u);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {  // taps (r, c), (r, c + 2), (r + 2, c), (r + 2, c + 2) of 2 * x
      const float sum = x[r * 5 + c] + x[r * 5 + c + 2] + x[(r + 2) * 5 + c] + x[(r + 2) * 5 + c + 2];
      EXPECT_FLOAT_EQ(y[r * 3 + c], 2.0f * sum / 4.0f) << r << "," << c;
    }
  }
}

}  // namespace
}  // namespace loom
