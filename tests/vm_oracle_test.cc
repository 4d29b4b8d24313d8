// The CPU reference VM, running compiled schedules of random:tiny, against the
// op-by-op oracle: logits within 1e-5 (relative, float32) and identical greedy
// tokens for 32 steps, for every SM policy, several SM counts, both barrier
// granularities and with every fusion turned off; and the tiny model of every
// family (padded rows, biases, 7 heads per KV head, YaRN, per-head q/k norms).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "graph/decode_oracle.h"
#include "graph/model.h"
#include "gtest/gtest.h"
#include "megakernel/reference_vm.h"
#include "tests/relative_error.h"
#include "scheduler/compiler.h"
#include "scheduler/options.h"

namespace loom {
namespace {

constexpr int kNewTokens = 32;
constexpr double kLogitTolerance = 1e-5;

class VmOracle : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    graph::ModelOptions mo;
    mo.max_seq = 64;
    absl::StatusOr<graph::Model> m = graph::LoadModel("random:tiny", mo);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = new graph::Model(*std::move(m));
    absl::StatusOr<graph::OracleDecode> o = graph::DecodeWithOracle(*model_, kPrompt, kNewTokens);
    ASSERT_TRUE(o.ok()) << o.status();
    oracle_ = new graph::OracleDecode(*std::move(o));
  }

  void CheckSchedule(const scheduler::CompileOptions& options, const std::string& what) {
    CheckAgainstOracle(*model_, *oracle_, options, what);
  }

 public:
  static void CheckAgainstOracle(const graph::Model& model, const graph::OracleDecode& oracle,
                                 const scheduler::CompileOptions& options, const std::string& what) {
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model.graph, model.spec, options);
    ASSERT_TRUE(s.ok()) << what << ": " << s.status();
    absl::StatusOr<std::unique_ptr<megakernel::ReferenceVm>> vm = megakernel::ReferenceVm::Create(*s, model.weights);
    ASSERT_TRUE(vm.ok()) << vm.status();
    ASSERT_TRUE((*vm)->Reset(kPrompt).ok());
    const int steps = static_cast<int>(kPrompt.size()) - 1 + kNewTokens;
    for (int step = 0; step < steps; ++step) {
      ASSERT_TRUE((*vm)->Run(1).ok());
      const double err = RelativeError((*vm)->logits(), oracle.logits[step]);
      ASSERT_LE(err, kLogitTolerance) << what << " step " << step;
    }
    EXPECT_EQ((*vm)->tokens(), oracle.tokens) << what;
  }

 protected:

  static inline const std::vector<int32_t> kPrompt = {17, 923, 4, 512};
  static inline graph::Model* model_ = nullptr;
  static inline graph::OracleDecode* oracle_ = nullptr;
};

TEST_F(VmOracle, EveryPolicyAndSmCountMatchesTheOracle) {
  for (scheduler::SmPolicy policy : {scheduler::ROUND_ROBIN, scheduler::LPT, scheduler::CRITICAL_PATH}) {
    for (uint32_t sms : {1u, 3u, 8u, 132u}) {
      scheduler::CompileOptions o;
      o.set_policy(policy);
      o.set_num_sms(sms);
      CheckSchedule(o, absl::StrCat(scheduler::SmPolicy_Name(policy), " on ", sms, " SMs"));
    }
  }
}

TEST_F(VmOracle, PerOpBarriersAndSmallTilesMatchTheOracle) {
  scheduler::CompileOptions o;
  o.set_barrier_granularity(scheduler::PER_OP);
  o.set_num_sms(8);
  o.set_matvec_tiles_per_sm(3);
  o.set_attention_splits(5);
  CheckSchedule(o, "PER_OP, 3 tiles per SM, 5 splits");
}

TEST_F(VmOracle, EveryFusionOffMatchesTheOracle) {
  scheduler::CompileOptions o;
  o.set_num_sms(6);
  o.set_elementwise_chunk(100);
  *o.mutable_fusion() = scheduler::AllFusionsOff();
  CheckSchedule(o, "all fusions off");
}

TEST_F(VmOracle, ManyStepsPerRunEqualsOneStepPerRun) {
  scheduler::CompileOptions o;
  o.set_num_sms(5);
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, "random:tiny", o);
  ASSERT_TRUE(s.ok());
  absl::StatusOr<std::unique_ptr<megakernel::ReferenceVm>> vm = megakernel::ReferenceVm::Create(*s, model_->weights);
  ASSERT_TRUE(vm.ok());
  ASSERT_TRUE((*vm)->Reset(kPrompt).ok());
  ASSERT_TRUE((*vm)->Run(10).ok());
  ASSERT_TRUE((*vm)->Run(static_cast<int>(kPrompt.size()) - 1 + kNewTokens - 10).ok());
  EXPECT_EQ((*vm)->tokens(), oracle_->tokens);
  // A second generation in the same VM (counters keep counting) gives the same tokens.
  ASSERT_TRUE((*vm)->Reset(kPrompt).ok());
  ASSERT_TRUE((*vm)->Run(static_cast<int>(kPrompt.size()) - 1 + kNewTokens).ok());
  EXPECT_EQ((*vm)->tokens(), oracle_->tokens);
  EXPECT_FALSE((*vm)->Run(64).ok());  // past the KV cache: refused, not run
}

TEST(VmOracleFamilies, EveryFamilysTinyModelMatchesTheOracleFusedAndUnfused) {
  for (const char* spec : {"random:tiny-mistral", "random:tiny-qwen2", "random:tiny-qwen3"}) {
    graph::ModelOptions mo;
    mo.max_seq = 64;
    absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, {17, 923, 4, 512}, kNewTokens);
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    for (bool fused : {true, false}) {
      for (uint32_t sms : {3u, 132u}) {
        scheduler::CompileOptions o;
        o.set_num_sms(sms);
        if (!fused) *o.mutable_fusion() = scheduler::AllFusionsOff();
        VmOracle::CheckAgainstOracle(*m, *oracle, o, absl::StrCat(spec, fused ? " fused" : " unfused", " on ", sms));
      }
    }
  }
}

}  // namespace
}  // namespace loom
