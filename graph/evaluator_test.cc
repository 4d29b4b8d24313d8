// The oracle itself is checked against hand computations and against its own
// consistency laws (prefill == repeated decode, streaming conv == whole conv).
#include "graph/evaluator.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "graph/graph_builder.h"
#include "graph/rope.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

HostTensor RandomF32(std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor t = HostTensor::Zeros(F32, std::move(shape));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (float& v : t.f32) v = d(rng);
  return t;
}

HostTensor RandomBf16(std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor t = HostTensor::Zeros(BF16, std::move(shape));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (uint16_t& v : t.bf16) v = FloatToBf16(d(rng));
  return t;
}

TEST(Evaluator, LinearRmsNormSiluAddArgmaxMatchHandComputation) {
  std::mt19937 rng(1);
  GraphBuilder b("g");
  b.Input("x", {2, 8}, F32);
  b.Weight("w", {3, 8});
  b.Weight("bias", {3});
  b.Weight("gamma", {8});
  const std::string n = b.RmsNorm("n", "x", "gamma", 1e-6f);
  const std::string y = b.Linear("y", n, "w", "bias");
  const std::string s = b.SiluMul("s", y, y);
  const std::string a = b.Add("a", s, y);
  b.Argmax("am", a);
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  WeightStore w = {{"w", RandomBf16({3, 8}, rng)}, {"bias", RandomBf16({3}, rng)}, {"gamma", RandomBf16({8}, rng)}};
  Evaluator ev(*g, w);
  HostTensor x = RandomF32({2, 8}, rng);
  ASSERT_TRUE(ev.Run({{"x", x}}).ok());
  for (int t = 0; t < 2; ++t) {
    double ss = 0;
    for (int k = 0; k < 8; ++k) ss += x.f32[t * 8 + k] * x.f32[t * 8 + k];
    const double r = 1.0 / std::sqrt(ss / 8 + 1e-6);
    int best = 0;
    double best_v = -1e30;
    for (int o = 0; o < 3; ++o) {
      double acc = w["bias"].Get(o);
      for (int k = 0; k < 8; ++k) acc += x.f32[t * 8 + k] * r * w["gamma"].Get(k) * w["w"].Get(o * 8 + k);
      EXPECT_NEAR(ev.Get("y").f32[t * 3 + o], acc, 1e-5);
      const double expect_a = acc / (1 + std::exp(-acc)) * acc + acc;
      EXPECT_NEAR(ev.Get("a").f32[t * 3 + o], expect_a, 1e-5);
      if (expect_a > best_v) best_v = expect_a, best = o;
    }
    EXPECT_EQ(ev.Get("am").i32[t], best);
  }
}

// An int4 weight's product with x is each group's sum of (u - z) x times the group's scale, in f32: the unrounded
// (u - z) * s, not the library's bf16 decompress of it. Scale 1 + 2^-7 and (u - z) = 15 make the difference: 15.1171875
// needs 11 significant bits, bf16 keeps 8 (15.125). Every value is exact in f32, so the expectation is order-free.
TEST(Evaluator, Int4ProductIsEachGroupsSumTimesItsScale) {
  GraphBuilder b("g");
  b.Input("x", {1, 64}, F32);
  b.Weight("w", {2, 64});
  b.Linear("y", "x", "w");
  absl::StatusOr<Graph> built = std::move(b).Build();
  ASSERT_TRUE(built.ok()) << built.status();
  GraphDef def = built->def();
  for (TensorDef& t : *def.mutable_tensors()) {
    if (t.name() == "w") t.set_dtype(I4), t.set_group_size(32);
  }
  absl::StatusOr<Graph> g = Graph::Create(std::move(def));
  ASSERT_TRUE(g.ok()) << g.status();
  HostTensor w = HostTensor::Zeros(I4, {2, 64});
  w.bf16 = {FloatToBf16(1.0078125f), FloatToBf16(0.5f), FloatToBf16(2.0f), FloatToBf16(1.0078125f)};  // [row][group]
  w.i32 = {0, 8, 3, 15};
  std::fill(w.f8.begin(), w.f8.end(), uint8_t{0});
  HostTensor x = HostTensor::Zeros(F32, {1, 64});
  double expect[2] = {0, 0};
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 64; ++c) {
      const int u = static_cast<int>((r * 7 + c * 5) % 16);
      const int64_t e = r * 64 + c;
      w.f8[e / 2] |= static_cast<uint8_t>(u << (4 * (e & 1)));
      const int64_t group = r * 2 + c / 32;
      expect[r] += (c % 3 == 0 ? 1.0 : 0.25) * (u - w.i32[group]) * Bf16ToFloat(w.bf16[group]);
    }
  }
  for (int64_t c = 0; c < 64; ++c) x.f32[c] = c % 3 == 0 ? 1.0f : 0.25f;
  // Row 0, column 3: u = 15, z = 0: the product unrounded, the element (the library's decompress) rounded.
  EXPECT_EQ(w.Int4Product(3), 15.1171875f);
  EXPECT_EQ(w.Get(3), 15.125f);
  WeightStore weights = {{"w", w}};
  Evaluator ev(*g, weights);
  ASSERT_TRUE(ev.Run({{"x", x}}).ok());
  EXPECT_EQ(ev.Get("y").f32[0], static_cast<float>(expect[0]));
  EXPECT_EQ(ev.Get("y").f32[1], static_cast<float>(expect[1]));
}

TEST(Evaluator, ArgmaxPicksLowestIndexOnTies) {
  GraphBuilder b("g");
  b.Input("x", {1, 4}, F32);
  b.Argmax("am", "x");
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok());
  WeightStore none;
  Evaluator ev(*g, none);
  ASSERT_TRUE(ev.Run({{"x", HostTensor::FromF32({1, 4}, {0.5f, 2.0f, 2.0f, -1.0f})}}).ok());
  EXPECT_EQ(ev.Get("am").i32[0], 1);
}

TEST(Evaluator, EmbeddingRejectsOutOfVocabIds) {
  GraphBuilder b("g");
  b.Input("ids", {1}, I32);
  b.Weight("table", {4, 2});
  b.Embedding("e", "table", "ids");
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok());
  WeightStore w = {{"table", HostTensor::Zeros(BF16, {4, 2})}};
  Evaluator ev(*g, w);
  absl::Status s = ev.Run({{"ids", HostTensor::FromI32({1}, {4})}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token id 4 outside vocab 4"), std::string::npos) << s;
}

TEST(Rope, Llama3ScalingMatchesHuggingFaceBands) {
  RopeAttrs a;
  a.set_head_dim(64);
  a.set_theta(500000);
  a.mutable_llama3_scaling()->set_factor(32);
  a.mutable_llama3_scaling()->set_low_freq_factor(1);
  a.mutable_llama3_scaling()->set_high_freq_factor(4);
  a.mutable_llama3_scaling()->set_original_max_position(8192);
  const std::vector<float> f = RopeInvFreq(a);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);  // high frequency: unchanged
  const float plain31 = 1.0f / std::pow(500000.0f, 62.0f / 64.0f);
  EXPECT_NEAR(f[31], plain31 / 32, 1e-12);  // low frequency: divided by factor
  // Medium band (wavelength between 8192/4 and 8192): interpolated, as transformers does.
  const double plain16 = 1.0 / std::sqrt(500000.0), wavelen = 2 * M_PI / plain16;
  const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
  EXPECT_NEAR(f[16], plain16 * ((1 - smooth) / 32 + smooth), 1e-8);
  for (int j = 1; j < 32; ++j) EXPECT_LT(f[j], f[j - 1]);
}

// Builds q/k/v inputs -> attention with T query rows at position `pos`.
absl::StatusOr<Graph> AttentionGraph(int tokens) {
  GraphBuilder b("attn");
  b.Input("q", {tokens, 4 * 8}, F32);
  b.Input("k", {tokens, 2 * 8}, F32);
  b.Input("v", {tokens, 2 * 8}, F32);
  b.Input("pos", {1}, I32);
  b.State("kc", {2, 16, 8});
  b.State("vc", {2, 16, 8});
  AttentionAttrs a;
  a.set_num_heads(4);
  a.set_num_kv_heads(2);
  a.set_head_dim(8);
  a.set_causal(true);
  b.Attention("o", "q", "k", "v", "kc", "vc", "pos", a);
  return std::move(b).Build();
}

HostTensor Rows(const HostTensor& t, int begin, int count) {
  const int64_t width = t.shape[1];
  return HostTensor::FromF32({count, width}, std::vector<float>(t.f32.begin() + begin * width,
                                                            t.f32.begin() + (begin + count) * width));
}

TEST(Evaluator, AttentionPrefillEqualsRepeatedDecodeAndFirstStepReturnsV) {
  std::mt19937 rng(7);
  constexpr int kTokens = 5;
  absl::StatusOr<Graph> prefill = AttentionGraph(kTokens);
  absl::StatusOr<Graph> decode = AttentionGraph(1);
  ASSERT_TRUE(prefill.ok() && decode.ok());
  WeightStore none;
  const HostTensor q = RandomF32({kTokens, 32}, rng), k = RandomF32({kTokens, 16}, rng),
                   v = RandomF32({kTokens, 16}, rng);
  Evaluator whole(*prefill, none);
  ASSERT_TRUE(whole.Run({{"q", q}, {"k", k}, {"v", v}, {"pos", HostTensor::FromI32({1}, {0})}}).ok());
  Evaluator step(*decode, none);
  for (int t = 0; t < kTokens; ++t) {
    ASSERT_TRUE(step.Run({{"q", Rows(q, t, 1)},
                          {"k", Rows(k, t, 1)},
                          {"v", Rows(v, t, 1)},
                          {"pos", HostTensor::FromI32({1}, {t})}})
                    .ok());
    for (int j = 0; j < 32; ++j) EXPECT_NEAR(step.Get("o").f32[j], whole.Get("o").f32[t * 32 + j], 1e-6);
    if (t == 0) {  // one visible position: softmax is 1, output is that position's v
      for (int head = 0; head < 4; ++head) {
        for (int d = 0; d < 8; ++d) EXPECT_NEAR(step.Get("o").f32[head * 8 + d], v.f32[(head / 2) * 8 + d], 1e-6);
      }
    }
  }
  Evaluator full(*decode, none);
  EXPECT_FALSE(full.Run({{"q", Rows(q, 0, 1)}, {"k", Rows(k, 0, 1)}, {"v", Rows(v, 0, 1)},
                         {"pos", HostTensor::FromI32({1}, {16})}})
                   .ok());
}

TEST(Evaluator, Conv1dStreamingEqualsWholeSequence) {
  std::mt19937 rng(3);
  auto build = [](int tokens) {
    GraphBuilder b("conv");
    b.Input("x", {tokens, 6}, F32);
    b.Weight("w", {6, 4});
    b.Weight("bias", {6});
    b.State("st", {6, 3});
    b.Conv1d("y", "x", "w", "st", "bias");
    return std::move(b).Build();
  };
  absl::StatusOr<Graph> whole_g = build(7), step_g = build(1);
  ASSERT_TRUE(whole_g.ok() && step_g.ok());
  WeightStore w = {{"w", RandomBf16({6, 4}, rng)}, {"bias", RandomBf16({6}, rng)}};
  const HostTensor x = RandomF32({7, 6}, rng);
  Evaluator whole(*whole_g, w), step(*step_g, w);
  ASSERT_TRUE(whole.Run({{"x", x}}).ok());
  for (int t = 0; t < 7; ++t) {
    ASSERT_TRUE(step.Run({{"x", Rows(x, t, 1)}}).ok());
    for (int c = 0; c < 6; ++c) {
      double expect = w["bias"].Get(c);
      for (int j = 0; j < 4; ++j) {
        const int src = t - 3 + j;
        if (src >= 0) expect += w["w"].Get(c * 4 + j) * x.f32[src * 6 + c];
      }
      EXPECT_NEAR(whole.Get("y").f32[t * 6 + c], expect, 1e-5);
      EXPECT_NEAR(step.Get("y").f32[c], expect, 1e-5);
    }
  }
}

TEST(Evaluator, Conv2dMatchesDirectSum) {
  std::mt19937 rng(5);
  GraphBuilder b("c2");
  b.Input("x", {2, 6, 5, 3}, F32);
  b.Weight("w", {4, 3, 2, 3});
  b.Weight("bias", {4});
  Conv2dAttrs a;
  a.set_stride_h(2);
  a.set_stride_w(1);
  a.set_pad_h(1);
  a.set_pad_w(0);
  b.Conv2d("y", "x", "w", "bias", a);
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  WeightStore w = {{"w", RandomBf16({4, 3, 2, 3}, rng)}, {"bias", RandomBf16({4}, rng)}};
  const HostTensor x = RandomF32({2, 6, 5, 3}, rng);
  Evaluator ev(*g, w);
  ASSERT_TRUE(ev.Run({{"x", x}}).ok());
  const HostTensor& y = ev.Get("y");
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 3, 4, 4}));
  // One output element by hand: batch 1, oy 2, ox 3, channel 2.
  double expect = w["bias"].Get(2);
  for (int dy = 0; dy < 3; ++dy)
    for (int dx = 0; dx < 2; ++dx)
      for (int c = 0; c < 3; ++c) {
        const int yi = 2 * 2 - 1 + dy, xi = 3 + dx;
        if (yi < 0 || yi >= 6 || xi >= 5) continue;
        expect += x.f32[((1 * 6 + yi) * 5 + xi) * 3 + c] * w["w"].Get(((2 * 3 + dy) * 2 + dx) * 3 + c);
      }
  EXPECT_NEAR(y.f32[((1 * 3 + 2) * 4 + 3) * 4 + 2], expect, 1e-5);
}

}  // namespace
}  // namespace loom::graph
