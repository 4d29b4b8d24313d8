#include "graph/decoder.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "graph/graph_builder.h"
#include "graph/parallel.h"

namespace loom::graph {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Fills `t` with center + uniform(-half_width, half_width), element i from hash(seed, name, i).
void FillUniform(HostTensor& t, uint64_t stream, float center, float half_width) {
  ParallelFor(t.size(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t r = SplitMix64(stream ^ static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull);
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0,1)
      t.bf16[i] = FloatToBf16(center + (2.0f * u - 1.0f) * half_width);
    }
  });
}

}  // namespace

HostTensor RandomBf16Weight(const std::string& name, std::vector<int64_t> shape, uint64_t seed, float center,
                            float half_width) {
  HostTensor t = HostTensor::Zeros(BF16, std::move(shape));
  FillUniform(t, SplitMix64(seed ^ HashName(name)), center, half_width);
  return t;
}

absl::Status DecoderConfig::Validate() const {
  if (hidden_size <= 0 || num_layers <= 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      intermediate_size <= 0 || vocab_size <= 0) {
    return absl::InvalidArgumentError("decoder config: sizes must be positive");
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("decoder config: num_attention_heads ", num_heads,
                                                   " is not a multiple of num_key_value_heads ", num_kv_heads));
  }
  if (head_dim % 2 != 0) return absl::InvalidArgumentError("decoder config: head_dim must be even for RoPE");
  if (!(rms_norm_eps > 0) || !(rope.theta() > 0)) {
    return absl::InvalidArgumentError("decoder config: rms_norm_eps and rope theta must be > 0");
  }
  if (!sliding_window.empty() && sliding_window.size() != static_cast<size_t>(num_layers)) {
    return absl::InvalidArgumentError("decoder config: one sliding window per layer");
  }
  return absl::OkStatus();
}

RopeAttrs DecoderConfig::RopeFor() const {
  RopeAttrs attrs = rope;
  attrs.set_head_dim(head_dim);
  return attrs;
}

int64_t DecoderConfig::DecodeWeightBytes() const {
  int64_t elements = 0;
  for (const auto& [name, shape] : DecoderWeightShapes(*this)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    elements += n;
  }
  // The lookup reads one embedding row; only a tied table is also read whole (by the LM head).
  if (!tie_word_embeddings) elements -= static_cast<int64_t>(vocab_size) * hidden_size;
  elements += hidden_size;
  return 2 * elements;
}

double DecoderConfig::Parameters() const {
  double n = 0;
  for (const auto& [name, shape] : DecoderWeightShapes(*this)) {
    double e = 1;
    for (int64_t d : shape) e *= static_cast<double>(d);
    n += e;
  }
  return n;
}

absl::Status DecoderConfig::CheckWindows(int max_seq) const {
  for (size_t l = 0; l < sliding_window.size(); ++l) {
    const int w = sliding_window[l];
    if (w > 0 && w < max_seq) {
      return absl::UnimplementedError(absl::StrCat(
          "sliding_window ", w, " (layer ", l, ") is smaller than the KV cache of ", max_seq,
          " positions; Loom has no sliding-window attention: with --max_seq=", w,
          " or less, full attention computes exactly the same"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> DecoderPresetNames() {
  return {"llama-3.2-1b", "tiny", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"};
}

absl::StatusOr<DecoderConfig> DecoderPreset(const std::string& name) {
  DecoderConfig c;
  if (name == "llama-3.2-1b") {
    c.hidden_size = 2048;
    c.num_layers = 16;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 64;
    c.intermediate_size = 8192;
    c.vocab_size = 128256;
    c.max_position_embeddings = 131072;
    c.rms_norm_eps = 1e-5f;
    c.rope.set_theta(500000.0f);
    RopeScaling* s = c.rope.mutable_llama3_scaling();
    s->set_factor(32.0f);
    s->set_low_freq_factor(1.0f);
    s->set_high_freq_factor(4.0f);
    s->set_original_max_position(8192);
    c.tie_word_embeddings = true;
    return c;
  }
  // The tiny presets are small, but have every feature of their family: GQA,
  // rope scaling that bites at short positions, K multiples of 256 (tiny) or
  // not (the others), biases and per-head norms where the family has them.
  c.num_layers = 2;
  c.vocab_size = 1000;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5f;
  c.rope.set_theta(10000.0f);
  if (name == "tiny") {
    c.hidden_size = 256;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 512;
    RopeScaling* s = c.rope.mutable_llama3_scaling();
    s->set_factor(4.0f);
    s->set_low_freq_factor(1.0f);
    s->set_high_freq_factor(4.0f);
    s->set_original_max_position(64);
  } else if (name == "tiny-mistral") {  // hidden 192: rows padded to 256 columns
    c.family = "mistral";
    c.hidden_size = 192;
    c.num_heads = 6;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.intermediate_size = 320;
    c.rope.set_linear_factor(2.0f);
    c.tie_word_embeddings = true;
  } else if (name == "tiny-qwen2") {  // 7 query heads per KV head, q/k/v biases, YaRN
    c.family = "qwen2";
    c.hidden_size = 224;
    c.num_heads = 7;
    c.num_kv_heads = 1;
    c.head_dim = 32;
    c.intermediate_size = 608;
    c.rms_norm_eps = 1e-6f;
    YarnScaling* y = c.rope.mutable_yarn();
    y->set_factor(4.0f);
    y->set_original_max_position(64);
    y->set_beta_fast(32.0f);
    y->set_beta_slow(1.0f);
    y->set_truncate(true);
    y->set_attention_factor(static_cast<float>(0.1 * std::log(4.0) + 1.0));
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
  } else if (name == "tiny-qwen3") {  // head_dim 64 decoupled from hidden / heads, per-head q/k norms
    c.family = "qwen3";
    c.hidden_size = 256;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 768;
    c.rms_norm_eps = 1e-6f;
    c.qk_norm = true;
  } else {
    return absl::NotFoundError(absl::StrCat("unknown preset 'random:", name, "'; known presets: random:",
                                            absl::StrJoin(DecoderPresetNames(), ", random:")));
  }
  return c;
}

std::string DecoderWeightName(int layer, const std::string& suffix) {
  if (layer < 0) return suffix;
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> DecoderWeightShapes(const DecoderConfig& c) {
  const int64_t d = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  shapes.push_back({"model.embed_tokens.weight", {c.vocab_size, d}});
  for (int l = 0; l < c.num_layers; ++l) {
    auto add = [&](const std::string& suffix, std::vector<int64_t> shape) {
      shapes.push_back({DecoderWeightName(l, suffix), std::move(shape)});
    };
    add("input_layernorm.weight", {d});
    for (auto [proj, rows] : {std::pair{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}}) {
      add(absl::StrCat("self_attn.", proj, ".weight"), {rows, d});
      if (c.qkv_bias) add(absl::StrCat("self_attn.", proj, ".bias"), {rows});
    }
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", {c.head_dim});
      add("self_attn.k_norm.weight", {c.head_dim});
    }
    add("self_attn.o_proj.weight", {d, q});
    if (c.o_bias) add("self_attn.o_proj.bias", {d});
    add("post_attention_layernorm.weight", {d});
    for (auto [proj, rows, cols] : {std::tuple{"gate_proj", inter, d}, {"up_proj", inter, d}, {"down_proj", d, inter}}) {
      add(absl::StrCat("mlp.", proj, ".weight"), {rows, cols});
      if (c.mlp_bias) add(absl::StrCat("mlp.", proj, ".bias"), {rows});
    }
  }
  shapes.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) shapes.push_back({"lm_head.weight", {c.vocab_size, d}});
  return shapes;
}

absl::StatusOr<Graph> BuildDecoderGraph(const DecoderConfig& c, int max_seq, DType kv_dtype) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (max_seq <= 0) return absl::InvalidArgumentError("max_seq must be positive");
  if (kv_dtype != F32 && kv_dtype != BF16) {
    return absl::InvalidArgumentError(absl::StrCat("kv_dtype ", DType_Name(kv_dtype), ": a KV cache is F32 or BF16"));
  }
  if (absl::Status s = c.CheckWindows(max_seq); !s.ok()) return s;
  GraphBuilder b("decoder");
  for (const auto& [name, shape] : DecoderWeightShapes(c)) b.Weight(name, shape);
  const std::string token = b.Input("token", {1}, I32);
  const std::string pos = b.Input("pos", {1}, I32);

  AttentionAttrs attn;
  attn.set_num_heads(c.num_heads);
  attn.set_num_kv_heads(c.num_kv_heads);
  attn.set_head_dim(c.head_dim);
  attn.set_causal(true);
  const RopeAttrs rope = c.RopeFor();

  std::string x = b.Embedding("embed", "model.embed_tokens.weight", token);
  for (int l = 0; l < c.num_layers; ++l) {
    auto n = [l](const std::string& s) { return absl::StrCat("layers.", l, ".", s); };
    auto w = [l](const std::string& s) { return DecoderWeightName(l, s); };
    auto linear = [&](const std::string& name, const std::string& in, const std::string& weight, bool bias) {
      return b.Linear(n(name), in, w(weight + ".weight"), bias ? w(weight + ".bias") : "");
    };
    const std::string h = b.RmsNorm(n("attn_norm"), x, w("input_layernorm.weight"), c.rms_norm_eps);
    std::string q = linear("q", h, "self_attn.q_proj", c.qkv_bias);
    std::string k = linear("k", h, "self_attn.k_proj", c.qkv_bias);
    const std::string v = linear("v", h, "self_attn.v_proj", c.qkv_bias);
    if (c.qk_norm) {
      q = b.RmsNorm(n("q_norm"), q, w("self_attn.q_norm.weight"), c.rms_norm_eps, c.head_dim);
      k = b.RmsNorm(n("k_norm"), k, w("self_attn.k_norm.weight"), c.rms_norm_eps, c.head_dim);
    }
    const std::string qr = b.Rope(n("q_rope"), q, pos, rope);
    const std::string kr = b.Rope(n("k_rope"), k, pos, rope);
    const std::string kc = b.State(n("k_cache"), {c.num_kv_heads, max_seq, c.head_dim}, kv_dtype);
    const std::string vc = b.State(n("v_cache"), {c.num_kv_heads, max_seq, c.head_dim}, kv_dtype);
    const std::string a = b.Attention(n("attn"), qr, kr, v, kc, vc, pos, attn);
    const std::string o = linear("o", a, "self_attn.o_proj", c.o_bias);
    const std::string x1 = b.Add(n("attn_residual"), x, o);
    const std::string h2 = b.RmsNorm(n("mlp_norm"), x1, w("post_attention_layernorm.weight"), c.rms_norm_eps);
    const std::string g = linear("gate", h2, "mlp.gate_proj", c.mlp_bias);
    const std::string u = linear("up", h2, "mlp.up_proj", c.mlp_bias);
    const std::string s = b.SiluMul(n("silu_mul"), g, u);
    const std::string dn = linear("down", s, "mlp.down_proj", c.mlp_bias);
    x = b.Add(n("mlp_residual"), x1, dn);
  }
  const std::string f = b.RmsNorm("final_norm", x, "model.norm.weight", c.rms_norm_eps);
  const std::string logits =
      b.Linear("logits", f, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  const std::string next = b.Argmax("next_token", logits);
  b.MarkOutput(logits);
  b.MarkOutput(next);
  return std::move(b).Build();
}

WeightStore RandomDecoderWeights(const DecoderConfig& c, uint64_t seed,
                                 const std::function<HostTensor(const std::string&, HostTensor)>& transform) {
  WeightStore weights;
  const absl::Status s = VisitRandomDecoderWeights(c, seed, transform, [&](const std::string& name, HostTensor t) {
    weights.emplace(name, std::move(t));
    return absl::OkStatus();
  });
  (void)s;  // (the visitor above never fails)
  return weights;
}

absl::Status VisitRandomDecoderWeights(const DecoderConfig& c, uint64_t seed,
                                       const std::function<HostTensor(const std::string&, HostTensor)>& transform,
                                       const std::function<absl::Status(const std::string&, HostTensor)>& visit) {
  constexpr float kStd = 0.02f;
  const float half_width = kStd * std::sqrt(3.0f);  // uniform with this std
  for (const auto& [name, shape] : DecoderWeightShapes(c)) {
    HostTensor t = HostTensor::Zeros(BF16, shape);
    const bool is_norm = absl::StrContains(name, "norm");
    const bool is_bias = absl::EndsWith(name, ".bias");
    // Embeddings wider than the linear weights keep random logits well separated.
    const float width = is_norm ? 0.1f : name == "model.embed_tokens.weight" ? 2.0f * half_width
                                  : is_bias                                ? 0.1f
                                                                           : half_width;
    FillUniform(t, SplitMix64(seed ^ HashName(name)), is_norm ? 1.0f : 0.0f, width);
    if (absl::Status s = visit(name, transform ? transform(name, std::move(t)) : std::move(t)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom::graph
