// A general graph's pass (scheduler/graph_lowering) on the CPU VM against the op-by-op oracle: a ResNet-style block
// imported from ONNX (Conv, Relu, Conv, residual Add, Relu, GlobalAveragePool, Flatten, Gemm, Softmax), lowered
// with its GEMM epilogues taking over the bias, the residual and the ReLUs, once with few output tiles (split
// over K: the residual copied in first, the ReLU applied by the next conv's CONV_GEMM as it gathers, or in place
// before the pool; or, for a reader of many K slabs, copied to bf16 with it by NHWC_BF16) and once with enough tiles
// for the fused epilogue, and both again with the convolutions as IM2COL + GEMM (CompileOptions.conv_im2col); bf16 conv
// activations (an unsplit convolution's or a max pool's output stored as bf16 too and gathered so by the
// convolution reading it, and none of it with the option off; channels not a multiple of 8 padded into a bf16 copy
// by NHWC_BF16, an NCHW image read through its transpose, a pending ReLU applied); a product of two activations
// refused by name. The ONNX backend data covers the rest of the ops (grouped and depthwise convolutions, CONCAT,
// pools, softmax) on the VM and the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/evaluator.h"
#include "graph/graph_builder.h"
#include "graph/model.h"
#include "graph/onnx_import.h"
#include "instructions/isa.h"
#include "runtime/gpu_backend.h"
#include "runtime/graph_runner.h"
#include "scheduler/compiler.h"
#include "scheduler/options.h"
#include "scheduler/prefill.h"
#include "tests/onnx_builders.h"

namespace loom {
namespace {

std::vector<float> Wave(size_t n, float scale, float phase) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

// Uniform in [-scale, scale) from a hash of the index: weights without the sine's structure, whose sums would
// cancel into values bf16 operands cannot resolve to 1e-2.
std::vector<float> Noise(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    v[i] = scale * (static_cast<float>(h >> 8) / static_cast<float>(1u << 23) - 1.0f);
  }
  return v;
}

onnx::NodeProto* Node(onnx::GraphProto* g, const std::string& type, std::vector<std::string> in,
                      const std::string& out) {
  return AddNamedNode(g, type, in, out);
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

// x [batch, 8, 12, 12] -> conv1x1 (8 -> 64, one K slab: never split) -> conv3x3 (64 -> 64) -> y: the second
// convolution gathers the first's bf16 copy, split over K on many SMs or whole on few.
std::string FedConvolution(int64_t batch) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  constexpr int64_t C = 64;
  AddValue(g->add_input(), "x", {batch, 8, 12, 12});
  *g->add_initializer() = FloatTensor("w0", {C, 8, 1, 1}, Wave(C * 8, 0.3f, 0.4f));
  *g->add_initializer() = FloatTensor("b0", {C}, Wave(C, 0.1f, 0.6f));
  *g->add_initializer() = FloatTensor("w1", {C, C, 3, 3}, Wave(C * C * 9, 0.06f, 0.1f));
  *g->add_initializer() = FloatTensor("b1", {C}, Wave(C, 0.1f, 0.2f));
  Node(g, "Conv", {"x", "w0", "b0"}, "f");
  Ints(Node(g, "Conv", {"f", "w1", "b1"}, "y"), "pads", {1, 1, 1, 1});
  AddValue(g->add_output(), "y", {batch, C, 12, 12});
  return m.SerializeAsString();
}

// x [batch, 64, 16, 16] -> max pool (3x3, stride 2) -> conv3x3 (64 -> 64) -> y: the pool stores its output as bf16
// too, which the convolution gathers.
std::string PoolFedConvolution(int64_t batch) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  constexpr int64_t C = 64;
  AddValue(g->add_input(), "x", {batch, C, 16, 16});
  *g->add_initializer() = FloatTensor("w1", {C, C, 3, 3}, Wave(C * C * 9, 0.06f, 0.1f));
  *g->add_initializer() = FloatTensor("b1", {C}, Wave(C, 0.3f, 0.2f));
  onnx::NodeProto* pool = Node(g, "MaxPool", {"x"}, "p");
  Ints(pool, "kernel_shape", {3, 3});
  Ints(pool, "strides", {2, 2});
  Ints(pool, "pads", {1, 1, 1, 1});
  Ints(Node(g, "Conv", {"p", "w1", "b1"}, "y"), "pads", {1, 1, 1, 1});
  AddValue(g->add_output(), "y", {batch, C, 8, 8});
  return m.SerializeAsString();
}

// x [batch, 3, 20, 20] -> conv 7x7 / 2 (3 -> 64, bias) -> relu -> y: the 3-channel NCHW image is copied by NHWC_BF16
// into bf16 NHWC padded to 8 channels, reading through the input's transpose (which emits nothing), and the
// convolution gathers that against its weight packed with the same zero channels.
std::string ImageConvolution(int64_t batch) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  constexpr int64_t C = 64;
  AddValue(g->add_input(), "x", {batch, 3, 20, 20});
  *g->add_initializer() = FloatTensor("w", {C, 3, 7, 7}, Noise(C * 3 * 49, 0.1f, 1));
  *g->add_initializer() = FloatTensor("b", {C}, Noise(C, 0.1f, 2));
  onnx::NodeProto* conv = Node(g, "Conv", {"x", "w", "b"}, "c");
  Ints(conv, "pads", {3, 3, 3, 3});
  Ints(conv, "strides", {2, 2});
  Node(g, "Relu", {"c"}, "y");
  AddValue(g->add_output(), "y", {batch, C, 10, 10});
  return m.SerializeAsString();
}

// x [1, 32, 8, 8] -> conv 3x3 (32 -> 256) -> relu -> conv 3x3 (256 -> 64) -> y, on 4 SMs: both split over K,
// the second multiplying 9 of its 36 K slabs an instruction.
std::string WideThenNarrow() {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  AddValue(g->add_input(), "x", {1, 32, 8, 8});
  *g->add_initializer() = FloatTensor("w1", {256, 32, 3, 3}, Noise(256 * 32 * 9, 0.06f, 5));
  *g->add_initializer() = FloatTensor("w2", {64, 256, 3, 3}, Noise(64 * 256 * 9, 0.03f, 6));
  Ints(Node(g, "Conv", {"x", "w1"}, "c1"), "pads", {1, 1, 1, 1});
  Node(g, "Relu", {"c1"}, "r1");
  Ints(Node(g, "Conv", {"r1", "w2"}, "y"), "pads", {1, 1, 1, 1});
  AddValue(g->add_output(), "y", {1, 64, 8, 8});
  return m.SerializeAsString();
}

// x [1, 64, 8, 8] -> conv 3x3 (64 -> 12, split over K on many SMs: its ReLU left to its reader) -> relu -> conv 3x3
// (12 -> 64) -> y: the second convolution's 12 channels are padded to 16 by NHWC_BF16, which applies the ReLU.
std::string PaddedAfterSplit() {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  AddValue(g->add_input(), "x", {1, 64, 8, 8});
  *g->add_initializer() = FloatTensor("w0", {12, 64, 3, 3}, Noise(12 * 64 * 9, 0.06f, 3));
  *g->add_initializer() = FloatTensor("w1", {64, 12, 3, 3}, Noise(64 * 12 * 9, 0.1f, 4));
  Ints(Node(g, "Conv", {"x", "w0"}, "c0"), "pads", {1, 1, 1, 1});
  Node(g, "Relu", {"c0"}, "r0");
  Ints(Node(g, "Conv", {"r0", "w1"}, "y"), "pads", {1, 1, 1, 1});
  AddValue(g->add_output(), "y", {1, 64, 8, 8});
  return m.SerializeAsString();
}

struct PassShape {
  int gemms = 0, split = 0, fused = 0;  // GEMM / CONV_GEMM instructions; parts of a split over K; taking over ADD / RELU
  int sums = 0, sum_relu = 0;            // SUM_SPLITS instructions; those applying the ReLU
  int conv_gemms = 0, im2cols = 0;
  int relu_on_read = 0;  // CONV_GEMM or IM2COL instructions applying a ReLU to what they read
  int bf16_inputs = 0, bf16_outputs = 0;  // CONV_GEMM gathering a bf16 input; storing a bf16 copy of its output
  int padded = 0, padded_relu = 0;        // NHWC_BF16 instructions; those applying a ReLU
  std::set<std::string> elementwise_ops;  // the ops ELEMENTWISE instructions carry out
};
PassShape Inspect(const scheduler::Schedule& s) {
  PassShape p;
  for (const scheduler::SmQueue& q : s.queues()) {
    for (const scheduler::Instruction& inst : q.instructions()) {
      if (inst.opcode() == "ELEMENTWISE") p.elementwise_ops.insert(inst.op());
      p.padded += inst.opcode() == "NHWC_BF16";
      p.padded_relu += inst.opcode() == "NHWC_BF16" && inst.args(11) == 1;  // NhwcBf16Args.relu
      p.sums += inst.opcode() == "SUM_SPLITS";
      p.sum_relu += inst.opcode() == "SUM_SPLITS" && (inst.args(7) & isa::kSumReluOut);  // SumSplitsArgs.flags
      const bool conv = inst.opcode() == "CONV_GEMM";
      p.im2cols += inst.opcode() == "IM2COL";
      p.relu_on_read += (inst.opcode() == "IM2COL" && inst.args(20) == 1) ||  // ImToColArgs.relu
                        (conv && (inst.args(21) & isa::kConvReluInput));       // ConvGemmArgs.flags
      p.bf16_inputs += conv && (inst.args(21) & isa::kConvBf16Input);  // ConvGemmArgs.flags
      p.bf16_outputs += conv && inst.args(10) != isa::kNoTensor;        // ConvGemmArgs.out_bf16
      if (inst.opcode() != "GEMM" && !conv) continue;
      ++p.gemms;
      p.conv_gemms += conv;
      p.split += inst.args(conv ? 5 : offsetof(isa::GemmArgs, epilogue) / 4) == isa::kGemmPartialF32;  // the epilogue
      p.fused += inst.op().find(',') != std::string::npos;
    }
  }
  return p;
}

void RunOn(runtime::GraphRunner::Backend backend, const graph::OnnxModel& m, const scheduler::Schedule& pass,
           int64_t batch);

// Compiles the block for `num_sms` SMs and runs it twice on the VM (and the GPU where there is one), fresh inputs
// each time, against the oracle.
void RunAgainstOracle(int64_t batch, uint32_t num_sms, bool im2col, PassShape* shape, bool bf16 = true,
                      const std::string& onnx = "") {
  absl::StatusOr<graph::OnnxModel> m =
      graph::ImportOnnxBytes(onnx.empty() ? ResidualBlock(batch) : onnx, "block.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  scheduler::CompileOptions options;
  options.set_num_sms(num_sms);
  options.set_conv_im2col(im2col);
  if (!bf16) options.set_conv_bf16_activations(false);
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "block.onnx", options);
  ASSERT_TRUE(pass.ok()) << pass.status();
  ASSERT_TRUE(pass->has_graph());
  *shape = Inspect(*pass);
  std::string why_no_gpu;
  for (auto backend : {runtime::GraphRunner::Backend::kCpu, runtime::GraphRunner::Backend::kGpu}) {
    if (backend == runtime::GraphRunner::Backend::kGpu && !runtime::GpuAvailable(&why_no_gpu)) {
      std::printf("GPU part skipped: %s\n", why_no_gpu.c_str());
      continue;
    }
    RunOn(backend, *m, *pass, batch);
  }
}

void RunOn(runtime::GraphRunner::Backend backend, const graph::OnnxModel& m, const scheduler::Schedule& pass,
           int64_t batch) {
  const auto& dims = m.graph.tensor(m.inputs[0]).shape();
  graph::HostTensor x = graph::HostTensor::Zeros(graph::F32, std::vector<int64_t>(dims.begin(), dims.end()));
  x.f32 = Wave(x.f32.size(), 1.0f, 0.0f);
  absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> vm =
      runtime::GraphRunner::Create(pass, m.weights, backend);
  ASSERT_TRUE(vm.ok()) << vm.status();
  for (int run = 0; run < 2; ++run) {  // a second run starts from the first's arena and barrier counts
    absl::StatusOr<runtime::TensorMap> got = (*vm)->Run({{m.inputs[0], x}});
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
        << (backend == runtime::GraphRunner::Backend::kGpu ? "GPU" : "VM") << ", batch " << batch << ", run " << run;
    x.f32 = Wave(x.f32.size(), 1.0f, 1.0f);  // fresh inputs for the second run
  }
}

TEST(GraphPass, FewTilesSplitOverKAndSumTheirPartsWithTheResidualAndTheRelu) {
  for (bool im2col : {false, true}) {
    SCOPED_TRACE(im2col ? "IM2COL + GEMM" : "CONV_GEMM");
    PassShape shape;
    RunAgainstOracle(1, 132, im2col, &shape);
    EXPECT_GT(shape.split, 2) << "the 64-row convolutions should be split over K on 132 SMs";
    EXPECT_GT(shape.sums, 0);
    EXPECT_GT(shape.sum_relu, 0) << "conv1's sum should apply its ReLU";
    EXPECT_EQ(shape.relu_on_read, 0) << "a sum leaves no ReLU to its readers";
    // conv2 multiplies 2 K slabs an instruction: a bf16 copy of conv1's sum would not pay.
    EXPECT_EQ(shape.bf16_inputs, 0);
    EXPECT_EQ(shape.padded, 0);
    EXPECT_EQ(shape.conv_gemms > 0, !im2col);
    EXPECT_EQ(shape.im2cols > 0, im2col);
  }
}

// Same input, same output: the residual block split over K on 132 SMs (parts summed by SUM_SPLITS in part order),
// run three times in fresh runners, gives bitwise the same output on the VM (its SMs are threads finishing in any
// order) and on the GPU where there is one.
TEST(GraphPass, ASplitPassIsBitwiseTheSameEveryRun) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(ResidualBlock(1), "block.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  scheduler::CompileOptions options;
  options.set_num_sms(132);
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "block.onnx", options);
  ASSERT_TRUE(pass.ok()) << pass.status();
  ASSERT_GT(Inspect(*pass).sums, 0) << "the block should be split over K on 132 SMs";
  const auto& dims = m->graph.tensor(m->inputs[0]).shape();
  graph::HostTensor x = graph::HostTensor::Zeros(graph::F32, std::vector<int64_t>(dims.begin(), dims.end()));
  x.f32 = Wave(x.f32.size(), 1.0f, 0.0f);
  std::string why_no_gpu;
  for (auto backend : {runtime::GraphRunner::Backend::kCpu, runtime::GraphRunner::Backend::kGpu}) {
    if (backend == runtime::GraphRunner::Backend::kGpu && !runtime::GpuAvailable(&why_no_gpu)) {
      std::printf("GPU part skipped: %s\n", why_no_gpu.c_str());
      continue;
    }
    std::vector<float> first;
    for (int run = 0; run < 3; ++run) {
      absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> r =
          runtime::GraphRunner::Create(*pass, m->weights, backend);
      ASSERT_TRUE(r.ok()) << r.status();
      absl::StatusOr<runtime::TensorMap> got = (*r)->Run({{m->inputs[0], x}});
      ASSERT_TRUE(got.ok()) << got.status();
      const std::vector<float>& y = got->at(m->outputs[0]).f32;
      if (run == 0) {
        first = y;
      } else {
        EXPECT_EQ(std::memcmp(y.data(), first.data(), y.size() * 4), 0)
            << (backend == runtime::GraphRunner::Backend::kGpu ? "GPU" : "VM") << ", run " << run + 1;
      }
    }
  }
}

// CompileOptions.max_k_splits bounds the ways a convolution with few tiles is split over K; 1 splits none.
TEST(GraphPass, MaxKSplitsBoundsTheSplitOverK) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(ResidualBlock(1), "block.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  for (uint32_t bound : {0u, 2u, 1u}) {
    scheduler::CompileOptions options;
    options.set_num_sms(132);
    options.set_max_k_splits(bound);
    absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "block.onnx", options);
    ASSERT_TRUE(pass.ok()) << pass.status();
    uint32_t most = 0;
    for (const scheduler::SmQueue& q : pass->queues()) {
      for (const scheduler::Instruction& inst : q.instructions()) {
        if (inst.opcode() == "SUM_SPLITS") most = std::max<uint32_t>(most, inst.args(4));  // SumSplitsArgs.splits
      }
    }
    if (bound == 0) EXPECT_GT(most, 2u) << "unbounded, the 64-row convolutions split more than 2 ways";
    else if (bound == 1) EXPECT_EQ(most, 0u) << "max_k_splits 1: nothing split";
    else EXPECT_EQ(most, bound);
  }
}

TEST(GraphPass, ASplitSumIsCopiedToBf16ForAReaderOfManySlabs) {
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16 activations" : "f32 activations");
    PassShape shape;
    RunAgainstOracle(1, 4, false, &shape, bf16, WideThenNarrow());
    EXPECT_GT(shape.split, 0);
    EXPECT_GT(shape.sum_relu, 0);
    EXPECT_EQ(shape.relu_on_read, 0);
    if (bf16) {
      // c1's sum (split over K, its ReLU applied by the sum) copied by NHWC_BF16; c2 (36 slabs, 4 ways) gathers it.
      EXPECT_GT(shape.padded, 0);
      EXPECT_EQ(shape.padded_relu, 0);
      EXPECT_GT(shape.bf16_inputs, 0);
    } else {
      EXPECT_EQ(shape.padded, 0);
    }
  }
}

TEST(GraphPass, ManyTilesTakeTheBiasResidualAndReluIntoTheEpilogue) {
  for (bool im2col : {false, true}) {
    SCOPED_TRACE(im2col ? "IM2COL + GEMM" : "CONV_GEMM");
    PassShape shape;
    RunAgainstOracle(8, 4, im2col, &shape);
    EXPECT_EQ(shape.split, 0);
    EXPECT_EQ(shape.sums, 0);
    EXPECT_GT(shape.fused, 0) << "conv2's GEMM should take over the residual ADD and the RELU";
    // conv1's output is read by conv2 alone: stored as bf16 only, and gathered so.
    EXPECT_EQ(shape.bf16_inputs, im2col ? 0 : shape.conv_gemms / 2);
    EXPECT_EQ(shape.bf16_outputs, im2col ? 0 : shape.conv_gemms / 2);
  }
}

TEST(GraphPass, AConvolutionGathersItsProducersBf16CopySplitOverKOrWhole) {
  for (uint32_t num_sms : {132u, 2u}) {
    SCOPED_TRACE(absl::StrCat(num_sms, " SMs"));
    PassShape shape;
    RunAgainstOracle(2, num_sms, false, &shape, true, FedConvolution(2));
    EXPECT_EQ(shape.bf16_outputs, 3) << "the 1x1 convolution's 3 row tiles store bf16 alone";
    EXPECT_EQ(shape.bf16_inputs, shape.conv_gemms - 3);
    EXPECT_EQ(shape.split > 0, num_sms == 132u);
    EXPECT_EQ(shape.sums > 0, num_sms == 132u);
  }
}

TEST(GraphPass, AConvolutionGathersAPoolsBf16Copy) {
  PassShape shape;
  RunAgainstOracle(2, 2, false, &shape, true, PoolFedConvolution(2));
  EXPECT_GT(shape.conv_gemms, 0);
  EXPECT_EQ(shape.bf16_inputs, shape.conv_gemms);
}

TEST(GraphPass, ConvolutionsGatherF32WhenBf16ActivationsAreOff) {
  PassShape shape;
  RunAgainstOracle(8, 4, false, &shape, /*bf16=*/false);
  EXPECT_GT(shape.conv_gemms, 0);
  EXPECT_EQ(shape.bf16_inputs, 0);
  EXPECT_EQ(shape.bf16_outputs, 0);
}

TEST(GraphPass, AThreeChannelImageIsPaddedToEightBf16Channels) {
  for (uint32_t num_sms : {132u, 2u}) {
    SCOPED_TRACE(absl::StrCat(num_sms, " SMs"));
    PassShape shape;
    RunAgainstOracle(2, num_sms, false, &shape, true, ImageConvolution(2));
    EXPECT_GT(shape.padded, 0);
    EXPECT_EQ(shape.padded_relu, 0);
    EXPECT_EQ(shape.bf16_inputs, shape.conv_gemms);
    // The input's transpose is read through: no ELEMENTWISE carries it out.
    EXPECT_EQ(shape.elementwise_ops.count("c/nhwc_in"), 0u);
  }
  PassShape off;
  RunAgainstOracle(2, 2, false, &off, /*bf16=*/false, ImageConvolution(2));
  EXPECT_EQ(off.padded, 0);
  EXPECT_EQ(off.bf16_inputs, 0);
  EXPECT_EQ(off.elementwise_ops.count("c/nhwc_in"), 1u) << "the input's transpose, carried out";
}

TEST(GraphPass, APaddedCopyReadsASplitConvolutionsSumWithItsRelu) {
  PassShape shape;
  RunAgainstOracle(1, 132, false, &shape, true, PaddedAfterSplit());
  EXPECT_GT(shape.split, 0) << "the 64 -> 12 convolution should be split over K on 132 SMs";
  EXPECT_GT(shape.sum_relu, 0) << "its sum applies the ReLU";
  EXPECT_GT(shape.padded, 0);
  EXPECT_EQ(shape.padded_relu, 0);
}

// x [2, 16, 32] through a pre-norm transformer encoder block as torch exports one: LayerNormalization, Q / K / V
// MatMuls with biases, heads split by Reshape + Transpose, Q·Kᵀ and P·V as MatMuls of two activations (batched over
// 2 x 4 heads), a scaled Softmax, the O projection and residual, LayerNormalization, an MLP with erf GELU spelled
// out (Div, Erf, Add, Mul, Mul), the second residual.
std::string EncoderBlock() {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  constexpr int64_t B = 2, S = 16, D = 32, H = 4, Dh = 8, F = 64;
  AddValue(g->add_input(), "x", {B, S, D});
  float phase = 0.1f;
  auto weight = [&](const std::string& name, std::vector<int64_t> dims, float scale) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    *g->add_initializer() = FloatTensor(name, dims, Wave(static_cast<size_t>(n), scale, phase += 0.37f));
  };
  weight("ln1_g", {D}, 1.0f), weight("ln1_b", {D}, 0.1f), weight("ln2_g", {D}, 1.0f), weight("ln2_b", {D}, 0.1f);
  for (const char* w : {"wq", "wk", "wv", "wo"}) weight(w, {D, D}, 0.2f);
  for (const char* b : {"bq", "bk", "bv"}) weight(b, {D}, 0.05f);
  weight("w1", {D, F}, 0.2f), weight("w2", {F, D}, 0.15f);
  *g->add_initializer() = FloatTensor("scale", {1}, {1.0f / std::sqrt(static_cast<float>(Dh))});
  *g->add_initializer() = FloatTensor("sqrt2", {1}, {std::sqrt(2.0f)});
  *g->add_initializer() = FloatTensor("one", {1}, {1.0f});
  *g->add_initializer() = FloatTensor("half", {1}, {0.5f});
  *g->add_initializer() = Int64Tensor("heads", {4}, {B, S, H, Dh});
  *g->add_initializer() = Int64Tensor("rows", {3}, {B, S, D});
  Node(g, "LayerNormalization", {"x", "ln1_g", "ln1_b"}, "ln1");
  for (const char* t : {"q", "k", "v"}) {
    Node(g, "MatMul", {"ln1", absl::StrCat("w", t)}, absl::StrCat(t, "_mm"));
    Node(g, "Add", {absl::StrCat(t, "_mm"), absl::StrCat("b", t)}, t);
    Node(g, "Reshape", {t, "heads"}, absl::StrCat(t, "_4d"));
  }
  Ints(Node(g, "Transpose", {"q_4d"}, "qh"), "perm", {0, 2, 1, 3});
  Ints(Node(g, "Transpose", {"k_4d"}, "kt"), "perm", {0, 2, 3, 1});
  Ints(Node(g, "Transpose", {"v_4d"}, "vh"), "perm", {0, 2, 1, 3});
  Node(g, "MatMul", {"qh", "kt"}, "scores");
  Node(g, "Mul", {"scores", "scale"}, "scaled");
  Node(g, "Softmax", {"scaled"}, "p");
  Node(g, "MatMul", {"p", "vh"}, "ctx");
  Ints(Node(g, "Transpose", {"ctx"}, "ctx_t"), "perm", {0, 2, 1, 3});
  Node(g, "Reshape", {"ctx_t", "rows"}, "ctx_rows");
  Node(g, "MatMul", {"ctx_rows", "wo"}, "attn");
  Node(g, "Add", {"x", "attn"}, "x1");
  Node(g, "LayerNormalization", {"x1", "ln2_g", "ln2_b"}, "ln2");
  Node(g, "MatMul", {"ln2", "w1"}, "h");
  Node(g, "Div", {"h", "sqrt2"}, "h_s");
  Node(g, "Erf", {"h_s"}, "h_erf");
  Node(g, "Add", {"h_erf", "one"}, "h_1");
  Node(g, "Mul", {"h", "h_1"}, "h_m");
  Node(g, "Mul", {"h_m", "half"}, "gelu");
  Node(g, "MatMul", {"gelu", "w2"}, "mlp");
  Node(g, "Add", {"x1", "mlp"}, "y");
  AddValue(g->add_output(), "y", {B, S, D});
  return m.SerializeAsString();
}

double RelativeRms(const graph::HostTensor& y, const graph::HostTensor& want) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < y.size(); ++i) {
    err += (y.Get(i) - want.Get(i)) * (y.Get(i) - want.Get(i));
    norm += want.Get(i) * want.Get(i);
  }
  return std::sqrt(err / norm);
}

// Runs `pass` `runs` times on the VM and the GPU (where there is one), fresh inputs each time, against an oracle
// that runs alongside (STATE tensors carry over from run to run on both sides).
void RunPassAgainstOracle(const scheduler::Schedule& pass, const graph::Graph& graph, const graph::WeightStore& weights,
                          int runs, double tolerance) {
  std::string why_no_gpu;
  for (auto backend : {runtime::GraphRunner::Backend::kCpu, runtime::GraphRunner::Backend::kGpu}) {
    const char* where = backend == runtime::GraphRunner::Backend::kGpu ? "GPU" : "VM";
    if (backend == runtime::GraphRunner::Backend::kGpu && !runtime::GpuAvailable(&why_no_gpu)) {
      std::printf("GPU part skipped: %s\n", why_no_gpu.c_str());
      continue;
    }
    absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner =
        runtime::GraphRunner::Create(pass, weights, backend);
    ASSERT_TRUE(runner.ok()) << runner.status();
    graph::Evaluator oracle(graph, weights);
    for (int run = 0; run < runs; ++run) {
      runtime::TensorMap inputs;
      for (const scheduler::IoTensor& io : pass.graph().inputs()) {
        const graph::TensorDef& t = graph.tensor(io.name());
        graph::HostTensor v = graph::HostTensor::Zeros(graph::F32, {t.shape().begin(), t.shape().end()});
        v.f32 = Wave(v.f32.size(), 1.0f, 0.5f * static_cast<float>(run) + static_cast<float>(inputs.size()));
        inputs[io.name()] = std::move(v);
      }
      absl::StatusOr<runtime::TensorMap> got = (*runner)->Run(inputs);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(oracle.Run(inputs).ok());
      for (const scheduler::IoTensor& io : pass.graph().outputs()) {
        EXPECT_LT(RelativeRms(got->at(io.name()), oracle.Get(io.name())), tolerance)
            << where << ", output " << io.name() << ", run " << run;
      }
    }
  }
}

TEST(GraphPass, TransformerEncoderBlockWithProductsOfTwoActivations) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(EncoderBlock(), "encoder.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "encoder.onnx", {});
  ASSERT_TRUE(pass.ok()) << pass.status();
  int norms = 0, gemms = 0;
  for (const scheduler::SmQueue& q : pass->queues()) {
    for (const scheduler::Instruction& inst : q.instructions()) {
      norms += inst.opcode() == "NORM_ROWS";
      gemms += inst.opcode() == "GEMM";
    }
  }
  EXPECT_GT(norms, 0);
  EXPECT_GE(gemms, 2 * 2 * 4 + 6) << "a GEMM per batch and head for Q·Kᵀ and P·V, one or more per projection (6)";
  RunPassAgainstOracle(*pass, m->graph, m->weights, 2, 1e-2);
}

// A gated depthwise-conv block on [T, C] rows (RMSNorm, u and gate projections, causal CONV1D with its state,
// SiLU-gated, the out projection and residual, LayerNorm), run three times: each run continues the sequence from
// the state the previous one left, as the oracle's does.
TEST(GraphPass, CausalConv1dCarriesItsStateFromPassToPass) {
  constexpr int64_t T = 5, C = 48, K = 4;
  graph::GraphBuilder b("gated_conv");
  b.Input("x", {T, C}, graph::F32);
  for (const char* w : {"wu", "wg", "wo"}) b.Weight(w, {C, C});
  b.Weight("conv_w", {C, K});
  b.Weight("conv_b", {C});
  b.Weight("norm", {C});
  b.Weight("ln_g", {C});
  b.Weight("ln_b", {C});
  b.State("conv_state", {C, K - 1});
  const std::string n = b.RmsNorm("n", "x", "norm", 1e-5f);
  const std::string u = b.Linear("u", n, "wu");
  const std::string gate = b.Linear("gate", n, "wg");
  const std::string c = b.Conv1d("c", u, "conv_w", "conv_state", "conv_b");
  const std::string y = b.SiluMul("y", gate, c);
  const std::string o = b.Linear("o", y, "wo");
  const std::string r = b.Add("r", o, "x");
  b.MarkOutput(b.LayerNorm("out", r, "ln_g", "ln_b", 1e-5f));
  absl::StatusOr<graph::Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  graph::WeightStore weights;
  float phase = 0.0f;
  for (const graph::TensorDef* t : g->TensorsOfKind(graph::WEIGHT)) {
    graph::HostTensor w = graph::HostTensor::Zeros(graph::BF16, {t->shape().begin(), t->shape().end()});
    const std::vector<float> v = Wave(w.bf16.size(), 0.3f, phase += 0.5f);
    for (size_t i = 0; i < v.size(); ++i) w.bf16[i] = graph::FloatToBf16(v[i]);
    weights[t->name()] = std::move(w);
  }
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(*g, "gated_conv", {});
  ASSERT_TRUE(pass.ok()) << pass.status();
  RunPassAgainstOracle(*pass, *g, weights, 3, 1e-2);
}

// A graph pass models an instruction's fixed cost at kGraphInstructionOverheadNs unless the options set one.
TEST(GraphPass, InstructionOverheadDefaultsToTheGraphVariantsUnlessSet) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(ResidualBlock(1), "block.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  scheduler::CompileOptions options;
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "block.onnx", options);
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_EQ(pass->options().cost().instruction_overhead_ns(), scheduler::kGraphInstructionOverheadNs);
  options.mutable_cost()->set_instruction_overhead_ns(700);
  pass = scheduler::Compile(m->graph, "block.onnx", options);
  ASSERT_TRUE(pass.ok()) << pass.status();
  EXPECT_EQ(pass->options().cost().instruction_overhead_ns(), 700);
}

TEST(GraphPass, UnsupportedOpsAreRefusedByName) {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  AddValue(g->add_input(), "x", {1, 2, 5, 5});
  AddValue(g->add_input(), "b", {3});
  *g->add_initializer() = FloatTensor("w", {3, 2, 3, 3}, Wave(54, 0.2f, 0.0f));
  Node(g, "Conv", {"x", "w", "b"}, "y");
  AddValue(g->add_output(), "y", {1, 3, 3, 3});
  absl::StatusOr<graph::OnnxModel> model = graph::ImportOnnxBytes(m.SerializeAsString(), "conv.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(model->graph, "conv.onnx", {});
  ASSERT_FALSE(pass.ok());
  EXPECT_EQ(pass.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(pass.status().message().find("(CONV2D): a bias computed at run time is not lowered"), std::string::npos)
      << pass.status();
}


// x [1, 16, 8, 8] -> depthwise conv 3x3 (group 16, pads 1, bias) -> y, or -> `activation` -> y.
std::string DepthwiseConvolution(const std::string& activation = "") {
  onnx::ModelProto m;
  m.add_opset_import()->set_version(14);
  onnx::GraphProto* g = m.mutable_graph();
  constexpr int64_t C = 16;
  AddValue(g->add_input(), "x", {1, C, 8, 8});
  *g->add_initializer() = FloatTensor("w", {C, 1, 3, 3}, Wave(C * 9, 0.2f, 0.4f));
  *g->add_initializer() = FloatTensor("b", {C}, Wave(C, 0.1f, 0.6f));
  onnx::NodeProto* conv = Node(g, "Conv", {"x", "w", "b"}, activation.empty() ? "y" : "conv");
  Ints(conv, "pads", {1, 1, 1, 1});
  onnx::AttributeProto* group = conv->add_attribute();
  group->set_name("group");
  group->set_type(onnx::AttributeProto::INT);
  group->set_i(C);
  if (!activation.empty()) Node(g, activation, {"conv"}, "y");
  AddValue(g->add_output(), "y", {1, C, 8, 8});
  return m.SerializeAsString();
}

// A depthwise convolution's one reader, a unary element-wise op (MobileNets' ReLU and HardSwish), is applied by
// DWCONV as it stores (DwConvArgs::out_func): no ELEMENTWISE pass of its own (the input's NCHW -> NHWC copy stays);
// the VM (and the GPU) against the oracle.
TEST(GraphPass, ADepthwiseConvolutionAppliesItsActivationAsItStores) {
  for (const std::string activation : {"Relu", "HardSwish", "Sigmoid"}) {
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(DepthwiseConvolution(activation), "dw.onnx");
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "dw.onnx", scheduler::CompileOptions());
    ASSERT_TRUE(pass.ok()) << pass.status();
    int dwconv = 0, fused = 0;
    for (const scheduler::SmQueue& q : pass->queues()) {
      for (const scheduler::Instruction& inst : q.instructions()) {
        dwconv += inst.opcode() == "DWCONV";
        fused += inst.opcode() == "DWCONV" && inst.args(offsetof(isa::DwConvArgs, out_func) / 4) != isa::kEwCopy;
      }
    }
    const PassShape shape = Inspect(*pass);
    EXPECT_GT(dwconv, 0) << activation;
    EXPECT_EQ(fused, dwconv) << activation;
    EXPECT_FALSE(shape.elementwise_ops.contains("y")) << activation << " ran as an ELEMENTWISE pass";
    RunPassAgainstOracle(*pass, m->graph, m->weights, 2, 1e-5);
  }
}

// Every opcode of the table is emitted by some lowering (an opcode none emits is dead code in the table and the
// kernel): a decode step of random:tiny with every fusion on and with every fusion off, its prefill pass (20 rows:
// split projections, sliced folds), a decode step of its FP8 form, a gated-conv decode step, and general-graph passes (convolutions whole, by
// IM2COL and depthwise, a pool, a padded image copy, an encoder block). tests/every_opcode_test.cc runs each opcode.
TEST(GraphPass, EveryOpcodeIsEmittedBySomeLowering) {
  std::set<std::string> emitted;
  auto add = [&](const scheduler::Schedule& s) {
    for (const scheduler::SmQueue& q : s.queues()) {
      for (const scheduler::Instruction& inst : q.instructions()) emitted.insert(inst.opcode());
    }
  };
  graph::ModelOptions mo;
  mo.max_seq = 64;
  for (const char* spec : {"random:tiny", "random:gated-conv-tiny"}) {
    absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    for (bool fused : {true, false}) {
      scheduler::CompileOptions o;
      if (!fused) *o.mutable_fusion() = scheduler::AllFusionsOff();
      absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, o);
      ASSERT_TRUE(s.ok()) << spec << ": " << s.status();
      add(*s);
      if (fused && std::string(spec) == "random:tiny") {
        absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m->graph, *s, 20);
        ASSERT_TRUE(pass.ok()) << pass.status();
        add(*pass);
      }
    }
  }
  for (const char* scheme : {"FP8", "W4A16"}) {
    graph::ModelOptions quantized = mo;
    quantized.scheme = scheme;
    absl::StatusOr<graph::Model> m = graph::LoadModel("random:tiny", quantized);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, {});
    ASSERT_TRUE(s.ok()) << s.status();
    add(*s);
  }
  struct Onnx {
    std::string bytes;
    bool im2col;
  };
  for (const Onnx& o : {Onnx{ResidualBlock(1), false}, Onnx{ResidualBlock(1), true}, Onnx{ImageConvolution(1), false},
                        Onnx{PoolFedConvolution(1), false}, Onnx{EncoderBlock(), false},
                        Onnx{DepthwiseConvolution(), false}}) {
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(o.bytes, "m.onnx");
    ASSERT_TRUE(m.ok()) << m.status();
    scheduler::CompileOptions options;
    options.set_conv_im2col(o.im2col);
    absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "m.onnx", options);
    ASSERT_TRUE(pass.ok()) << pass.status();
    add(*pass);
  }
  for (int op = 0; op < isa::kNumOpcodes; ++op) {
    const std::string name = isa::OpcodeName(static_cast<isa::Opcode>(op));
    EXPECT_TRUE(emitted.count(name)) << name << " is emitted by no lowering";
  }
}

}  // namespace
}  // namespace loom
