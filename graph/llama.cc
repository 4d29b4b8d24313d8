#include "graph/llama.h"

#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/graph_builder.h"

namespace loom::graph {
namespace {

absl::Status ConfigError(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// Reads a required positive integer field.
absl::Status RequireInt(const nlohmann::json& j, const char* key, const std::string& path, int* out) {
  auto it = j.find(key);
  if (it == j.end()) return ConfigError(path, absl::StrCat("missing field '", key, "'"));
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1 << 30)) {
    return ConfigError(path, absl::StrCat("field '", key, "' must be a positive integer"));
  }
  *out = it->get<int>();
  return absl::OkStatus();
}

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
  const int64_t n = t.size();
  const int threads = static_cast<int>(std::max(1u, std::min(8u, std::thread::hardware_concurrency())));
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      const int64_t end = std::min(n, (w + 1) * chunk);
      for (int64_t i = w * chunk; i < end; ++i) {
        const uint64_t r = SplitMix64(stream ^ static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull);
        const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0,1)
        t.bf16[i] = FloatToBf16(center + (2.0f * u - 1.0f) * half_width);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
}

}  // namespace

absl::Status LlamaConfig::Validate() const {
  if (hidden_size <= 0 || num_layers <= 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      intermediate_size <= 0 || vocab_size <= 0) {
    return absl::InvalidArgumentError("llama config: sizes must be positive");
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("llama config: num_attention_heads ", num_heads,
                                                   " is not a multiple of num_key_value_heads ", num_kv_heads));
  }
  if (head_dim % 2 != 0) return absl::InvalidArgumentError("llama config: head_dim must be even for RoPE");
  if (!(rms_norm_eps > 0) || !(rope_theta > 0)) {
    return absl::InvalidArgumentError("llama config: rms_norm_eps and rope_theta must be > 0");
  }
  return absl::OkStatus();
}

RopeAttrs LlamaConfig::rope() const {
  RopeAttrs attrs;
  attrs.set_head_dim(head_dim);
  attrs.set_theta(rope_theta);
  if (llama3_scaling) *attrs.mutable_llama3_scaling() = *llama3_scaling;
  return attrs;
}

int64_t LlamaConfig::DecodeWeightBytes() const {
  int64_t elements = 0;
  for (const auto& [name, shape] : LlamaWeightShapes(*this)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    elements += n;
  }
  // The lookup reads one embedding row; only a tied table is also read whole (by the LM head).
  if (!tie_word_embeddings) elements -= static_cast<int64_t>(vocab_size) * hidden_size;
  elements += hidden_size;
  return 2 * elements;
}

absl::StatusOr<LlamaConfig> ParseLlamaConfig(const std::string& json_text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return ConfigError(path, "not a JSON object");
  if (auto mt = j.find("model_type"); mt != j.end() && (!mt->is_string() || mt->get<std::string>() != "llama")) {
    return ConfigError(path, absl::StrCat("model_type ", mt->dump(), " is not a Llama-family model"));
  }
  LlamaConfig c;
  for (auto [key, field] : {std::pair{"hidden_size", &c.hidden_size}, {"num_hidden_layers", &c.num_layers},
                            {"num_attention_heads", &c.num_heads}, {"intermediate_size", &c.intermediate_size},
                            {"vocab_size", &c.vocab_size}}) {
    if (absl::Status s = RequireInt(j, key, path, field); !s.ok()) return s;
  }
  c.num_kv_heads = c.num_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    if (absl::Status s = RequireInt(j, "num_key_value_heads", path, &c.num_kv_heads); !s.ok()) return s;
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    if (absl::Status s = RequireInt(j, "head_dim", path, &c.head_dim); !s.ok()) return s;
  }
  c.max_position_embeddings = 2048;
  if (j.contains("max_position_embeddings")) {
    if (absl::Status s = RequireInt(j, "max_position_embeddings", path, &c.max_position_embeddings); !s.ok()) {
      return s;
    }
  }
  auto number = [&](const char* key, float* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end()) return absl::OkStatus();
    if (!it->is_number()) return ConfigError(path, absl::StrCat("field '", key, "' must be a number"));
    *out = it->get<float>();
    return absl::OkStatus();
  };
  if (absl::Status s = number("rms_norm_eps", &c.rms_norm_eps); !s.ok()) return s;
  if (absl::Status s = number("rope_theta", &c.rope_theta); !s.ok()) return s;
  if (auto it = j.find("tie_word_embeddings"); it != j.end()) {
    if (!it->is_boolean()) return ConfigError(path, "field 'tie_word_embeddings' must be a boolean");
    c.tie_word_embeddings = it->get<bool>();
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    const nlohmann::json& rs = *it;
    const std::string type = rs.value("rope_type", rs.value("type", std::string()));
    if (type != "llama3") return ConfigError(path, absl::StrCat("rope_scaling type '", type, "' is not supported"));
    RopeScaling s;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!rs.contains(key) || !rs[key].is_number()) {
        return ConfigError(path, absl::StrCat("rope_scaling is missing numeric field '", key, "'"));
      }
    }
    s.set_factor(rs["factor"].get<float>());
    s.set_low_freq_factor(rs["low_freq_factor"].get<float>());
    s.set_high_freq_factor(rs["high_freq_factor"].get<float>());
    s.set_original_max_position(rs["original_max_position_embeddings"].get<int>());
    if (!(s.factor() > 0) || !(s.high_freq_factor() > s.low_freq_factor()) || s.original_max_position() <= 0) {
      return ConfigError(path, "rope_scaling values are inconsistent");
    }
    c.llama3_scaling = s;
  }
  if (absl::Status s = c.Validate(); !s.ok()) return ConfigError(path, std::string(s.message()));
  return c;
}

nlohmann::json LlamaConfigToJson(const LlamaConfig& c) {
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", "bfloat16"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  if (c.llama3_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.llama3_scaling->factor()},
                         {"low_freq_factor", c.llama3_scaling->low_freq_factor()},
                         {"high_freq_factor", c.llama3_scaling->high_freq_factor()},
                         {"original_max_position_embeddings", c.llama3_scaling->original_max_position()}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

std::vector<std::string> LlamaPresetNames() { return {"llama-3.2-1b", "tiny"}; }

absl::StatusOr<LlamaConfig> LlamaPreset(const std::string& name) {
  LlamaConfig c;
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
    c.rope_theta = 500000.0f;
    RopeScaling s;
    s.set_factor(32.0f);
    s.set_low_freq_factor(1.0f);
    s.set_high_freq_factor(4.0f);
    s.set_original_max_position(8192);
    c.llama3_scaling = s;
    c.tie_word_embeddings = true;
  } else if (name == "tiny") {
    // Small, but every feature of the 1B model: GQA, llama3 scaling that bites
    // (original_max_position 64), K multiples of 256, untied LM head.
    c.hidden_size = 256;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 512;
    c.vocab_size = 1000;
    c.max_position_embeddings = 512;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    RopeScaling s;
    s.set_factor(4.0f);
    s.set_low_freq_factor(1.0f);
    s.set_high_freq_factor(4.0f);
    s.set_original_max_position(64);
    c.llama3_scaling = s;
    c.tie_word_embeddings = false;
  } else {
    return absl::NotFoundError(absl::StrCat("unknown preset 'random:", name, "'; known presets: random:",
                                            absl::StrJoin(LlamaPresetNames(), ", random:")));
  }
  return c;
}

std::string LlamaWeightName(int layer, const std::string& suffix) {
  if (layer < 0) return suffix;
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaWeightShapes(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  shapes.push_back({"model.embed_tokens.weight", {c.vocab_size, d}});
  for (int l = 0; l < c.num_layers; ++l) {
    shapes.push_back({LlamaWeightName(l, "input_layernorm.weight"), {d}});
    shapes.push_back({LlamaWeightName(l, "self_attn.q_proj.weight"), {q, d}});
    shapes.push_back({LlamaWeightName(l, "self_attn.k_proj.weight"), {kv, d}});
    shapes.push_back({LlamaWeightName(l, "self_attn.v_proj.weight"), {kv, d}});
    shapes.push_back({LlamaWeightName(l, "self_attn.o_proj.weight"), {d, q}});
    shapes.push_back({LlamaWeightName(l, "post_attention_layernorm.weight"), {d}});
    shapes.push_back({LlamaWeightName(l, "mlp.gate_proj.weight"), {c.intermediate_size, d}});
    shapes.push_back({LlamaWeightName(l, "mlp.up_proj.weight"), {c.intermediate_size, d}});
    shapes.push_back({LlamaWeightName(l, "mlp.down_proj.weight"), {d, c.intermediate_size}});
  }
  shapes.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) shapes.push_back({"lm_head.weight", {c.vocab_size, d}});
  return shapes;
}

absl::StatusOr<Graph> BuildLlamaDecodeGraph(const LlamaConfig& c, int max_seq) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (max_seq <= 0) return absl::InvalidArgumentError("max_seq must be positive");
  GraphBuilder b("llama_decode");
  for (const auto& [name, shape] : LlamaWeightShapes(c)) b.Weight(name, shape);
  const std::string token = b.Input("token", {1}, I32);
  const std::string pos = b.Input("pos", {1}, I32);

  AttentionAttrs attn;
  attn.set_num_heads(c.num_heads);
  attn.set_num_kv_heads(c.num_kv_heads);
  attn.set_head_dim(c.head_dim);
  attn.set_causal(true);
  const RopeAttrs rope = c.rope();

  std::string x = b.Embedding("embed", "model.embed_tokens.weight", token);
  for (int l = 0; l < c.num_layers; ++l) {
    auto n = [l](const std::string& s) { return absl::StrCat("layers.", l, ".", s); };
    auto w = [l](const std::string& s) { return LlamaWeightName(l, s); };
    const std::string h = b.RmsNorm(n("attn_norm"), x, w("input_layernorm.weight"), c.rms_norm_eps);
    const std::string q = b.Linear(n("q"), h, w("self_attn.q_proj.weight"));
    const std::string k = b.Linear(n("k"), h, w("self_attn.k_proj.weight"));
    const std::string v = b.Linear(n("v"), h, w("self_attn.v_proj.weight"));
    const std::string qr = b.Rope(n("q_rope"), q, pos, rope);
    const std::string kr = b.Rope(n("k_rope"), k, pos, rope);
    const std::string kc = b.State(n("k_cache"), {c.num_kv_heads, max_seq, c.head_dim});
    const std::string vc = b.State(n("v_cache"), {c.num_kv_heads, max_seq, c.head_dim});
    const std::string a = b.Attention(n("attn"), qr, kr, v, kc, vc, pos, attn);
    const std::string o = b.Linear(n("o"), a, w("self_attn.o_proj.weight"));
    const std::string x1 = b.Add(n("attn_residual"), x, o);
    const std::string h2 = b.RmsNorm(n("mlp_norm"), x1, w("post_attention_layernorm.weight"), c.rms_norm_eps);
    const std::string g = b.Linear(n("gate"), h2, w("mlp.gate_proj.weight"));
    const std::string u = b.Linear(n("up"), h2, w("mlp.up_proj.weight"));
    const std::string s = b.SiluMul(n("silu_mul"), g, u);
    const std::string dn = b.Linear(n("down"), s, w("mlp.down_proj.weight"));
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

WeightStore RandomLlamaWeights(const LlamaConfig& c, uint64_t seed) {
  WeightStore weights;
  constexpr float kStd = 0.02f;
  const float half_width = kStd * std::sqrt(3.0f);  // uniform with this std
  for (const auto& [name, shape] : LlamaWeightShapes(c)) {
    HostTensor t = HostTensor::Zeros(BF16, shape);
    const bool is_norm = shape.size() == 1;
    // Embeddings wider than the linear weights keep random logits well separated.
    const float width = is_norm ? 0.1f : name == "model.embed_tokens.weight" ? 2.0f * half_width : half_width;
    FillUniform(t, SplitMix64(seed ^ HashName(name)), is_norm ? 1.0f : 0.0f, width);
    weights.emplace(name, std::move(t));
  }
  return weights;
}

}  // namespace loom::graph
