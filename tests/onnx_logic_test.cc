// The ONNX importer's comparisons, logic and Where on activations (bools as 0 / 1 floats: the IR's GREATER, LESS,
// EQUAL, GREATER_EQUAL, LESS_EQUAL and KEEP) and the hard activations (HARD_SIGMOID / HARD_SWISH) on small hand-built
// models, against their definitions on the graph oracle and lowered to a graph pass on the CPU VM (and the GPU where
// there is one). The other op mappings:
// onnx_ops_test.cc, onnx_reduce_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/evaluator.h"
#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"
#include "tests/onnx_builders.h"
#include "tests/onnx_test_util.h"

namespace loom {
namespace {

using namespace onnx_test;  // NOLINT: the tests' helpers

bool Same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Each op on two activations a, b of 8 elements (NaN, infinities, equal pairs and a -0 among them), its bool output
// a 0 / 1 float: the comparisons, Not of a comparison, And / Or / Xor of two, against C++'s; Where(a > b, a, b) picks
// exactly (a NaN or infinite operand not picked never reaches the sum); Where with a constant bool mask picking
// -inf (a causal mask's form); ThresholdedRelu.
TEST(OnnxImport, ComparisonsLogicAndWhereOnActivations) {
  const float inf = INFINITY, nan = NAN;
  const std::vector<float> a = {1.0f, -2.0f, 3.0f, nan, inf, -inf, 0.5f, 7.0f};
  const std::vector<float> b = {1.0f, 2.0f, -3.0f, 1.0f, 5.0f, nan, 0.5f, -inf};
  struct Case {
    std::string name;
    std::function<void(onnx::GraphProto*)> build;  // nodes from inputs a, b to output y
    std::function<float(size_t)> want;
  };
  auto node = AddNamedNode;
  auto f = [](bool v) { return v ? 1.0f : 0.0f; };
  std::vector<Case> cases;
  for (const auto& [type, cmp] : std::vector<std::pair<std::string, std::function<bool(float, float)>>>{
           {"Greater", [](float x, float y) { return x > y; }},
           {"Less", [](float x, float y) { return x < y; }},
           {"Equal", [](float x, float y) { return x == y; }},
           {"GreaterOrEqual", [](float x, float y) { return x >= y; }},
           {"LessOrEqual", [](float x, float y) { return x <= y; }}}) {
    cases.push_back({type,
                     [&, type](onnx::GraphProto* g) {
                       node(g, type, {"a", "b"}, "y");
                     },
                     [&, cmp](size_t i) { return f(cmp(a[i], b[i])); }});
  }
  cases.push_back({"Not",
                   [&](onnx::GraphProto* g) {
                     node(g, "Less", {"a", "b"}, "lt");
                     node(g, "Not", {"lt"}, "y");
                   },
                   [&](size_t i) { return f(!(a[i] < b[i])); }});
  for (const std::string& type : {"And", "Or", "Xor"}) {
    cases.push_back({type,
                     [&, type](onnx::GraphProto* g) {
                       node(g, "Greater", {"a", "b"}, "gt");
                       node(g, "Equal", {"a", "a"}, "not_nan");
                       node(g, type, {"gt", "not_nan"}, "y");
                     },
                     [&, type](size_t i) {
                       const bool p = a[i] > b[i], q = a[i] == a[i];
                       return f(type == "And" ? p && q : type == "Or" ? p || q : p != q);
                     }});
  }
  cases.push_back({"Where",
                   [&](onnx::GraphProto* g) {
                     node(g, "Greater", {"a", "b"}, "gt");
                     node(g, "Where", {"gt", "a", "b"}, "y");
                   },
                   [&](size_t i) { return a[i] > b[i] ? a[i] : b[i]; }});
  cases.push_back({"Where with a constant mask",
                   [&](onnx::GraphProto* g) {
                     *g->add_initializer() = BoolTensor("mask", {8}, {1, 1, 0, 0, 1, 0, 1, 0});
                     *g->add_initializer() = FloatTensor("minus_inf", {}, {-inf});
                     node(g, "Where", {"mask", "a", "minus_inf"}, "y");
                   },
                   [&](size_t i) {
                     const std::vector<int> mask = {1, 1, 0, 0, 1, 0, 1, 0};
                     return mask[i] ? a[i] : -inf;
                   }});
  cases.push_back({"ThresholdedRelu",
                   [&](onnx::GraphProto* g) {
                     onnx::NodeProto* n = node(g, "ThresholdedRelu", {"a"}, "y");
                     onnx::AttributeProto* alpha = n->add_attribute();
                     alpha->set_name("alpha"), alpha->set_type(onnx::AttributeProto::FLOAT), alpha->set_f(0.75f);
                   },
                   [&](size_t i) { return a[i] > 0.75f ? a[i] : 0.0f; }});
  for (const Case& c : cases) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(18);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "a", {8});
    AddValue(g->add_input(), "b", {8});
    c.build(g);
    AddValue(g->add_output(), "y", {8});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "logic.onnx");
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    graph::HostTensor ta = graph::HostTensor::FromF32({8}, a), tb = graph::HostTensor::FromF32({8}, b);
    std::vector<float> y;
    {
      graph::Evaluator e(m->graph, m->weights);
      ASSERT_TRUE(e.Run({{m->inputs[0], ta}, {m->inputs[1], tb}}).ok()) << c.name;
      const graph::HostTensor& out = e.Get(m->outputs[0]);
      for (int64_t i = 0; i < out.size(); ++i) y.push_back(out.Get(i));
    }
    ASSERT_EQ(y.size(), 8u) << c.name;
    for (size_t i = 0; i < 8; ++i) EXPECT_TRUE(Same(y[i], c.want(i))) << c.name << " at " << i << ": " << y[i];
    for (const std::vector<float>& lowered : RunLowered(*m, {ta, tb}, "logic.onnx")) {
      ASSERT_EQ(lowered.size(), y.size()) << c.name;
      for (size_t i = 0; i < 8; ++i) EXPECT_TRUE(Same(lowered[i], y[i])) << c.name << " lowered at " << i;
    }
  }
}

// HardSigmoid / HardSwish with torch's alpha 1/6 and beta 1/2 are one IR op each (HARD_SIGMOID / HARD_SWISH: one
// element-wise pass, alpha * x + beta as one fused multiply-add); another alpha stays the five-op chain; Clip(0, 6)
// (torch's ReLU6) is RELU6, another bound the two-op chain. All against the definition on the oracle and lowered on
// the VM (and the GPU where there is one), exactly, NaN and infinities included.
TEST(OnnxImport, HardActivationsAreOnePassWithTorchsConstants) {
  const std::vector<float> x = {-4.0f, -3.0f, -1.0f, 0.0f, 2.9999f, 3.0f, 4.0f, NAN, INFINITY, -INFINITY, 0.1f, -2.5f,
                                -0.0f, 5.5f, 6.0f, 7.0f};
  struct Case {
    std::string type;
    float alpha;
    size_t ops;  // IR ops the node becomes
  };
  for (const Case& c : std::vector<Case>{{"HardSwish", 1.0f / 6.0f, 1}, {"HardSigmoid", 1.0f / 6.0f, 1},
                                          {"HardSigmoid", 0.2f, 4}, {"Clip", 6.0f, 1}, {"Clip", 5.0f, 2}}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(18);
    onnx::GraphProto* g = proto.mutable_graph();
    const int64_t n = static_cast<int64_t>(x.size());
    AddValue(g->add_input(), "x", {n});
    if (c.type == "Clip") {  // (here alpha is the upper bound: 6 is torch's ReLU6, the IR's RELU6)
      *g->add_initializer() = FloatTensor("lo", {}, {0.0f});
      *g->add_initializer() = FloatTensor("hi", {}, {c.alpha});
    }
    onnx::NodeProto* node = AddNamedNode(g, c.type, c.type == "Clip" ? std::vector<std::string>{"x", "lo", "hi"}
                                                                     : std::vector<std::string>{"x"}, "y");
    if (c.type == "HardSigmoid") {
      onnx::AttributeProto* alpha = node->add_attribute();
      alpha->set_name("alpha"), alpha->set_type(onnx::AttributeProto::FLOAT), alpha->set_f(c.alpha);
    }
    AddValue(g->add_output(), "y", {n});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "hard.onnx");
    ASSERT_TRUE(m.ok()) << c.type << ": " << m.status();
    EXPECT_EQ(static_cast<size_t>(m->graph.def().ops_size()), c.ops) << c.type << " alpha " << c.alpha;
    std::vector<float> want;
    for (float v : x) {
      if (c.type == "Clip") {  // max then min: -0 and NaN kept
        const float low = v < 0.0f ? 0.0f : v;
        want.push_back(low > c.alpha ? c.alpha : low);
        continue;
      }
      volatile float scaled = c.alpha * v;  // (the chain rounds the product before the sum: never contracted here)
      float h = c.ops == 1 ? std::fma(v, c.alpha, 0.5f) : scaled + 0.5f;
      h = std::isnan(h) ? h : std::min(1.0f, std::max(0.0f, h));
      want.push_back(c.type == "HardSwish" ? v * h : h);
    }
    const graph::HostTensor in = graph::HostTensor::FromF32({n}, x);
    std::vector<std::vector<float>> outs = {Evaluate(*m, in, 0)};
    for (std::vector<float>& lowered : RunLowered(*m, in, "hard.onnx")) outs.push_back(std::move(lowered));
    ASSERT_GE(outs.size(), 2u);
    for (const std::vector<float>& y : outs) {
      ASSERT_EQ(y.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(Same(y[i], want[i])) << c.type << " alpha " << c.alpha << " at x = " << x[i] << ": " << y[i];
      }
    }
  }
}

// A general graph's constants may hold infinities (an attention mask's -inf: the pass runs) but never NaN: the pass
// is refused naming the weight and element when its weights are packed.
TEST(OnnxImport, GraphWeightsMayBeInfiniteButNotNaN) {
  for (bool nan : {false, true}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(18);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {4});
    *g->add_initializer() = FloatTensor("w", {4}, {1.0f, nan ? NAN : -INFINITY, 2.0f, 3.0f});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Add");
    n->set_name("y");
    n->add_input("x");
    n->add_input("w");
    n->add_output("y");
    AddValue(g->add_output(), "y", {4});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "weights.onnx");
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<scheduler::Schedule> pass =
        scheduler::Compile(m->graph, "weights.onnx", scheduler::CompileOptions());
    ASSERT_TRUE(pass.ok()) << pass.status();
    absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner =
        runtime::GraphRunner::Create(*pass, m->weights, runtime::GraphRunner::Backend::kCpu);
    if (nan) {
      ASSERT_FALSE(runner.ok());
      EXPECT_NE(runner.status().message().find("holds nan at [1]: Loom refuses weights that are NaN"),
                std::string::npos)
          << runner.status();
      continue;
    }
    ASSERT_TRUE(runner.ok()) << runner.status();
    absl::StatusOr<runtime::TensorMap> got =
        (*runner)->Run({{m->inputs[0], graph::HostTensor::FromF32({4}, {1.0f, 1.0f, 1.0f, 1.0f})}});
    ASSERT_TRUE(got.ok()) << got.status();
    const graph::HostTensor& y = got->at(m->outputs[0]);
    EXPECT_EQ(y.Get(0), 2.0f);
    EXPECT_EQ(y.Get(1), -INFINITY);
  }
}

}  // namespace
}  // namespace loom
