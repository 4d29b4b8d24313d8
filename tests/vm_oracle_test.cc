// The CPU reference VM, running compiled schedules of random:tiny, against the
// op-by-op oracle: logits within 1e-5 (relative, float32) and identical greedy
// tokens for 32 steps, for every SM policy, several SM counts, both barrier
// granularities and with every fusion turned off; and the tiny model of every
// family (padded rows, biases, 7 heads per KV head, YaRN, per-head q/k norms).
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/decode_oracle.h"
#include "graph/decoder.h"
#include "graph/graph_builder.h"
#include "graph/hf_config.h"
#include "graph/model.h"
#include "gtest/gtest.h"
#include "runtime/reference_vm.h"
#include "tests/relative_error.h"
#include "scheduler/compiler.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/options.h"
#include "scheduler/prefill.h"

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
    absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, model.weights);
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

TEST_F(VmOracle, ReducesOfAnyHeadCountMatchTheOracle) {
  for (uint32_t per : {1u, 3u}) {
    scheduler::CompileOptions o;
    o.set_num_sms(8);
    o.set_attention_splits(5);
    o.set_attention_reduce_heads(per);
    CheckSchedule(o, absl::StrCat("5 splits, reduces of ", per, " heads"));
  }
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
  absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, model_->weights);
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

// A one-pass prefill of random:tiny (two row tiles, several key tiles) and of random:tiny-qwen3 (per-head q/k
// norms in the QKV GEMM's epilogue), then decode, on the VM against the
// op-by-op oracle consuming the prompt token by token: the logits of every prompt position (bf16 operand images in
// the pass: a looser tolerance) and identical greedy tokens. Passes are verified.
TEST(VmPrefill, PrefillThenDecodeMatchesTheOracle) {
  constexpr double kPrefillLogitTolerance = 2e-2;  // measured 3e-3
  for (const auto& [spec, rows] : std::vector<std::pair<std::string, int>>{
           {"random:tiny", 1}, {"random:tiny", 40}, {"random:tiny", 150}, {"random:tiny-qwen3", 70}}) {
  graph::ModelOptions mo;
  mo.max_seq = 256;
  absl::StatusOr<graph::Model> loaded = graph::LoadModel(spec, mo);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const graph::Model* m = &*loaded;
  {
    std::vector<int32_t> prompt;
    for (int i = 0; i < rows; ++i) prompt.push_back((i * 7919 + 3) % 1000);
    absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, prompt, 16);
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    // On 3 SMs with one barrier per stage, on 132 with one per 128-row tile and stage (auto, for these sizes), and
    // on 132 with 48 KB pages: 128 x 256 GEMM tiles (isa::GemmArgs::wide) but the QKV projection's.
    for (const auto& [sms, page_bytes] : std::vector<std::pair<uint32_t, uint32_t>>{
             {3, 0}, {132, 0}, {132, isa::kGemmWideStepBytes}}) {
      const std::string what = absl::StrCat(spec, ", ", rows, " rows on ", sms, " SMs, pages ", page_bytes);
      scheduler::CompileOptions o;
      o.set_num_sms(sms);
      absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, o);
      ASSERT_TRUE(s.ok()) << s.status();
      scheduler::PrefillOptions po;
      po.all_logits = true;
      po.page_bytes = page_bytes;
      if (sms == 3) po.row_tile_barriers = scheduler::PrefillOptions::RowTileBarriers::kOff;
      absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m->graph, *s, rows, po);
      ASSERT_TRUE(pass.ok()) << what << ": " << pass.status();
      absl::StatusOr<scheduler::DecodedSchedule> decoded = scheduler::DecodeSchedule(*pass);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      uint32_t wide = 0;  // the wide tiles are there
      for (const auto& queue : decoded->queues) {
        for (const isa::Instruction& inst : queue) {
          wide += inst.op() == isa::Opcode::GEMM && inst.as<isa::GemmArgs>().wide ? 1 : 0;
        }
      }
      EXPECT_EQ(wide > 0, page_bytes != 0) << what;
      absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, m->weights);
      ASSERT_TRUE(vm.ok());
      ASSERT_TRUE((*vm)->Reset(prompt).ok());
      ASSERT_TRUE((*vm)->Prefill(*pass).ok());
      EXPECT_EQ((*vm)->position(), rows) << what;
      const scheduler::Tensor* logits = nullptr;
      for (const scheduler::Tensor& t : pass->tensors()) logits = t.name() == "prefill.logits" ? &t : logits;
      ASSERT_NE(logits, nullptr);
      const std::vector<uint8_t> bytes = (*vm)->ReadArena(logits->offset(), logits->bytes());
      const uint32_t vocab = s->vocab_size();
      for (int r = 0; r < rows; ++r) {
        std::vector<float> row(vocab);
        std::memcpy(row.data(), bytes.data() + uint64_t{4} * vocab * r, 4ull * vocab);
        ASSERT_LE(RelativeError(row, oracle->logits[r]), kPrefillLogitTolerance) << what << ", position " << r;
      }
      ASSERT_TRUE((*vm)->Run(15).ok());
      EXPECT_EQ((*vm)->tokens(), oracle->tokens) << what;
    }
  }
  }
}

// A random model with quantized projections (`scheme`, `group`): decode runs them as `opcode` tiles (the LM head
// stays a bf16 MATVEC) and matches the oracle on the same weights (1e-5, identical tokens); with `prefill`, a
// one-pass prefill reads them widened to bf16, then decode, likewise.
void CheckQuantizedDecode(const std::string& spec, const std::string& scheme, int group, graph::DType dtype,
                          isa::Opcode opcode, bool prefill) {
  SCOPED_TRACE(absl::StrCat(spec, " ", scheme, " group ", group));
  graph::ModelOptions mo;
  mo.max_seq = 128;
  mo.scheme = scheme;
  mo.group_size = group;
  absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
  ASSERT_TRUE(m.ok()) << m.status();
  int quantized_weights = 0;
  for (const graph::TensorDef& t : m->graph.def().tensors()) quantized_weights += t.dtype() == dtype ? 1 : 0;
  EXPECT_EQ(quantized_weights, 7 * m->config.num_layers);  // q, k, v, o, gate, up, down
  std::vector<int32_t> prompt = {17, 923, 4, 512, 33, 7, 250, 1};
  for (int32_t& t : prompt) t %= m->config.vocab_size;
  absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, prompt, 16);
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  scheduler::CompileOptions o;
  o.set_num_sms(6);
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, o);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<scheduler::DecodedSchedule> decoded = scheduler::DecodeSchedule(*s);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  int quantized_tiles = 0, bf16_tiles = 0;
  for (const auto& queue : decoded->queues) {
    for (const isa::Instruction& inst : queue) {
      quantized_tiles += inst.op() == opcode ? 1 : 0;
      bf16_tiles += inst.op() == isa::Opcode::MATVEC ? 1 : 0;
    }
  }
  EXPECT_GT(quantized_tiles, 0);
  EXPECT_GT(bf16_tiles, 0) << "the LM head";
  absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> steps = runtime::ReferenceVm::Create(*s, m->weights);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_TRUE((*steps)->Reset(prompt).ok());
  for (size_t step = 0; step + 1 < prompt.size() + 16; ++step) {
    ASSERT_TRUE((*steps)->Run(1).ok());
    ASSERT_LE(RelativeError((*steps)->logits(), oracle->logits[step]), kLogitTolerance) << "step " << step;
  }
  EXPECT_EQ((*steps)->tokens(), oracle->tokens);
  if (!prefill) return;
  absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m->graph, *s, static_cast<int>(prompt.size()));
  ASSERT_TRUE(pass.ok()) << pass.status();
  absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, m->weights);
  ASSERT_TRUE(vm.ok()) << vm.status();
  ASSERT_TRUE((*vm)->Reset(prompt).ok());
  ASSERT_TRUE((*vm)->Prefill(*pass).ok());
  ASSERT_TRUE((*vm)->Run(15).ok());
  EXPECT_EQ((*vm)->tokens(), oracle->tokens) << "after a prefill pass";
}

// FP8 (random:<preset> --scheme=FP8: e4m3 with a power-of-two scale per row, exact widened to bf16 for the prefill).
// (qwen2: q/k/v biases, head_dim 32, which the prefill pass does not cover.)
TEST(VmOracleFp8, Fp8ProjectionsDecodeAndPrefillMatchTheOracle) {
  CheckQuantizedDecode("random:tiny", "FP8", 0, graph::F8E4M3, isa::Opcode::MATVEC_FP8, true);
  CheckQuantizedDecode("random:tiny-qwen2", "FP8", 0, graph::F8E4M3, isa::Opcode::MATVEC_FP8, false);
}

// Int4 (random:<preset> --scheme=W4A16: symmetric, a bf16 scale per group; MATVEC_W4 tiles are whole bands of 16
// rows), groups of 128, 64 (192 and 320 columns: a 64-column slot a chunk) and 32 (224 columns padded to 256, the
// padding its own group); each value is a bf16, so the prefill's widened weights are exact.
TEST(VmOracleW4, Int4ProjectionsDecodeAndPrefillMatchTheOracle) {
  CheckQuantizedDecode("random:tiny", "W4A16", 128, graph::I4, isa::Opcode::MATVEC_W4, true);
  CheckQuantizedDecode("random:tiny-mistral", "W4A16", 64, graph::I4, isa::Opcode::MATVEC_W4, false);
  CheckQuantizedDecode("random:tiny-qwen2", "W4A16", 32, graph::I4, isa::Opcode::MATVEC_W4, false);
  CheckQuantizedDecode("random:tiny-qwen3", "W4A16", 128, graph::I4, isa::Opcode::MATVEC_W4, false);
}

// Checkpoints whose int4 weights the hub's libraries packed (tests/data/quantized, written by compressed-tensors,
// AutoAWQ's and GPTQModel's own packing): float16 scales, zero points, AWQ's and GPTQ's layouts, all read into
// MATVEC_W4's and computed as stored, decode and prefill against the oracle.
TEST(VmOracleW4, HubInt4CheckpointsDecodeAndPrefillMatchTheOracle) {
  for (const char* fixture : {"w4a16-g32-f16", "awq-g32", "gptq-g32-asym", "gptq-v2-g64-sym"}) {
    CheckQuantizedDecode(absl::StrCat(LOOM_SOURCE_DIR, "/tests/data/quantized/", fixture), "", 0, graph::I4,
                         isa::Opcode::MATVEC_W4, true);
  }
}

// The gated depthwise-conv LM (no attention): decode steps carry each layer's conv state from token to token
// (CONV1D on the VM against the oracle, 1e-5), and a one-pass prefill (the general graph lowering over the prompt's
// rows, continuing from and leaving the conv states) matches the oracle consuming the prompt token by token: the
// last row's logits (bf16 GEMM operands: 2e-2) and identical greedy tokens after it.
TEST(VmPrefill, GatedConvDecodeAndPrefillMatchTheOracle) {
  graph::ModelOptions mo;
  mo.max_seq = 512;
  absl::StatusOr<graph::Model> m = graph::LoadModel("random:gated-conv-tiny", mo);
  ASSERT_TRUE(m.ok()) << m.status();
  for (uint32_t sms : {3u, 132u}) {
    scheduler::CompileOptions o;
    o.set_num_sms(sms);
    VmOracle::CheckAgainstOracle(*m, *graph::DecodeWithOracle(*m, {17, 923, 4, 512}, kNewTokens), o,
                                 absl::StrCat("gated-conv decode on ", sms, " SMs"));
  }
  for (int rows : {1, 3, 40, 300}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < rows; ++i) prompt.push_back((i * 7919 + 3) % 1000);
    absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, prompt, 16);
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    for (uint32_t sms : {3u, 132u}) {
      const std::string what = absl::StrCat("gated-conv, ", rows, " rows on ", sms, " SMs");
      scheduler::CompileOptions o;
      o.set_num_sms(sms);
      absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, o);
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_TRUE(scheduler::HasPrefillWeights(*s));
      absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m->graph, *s, rows);
      ASSERT_TRUE(pass.ok()) << what << ": " << pass.status();
      absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, m->weights);
      ASSERT_TRUE(vm.ok());
      ASSERT_TRUE((*vm)->Reset(prompt).ok());
      ASSERT_TRUE((*vm)->Prefill(*pass).ok());
      EXPECT_EQ((*vm)->position(), rows) << what;
      EXPECT_LE(RelativeError((*vm)->logits(), oracle->logits[rows - 1]), 2e-2) << what;
      ASSERT_TRUE((*vm)->Run(15).ok());
      EXPECT_EQ((*vm)->tokens(), oracle->tokens) << what;
    }
  }
}

// What the prefill lowering does not cover is refused by name (the prompt then runs token by token).
TEST(VmPrefill, UncoveredShapesAreRefusedByName) {
  graph::ModelOptions mo;
  mo.max_seq = 64;
  absl::StatusOr<graph::Model> mistral = graph::LoadModel("random:tiny-mistral", mo);
  ASSERT_TRUE(mistral.ok());
  EXPECT_NE(scheduler::PrefillSupported(mistral->graph).message().find("head_dim 32"), std::string::npos)
      << scheduler::PrefillSupported(mistral->graph);
  // Asked for explicitly, compiling refuses; by default it compiles without the prefill weights.
  scheduler::CompileOptions o;
  o.set_prefill(true);
  EXPECT_FALSE(scheduler::Compile(mistral->graph, mistral->spec, o).ok());
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(mistral->graph, mistral->spec, {});
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(scheduler::HasPrefillWeights(*s));
  EXPECT_FALSE(scheduler::LowerPrefill(mistral->graph, *s, 4).ok());
}

// The prefill pass is lowered op by op, so layers of other shapes than a Llama layer's lower as well: here a full
// layer, two attention blocks in a row (each with its own KV cache, no MLP between them) and an MLP block without
// attention, on random:tiny's weights; prefill + decode on the VM against the oracle. A norm the pass has no rule
// for (LayerNorm) is refused by name.
TEST(VmPrefill, LayersOfOtherShapesAreLoweredOpByOp) {
  constexpr int kMaxSeq = 256;
  graph::ModelOptions mo;
  mo.max_seq = kMaxSeq;
  absl::StatusOr<graph::Model> tiny = graph::LoadModel("random:tiny", mo);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  const graph::DecoderConfig& c = tiny->config;
  auto build = [&](bool layer_norm) -> absl::StatusOr<graph::Graph> {
    graph::GraphBuilder b("decoder");
    for (const auto& [name, shape] : graph::DecoderWeightShapes(c)) b.Weight(name, shape);
    if (layer_norm) b.Weight("ln.bias", {c.hidden_size});
    const std::string pos = b.Input("pos", {1}, graph::I32);
    std::string x = b.Embedding("embed", "model.embed_tokens.weight", b.Input("token", {1}, graph::I32));
    graph::AttentionAttrs attn;
    attn.set_num_heads(c.num_heads);
    attn.set_num_kv_heads(c.num_kv_heads);
    attn.set_head_dim(c.head_dim);
    attn.set_causal(true);
    auto w = [](int l, const std::string& s) { return graph::DecoderWeightName(l, s); };
    auto attention_block = [&](const std::string& n, int l) {
      const std::string h = layer_norm ? b.LayerNorm(n + ".norm", x, w(l, "input_layernorm.weight"), "ln.bias", 1e-5f)
                                       : b.RmsNorm(n + ".norm", x, w(l, "input_layernorm.weight"), c.rms_norm_eps);
      const std::string q = b.Rope(n + ".q_rope", b.Linear(n + ".q", h, w(l, "self_attn.q_proj.weight")), pos,
                                   c.RopeFor());
      const std::string k = b.Rope(n + ".k_rope", b.Linear(n + ".k", h, w(l, "self_attn.k_proj.weight")), pos,
                                   c.RopeFor());
      const std::string v = b.Linear(n + ".v", h, w(l, "self_attn.v_proj.weight"));
      const std::string kc = b.State(n + ".k_cache", {c.num_kv_heads, kMaxSeq, c.head_dim});
      const std::string vc = b.State(n + ".v_cache", {c.num_kv_heads, kMaxSeq, c.head_dim});
      const std::string a = b.Attention(n + ".attn", q, k, v, kc, vc, pos, attn);
      x = b.Add(n + ".residual", x, b.Linear(n + ".o", a, w(l, "self_attn.o_proj.weight")));
    };
    auto mlp_block = [&](const std::string& n, int l) {
      const std::string h = b.RmsNorm(n + ".norm", x, w(l, "post_attention_layernorm.weight"), c.rms_norm_eps);
      const std::string s = b.SiluMul(n + ".silu_mul", b.Linear(n + ".gate", h, w(l, "mlp.gate_proj.weight")),
                                      b.Linear(n + ".up", h, w(l, "mlp.up_proj.weight")));
      x = b.Add(n + ".residual", x, b.Linear(n + ".down", s, w(l, "mlp.down_proj.weight")));
    };
    attention_block("layers.0.attention", 0);
    mlp_block("layers.0.mlp", 0);
    attention_block("layers.1.attention", 1);
    attention_block("layers.2.attention", 1);
    mlp_block("layers.3.mlp", 1);
    const std::string logits =
        b.Linear("logits", b.RmsNorm("final_norm", x, "model.norm.weight", c.rms_norm_eps), "lm_head.weight");
    b.Argmax("next_token", logits);
    b.MarkOutput(logits);
    return std::move(b).Build();
  };
  ASSERT_FALSE(c.tie_word_embeddings);
  absl::StatusOr<graph::Graph> layer_norm = build(true);
  ASSERT_TRUE(layer_norm.ok()) << layer_norm.status();
  EXPECT_EQ(scheduler::PrefillSupported(*layer_norm).message(),
            "prefill: op 'layers.0.attention.norm' (LAYER_NORM): no prefill lowering (a decoder's pass covers RMSNorm, "
            "projections, RoPE, attention, SiLU-mul, residual adds and the argmax of the logits)");
  absl::StatusOr<graph::Graph> g = build(false);
  ASSERT_TRUE(g.ok()) << g.status();
  graph::Model m = std::move(*tiny);
  m.graph = std::move(*g);
  ASSERT_TRUE(scheduler::PrefillSupported(m.graph).ok()) << scheduler::PrefillSupported(m.graph);
  for (int rows : {1, 37, 150}) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < rows; ++i) prompt.push_back((i * 7919 + 3) % 1000);
    absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(m, prompt, 8);
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    scheduler::CompileOptions o;
    o.set_prefill(true);
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m.graph, m.spec, o);
    ASSERT_TRUE(s.ok()) << s.status();
    absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m.graph, *s, rows);
    ASSERT_TRUE(pass.ok()) << rows << " rows: " << pass.status();
    absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, m.weights);
    ASSERT_TRUE(vm.ok());
    ASSERT_TRUE((*vm)->Reset(prompt).ok());
    ASSERT_TRUE((*vm)->Prefill(*pass).ok());
    EXPECT_LE(RelativeError((*vm)->logits(), oracle->logits[rows - 1]), 2e-2) << rows << " rows";
    ASSERT_TRUE((*vm)->Run(7).ok());
    EXPECT_EQ((*vm)->tokens(), oracle->tokens) << rows << " rows";
  }
}

// The pass's page size: 32 KB where four such pages fit beside the activation ring (head_dim 64), else 16 KB
// (head_dim 128: FLASH_ATTN's 97 KB slot), and 48 KB for long prompts where three fit; explicit sizes are kept,
// others refused.
TEST(VmPrefill, PageSizeFollowsTheActivationRing) {
  const std::string config = std::string(LOOM_SOURCE_DIR) + "/tests/data/hf_configs/transformers5/llama-3.2-3b.json";
  for (const auto& [spec, page_bytes] : std::vector<std::pair<std::string, uint32_t>>{
           {"random:tiny", 32768}, {config, 16384}}) {  // head_dim 64; Llama-3.2-3B's shape (head_dim 128)
    graph::ModelOptions mo;
    mo.max_seq = 1024;
    mo.load_weights = false;
    graph::Model m;
    if (absl::StartsWith(spec, "random:")) {
      absl::StatusOr<graph::Model> loaded = graph::LoadModel(spec, mo);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      m = *std::move(loaded);
    } else {  // the config alone: compiling needs no weights
      std::ifstream in(spec);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::vector<std::string> unused;
      absl::StatusOr<graph::DecoderConfig> c = graph::ParseHfConfig(text, spec, &unused);
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<graph::Graph> g = graph::BuildDecoderGraph(*c, mo.max_seq);
      ASSERT_TRUE(g.ok()) << g.status();
      m.graph = *std::move(g);
      m.spec = spec;
    }
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m.graph, m.spec, {});
    ASSERT_TRUE(s.ok()) << s.status();
    scheduler::PrefillOptions po;
    po.verify = false;
    absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m.graph, *s, 130, po);
    ASSERT_TRUE(pass.ok()) << spec << ": " << pass.status();
    EXPECT_EQ(pass->options().smem().page_bytes(), page_bytes) << spec;
    EXPECT_GE(pass->options().smem().num_pages(), page_bytes == 32768 ? 4u : 7u) << spec;
    po.page_bytes = 16384;
    pass = scheduler::LowerPrefill(m.graph, *s, 130, po);
    ASSERT_TRUE(pass.ok()) << spec << ": " << pass.status();
    EXPECT_EQ(pass->options().smem().page_bytes(), 16384u) << spec;
    po.page_bytes = 20000;
    pass = scheduler::LowerPrefill(m.graph, *s, 130, po);
    ASSERT_FALSE(pass.ok());
    EXPECT_NE(pass.status().message().find("page_bytes 20000"), std::string::npos) << pass.status();
    // 48 KB pages (128 x 256 GEMM tiles) where the gate/up GEMM has kMinWideTileWaves waves of wide tiles and three
    // pages fit (head_dim 64), else as before (head_dim 128). On 8 SMs, 1024 rows of random:tiny make 4 waves, 130
    // rows one.
    scheduler::CompileOptions o8;
    o8.set_num_sms(8);
    absl::StatusOr<scheduler::Schedule> s8 = scheduler::Compile(m.graph, m.spec, o8);
    ASSERT_TRUE(s8.ok()) << s8.status();
    po.page_bytes = 0;
    pass = scheduler::LowerPrefill(m.graph, *s8, 1024, po);
    ASSERT_TRUE(pass.ok()) << spec << ": " << pass.status();
    EXPECT_EQ(pass->options().smem().page_bytes(), page_bytes == 32768 ? isa::kGemmWideStepBytes : 16384u) << spec;
    if (page_bytes == 32768) EXPECT_GE(pass->options().smem().num_pages(), scheduler::kMinWideTilePages) << spec;
    pass = scheduler::LowerPrefill(m.graph, *s8, 130, po);
    ASSERT_TRUE(pass.ok()) << spec << ": " << pass.status();
    EXPECT_EQ(pass->options().smem().page_bytes(), page_bytes) << spec;
  }
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
