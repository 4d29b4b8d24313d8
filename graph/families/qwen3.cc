// Qwen3 (model_type "qwen3", Qwen3ForCausalLM): per-head RMSNorm of q and k
// before RoPE, head_dim decoupled from hidden_size (default 128), optional
// biases on q, k, v and o (attention_bias); sliding windows per layer type.
#include "graph/families/qwen.h"

namespace loom::graph {
namespace {

absl::Status Read(HfConfigReader& r, DecoderConfig* c) {
  FamilyDefaults defaults;
  defaults.max_position_embeddings = 32768;
  defaults.num_kv_heads = 32;
  defaults.head_dim = 128;
  if (absl::Status s = ReadCommonConfig(r, defaults, c); !s.ok()) return s;
  bool attention_bias = false;
  if (absl::Status s = r.OptionalBool("attention_bias", &attention_bias); !s.ok()) return s;
  c->qkv_bias = c->o_bias = attention_bias;
  c->qk_norm = true;
  return ReadQwenWindows(r, c);
}

absl::Status Write(const DecoderConfig& c, nlohmann::json* j) {
  if (c.qkv_bias != c.o_bias || c.mlp_bias || !c.qk_norm) {
    return absl::InvalidArgumentError("a qwen3 config has q/k norms, q/k/v/o biases together and no MLP biases");
  }
  (*j)["attention_bias"] = c.qkv_bias;
  WriteQwenWindows(c, j);
  return absl::OkStatus();
}

}  // namespace

const Family kQwen3Family = {"qwen3", "Qwen3ForCausalLM", Read, Write};

}  // namespace loom::graph
