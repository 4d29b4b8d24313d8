// The ONNX importer's op mappings on small hand-built models (tests/onnx_builders.h): Squeeze / Unsqueeze, Pow,
// Slice / Split / Gather, Expand, Pad, ConvTranspose, nearest Resize / Upsample and Gelu, each against its definition
// on the graph oracle and lowered to a graph pass on the CPU VM (and the GPU where there is one). The reductions:
// onnx_reduce_test.cc; file features and constant folding: onnx_import_test.cc; ONNX's own backend data:
// onnx_backend_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

using namespace onnx_test;  // NOLINT: the tests' helpers

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

// Pow with a constant exponent of one element (GELU's tanh form, as exporters write it, cubes; norms square; a
// square root): 2, 3, -1, 0.5 and -0.5 against std::pow (NaN where it is, at -2 to the half); 1.5 is refused naming
// the exponent.
TEST(OnnxImport, PowWithAConstantExponent) {
  for (float e : {2.0f, 3.0f, -1.0f, 0.5f, -0.5f, 1.5f}) {
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
    if (e == 1.5f) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'p' (Pow): exponent 1.5"), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << e << ": " << m.status();
    const std::vector<float> x = {1.5f, -2.0f, 0.25f, 3.0f};
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({4}, x), 0);
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = std::pow(x[i], e);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(y[i])) << e << " at " << i << ": " << y[i];
      } else {
        EXPECT_FLOAT_EQ(y[i], want) << e << " at " << i;
      }
    }
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
// input (h / sh, w / sw), on the oracle and lowered on the VM (the GPU where there is one); a cubic mode and a
// factor of 1.5 refused by name (linear mode: onnx_resize_test.cc).
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
                        Case{"Resize", 13, {1, 1, 2, 2}, {}, "", "", "cubic", "mode 'cubic'"},
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

// The exponential activations against their definitions in double precision at values from -100 to 100 (Softplus
// past exp's overflow at 88: x, not inf; Mish there too), on the oracle and lowered on the VM (the GPU where there
// is one); an Elu with alpha 0 is refused naming it.
TEST(OnnxImport, ExponentialActivations) {
  const std::vector<float> x = {-100.0f, -20.0f, -1.5f, -0.25f, 0.0f, 0.5f, 3.0f, 20.0f, 95.0f, 100.0f};
  auto softplus = [](double v) { return std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))); };
  struct Case {
    std::string op;
    float alpha;  // 0: the default
    std::function<double(double)> f;
  };
  const double selu_alpha = 1.67326319217681884765625, selu_gamma = 1.05070102214813232421875;
  for (const Case& c : {Case{"Elu", 0.5f, [](double v) { return v < 0 ? 0.5 * (std::exp(v) - 1) : v; }},
                        Case{"Selu", 0.0f,
                             [&](double v) { return selu_gamma * (v < 0 ? selu_alpha * (std::exp(v) - 1) : v); }},
                        Case{"Celu", 2.0f, [](double v) { return std::max(0.0, v) + std::min(0.0, 2 * (std::exp(v / 2) - 1)); }},
                        Case{"Softplus", 0.0f, softplus},
                        Case{"Softsign", 0.0f, [](double v) { return v / (1 + std::fabs(v)); }},
                        Case{"Mish", 0.0f, [&](double v) { return v * std::tanh(softplus(v)); }},
                        Case{"Elu", -1.0f, nullptr}}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(18);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {static_cast<int64_t>(x.size())});
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(c.op);
    n->set_name("act");
    n->add_input("x");
    if (c.alpha != 0.0f) {
      onnx::AttributeProto* alpha = n->add_attribute();
      alpha->set_name("alpha");
      alpha->set_type(onnx::AttributeProto::FLOAT);
      alpha->set_f(c.alpha);
    }
    n->add_output("y");
    AddValue(g->add_output(), "y", {static_cast<int64_t>(x.size())});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "act.onnx");
    if (!c.f) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'act' (Elu): alpha -1"), std::string::npos) << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << c.op << ": " << m.status();
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32({static_cast<int64_t>(x.size())}, x), 0);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = c.f(x[i]);
      EXPECT_NEAR(y[i], want, 1e-6 + 1e-6 * std::fabs(want)) << c.op << " at " << x[i];
    }
    for (const std::vector<float>& lowered :
         RunLowered(*m, graph::HostTensor::FromF32({static_cast<int64_t>(x.size())}, x), "act.onnx")) {
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(lowered[i], y[i], 1e-6 + 1e-6 * std::fabs(y[i])) << c.op;
    }
  }
}

}  // namespace
}  // namespace loom
