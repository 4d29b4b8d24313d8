// GPU tests (ctest label gpu, binary gpu_test) of whole schedules: random:tiny and every family's tiny preset
// on the megakernel against the CPU reference VM (policies, SM counts, fusions, activation slots, one launch
// or a step a launch, the one-pass prefill then decode).
#include <algorithm>

#include "tests/gpu_op_bench.h"

namespace loom::megakernel {
namespace {

using namespace ::loom::runtime;  // the runtime the tests drive

using namespace gpu_bench;  // NOLINT: the bench's helpers and tolerances

class GpuSchedules : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!GpuAvailable(&why)) GTEST_SKIP() << why;
    Load("random:tiny");
  }
  void Load(const std::string& spec, int max_seq = 64, graph::DType kv_dtype = graph::F32) {
    graph::ModelOptions mo;
    mo.max_seq = max_seq;
    mo.kv_dtype = kv_dtype;
    absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<graph::Model>(*std::move(m));
  }

  void Check(const scheduler::CompileOptions& options, int steps_per_launch, const std::string& what) {
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, model_->spec, options);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::vector<int32_t> prompt = {17, 923, 4, 512};
    const int steps = static_cast<int>(prompt.size()) - 1 + 32;
    absl::StatusOr<std::unique_ptr<ReferenceVm>> vm = ReferenceVm::Create(*s, model_->weights);
    ASSERT_TRUE(vm.ok());
    ASSERT_TRUE((*vm)->Reset(prompt).ok());
    ASSERT_TRUE((*vm)->Run(steps).ok());
    absl::StatusOr<std::unique_ptr<GpuDecoder>> gpu = GpuDecoder::Create(*s, model_->weights);
    ASSERT_TRUE(gpu.ok()) << what << ": " << gpu.status();
    ASSERT_TRUE((*gpu)->Reset(prompt).ok());
    const int per_launch = steps_per_launch > 0 ? steps_per_launch : steps;
    for (int done = 0; done < steps; done += per_launch) {
      absl::StatusOr<float> ms = (*gpu)->Run(std::min(per_launch, steps - done));
      ASSERT_TRUE(ms.ok()) << what << ": " << ms.status();
    }
    absl::StatusOr<std::vector<int32_t>> tokens = (*gpu)->tokens();
    absl::StatusOr<std::vector<float>> logits = (*gpu)->logits();
    ASSERT_TRUE(tokens.ok() && logits.ok()) << what;
    EXPECT_EQ(*tokens, (*vm)->tokens()) << what;
    EXPECT_LE(RelativeError(*logits, (*vm)->logits()), kTolerance) << what << ": last step's logits";
  }

  // The VM and a GPU decoder of `s`, each with `prompt` loaded and `pass` run over it.
  void PrefillBoth(const scheduler::Schedule& s, const scheduler::Schedule& pass, const std::vector<int32_t>& prompt,
                   std::unique_ptr<ReferenceVm>* vm, std::unique_ptr<GpuDecoder>* d, const std::string& what) {
    absl::StatusOr<std::unique_ptr<ReferenceVm>> v = ReferenceVm::Create(s, model_->weights);
    ASSERT_TRUE(v.ok()) << what << ": " << v.status();
    ASSERT_TRUE((*v)->Reset(prompt).ok());
    ASSERT_TRUE((*v)->Prefill(pass).ok()) << what;
    absl::StatusOr<std::unique_ptr<GpuDecoder>> g = GpuDecoder::Create(s, model_->weights);
    ASSERT_TRUE(g.ok()) << what << ": " << g.status();
    ASSERT_TRUE((*g)->Reset(prompt).ok());
    absl::StatusOr<float> ms = (*g)->Prefill(pass);
    ASSERT_TRUE(ms.ok()) << what << ": " << ms.status();
    *vm = *std::move(v);
    *d = *std::move(g);
  }

  std::unique_ptr<graph::Model> model_;
};

TEST_F(GpuSchedules, EveryPolicyMatchesTheVmInOneLaunchAndStepByStep) {
  for (scheduler::SmPolicy policy : {scheduler::ROUND_ROBIN, scheduler::LPT, scheduler::CRITICAL_PATH}) {
    for (uint32_t sms : {132u, 8u}) {
      scheduler::CompileOptions o;
      o.set_policy(policy);
      o.set_num_sms(sms);
      const std::string what = absl::StrCat(scheduler::SmPolicy_Name(policy), " on ", sms, " SMs");
      Check(o, 0, what + ", one launch");
      Check(o, 1, what + ", one step per launch");
    }
  }
}

// ARGMAX_REDUCE stores the next step's EMBED row (the default) in every step of a launch but its last, and the EMBED
// runs only in a launch's first step: against the VM in one launch, in launches of 5 steps and a step a launch,
// through the prompt's forced tokens, folded and not. (Past a full KV cache neither the VM nor the GPU session runs.)
TEST_F(GpuSchedules, TheFoldedEmbeddingMatchesTheVmAcrossLaunches) {
  for (bool fold : {true, false}) {
    for (int per_launch : {0, 5, 1}) {
      scheduler::CompileOptions o;
      o.set_num_sms(16);
      o.mutable_fusion()->set_next_embedding(fold);
      Check(o, per_launch, absl::StrCat(fold ? "folded" : "unfolded", ", ", per_launch, " steps a launch"));
    }
  }
}

TEST_F(GpuSchedules, UnfusedAndPerOpSchedulesMatchTheVm) {
  scheduler::CompileOptions o;
  o.set_num_sms(16);
  o.set_barrier_granularity(scheduler::PER_OP);
  o.set_elementwise_chunk(100);
  *o.mutable_fusion() = scheduler::AllFusionsOff();
  Check(o, 0, "unfused, per-op barriers");
}

TEST_F(GpuSchedules, EveryActivationSlotCountMatchesTheVm) {
  for (uint32_t slots = 1; slots <= 4; ++slots) {
    scheduler::CompileOptions o;
    o.set_num_sms(8);  // several instructions per SM in flight through the activation ring
    o.mutable_smem()->set_activation_slots(slots);
    Check(o, 0, absl::StrCat(slots, " activation slots"));
  }
}

// One-pass prefill of random:tiny on the GPU against the same pass on the CPU VM: the KV caches it fills, the
// residual stream after the last layer and the logits of the last prompt row (bf16 operand images on both sides,
// the device's P·V in bf16: the looser chain tolerance), the first new token, and decode after it.
TEST_F(GpuSchedules, PrefillMatchesTheVm) {
  for (const char* spec : {"random:tiny", "random:tiny-qwen3"}) {  // tiny-qwen3: per-head q/k norms
    Load(spec, 512);
    for (uint32_t sms : {132u, 8u}) {
      scheduler::CompileOptions o;
      o.set_num_sms(sms);
      absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, model_->spec, o);
      ASSERT_TRUE(s.ok()) << s.status();
      for (uint32_t rows : {1u, 20u, 129u, 299u}) {
        // On 132 SMs also with 48 KB pages: 128 x 256 GEMM tiles (the wide kernel variant).
        for (uint32_t wide : {0u, 1u}) {
          if (wide && sms == 8) continue;
          const std::string what =
              absl::StrCat(spec, ": prefill of ", rows, " rows on ", sms, " SMs", wide ? ", wide tiles" : "");
          std::vector<int32_t> prompt;
          for (uint32_t i = 0; i < rows; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % 1000));
          // 8 SMs: a barrier per stage, 16 KB pages; 132 SMs: a barrier per row tile and stage, 32 KB pages.
          scheduler::PrefillOptions po;
          po.row_tile_barriers = sms == 8 ? scheduler::PrefillOptions::RowTileBarriers::kOff
                                          : scheduler::PrefillOptions::RowTileBarriers::kOn;
          po.page_bytes = sms == 8 ? 16384 : wide ? isa::kGemmWideStepBytes : 32768;
          absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(model_->graph, *s, rows, po);
          ASSERT_TRUE(pass.ok()) << pass.status();
          std::unique_ptr<ReferenceVm> vm;
          std::unique_ptr<GpuDecoder> d;
          PrefillBoth(*s, *pass, prompt, &vm, &d, what);
          if (HasFatalFailure()) return;
          for (const scheduler::Tensor& t : pass->tensors()) {
            if (t.dtype() != graph::F32 || t.region() != scheduler::ARENA ||
                !(absl::StrContains(t.name(), "cache") || t.name() == "prefill.x")) {
              continue;
            }
            std::vector<float> got(t.bytes() / 4), want(t.bytes() / 4);
            ASSERT_TRUE(d->machine().ReadArena(t.offset(), got.data(), t.bytes()).ok());
            const std::vector<uint8_t> vm_bytes = vm->ReadArena(t.offset(), t.bytes());
            std::memcpy(want.data(), vm_bytes.data(), t.bytes());
            EXPECT_LE(RelativeError(got, want), kPrefillTolerance) << what << ": " << t.name();
          }
          absl::StatusOr<std::vector<float>> logits = d->logits();
          ASSERT_TRUE(logits.ok());
          EXPECT_LE(RelativeError(*logits, vm->logits()), kPrefillTolerance) << what << ": logits";
          absl::StatusOr<std::vector<int32_t>> tokens = d->tokens();
          ASSERT_TRUE(tokens.ok());
          EXPECT_EQ(*tokens, vm->tokens()) << what << ": the first new token";
          ASSERT_TRUE(vm->Run(8).ok());
          ASSERT_TRUE(d->Run(8).ok());
          tokens = d->tokens();
          ASSERT_TRUE(tokens.ok());
          EXPECT_EQ(*tokens, vm->tokens()) << what << ": decode after the prefill";
        }
      }
    }
  }
}

// A bucket's pass (scheduler::PrefillBucketRows) uploaded once and run for prompts of 20 and then 30 rows in the
// pass of 32, 100 and 120 in the pass of 128 (its last-row entry rewritten in the uploaded table each run), and of
// 129 rows in the pass of 256, against the same runs on the VM: the logits and the tokens decoded after.
TEST_F(GpuSchedules, ABucketsPassRunsEveryLengthOfItsLastTile) {
  Load("random:tiny", 512);
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, model_->spec, scheduler::CompileOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(*s, model_->weights);
  ASSERT_TRUE(d.ok()) << d.status();
  for (uint32_t rows : {20u, 30u, 100u, 120u, 129u}) {
    const uint32_t bucket = scheduler::PrefillBucketRows(rows, s->max_seq() - 1);
    absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(model_->graph, *s, bucket);
    ASSERT_TRUE(pass.ok()) << pass.status();
    std::vector<int32_t> prompt;
    for (uint32_t i = 0; i < rows; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % 1000));
    absl::StatusOr<std::unique_ptr<ReferenceVm>> vm = ReferenceVm::Create(*s, model_->weights);
    ASSERT_TRUE(vm.ok());
    ASSERT_TRUE((*vm)->Reset(prompt).ok());
    ASSERT_TRUE((*vm)->Prefill(*pass, rows).ok());
    ASSERT_TRUE((*d)->Reset(prompt).ok());
    ASSERT_TRUE((*d)->Prefill(*pass, false, rows).ok());
    const std::string what = absl::StrCat(rows, " rows in the pass of ", bucket);
    absl::StatusOr<std::vector<float>> logits = (*d)->logits();
    ASSERT_TRUE(logits.ok());
    EXPECT_LE(RelativeError(*logits, (*vm)->logits()), kPrefillTolerance) << what;
    ASSERT_TRUE((*vm)->Run(8).ok());
    ASSERT_TRUE((*d)->Run(8).ok());
    absl::StatusOr<std::vector<int32_t>> tokens = (*d)->tokens();
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ(*tokens, (*vm)->tokens()) << what;
  }
}

// bf16 KV caches (ModelOptions::kv_dtype), random:tiny and tiny-qwen3 (per-head norms): decode fused and unfused,
// and a prefill pass of 129 rows (the caches it fills, the logits, the tokens after it), against the VM.
TEST_F(GpuSchedules, Bf16KvCachesMatchTheVm) {
  for (const char* spec : {"random:tiny", "random:tiny-qwen3"}) {
    Load(spec, 512, graph::BF16);
    for (bool fused : {true, false}) {
      scheduler::CompileOptions o;
      o.set_num_sms(16);
      if (!fused) *o.mutable_fusion() = scheduler::AllFusionsOff();
      Check(o, 0, absl::StrCat(spec, ", bf16 KV", fused ? ", fused" : ", unfused"));
    }
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, model_->spec, scheduler::CompileOptions());
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<int32_t> prompt;
    for (uint32_t i = 0; i < 129; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % 1000));
    absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(model_->graph, *s, 129);
    ASSERT_TRUE(pass.ok()) << pass.status();
    std::unique_ptr<ReferenceVm> vm;
    std::unique_ptr<GpuDecoder> d;
    PrefillBoth(*s, *pass, prompt, &vm, &d, spec);
    if (HasFatalFailure()) return;
    int caches = 0;
    for (const scheduler::Tensor& t : pass->tensors()) {
      if (!absl::StrContains(t.name(), "cache")) continue;
      ASSERT_EQ(t.dtype(), graph::BF16) << t.name();
      std::vector<uint16_t> got_bits(t.bytes() / 2);
      ASSERT_TRUE(d->machine().ReadArena(t.offset(), got_bits.data(), t.bytes()).ok());
      const std::vector<uint8_t> vm_bytes = vm->ReadArena(t.offset(), t.bytes());
      std::vector<float> got, want;
      for (size_t i = 0; i < got_bits.size(); ++i) {
        uint16_t w;
        std::memcpy(&w, vm_bytes.data() + 2 * i, 2);
        got.push_back(graph::Bf16ToFloat(got_bits[i]));
        want.push_back(graph::Bf16ToFloat(w));
      }
      EXPECT_LE(RelativeError(got, want), kPrefillTolerance) << spec << ": " << t.name();
      ++caches;
    }
    EXPECT_EQ(caches, 2 * model_->config.num_layers);
    absl::StatusOr<std::vector<float>> logits = d->logits();
    ASSERT_TRUE(logits.ok());
    EXPECT_LE(RelativeError(*logits, vm->logits()), kPrefillTolerance) << spec << ": logits after the prefill";
    ASSERT_TRUE(vm->Run(8).ok());
    ASSERT_TRUE(d->Run(8).ok());
    absl::StatusOr<std::vector<int32_t>> tokens = d->tokens();
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ(*tokens, vm->tokens()) << spec << ": decode after the prefill";
  }
}

// Every family's tiny preset (padded rows, biases, 7 heads per KV head, YaRN,
// per-head q/k norms), fused and unfused.
TEST_F(GpuSchedules, EveryFamilyMatchesTheVm) {
  for (const char* spec : {"random:tiny-mistral", "random:tiny-qwen2", "random:tiny-qwen3"}) {
    Load(spec);
    for (bool fused : {true, false}) {
      scheduler::CompileOptions o;
      o.set_num_sms(16);
      if (!fused) *o.mutable_fusion() = scheduler::AllFusionsOff();
      Check(o, 0, absl::StrCat(spec, fused ? ", fused" : ", unfused"));
    }
  }
}

}  // namespace
}  // namespace loom::megakernel
