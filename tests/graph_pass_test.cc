// A general graph's pass (scheduler/lowering_nn) on the CPU VM against the op-by-op oracle: a ResNet-style block
// imported from ONNX (Conv, Relu, Conv, residual Add, Relu, GlobalAveragePool, Flatten, Gemm, Softmax), lowered
// with its GEMM epilogues taking over the bias, the residual and the ReLUs, once with few output tiles (split
// over K: the residual copied in first, the ReLU applied by the next conv's IM2COL as it reads, or in place before
// the pool) and once with enough tiles for the fused
// epilogue; a product of two activations refused by name. The ONNX backend data covers the rest of the ops (grouped
// and depthwise convolutions, CONCAT, pools, softmax) on the VM and the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/evaluator.h"
#include "graph/onnx_import.h"
#include "instructions/isa.h"
#include "megakernel/gpu_backend.h"
#include "megakernel/graph_runner.h"
#include "scheduler/compiler.h"
#include "tests/onnx_builders.h"

namespace loom {
namespace {

std::vector<float> Wave(size_t n, float scale, float phase) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

onnx::NodeProto* Node(onnx::GraphProto* g, const std::string& type, std::vector<std::string> in,
                      const std::string& out) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(type);
  n->set_name(out);
  for (const std::string& i : in) n->add_input(i);
  n->add_output(out);
  return n;
}

void Ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// x [batch, 64, 8, 8] -> conv3x3 + relu -> conv3x3 + x -> relu -> global pool -> flatten -> gemm [64 -> 10] -> softmax
std::string ResidualBlock(int64_t batch) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  constexpr int64_t C = 64;
  AddValue(g->add_input(), "x", {batch, C, 8, 8});
  *g->add_initializer() = FloatTensor("w1", {C, C, 3, 3}, Wave(C * C * 9, 0.06f, 0.1f));
  *g->add_initializer() = FloatTensor("b1", {C}, Wave(C, 0.1f, 0.2f));
  *g->add_initializer() = FloatTensor("w2", {C, C, 3, 3}, Wave(C * C * 9, 0.06f, 0.7f));
  *g->add_initializer() = FloatTensor("b2", {C}, Wave(C, 0.1f, 0.9f));
  *g->add_initializer() = FloatTensor("fc_w", {10, C}, Wave(10 * C, 0.3f, 0.3f));
  *g->add_initializer() = FloatTensor("fc_b", {10}, Wave(10, 0.1f, 0.5f));
  Ints(Node(g, "Conv", {"x", "w1", "b1"}, "c1"), "pads", {1, 1, 1, 1});
  Node(g, "Relu", {"c1"}, "r1");
  Ints(Node(g, "Conv", {"r1", "w2", "b2"}, "c2"), "pads", {1, 1, 1, 1});
  Node(g, "Add", {"c2", "x"}, "sum");
  Node(g, "Relu", {"sum"}, "r2");
  Node(g, "GlobalAveragePool", {"r2"}, "pool");
  Node(g, "Flatten", {"pool"}, "flat");
  onnx::NodeProto* gemm = Node(g, "Gemm", {"flat", "fc_w", "fc_b"}, "logits");
  onnx::AttributeProto* tb = gemm->add_attribute();
  tb->set_name("transB");
  tb->set_type(onnx::AttributeProto::INT);
  tb->set_i(1);
  Node(g, "Softmax", {"logits"}, "y");
  AddValue(g->add_output(), "y", {batch, 10});
  return m.SerializeAsString();
}

struct PassShape {
  int gemms = 0, accumulating = 0, fused = 0;  // GEMM instructions; split over K; taking over an ADD or RELU
  int relu_on_read = 0;                        // IM2COL instructions applying a split GEMM's pending ReLU
};
PassShape Inspect(const scheduler::Schedule& s) {
  PassShape p;
  for (const scheduler::SmQueue& q : s.queues()) {
    for (const scheduler::Instruction& inst : q.instructions()) {
      p.relu_on_read += inst.opcode() == "IM2COL" && inst.args(20) == 1;  // ImToColArgs.relu
      if (inst.opcode() != "GEMM") continue;
      ++p.gemms;
      p.accumulating += inst.args(10) == isa::kGemmAccumulateF32;  // GemmArgs.epilogue
      p.fused += inst.op().find(',') != std::string::npos;
    }
  }
  return p;
}

void RunOn(megakernel::GraphRunner::Backend backend, const graph::OnnxModel& m, const scheduler::Schedule& pass,
           int64_t batch);

// Compiles the block for `num_sms` SMs and runs it twice on the VM (and the GPU where there is one), fresh inputs
// each time, against the oracle.
void RunAgainstOracle(int64_t batch, uint32_t num_sms, PassShape* shape) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(ResidualBlock(batch), "block.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  scheduler::CompileOptions options;
  options.set_num_sms(num_sms);
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "block.onnx", options);
  ASSERT_TRUE(pass.ok()) << pass.status();
  ASSERT_TRUE(pass->has_graph());
  *shape = Inspect(*pass);
  std::string why_no_gpu;
  for (auto backend : {megakernel::GraphRunner::Backend::kCpu, megakernel::GraphRunner::Backend::kGpu}) {
    if (backend == megakernel::GraphRunner::Backend::kGpu && !megakernel::GpuAvailable(&why_no_gpu)) {
      std::printf("GPU part skipped: %s\n", why_no_gpu.c_str());
      continue;
    }
    RunOn(backend, *m, *pass, batch);
  }
}

void RunOn(megakernel::GraphRunner::Backend backend, const graph::OnnxModel& m, const scheduler::Schedule& pass,
           int64_t batch) {
  graph::HostTensor x = graph::HostTensor::Zeros(graph::F32, {batch, 64, 8, 8});
  x.f32 = Wave(x.f32.size(), 1.0f, 0.0f);
  absl::StatusOr<std::unique_ptr<megakernel::GraphRunner>> vm =
      megakernel::GraphRunner::Create(pass, m.weights, backend);
  ASSERT_TRUE(vm.ok()) << vm.status();
  for (int run = 0; run < 2; ++run) {  // a second run starts from the first's arena and barrier counts
    absl::StatusOr<megakernel::TensorMap> got = (*vm)->Run({{m.inputs[0], x}});
    ASSERT_TRUE(got.ok()) << got.status();
    graph::Evaluator oracle(m.graph, m.weights);
    ASSERT_TRUE(oracle.Run({{m.inputs[0], x}}).ok());
    const graph::HostTensor& want = oracle.Get(m.outputs[0]);
    const graph::HostTensor& y = got->at(m.outputs[0]);
    ASSERT_EQ(y.size(), want.size());
    double err = 0, norm = 0;
    for (int64_t i = 0; i < y.size(); ++i) {
      err += (y.Get(i) - want.Get(i)) * (y.Get(i) - want.Get(i));
      norm += want.Get(i) * want.Get(i);
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-2)
        << (backend == megakernel::GraphRunner::Backend::kGpu ? "GPU" : "VM") << ", batch " << batch << ", run " << run;
    x.f32 = Wave(x.f32.size(), 1.0f, 1.0f);  // fresh inputs for the second run
  }
}

TEST(GraphPass, FewTilesSplitOverKWithTheResidualCopiedInAndTheReluLeftToReaders) {
  PassShape shape;
  RunAgainstOracle(1, 132, &shape);
  EXPECT_GT(shape.accumulating, 2) << "the 64-row convolutions should be split over K on 132 SMs";
  EXPECT_GT(shape.relu_on_read, 0) << "conv2's IM2COL should apply conv1's ReLU as it reads";
}

TEST(GraphPass, ManyTilesTakeTheBiasResidualAndReluIntoTheEpilogue) {
  PassShape shape;
  RunAgainstOracle(8, 4, &shape);
  EXPECT_EQ(shape.accumulating, 0);
  EXPECT_GT(shape.fused, 0) << "conv2's GEMM should take over the residual ADD and the RELU";
}

TEST(GraphPass, UnsupportedOpsAreRefusedByName) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  AddValue(g->add_input(), "a", {3, 4});
  AddValue(g->add_input(), "b", {4, 5});
  Node(g, "MatMul", {"a", "b"}, "y");
  AddValue(g->add_output(), "y", {3, 5});
  absl::StatusOr<graph::OnnxModel> model = graph::ImportOnnxBytes(m.SerializeAsString(), "mm.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(model->graph, "mm.onnx", {});
  ASSERT_FALSE(pass.ok());
  EXPECT_EQ(pass.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(pass.status().message().find("(MATMUL): only a constant 2-D right-hand side is lowered"), std::string::npos)
      << pass.status();
}

}  // namespace
}  // namespace loom
