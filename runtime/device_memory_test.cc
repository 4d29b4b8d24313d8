// The GPU-memory refusal (FitsDeviceMemory) on given free bytes, and the prefill pass's share of a schedule's weights
// it names: a model that fits only without the prefill pass's operand images is told so, with what it would need.
#include <string>

#include "gtest/gtest.h"
#include "graph/model.h"
#include "runtime/gpu_machine.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"

namespace loom::runtime {
namespace {

constexpr uint64_t kGB = 1000000000;

TEST(DeviceMemory, ARefusalSaysWhatTheModelNeedsWithoutThePrefillImages) {
  EXPECT_TRUE(FitsDeviceMemory(40 * kGB, 3 * kGB, 0, 80 * kGB, 80 * kGB).ok());
  // A 70B model in int4 with its prefill images (141 GB of bf16) on an 80 GB GPU.
  const absl::Status s = FitsDeviceMemory(182 * kGB, 3 * kGB, 141 * kGB, 79 * kGB, 80 * kGB);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(s.message());
  EXPECT_NE(m.find("the model needs 185.07 GB of GPU memory (weights 182.00 GB"), std::string::npos) << m;
  EXPECT_NE(m.find("79.00 GB free of 80.00 GB"), std::string::npos) << m;
  EXPECT_NE(m.find("141.00 GB of the weights are the prefill pass's bf16 operand images: --prefill=false (prompts "
                   "run as decode steps) needs 44.07 GB"),
            std::string::npos)
      << m;
  // Without prefill images the message does not mention them.
  const std::string plain(FitsDeviceMemory(90 * kGB, 3 * kGB, 0, 79 * kGB, 80 * kGB).message());
  EXPECT_EQ(plain.find("--prefill=false"), std::string::npos) << plain;
}

TEST(DeviceMemory, PrefillWeightBytesAreTheOperandImages) {
  graph::ModelOptions mo;
  mo.max_seq = 64;
  absl::StatusOr<graph::Model> m = graph::LoadModel("random:tiny", mo);
  ASSERT_TRUE(m.ok()) << m.status();
  scheduler::CompileOptions with, without;
  with.set_prefill(true);
  without.set_prefill(false);
  absl::StatusOr<scheduler::Schedule> a = scheduler::Compile(m->graph, m->spec, with);
  absl::StatusOr<scheduler::Schedule> b = scheduler::Compile(m->graph, m->spec, without);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(scheduler::PrefillWeightBytes(*b), 0u);
  EXPECT_GT(scheduler::PrefillWeightBytes(*a), 0u);
  // The images are most of what the prefill weights add (the rest: their biases' copies and alignment).
  EXPECT_LE(scheduler::PrefillWeightBytes(*a), a->weight_bytes() - b->weight_bytes());
  EXPECT_GE(scheduler::PrefillWeightBytes(*a), (a->weight_bytes() - b->weight_bytes()) * 9 / 10);
}

}  // namespace
}  // namespace loom::runtime
