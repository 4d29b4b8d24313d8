// Same input, same output: a prompt's prefill pass and the decode steps after it give bitwise the same logits and
// tokens in every run, on the CPU VM (its SMs are threads finishing in any order) and on the GPU (its SMs finish in
// any order), including prompt lengths whose O- and down-projections are split over K, and whether the decode
// steps run in one launch or a launch each. The GPU cases skip without a GPU, saying why.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/model.h"
#include "gtest/gtest.h"
#include "runtime/gpu_backend.h"
#include "runtime/session.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"

namespace loom {
namespace {

constexpr int kDecodeSteps = 8;

// What one run gave: the logits after the prompt and after the decode steps, as bits, and every token.
struct Run {
  std::vector<uint32_t> prompt_logits, step_logits;
  std::vector<int32_t> tokens;
  bool used_prefill = false;
};

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * 4);
  return bits;
}

// A fresh Session (as a separate `loom run` would be): the prompt, then kDecodeSteps steps in one launch, or one
// launch a step.
Run RunOnce(const graph::Model& model, const scheduler::Schedule& s, runtime::Backend backend,
            const std::vector<int32_t>& prompt, bool step_by_step) {
  Run r;
  absl::StatusOr<std::unique_ptr<runtime::Session>> session =
      runtime::Session::Create(model.graph, s, model.weights, backend);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return r;
  EXPECT_TRUE((*session)->Start(prompt).ok());
  r.used_prefill = (*session)->used_prefill();
  absl::StatusOr<std::vector<float>> logits = (*session)->logits();
  EXPECT_TRUE(logits.ok());
  if (logits.ok()) r.prompt_logits = Bits(*logits);
  for (int i = 0; i < (step_by_step ? kDecodeSteps : 1); ++i) {
    EXPECT_TRUE((*session)->Step(step_by_step ? 1 : kDecodeSteps).ok());
  }
  logits = (*session)->logits();
  if (logits.ok()) r.step_logits = Bits(*logits);
  absl::StatusOr<std::vector<int32_t>> tokens = (*session)->tokens();
  if (tokens.ok()) r.tokens = *tokens;
  return r;
}

// The most parts any instruction of the pass for `rows` prompt rows adds (PACK_ROWS folding them into x, SUM_SPLITS
// after the last layer): 0 when nothing is split over K.
uint32_t MostParts(const graph::Model& model, const scheduler::Schedule& s, uint32_t rows,
                   const scheduler::PrefillOptions& options = {}) {
  absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(model.graph, s, rows, options);
  EXPECT_TRUE(pass.ok()) << pass.status();
  uint32_t most = 0;
  if (!pass.ok()) return most;
  for (const scheduler::SmQueue& q : pass->queues()) {
    for (const scheduler::Instruction& inst : q.instructions()) {
      if (inst.opcode() == "SUM_SPLITS") most = std::max<uint32_t>(most, inst.args(4));  // SumSplitsArgs.splits
      if (inst.opcode() == "PACK_ROWS") most = std::max<uint32_t>(most, inst.args(9));   // PackRowsArgs.splits
    }
  }
  return most;
}

// Three runs of each prompt length (the third with a launch per decode step) are bitwise equal.
void ExpectDeterministic(const std::string& spec, runtime::Backend backend, const std::vector<uint32_t>& lengths,
                         uint32_t split_length, graph::DType kv_dtype = graph::F32) {
  graph::ModelOptions mo;
  mo.max_seq = 512;
  mo.kv_dtype = kv_dtype;
  absl::StatusOr<graph::Model> model = graph::LoadModel(spec, mo);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model->graph, spec, scheduler::CompileOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(MostParts(*model, *s, split_length), 2u) << spec << ": a prompt of " << split_length
                                                     << " rows should split its projections over K";
  scheduler::PrefillOptions bounded;
  bounded.max_splits = 2;
  EXPECT_EQ(MostParts(*model, *s, split_length, bounded), 2u) << spec << ": max_splits 2";
  bounded.max_splits = 1;
  EXPECT_EQ(MostParts(*model, *s, split_length, bounded), 0u) << spec << ": max_splits 1, nothing split";
  for (uint32_t length : lengths) {
    std::vector<int32_t> prompt;
    for (uint32_t i = 0; i < length; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % 1000));
    const Run first = RunOnce(*model, *s, backend, prompt, false);
    // (A one-token prompt runs as a decode step: Session::Start.)
    EXPECT_EQ(first.used_prefill, length > 1) << spec << ", " << length << " rows: the prompt should take the "
                                              << (length > 1 ? "prefill pass" : "decode step");
    for (int run = 1; run < 3; ++run) {
      const Run again = RunOnce(*model, *s, backend, prompt, run == 2);
      const std::string what = absl::StrCat(spec, ", a prompt of ", length, " rows, run ", run + 1,
                                            run == 2 ? " (a launch per decode step)" : "");
      EXPECT_EQ(again.prompt_logits, first.prompt_logits) << what << ": the prefill pass's logits differ";
      EXPECT_EQ(again.step_logits, first.step_logits) << what << ": the last decode step's logits differ";
      EXPECT_EQ(again.tokens, first.tokens) << what << ": the tokens differ";
    }
  }
}

// A Llama shape whose short prompts split the O- and down-projections 16 ways on 132 SMs (hidden 1536: 12 output
// tiles), written as a config.json for `random:`.
std::string WideConfig() {
  const std::string path = testing::TempDir() + "/determinism_config.json";
  std::ofstream(path) << R"({"model_type": "llama", "hidden_size": 1536, "num_attention_heads": 12,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000,
    "num_hidden_layers": 5, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0})";
  return "random:" + path;
}

TEST(Determinism, VmPrefillAndDecodeAreBitwiseTheSameEveryRun) {
  ExpectDeterministic("random:tiny", runtime::Backend::kCpu, {1, 10, 130}, 10);
}

TEST(Determinism, GpuPrefillAndDecodeAreBitwiseTheSameEveryRun) {
  std::string why;
  if (!runtime::GpuAvailable(&why)) GTEST_SKIP() << why;
  ExpectDeterministic("random:tiny", runtime::Backend::kGpu, {1, 20, 129, 300}, 20);
  ExpectDeterministic(WideConfig(), runtime::Backend::kGpu, {4, 300}, 4);
  ExpectDeterministic(WideConfig(), runtime::Backend::kGpu, {300}, 4, graph::BF16);  // a bf16 KV cache
}

}  // namespace
}  // namespace loom
