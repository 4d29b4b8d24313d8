// The ONNX importer on small hand-built models (tests/onnx_builders.h): each mapping of an op or a file feature
// checked against its definition on the graph oracle, and, for the ops added past the backend data's, lowered to a
// graph pass on the CPU VM (and the GPU where there is one). ONNX's own backend data: tests/onnx_backend_test.cc.
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

namespace loom {
namespace {

namespace fs = std::filesystem;

std::vector<float> Ramp(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * scale) + offset;
  return v;
}
std::vector<float> Evaluate(const graph::OnnxModel& m, const graph::HostTensor& x, size_t output) {
  graph::Evaluator ev(m.graph, m.weights);
  EXPECT_TRUE(ev.Run({{m.inputs[0], x}}).ok());
  const graph::HostTensor& y = ev.Get(m.outputs[output]);
  std::vector<float> out(y.size());
  for (int64_t i = 0; i < y.size(); ++i) out[i] = y.Get(i);
  return out;
}

// Conv -> BatchNormalization folds into the Conv's weights and bias when the BN is the Conv's only reader: the same
// `m` compiled to a graph pass and run on `x` on the CPU VM, and on the GPU where there is one: each backend's
// first output (a failed step fails the test and ends the list).
std::vector<std::vector<float>> RunLowered(const graph::OnnxModel& m, const graph::HostTensor& x,
                                           const std::string& file) {
  std::vector<std::vector<float>> outs;
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m.graph, file, scheduler::CompileOptions());
  EXPECT_TRUE(pass.ok()) << pass.status();
  if (!pass.ok()) return outs;
  std::string why;
  for (auto backend : {runtime::GraphRunner::Backend::kCpu, runtime::GraphRunner::Backend::kGpu}) {
    if (backend == runtime::GraphRunner::Backend::kGpu && !runtime::GpuAvailable(&why)) continue;
    absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner = runtime::GraphRunner::Create(*pass, m.weights, backend);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return outs;
    absl::StatusOr<runtime::TensorMap> got = (*runner)->Run({{m.inputs[0], x}});
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return outs;
    const graph::HostTensor& y = got->at(m.outputs[0]);
    std::vector<float> values(y.size());
    for (int64_t i = 0; i < y.size(); ++i) values[i] = y.Get(i);
    outs.push_back(std::move(values));
  }
  return outs;
}

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
void IntsAttr(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
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

// Squeeze / Unsqueeze with constant axes (opset 13's inputs; opset 11's attributes) are reshapes of static shapes:
// [2, 1, 3] -> Unsqueeze(0, -1) -> [1, 2, 1, 3, 1] -> Squeeze() -> [2, 3]; a Squeeze of a dimension that is not 1
// is refused naming it.
TEST(OnnxImport, SqueezeAndUnsqueezeWithConstantAxes) {
  for (int opset : {11, 13}) {
    for (bool bad : {false, true}) {
      onnx::ModelProto proto;
      proto.add_opset_import()->set_version(opset);
      onnx::GraphProto* g = proto.mutable_graph();
      AddValue(g->add_input(), "x", {2, 1, 3});
      auto axes = [&](onnx::NodeProto* n, const std::string& name, std::vector<int64_t> values) {
        if (opset >= 13) {
          *g->add_initializer() = Int64Tensor(name, {static_cast<int64_t>(values.size())}, values);
          n->add_input(name);
          return;
        }
        onnx::AttributeProto* a = n->add_attribute();
        a->set_name("axes");
        a->set_type(onnx::AttributeProto::INTS);
        for (int64_t v : values) a->add_ints(v);
      };
      onnx::NodeProto* u = g->add_node();
      u->set_op_type("Unsqueeze");
      u->set_name("u");
      u->add_input("x");
      axes(u, "u_axes", {0, -1});
      u->add_output("u");
      onnx::NodeProto* q = g->add_node();
      q->set_op_type("Squeeze");
      q->set_name("q");
      q->add_input("u");
      if (bad) axes(q, "q_axes", {1});  // a dimension of 2
      q->add_output("y");
      AddValue(g->add_output(), "y", {2, 3});
      absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "sq.onnx");
      if (bad) {
        ASSERT_FALSE(m.ok()) << opset;
        EXPECT_NE(m.status().message().find("node 'q' (Squeeze): axis 1 has size 2, not 1"), std::string::npos)
            << m.status();
        continue;
      }
      ASSERT_TRUE(m.ok()) << opset << ": " << m.status();
      EXPECT_EQ(m->graph.tensor(m->outputs[0]).shape_size(), 2) << opset;
      EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({2, 1, 3}, {1, 2, 3, 4, 5, 6}), 0),
                (std::vector<float>{1, 2, 3, 4, 5, 6}));
    }
  }
}

// Pow with a constant exponent of one element (GELU's tanh form, as exporters write it, cubes; norms square): 2, 3
// and -1 against std::pow; 0.5 is refused naming the exponent.
TEST(OnnxImport, PowWithAConstantExponent) {
  for (float e : {2.0f, 3.0f, -1.0f, 0.5f}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(15);
    onnx::GraphProto* g = proto.mutable_graph();
    *g->add_initializer() = FloatTensor("e", {}, {e});
    AddValue(g->add_input(), "x", {4});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Pow");
    n->set_name("p");
    n->add_input("x");
    n->add_input("e");
    n->add_output("y");
    AddValue(g->add_output(), "y", {4});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "pow.onnx");
    if (e == 0.5f) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'p' (Pow): exponent 0.5"), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << e << ": " << m.status();
    const std::vector<float> x = {1.5f, -2.0f, 0.25f, 3.0f};
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({4}, x), 0);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(y[i], std::pow(x[i], e)) << e << " at " << i;
  }
}

// ReduceMean over every spatial axis (AdaptiveAvgPool2d(1) as exporters write it: axes [2, 3] or [-1, -2], an
// attribute before opset 18 and a constant input from it, with and without keepdims) is a global average pool,
// ReduceMax a global max pool; the mean over the channels is refused naming the axes.
TEST(OnnxImport, ReduceMeanOverTheSpatialAxesIsAGlobalPool) {
  struct Case {
    int opset;
    std::vector<int64_t> axes;
    bool keepdims;
    bool refused;
    bool max = false;
  };
  for (const Case& c : {Case{13, {2, 3}, true, false}, Case{18, {-1, -2}, false, false}, Case{18, {3, 2}, true, false},
                        Case{13, {1}, true, true}, Case{13, {2, 3}, false, false, true},
                        Case{18, {-2, -1}, true, false, true}}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(c.opset);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {1, 3, 2, 2});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(c.max ? "ReduceMax" : "ReduceMean");
    n->set_name("m");
    n->add_input("x");
    if (c.opset >= 18) {
      *g->add_initializer() = Int64Tensor("axes", {static_cast<int64_t>(c.axes.size())}, c.axes);
      n->add_input("axes");
    } else {
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name("axes");
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : c.axes) a->add_ints(v);
    }
    onnx::AttributeProto* k = n->add_attribute();
    k->set_name("keepdims");
    k->set_type(onnx::AttributeProto::INT);
    k->set_i(c.keepdims ? 1 : 0);
    n->add_output("y");
    AddValue(g->add_output(), "y", c.keepdims ? std::vector<int64_t>{1, 3, 1, 1} : std::vector<int64_t>{1, 3});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "mean.onnx");
    if (c.refused) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'm' (ReduceMean): the mean over axes [1] of a rank-4 input"),
                std::string::npos)
          << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << c.opset << ": " << m.status();
    EXPECT_EQ(m->graph.tensor(m->outputs[0]).shape_size(), c.keepdims ? 4 : 2);
    EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({1, 3, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40, -1, -1, -1, -1}), 0),
              (c.max ? std::vector<float>{4.0f, 40.0f, -1.0f} : std::vector<float>{2.5f, 25.0f, -1.0f}));
  }
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
      onnx::NodeProto* n = g->add_node();
      n->set_op_type(type);
      n->set_name(out);
      for (const std::string& i : in) n->add_input(i);
      n->add_output(out);
      return n;
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

// Slice (opset 9's attributes, opset 13's constant inputs with negative bounds, an end past the axis and a step of
// 2), Split (equal parts, opset 13's sizes input, opset 18's num_outputs), Gather of an activation at a scalar index
// (ViT's class token) and of a constant, against their definitions on the oracle, then lowered on the VM (and the
// GPU where there is one); a negative step and run-time indices refused by name.
TEST(OnnxImport, SliceSplitAndGather) {
  const std::vector<float> x = Ramp(2 * 6 * 4, 0.7f, 0.1f);
  auto at = [&](int64_t a, int64_t b, int64_t c) { return x[(a * 6 + b) * 4 + c]; };
  struct Case {
    std::string name;
    int opset;
    std::function<void(onnx::GraphProto*, onnx::NodeProto*)> build;
    std::vector<int64_t> out_shape;
    std::function<float(const std::vector<int64_t>&)> want;  // element at the output index
    std::string refused;
  };
  auto int_input = [](onnx::GraphProto* g, onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    *g->add_initializer() = Int64Tensor(name, {static_cast<int64_t>(v.size())}, v);
    n->add_input(name);
  };
  auto int_attr = [](onnx::NodeProto* n, const std::string& name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  };
  const std::vector<Case> cases = {
      {"Slice", 9, [](onnx::GraphProto*, onnx::NodeProto* n) {
         IntsAttr(n, "starts", {1, 0}), IntsAttr(n, "ends", {5, 3}), IntsAttr(n, "axes", {1, 2});
       }, {2, 4, 3}, [&](const std::vector<int64_t>& i) { return at(i[0], i[1] + 1, i[2]); }, ""},
      {"Slice", 13, [&](onnx::GraphProto* g, onnx::NodeProto* n) {
         int_input(g, n, "starts", {-5, 1}), int_input(g, n, "ends", {100, -1}), int_input(g, n, "axes", {1, -1});
         int_input(g, n, "steps", {2, 1});
       }, {2, 3, 2}, [&](const std::vector<int64_t>& i) { return at(i[0], 1 + 2 * i[1], 1 + i[2]); }, ""},
      {"Slice", 13, [&](onnx::GraphProto* g, onnx::NodeProto* n) {
         int_input(g, n, "starts", {5}), int_input(g, n, "ends", {0}), int_input(g, n, "axes", {1});
         int_input(g, n, "steps", {-1});
       }, {}, nullptr, "step -1"},
      {"Split", 13, [&](onnx::GraphProto* g, onnx::NodeProto* n) {  // its second output, checked
         int_attr(n, "axis", 1);
         int_input(g, n, "split", {2, 4});
         n->add_output("y2");
       }, {2, 4, 4}, [&](const std::vector<int64_t>& i) { return at(i[0], 2 + i[1], i[2]); }, ""},
      {"Split", 18, [&](onnx::GraphProto*, onnx::NodeProto* n) {  // 6 rows in 3 of 2: the second
         int_attr(n, "num_outputs", 3), int_attr(n, "axis", 1);
         n->add_output("y2"), n->add_output("y3");
       }, {2, 2, 4}, [&](const std::vector<int64_t>& i) { return at(i[0], 2 + i[1], i[2]); }, ""},
      {"Split", 18, [&](onnx::GraphProto*, onnx::NodeProto* n) {  // 6 rows in 4 of ceil(6 / 4): 2, 2, 2, 0
         int_attr(n, "num_outputs", 4), int_attr(n, "axis", 1);
         n->add_output("y2"), n->add_output("y3"), n->add_output("y4");
       }, {}, nullptr, "output 3 is empty"},
      {"Gather", 13, [&](onnx::GraphProto* g, onnx::NodeProto* n) {  // x[:, -6]
         *g->add_initializer() = Int64Tensor("index", {}, {-6});
         n->add_input("index");
         int_attr(n, "axis", 1);
       }, {2, 4}, [&](const std::vector<int64_t>& i) { return at(i[0], 0, i[1]); }, ""},
      {"Gather", 13, [&](onnx::GraphProto* g, onnx::NodeProto* n) {
         AddValue(g->add_input(), "ids", {1});
         n->add_input("ids");
       }, {}, nullptr, "the indices are not a constant"},
  };
  for (const Case& c : cases) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(c.opset);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 6, 4});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(c.name);
    n->set_name("s");
    n->add_input("x");
    n->add_output("y");
    c.build(g, n);
    const std::string checked = c.name == "Split" ? "y2" : "y";
    AddValue(g->add_output(), checked, c.out_shape.empty() ? std::vector<int64_t>{1} : c.out_shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "slice.onnx");
    const std::string what = absl::StrCat(c.name, "-", c.opset, " ", c.refused);
    if (!c.refused.empty()) {
      ASSERT_FALSE(m.ok()) << what;
      EXPECT_NE(m.status().message().find(c.refused), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << what << ": " << m.status();
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 6, 4}, x), 0);
    int64_t elements = 1;
    for (int64_t d : c.out_shape) elements *= d;
    ASSERT_EQ(y.size(), static_cast<size_t>(elements)) << what;
    std::vector<int64_t> index(c.out_shape.size(), 0);
    for (size_t e = 0; e < y.size(); ++e) {
      int64_t rest = static_cast<int64_t>(e);
      for (int d = static_cast<int>(index.size()) - 1; d >= 0; --d) index[d] = rest % c.out_shape[d], rest /= c.out_shape[d];
      ASSERT_EQ(y[e], c.want(index)) << what << " at " << e;
    }
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32({2, 6, 4}, x), "slice.onnx")) {
      ASSERT_EQ(lowered, y) << what << " lowered";
    }
  }
}

// Expand: an activation broadcast both ways ([2, 1, 4] with [3, 1, 1, 1] is [3, 2, 1, 4]), and a constant's folded
// then concatenated (ViT's class token before its patches), on the oracle and lowered on the VM (the GPU where there
// is one).
TEST(OnnxImport, ExpandOfAnActivationAndOfAConstant) {
  const std::vector<float> x = Ramp(8, 0.9f, 0.2f);
  const std::vector<float> cls = {0.5f, -1.0f, 2.0f, 0.25f};
  for (bool constant : {false, true}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(13);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 1, 4});
    *g->add_initializer() = FloatTensor("cls", {1, 1, 4}, cls);
    *g->add_initializer() = Int64Tensor("shape", {constant ? 3 : 4}, constant ? std::vector<int64_t>{2, 1, 4}
                                                                                 : std::vector<int64_t>{3, 1, 1, 1});
    onnx::NodeProto* e = g->add_node();
    e->set_op_type("Expand");
    e->set_name("e");
    e->add_input(constant ? "cls" : "x");
    e->add_input("shape");
    e->add_output(constant ? "tokens" : "y");
    if (constant) {
      onnx::NodeProto* c = g->add_node();
      c->set_op_type("Concat");
      c->set_name("c");
      c->add_input("tokens");
      c->add_input("x");
      c->add_output("y");
      onnx::AttributeProto* axis = c->add_attribute();
      axis->set_name("axis"), axis->set_type(onnx::AttributeProto::INT), axis->set_i(1);
    }
    const std::vector<int64_t> out_shape = constant ? std::vector<int64_t>{2, 2, 4} : std::vector<int64_t>{3, 2, 1, 4};
    AddValue(g->add_output(), "y", out_shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "expand.onnx");
    ASSERT_TRUE(m.ok()) << m.status();
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 1, 4}, x), 0);
    ASSERT_EQ(y.size(), constant ? 16u : 24u);
    for (size_t i = 0; i < y.size(); ++i) {
      // constant: row b is [cls, x[b]]; else element (r, b, 0, k) is x[b, 0, k]
      const float want = constant ? ((i / 4) % 2 == 0 ? cls[i % 4] : x[(i / 8) * 4 + i % 4]) : x[(i / 4) % 2 * 4 + i % 4];
      ASSERT_EQ(y[i], want) << constant << " at " << i;
    }
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32({2, 1, 4}, x), "expand.onnx")) {
      ASSERT_EQ(lowered, y) << constant;
    }
  }
}

// Pad in constant mode: opset 11's inputs (pads of H and W, begin and end differing, a constant value) and opset 2's
// attributes (the value 0 by default), on the oracle against the definition and lowered on the VM (the GPU where
// there is one); reflect mode and negative pads refused by name.
TEST(OnnxImport, PadWithAConstant) {
  const std::vector<float> x = Ramp(2 * 2 * 3, 0.8f, 0.3f);
  struct Case {
    int opset;
    std::vector<int64_t> pads;  // N, C, H, W begins, then ends
    float value;
    std::string mode, refused;
  };
  for (const Case& c : {Case{11, {0, 0, 1, 0, 0, 0, 2, 1}, 0.5f, "", ""}, Case{2, {0, 1, 0, 2, 0, 0, 1, 0}, 0.0f, "", ""},
                        Case{11, {0, 0, 1, 1, 0, 0, 1, 1}, 0.0f, "reflect", "mode 'reflect'"},
                        Case{11, {0, 0, -1, 0, 0, 0, 0, 0}, 0.0f, "", "negative pads on axis 2"}}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(c.opset);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {1, 2, 2, 3});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Pad");
    n->set_name("p");
    n->add_input("x");
    n->add_output("y");
    if (c.opset >= 11) {
      *g->add_initializer() = Int64Tensor("pads", {8}, c.pads);
      *g->add_initializer() = FloatTensor("value", {}, {c.value});
      n->add_input("pads");
      n->add_input("value");
    } else {
      IntsAttr(n, "pads", c.pads);
    }
    if (!c.mode.empty()) {
      onnx::AttributeProto* m = n->add_attribute();
      m->set_name("mode"), m->set_type(onnx::AttributeProto::STRING), m->set_s(c.mode);
    }
    std::vector<int64_t> shape = {1, 2, 2, 3};
    for (int d = 0; d < 4; ++d) shape[d] += std::max<int64_t>(0, c.pads[d]) + c.pads[d + 4];
    AddValue(g->add_output(), "y", shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "pad.onnx");
    if (!c.refused.empty()) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'p' (Pad): " + c.refused), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << m.status();
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({1, 2, 2, 3}, x), 0);
    ASSERT_EQ(y.size(), static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
    for (size_t i = 0; i < y.size(); ++i) {
      const int64_t w = i % shape[3], h = i / shape[3] % shape[2], ch = i / (shape[3] * shape[2]) % shape[1];
      const int64_t xc = ch - c.pads[1], xh = h - c.pads[2], xw = w - c.pads[3];
      const bool inside = xc >= 0 && xc < 2 && xh >= 0 && xh < 2 && xw >= 0 && xw < 3;
      ASSERT_EQ(y[i], inside ? x[(xc * 2 + xh) * 3 + xw] : c.value) << c.opset << " at " << i;
    }
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32({1, 2, 2, 3}, x), "pad.onnx")) {
      ASSERT_EQ(lowered, y) << c.opset;
    }
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
// is all true is its first operand; a mixed condition picking between activations is refused by name.
TEST(OnnxImport, MaskArithmeticOnConstantsFolds) {
  for (int form = 0; form < 3; ++form) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(17);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 3});
    auto node = [&](const std::string& type, std::vector<std::string> in, const std::string& out) {
      onnx::NodeProto* n = g->add_node();
      n->set_op_type(type);
      n->set_name(out);
      for (const std::string& i : in) n->add_input(i);
      n->add_output(out);
      return n;
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
    if (form == 2) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'y' (Where): an operand computed at run time"), std::string::npos)
          << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << form << ": " << m.status();
    const std::vector<float> x = {1.0f, -2.0f, 3.0f, 0.5f, 4.0f, -8.0f};
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 3}, x), 0);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], form == 0 ? x[i] * (i % 3 == 1 ? 2.0f : 1.0f) : x[i]) << i;
    if (form == 0) EXPECT_EQ(m->graph.def().ops_size(), 1) << "only the MUL by x is left";
  }
}

// ConvTranspose (2-D: strides 2 and 1, asymmetric pads, output_padding, 2 groups, a bias; 1-D: stride 3,
// dilation 2) against its definition scattered by hand, on the oracle and lowered on the VM (the GPU where there is
// one); a pad past the kernel's reach refused by name.
TEST(OnnxImport, ConvTransposeIsTheConvolutionOfTheSpreadInput) {
  struct Case {
    std::vector<int64_t> x, w, strides, dilations, pads, extra;
    int64_t groups;
    std::string refused;
  };
  for (const Case& c : {Case{{1, 4, 3, 2}, {4, 3, 3, 2}, {2, 1}, {1, 1}, {1, 0, 0, 1}, {1, 0}, 2, ""},
                        Case{{2, 2, 4}, {2, 3, 3}, {3}, {2}, {0, 1}, {0}, 1, ""},
                        Case{{1, 2, 3, 3}, {2, 2, 2, 2}, {1, 1}, {1, 1}, {2, 0, 0, 0}, {0, 0}, 1, "beyond the kernel's reach"}}) {
    const size_t spatial = c.x.size() - 2;
    std::vector<int64_t> y_shape = {c.x[0], c.w[1] * c.groups};
    for (size_t d = 0; d < spatial; ++d) {
      y_shape.push_back((c.x[2 + d] - 1) * c.strides[d] - c.pads[d] - c.pads[d + spatial] +
                        c.dilations[d] * (c.w[2 + d] - 1) + 1 + c.extra[d]);
    }
    auto count = [](const std::vector<int64_t>& s) { int64_t n = 1; for (int64_t v : s) n *= v; return n; };
    const std::vector<float> x = Ramp(count(c.x), 0.7f, 0.1f), w = Ramp(count(c.w), 0.45f, -0.2f);
    const std::vector<float> bias = Ramp(y_shape[1], 1.3f, 0.0f);
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(17);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", c.x);
    *g->add_initializer() = FloatTensor("w", c.w, w);
    *g->add_initializer() = FloatTensor("b", {y_shape[1]}, bias);
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("ConvTranspose");
    n->set_name("t");
    n->add_input("x"), n->add_input("w"), n->add_input("b");
    n->add_output("y");
    IntsAttr(n, "strides", c.strides), IntsAttr(n, "dilations", c.dilations), IntsAttr(n, "pads", c.pads);
    IntsAttr(n, "output_padding", c.extra);
    onnx::AttributeProto* grp = n->add_attribute();
    grp->set_name("group"), grp->set_type(onnx::AttributeProto::INT), grp->set_i(c.groups);
    AddValue(g->add_output(), "y", y_shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "convt.onnx");
    if (!c.refused.empty()) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find(c.refused), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << m.status();
    // The definition: every input element scattered through the kernel (2-D; a 1-D case has height 1).
    const int64_t h_in = spatial == 2 ? c.x[2] : 1, w_in = c.x.back(), kh = spatial == 2 ? c.w[2] : 1, kw = c.w.back();
    const int64_t h_out = spatial == 2 ? y_shape[2] : 1, w_out = y_shape.back(), cig = c.x[1] / c.groups, cog = c.w[1];
    const int64_t sh = spatial == 2 ? c.strides[0] : 1, sw = c.strides.back(), dh = spatial == 2 ? c.dilations[0] : 1;
    const int64_t dw = c.dilations.back(), ph = spatial == 2 ? c.pads[0] : 0, pw = c.pads[spatial - 1];
    std::vector<double> want(count(y_shape));
    for (int64_t b = 0; b < c.x[0]; ++b)
      for (int64_t o = 0; o < y_shape[1]; ++o)
        for (int64_t i = 0; i < h_out * w_out; ++i) want[(b * y_shape[1] + o) * h_out * w_out + i] = bias[o];
    for (int64_t b = 0; b < c.x[0]; ++b)
      for (int64_t ic = 0; ic < c.x[1]; ++ic)
        for (int64_t ih = 0; ih < h_in; ++ih)
          for (int64_t iw = 0; iw < w_in; ++iw)
            for (int64_t o = 0; o < cog; ++o)
              for (int64_t r = 0; r < kh; ++r)
                for (int64_t q = 0; q < kw; ++q) {
                  const int64_t oh = ih * sh - ph + r * dh, ow = iw * sw - pw + q * dw;
                  if (oh < 0 || oh >= h_out || ow < 0 || ow >= w_out) continue;
                  const int64_t oc = ic / cig * cog + o;
                  want[((b * y_shape[1] + oc) * h_out + oh) * w_out + ow] +=
                      static_cast<double>(x[((b * c.x[1] + ic) * h_in + ih) * w_in + iw]) *
                      w[((ic * cog + o) * kh + r) * kw + q];
                }
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32(c.x, x), 0);
    ASSERT_EQ(y.size(), want.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << i;
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32(c.x, x), "convt.onnx")) {
      double err = 0, norm = 0;
      for (size_t i = 0; i < lowered.size(); ++i) err += (lowered[i] - want[i]) * (lowered[i] - want[i]), norm += want[i] * want[i];
      EXPECT_LE(std::sqrt(err / norm), runtime::kGraphTolerance);  // (the convolution's bf16 operands)
    }
  }
}

// Resize and Upsample in nearest mode by whole factors (Resize-13 with scales, asymmetric / floor; Resize-13 with
// sizes, half_pixel / round_prefer_floor; Upsample-9's scales input, Upsample-7's attribute): output (h, w) reads
// input (h / sh, w / sw), on the oracle and lowered on the VM (the GPU where there is one); a linear mode and a
// factor of 1.5 refused by name.
TEST(OnnxImport, NearestResizeByWholeFactors) {
  const std::vector<float> x = Ramp(2 * 2 * 3, 0.9f, 0.4f);  // [1, 2, 2, 3]
  struct Case {
    std::string op;
    int opset;
    std::vector<float> scales;
    std::vector<int64_t> sizes;
    std::string coordinates, rounding, mode, refused;
  };
  for (const Case& c : {Case{"Resize", 13, {1, 1, 2, 3}, {}, "asymmetric", "floor", "", ""},
                        Case{"Resize", 13, {}, {1, 2, 6, 6}, "half_pixel", "round_prefer_floor", "", ""},
                        Case{"Upsample", 9, {1, 1, 3, 1}, {}, "", "", "", ""},
                        Case{"Upsample", 7, {1, 1, 2, 2}, {}, "", "", "", ""},
                        Case{"Resize", 13, {1, 1, 2, 2}, {}, "", "", "linear", "mode 'linear'"},
                        Case{"Resize", 13, {1, 1, 1.5f, 1}, {}, "asymmetric", "floor", "", "axis 2 from 2 to 3"}}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(c.opset);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {1, 2, 2, 3});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(c.op);
    n->set_name("r");
    n->add_input("x");
    n->add_output("y");
    auto str = [&](const std::string& name, const std::string& v) {
      if (v.empty()) return;
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name(name), a->set_type(onnx::AttributeProto::STRING), a->set_s(v);
    };
    str("coordinate_transformation_mode", c.coordinates), str("nearest_mode", c.rounding);
    str("mode", c.mode.empty() ? "nearest" : c.mode);
    if (c.op == "Upsample" && c.opset < 9) {
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name("scales"), a->set_type(onnx::AttributeProto::FLOATS);
      for (float v : c.scales) a->add_floats(v);
    } else if (c.op == "Upsample") {
      *g->add_initializer() = FloatTensor("scales", {4}, c.scales);
      n->add_input("scales");
    } else {
      n->add_input("");  // roi
      if (c.sizes.empty()) {
        *g->add_initializer() = FloatTensor("scales", {4}, c.scales);
        n->add_input("scales");
      } else {
        n->add_input("");
        *g->add_initializer() = Int64Tensor("sizes", {4}, c.sizes);
        n->add_input("sizes");
      }
    }
    const std::vector<int64_t> shape =
        c.sizes.empty() ? std::vector<int64_t>{1, 2, static_cast<int64_t>(2 * c.scales[2]), static_cast<int64_t>(3 * c.scales[3])}
                        : c.sizes;
    AddValue(g->add_output(), "y", shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "resize.onnx");
    const std::string what = absl::StrCat(c.op, "-", c.opset, " ", c.refused);
    if (!c.refused.empty()) {
      ASSERT_FALSE(m.ok()) << what;
      EXPECT_NE(m.status().message().find(c.refused), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << what << ": " << m.status();
    const int64_t sh = shape[2] / 2, sw = shape[3] / 3;
    std::vector<float> want;
    for (int64_t ch = 0; ch < 2; ++ch)
      for (int64_t h = 0; h < shape[2]; ++h)
        for (int64_t w = 0; w < shape[3]; ++w) want.push_back(x[(ch * 2 + h / sh) * 3 + w / sw]);
    EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({1, 2, 2, 3}, x), 0), want) << what;
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32({1, 2, 2, 3}, x), "resize.onnx")) {
      EXPECT_EQ(lowered, want) << what << " lowered";
    }
  }
}

// Gelu (opset 20), both forms, against the spec's formulas in double; another `approximate` is refused by name.
TEST(OnnxImport, GeluOfBothForms) {
  for (const std::string approximate : {"", "none", "tanh", "fast"}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(20);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 8});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Gelu");
    n->set_name("gelu");
    n->add_input("x");
    n->add_output("y");
    if (!approximate.empty()) {
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name("approximate");
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s(approximate);
    }
    AddValue(g->add_output(), "y", {2, 8});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "gelu.onnx");
    if (approximate == "fast") {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'gelu' (Gelu): approximate 'fast'"), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << approximate << ": " << m.status();
    const std::vector<float> x = Ramp(16, 0.9f, 0.0f);
    std::vector<float> scaled = x;
    for (float& v : scaled) v *= 3.0f;  // -3..3: both tails and the middle
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({2, 8}, scaled), 0);
    for (size_t i = 0; i < scaled.size(); ++i) {
      const double v = scaled[i];
      const double want = approximate == "tanh"
                              ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::acos(-1.0)) * (v + 0.044715 * v * v * v)))
                              : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      EXPECT_NEAR(y[i], want, 2e-6 * (1 + std::abs(want))) << approximate << " at " << v;
    }
    // Lowered to a graph pass, on the CPU VM and the GPU where there is one: the oracle's values within the graph
    // tolerance.
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32({2, 8}, scaled), "gelu.onnx")) {
      double err = 0, norm = 0;
      for (size_t i = 0; i < y.size(); ++i) err += (lowered[i] - y[i]) * (lowered[i] - y[i]), norm += y[i] * y[i];
      EXPECT_LE(std::sqrt(err / norm), runtime::kGraphTolerance) << approximate;
    }
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
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(type);
    n->set_name(out);
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    return n;
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
