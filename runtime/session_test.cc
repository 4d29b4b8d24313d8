// Session on the CPU VM: calls out of order are refused, non-finite weights are refused naming the weight, and
// logits that overflow at run time fail the step instead of handing out argmax-of-NaN tokens.
#include "runtime/session.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/decode_oracle.h"
#include "graph/model.h"
#include "gtest/gtest.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"

namespace loom::runtime {
namespace {

struct Tiny {
  graph::Model model;
  scheduler::Schedule schedule;
};

Tiny LoadTiny(int max_seq = 32) {
  graph::ModelOptions mo;
  mo.max_seq = max_seq;
  absl::StatusOr<graph::Model> m = graph::LoadModel("random:tiny", mo);
  EXPECT_TRUE(m.ok()) << m.status();
  scheduler::CompileOptions options;
  options.set_num_sms(4);
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, "random:tiny", options);
  EXPECT_TRUE(s.ok()) << s.status();
  return {*std::move(m), *std::move(s)};
}

// A prompt of n tokens.
std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7919 + 3) % 1000);
  return p;
}

void Fill(graph::HostTensor& t, float v) {
  for (int64_t i = 0; i < t.size(); ++i) t.bf16[i] = graph::FloatToBf16(v);
}

TEST(Session, NothingRunsBeforeStart) {
  Tiny tiny = LoadTiny();
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights,
                                                                Backend::kCpu);
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status step = (*s)->Step(1);
  EXPECT_EQ(step.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(step.message(), "step() before start(): no prompt has been consumed (start a generation first)");
  EXPECT_EQ((*s)->logits().status().message(),
            "logits() before start(): no prompt has been consumed (start a generation first)");
  ASSERT_TRUE((*s)->Start({1, 2, 3}).ok());
  ASSERT_TRUE((*s)->Step(2).ok());
  absl::StatusOr<std::vector<float>> logits = (*s)->logits();
  ASSERT_TRUE(logits.ok());
  EXPECT_TRUE(CheckLogitsFinite(*logits, 5).ok());
}

TEST(Session, NonFiniteWeightsAreRefusedNamingTheWeight) {
  Tiny tiny = LoadTiny();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    graph::WeightStore weights = tiny.model.weights;
    graph::HostTensor& w = weights.at("model.layers.1.self_attn.v_proj.weight");  // [128, 256]
    w.bf16[3 * 256 + 7] = graph::FloatToBf16(bad);
    absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(tiny.model.graph, tiny.schedule, weights,
                                                                  Backend::kCpu);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().message(),
              std::string("weight 'model.layers.1.self_attn.v_proj.weight' holds ") + (std::isnan(bad) ? "nan" : "-inf") +
                  " at [3,7]: Loom refuses weights that are not finite (a broken checkpoint?)");
  }
}

// Finite weights whose product overflows float32 (a final norm scale of bf16's largest value): the logits become
// infinite or NaN, and the step says so.
TEST(Session, OverflowingLogitsFailTheStep) {
  Tiny tiny = LoadTiny();
  Fill(tiny.model.weights.at("model.norm.weight"), 3.3e38f);
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights,
                                                                Backend::kCpu);
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status start = (*s)->Start({1, 2, 3});
  EXPECT_EQ(start.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(start.message().find("the logits that chose the token at position 3 are not finite ("), std::string::npos)
      << start;
  EXPECT_EQ((*s)->Step(1).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE((*s)->logits().ok());  // still there to look at
}

TEST(Session, CheckLogitsFiniteCountsWhatIsNot) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(CheckLogitsFinite({1, -2, 3}, 0).ok());
  EXPECT_EQ(CheckLogitsFinite({nan, 1, inf, -inf, nan}, 7).message(),
            "the logits that chose the token at position 7 are not finite (2 NaN, 2 infinite of 5): the model "
            "overflowed or its weights are broken; the generated tokens are meaningless");
}

// keep_logits: one vocab row per step, the prompt's positions then each Step's; the last row is logits(), and the
// pass's rows agree with the token-by-token steps' (what `loom run --logits_out` writes either way).
TEST(Session, KeptLogitsHoldEveryStepsRow) {
  Tiny tiny = LoadTiny();
  const std::vector<int32_t> prompt = {5, 9, 2, 7, 11};
  std::vector<std::vector<float>> kept;
  std::vector<std::vector<int32_t>> tokens;
  for (const bool prefill : {true, false}) {
    absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights,
                                                                  Backend::kCpu);
    ASSERT_TRUE(s.ok()) << s.status();
    StartOptions start;
    start.prefill = prefill;
    start.keep_logits = true;
    ASSERT_TRUE((*s)->Start(prompt, start).ok());
    EXPECT_EQ((*s)->used_prefill(), prefill);
    EXPECT_EQ((*s)->kept_logits().size(), prompt.size() * (*s)->vocab_size());
    ASSERT_TRUE((*s)->Step(3).ok());
    const std::vector<float>& all = (*s)->kept_logits();
    ASSERT_EQ(all.size(), (prompt.size() + 3) * (*s)->vocab_size());
    absl::StatusOr<std::vector<float>> last = (*s)->logits();
    ASSERT_TRUE(last.ok());
    EXPECT_TRUE(std::equal(last->begin(), last->end(), all.end() - (*s)->vocab_size()));
    kept.push_back(all);
    tokens.push_back(*(*s)->tokens());
    // Not kept: the next Start forgets them.
    ASSERT_TRUE((*s)->Start(prompt, prefill).ok());
    EXPECT_TRUE((*s)->kept_logits().empty());
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  float worst = 0, scale = 0;
  for (size_t i = 0; i < kept[0].size(); ++i) {
    worst = std::max(worst, std::abs(kept[0][i] - kept[1][i]));
    scale = std::max(scale, std::abs(kept[1][i]));
  }
  EXPECT_LT(worst, 2e-2f * scale);  // bf16 operand images in the pass against the steps' f32 activations
}

// With StartOptions::buckets (the default), prompts whose rows end in the same bucket share one lowered pass
// (scheduler::PrefillBucketRows: 16, 32, 64, 128, then every 128 rows): the second start lowers nothing; a prompt in
// the next bucket lowers its own; every row's logits take a pass of their own length, and so does a prompt started
// without buckets.
TEST(Session, PromptsOfOneBucketShareAPass) {
  Tiny tiny = LoadTiny(300);
  absl::StatusOr<std::unique_ptr<Session>> s =
      Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights, Backend::kCpu);
  ASSERT_TRUE(s.ok()) << s.status();
  auto prompt = Prompt;
  const StartOptions buckets;
  EXPECT_TRUE(buckets.buckets) << "the default";
  int instructions = 0;
  for (const int n : {100, 120, 20, 30, 129}) {
    ASSERT_TRUE((*s)->Start(prompt(n), buckets).ok()) << n;
    EXPECT_TRUE((*s)->used_prefill()) << n;
    EXPECT_EQ(*(*s)->position(), n) << n;
    if (n == 100) instructions = (*s)->pass_instructions();
    if (n == 120 || n == 30) EXPECT_EQ((*s)->pass_lower_ms(), 0.0) << n << " rows: their bucket's pass is lowered";
    if (n == 120) EXPECT_EQ((*s)->pass_instructions(), instructions) << n;
    if (n == 20) EXPECT_GT((*s)->pass_lower_ms(), 0.0) << "the pass of 32";
    if (n == 129) EXPECT_GT((*s)->pass_instructions(), instructions) << "the pass of 256";
  }
  StartOptions all = buckets;
  all.keep_logits = true;
  ASSERT_TRUE((*s)->Start(prompt(120), all).ok());
  EXPECT_GT((*s)->pass_lower_ms(), 0.0) << "every row's logits: a pass of 120 rows";
  EXPECT_EQ((*s)->kept_logits().size(), 120u * (*s)->vocab_size());
  StartOptions exact;
  exact.buckets = false;
  ASSERT_TRUE((*s)->Start(prompt(110), exact).ok());  // a pass of its own length
  EXPECT_GT((*s)->pass_lower_ms(), 0.0);
}

// The buckets a prompt of up to 300 rows meets, smallest first.
TEST(Session, BucketsAreThePowersOfTwoBelowATileThenTiles) {
  EXPECT_EQ(scheduler::PrefillBuckets(300, 1000), (std::vector<uint32_t>{16, 32, 64, 128, 256, 384}));
  EXPECT_EQ(scheduler::PrefillBuckets(2048, 1000).back(), 1000u) << "the last one as long as the cache's room";
  EXPECT_EQ(scheduler::PrefillBucketRows(17, 20), 20u);
  EXPECT_EQ(scheduler::PrefillBucketRows(2, 1000), 16u);
}

// LowerAhead lowers every bucket's pass (chunks of 128 rows: 16, 32, 64 and 128) in the background; Starts racing it
// and after it lower nothing and give the tokens a session without it gives. A second LowerAhead is refused; a
// session destroyed while its thread lowers stops it.
TEST(Session, LowerAheadLowersEveryBucketsPass) {
  Tiny tiny = LoadTiny(300);
  StartOptions start;
  start.chunk_rows = 128;
  std::vector<std::vector<int32_t>> want;
  {
    absl::StatusOr<std::unique_ptr<Session>> s =
        Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights, Backend::kCpu);
    ASSERT_TRUE(s.ok()) << s.status();
    for (const int n : {5, 60, 200}) {
      ASSERT_TRUE((*s)->Start(Prompt(n), start).ok());
      want.push_back(*(*s)->tokens());
    }
  }
  absl::StatusOr<std::unique_ptr<Session>> s =
      Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights, Backend::kCpu);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->LowerAhead(start).ok());
  EXPECT_EQ((*s)->LowerAhead(start).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*s)->Start(Prompt(5), start).ok());  // (racing the thread: lowered here, or waited for, or found)
  EXPECT_EQ(*(*s)->tokens(), want[0]);
  const int ahead = (*s)->WaitLoweredAhead();
  EXPECT_GE(ahead, 3);
  EXPECT_LE(ahead, 4);
  for (const int i : {1, 2}) {
    ASSERT_TRUE((*s)->Start(Prompt(i == 1 ? 60 : 200), start).ok());
    EXPECT_EQ((*s)->pass_lower_ms(), 0.0) << i;
    EXPECT_EQ(*(*s)->tokens(), want[i]) << i;
  }
  // Nothing to lower ahead for a model whose passes take no buckets (the gated-conv LM), or without prefill.
  graph::ModelOptions mo;
  mo.max_seq = 64;
  absl::StatusOr<graph::Model> conv = graph::LoadModel("random:gated-conv-tiny", mo);
  ASSERT_TRUE(conv.ok()) << conv.status();
  scheduler::CompileOptions o;
  o.set_num_sms(4);
  absl::StatusOr<scheduler::Schedule> conv_schedule = scheduler::Compile(conv->graph, conv->spec, o);
  ASSERT_TRUE(conv_schedule.ok()) << conv_schedule.status();
  absl::StatusOr<std::unique_ptr<Session>> none =
      Session::Create(conv->graph, *conv_schedule, conv->weights, Backend::kCpu);
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_TRUE((*none)->LowerAhead(start).ok());
  EXPECT_EQ((*none)->WaitLoweredAhead(), 0);
  StartOptions off = start;
  off.prefill = false;
  ASSERT_TRUE((*s)->LowerAhead(off).ok()) << "prefill off: nothing to lower, not a second LowerAhead";
  absl::StatusOr<std::unique_ptr<Session>> stopped =
      Session::Create(tiny.model.graph, tiny.schedule, tiny.model.weights, Backend::kCpu);
  ASSERT_TRUE(stopped.ok());
  ASSERT_TRUE((*stopped)->LowerAhead(StartOptions{}).ok());
  stopped->reset();
}

// A prompt of 300 rows in passes of 128 (StartOptions::chunk_rows: 128, 128, then 44 at positions 0, 128, 256, each
// attending to the rows before it in the KV cache) gives the oracle's tokens, and the one pass's logits within the
// prefill tolerance; the passes of 128 rows are lowered once (with buckets, the last one's too). Its every-row
// logits come chunk by chunk, 300 rows of them.
TEST(Session, ALongPromptRunsInChunks) {
  Tiny tiny = LoadTiny(400);
  const graph::Model* m = &tiny.model;
  const scheduler::Schedule* schedule = &tiny.schedule;
  const std::vector<int32_t> prompt = Prompt(300);
  absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, prompt, 6);
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  std::vector<std::vector<float>> logits;
  for (const bool chunked : {false, true}) {
    for (const bool buckets : {false, true}) {
      absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(m->graph, *schedule, m->weights, Backend::kCpu);
      ASSERT_TRUE(s.ok()) << s.status();
      StartOptions start;
      start.chunk_rows = chunked ? 128 : 0;
      start.buckets = buckets;
      ASSERT_TRUE((*s)->Start(prompt, start).ok());
      EXPECT_TRUE((*s)->used_prefill());
      EXPECT_EQ(*(*s)->position(), 300);
      ASSERT_TRUE((*s)->Step(5).ok());
      EXPECT_EQ(*(*s)->tokens(), oracle->tokens) << (chunked ? "chunked" : "one pass") << (buckets ? ", buckets" : "");
      if (!chunked && !buckets) {
        ASSERT_TRUE((*s)->Start(prompt, start).ok());
        logits.push_back(*(*s)->logits());
        continue;
      }
      if (chunked) {
        // Again: every pass is lowered already.
        ASSERT_TRUE((*s)->Start(prompt, start).ok());
        EXPECT_EQ((*s)->pass_lower_ms(), 0.0) << (buckets ? "buckets" : "exact");
        logits.push_back(*(*s)->logits());
      }
    }
  }
  ASSERT_EQ(logits.size(), 3u);
  for (size_t i = 1; i < logits.size(); ++i) {
    float worst = 0, scale = 0;
    for (size_t j = 0; j < logits[0].size(); ++j) {
      worst = std::max(worst, std::abs(logits[i][j] - logits[0][j]));
      scale = std::max(scale, std::abs(logits[0][j]));
    }
    EXPECT_LT(worst, 2e-2f * scale) << i;
  }
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(m->graph, *schedule, m->weights, Backend::kCpu);
  ASSERT_TRUE(s.ok());
  StartOptions keep;
  keep.chunk_rows = 128;
  keep.keep_logits = true;
  ASSERT_TRUE((*s)->Start(prompt, keep).ok());
  EXPECT_EQ((*s)->kept_logits().size(), 300u * (*s)->vocab_size());
}

}  // namespace
}  // namespace loom::runtime
