// The ONNX importer's reductions (ReduceMean, ReduceSum, ReduceMax, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum,
// ReduceLogSumExp) and LogSoftmax on small hand-built models (tests/onnx_builders.h), against their definitions on
// the graph oracle and lowered to a graph pass on the CPU VM (and the GPU where there is one). The other op mappings:
// onnx_ops_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"
#include "tests/onnx_builders.h"
#include "tests/onnx_test_util.h"

namespace loom {
namespace {

using namespace onnx_test;  // NOLINT: the tests' helpers

// ReduceMean over every spatial axis (AdaptiveAvgPool2d(1) as exporters write it: axes [2, 3] or [-1, -2], an
// attribute before opset 18 and a constant input from it, with and without keepdims) is a global average pool,
// ReduceMax a global max pool (other axes: ReductionsOverAnyAxes).
TEST(OnnxImport, ReduceMeanOverTheSpatialAxesIsAGlobalPool) {
  struct Case {
    int opset;
    std::vector<int64_t> axes;
    bool keepdims;
    bool max = false;
  };
  for (const Case& c : {Case{13, {2, 3}, true}, Case{18, {-1, -2}, false}, Case{18, {3, 2}, true},
                        Case{13, {2, 3}, false, true}, Case{18, {-2, -1}, true, true}}) {
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
    ASSERT_TRUE(m.ok()) << c.opset << ": " << m.status();
    EXPECT_EQ(m->graph.tensor(m->outputs[0]).shape_size(), c.keepdims ? 4 : 2);
    EXPECT_EQ(Evaluate(*m, graph::HostTensor::FromF32({1, 3, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40, -1, -1, -1, -1}), 0),
              (c.max ? std::vector<float>{4.0f, 40.0f, -1.0f} : std::vector<float>{2.5f, 25.0f, -1.0f}));
  }
}

// ReduceMean, ReduceSum, ReduceMax, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum and ReduceLogSumExp over
// trailing axes (a hand-written
// norm's mean over the last axis, a sum over the last two, a whole tensor's maximum with no axes given) and over
// others (a middle axis, the first and last: transposed to the end first), with and without keepdims, against their
// definitions on the oracle and lowered on the VM (the GPU where there is one): an NHWC view with one pool window per
// row. A sum over the spatial axes is the global pool times the count; noop_with_empty_axes passes the input on; an
// axis past the rank is refused naming it.
TEST(OnnxImport, ReductionsOverAnyAxes) {
  const std::vector<int64_t> shape = {2, 3, 4};
  const std::vector<float> x = Ramp(24, 0.7f, 0.2f);         // both signs
  const std::vector<float> positive = Ramp(24, 0.7f, 1.5f);  // for the log of a sum
  auto reduce = [&](const std::string& op, const std::vector<float>& data, const std::vector<int64_t>& axes,
                    size_t out) {
    std::vector<bool> reduced(3, axes.empty());
    for (int64_t a : axes) reduced[a < 0 ? a + 3 : a] = true;
    std::vector<float> y;
    // Outputs in row-major order of the kept axes: walk every element, grouped by its kept coordinates.
    std::map<std::vector<int64_t>, std::vector<float>> groups;
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t k = 0; k < 4; ++k) {
          const int64_t idx[3] = {i, j, k};
          std::vector<int64_t> key;
          for (int d = 0; d < 3; ++d) key.push_back(reduced[d] ? 0 : idx[d]);
          groups[key].push_back(data[(i * 3 + j) * 4 + k]);
        }
    for (const auto& [key, v] : groups) {
      float r = op == "ReduceMax" ? -INFINITY : 0.0f;
      for (float e : v) {
        r = op == "ReduceMax"                             ? std::max(r, e)
            : op == "ReduceSumSquare" || op == "ReduceL2" ? r + e * e
            : op == "ReduceL1"                            ? r + std::fabs(e)
            : op == "ReduceLogSumExp"                     ? r + std::exp(e)
                                                          : r + e;
      }
      y.push_back(op == "ReduceMean"                                ? r / static_cast<float>(v.size())
                  : op == "ReduceL2"                                ? std::sqrt(r)
                  : op == "ReduceLogSum" || op == "ReduceLogSumExp" ? std::log(r)
                                                                    : r);
    }
    EXPECT_EQ(y.size(), out);
    return y;
  };
  struct Case {
    std::string op;
    int opset;
    std::vector<int64_t> axes;
    bool keepdims;
    std::vector<int64_t> out_shape;
  };
  for (const Case& c :
       {Case{"ReduceMean", 18, {-1}, true, {2, 3, 1}}, Case{"ReduceMean", 13, {2}, false, {2, 3}},
        Case{"ReduceSum", 13, {1, 2}, false, {2}}, Case{"ReduceSum", 11, {-2, -1}, true, {2, 1, 1}},
        Case{"ReduceMax", 18, {}, false, {1}}, Case{"ReduceMax", 13, {-1}, true, {2, 3, 1}},
        Case{"ReduceMean", 18, {1}, true, {2, 1, 4}}, Case{"ReduceSum", 13, {0}, false, {3, 4}},
        Case{"ReduceSumSquare", 18, {0, 2}, false, {3}}, Case{"ReduceL1", 13, {-1}, true, {2, 3, 1}},
        Case{"ReduceL2", 18, {1}, false, {2, 4}}, Case{"ReduceMax", 18, {2, 0}, true, {1, 3, 1}},
        Case{"ReduceLogSumExp", 18, {-1}, false, {2, 3}}, Case{"ReduceLogSumExp", 13, {0, 1}, true, {1, 1, 4}},
        Case{"ReduceLogSum", 18, {0}, true, {1, 3, 4}}}) {
    const std::string what = absl::StrCat(c.op, "-", c.opset, " axes [", absl::StrJoin(c.axes, ","), "]");
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(c.opset);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", shape);
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(c.op);
    n->set_name("r");
    n->add_input("x");
    const bool axes_input = c.opset >= (c.op == "ReduceSum" ? 13 : 18);
    if (!c.axes.empty()) {
      if (axes_input) {
        *g->add_initializer() = Int64Tensor("axes", {static_cast<int64_t>(c.axes.size())}, c.axes);
        n->add_input("axes");
      } else {
        IntsAttr(n, "axes", c.axes);
      }
    }
    onnx::AttributeProto* k = n->add_attribute();
    k->set_name("keepdims");
    k->set_type(onnx::AttributeProto::INT);
    k->set_i(c.keepdims ? 1 : 0);
    n->add_output("y");
    AddValue(g->add_output(), "y", c.out_shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "reduce.onnx");
    ASSERT_TRUE(m.ok()) << what << ": " << m.status();
    const graph::TensorDef& out = m->graph.tensor(m->outputs[0]);
    EXPECT_EQ(std::vector<int64_t>(out.shape().begin(), out.shape().end()), c.out_shape) << what;
    int64_t outputs = 1;
    for (int64_t d : c.out_shape) outputs *= d;
    const std::vector<float>& input = c.op == "ReduceLogSum" ? positive : x;
    const std::vector<float> want = reduce(c.op, input, c.axes, static_cast<size_t>(outputs));
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32(shape, input), 0);
    ASSERT_EQ(y.size(), want.size()) << what;
    for (size_t i = 0; i < y.size(); ++i)
      EXPECT_NEAR(y[i], want[i], 1e-5f * (1 + std::fabs(want[i]))) << what << " at " << i;
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32(shape, input), "reduce.onnx")) {
      ASSERT_EQ(lowered.size(), y.size()) << what;
      for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(lowered[i], y[i], 1e-5f * (1 + std::fabs(y[i]))) << what;
    }
  }
  // The sum over NCHW's spatial axes; noop_with_empty_axes; a leading axis refused.
  for (int which = 0; which < 3; ++which) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(18);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", which == 0 ? std::vector<int64_t>{1, 2, 3, 2} : shape);
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(which == 1 ? "ReduceMean" : "ReduceSum");
    n->set_name("r");
    n->add_input("x");
    if (which != 1) {
      const std::vector<int64_t> axes = which == 0 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{3};
      *g->add_initializer() = Int64Tensor("axes", {static_cast<int64_t>(axes.size())}, axes);
      n->add_input("axes");
    } else {
      onnx::AttributeProto* noop = n->add_attribute();
      noop->set_name("noop_with_empty_axes");
      noop->set_type(onnx::AttributeProto::INT);
      noop->set_i(1);
    }
    n->add_output("y");
    AddValue(g->add_output(), "y", which == 0 ? std::vector<int64_t>{1, 2, 1, 1} : shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "reduce.onnx");
    if (which == 2) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("node 'r' (ReduceSum): axis 3 of a rank-3 input"), std::string::npos)
          << m.status();
      continue;
    }
    ASSERT_TRUE(m.ok()) << which << ": " << m.status();
    const std::vector<float> input(x.begin(), x.begin() + (which == 0 ? 12 : 24));
    const std::vector<float> y =
        Evaluate(*m, graph::HostTensor::FromF32(which == 0 ? std::vector<int64_t>{1, 2, 3, 2} : shape, input), 0);
    if (which == 1) {
      EXPECT_EQ(y, input);
      continue;
    }
    for (int ch = 0; ch < 2; ++ch) {
      float sum = 0.0f;
      for (int e = 0; e < 6; ++e) sum += input[ch * 6 + e];
      EXPECT_NEAR(y[ch], sum, 1e-5f * (1 + std::fabs(sum))) << ch;
    }
  }
}

// LogSoftmax (opset 13's axis, the middle one; opset 11's flattened axes [1, rank)) against its definition in
// double precision, a row with a large number among small ones included (the log of a softmax would be -inf there),
// on the oracle and lowered on the VM (the GPU where there is one).
TEST(OnnxImport, LogSoftmaxIsStableOnLargeNumbers) {
  const std::vector<int64_t> shape = {2, 3, 4};
  std::vector<float> x = Ramp(24, 0.9f, -4.0f);
  x[5] = 10000.0f;
  for (int opset : {13, 11}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(opset);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", shape);
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("LogSoftmax");
    n->set_name("ls");
    n->add_input("x");
    onnx::AttributeProto* axis = n->add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(1);
    n->add_output("y");
    AddValue(g->add_output(), "y", shape);
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "logsoftmax.onnx");
    ASSERT_TRUE(m.ok()) << opset << ": " << m.status();
    // Groups of elements normalised together: opset 13 the 3 along axis 1 of each (i, k); opset 11 the 12 of each i.
    std::vector<double> want(24);
    for (int i = 0; i < 2; ++i) {
      for (int k = 0; k < (opset == 13 ? 4 : 1); ++k) {
        std::vector<int> members;
        for (int j = 0; j < 3; ++j) {
          for (int kk = 0; kk < 4; ++kk) {
            if (opset == 11 || kk == k) members.push_back((i * 3 + j) * 4 + kk);
          }
        }
        double mx = -INFINITY, sum = 0.0;
        for (int e : members) mx = std::max(mx, static_cast<double>(x[e]));
        for (int e : members) sum += std::exp(x[e] - mx);
        for (int e : members) want[e] = x[e] - mx - std::log(sum);
      }
    }
    const std::vector<float> y = Evaluate(*m, graph::HostTensor::FromF32(shape, x), 0);
    ASSERT_EQ(y.size(), want.size());
    for (size_t i = 0; i < y.size(); ++i)
      EXPECT_NEAR(y[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << opset << " at " << i;
    for (const std::vector<float>& lowered : RunLowered(*m, graph::HostTensor::FromF32(shape, x), "logsoftmax.onnx")) {
      ASSERT_EQ(lowered.size(), y.size());
      for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(lowered[i], y[i], 1e-4 * (1 + std::fabs(y[i]))) << opset;
    }
  }
}

}  // namespace
}  // namespace loom
