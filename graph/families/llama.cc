// Llama (model_type "llama", LlamaForCausalLM): optional biases on the
// attention projections (attention_bias: q, k, v and o) and on the MLP
// (mlp_bias: gate, up, down).
#include "graph/families/families.h"

namespace loom::graph {
namespace {

absl::Status Read(HfConfigReader& r, DecoderConfig* c) {
  FamilyDefaults defaults;
  defaults.max_position_embeddings = 2048;
  if (absl::Status s = ReadCommonConfig(r, defaults, c); !s.ok()) return s;
  bool attention_bias = false;
  if (absl::Status s = r.OptionalBool("attention_bias", &attention_bias); !s.ok()) return s;
  if (absl::Status s = r.OptionalBool("mlp_bias", &c->mlp_bias); !s.ok()) return s;
  c->qkv_bias = c->o_bias = attention_bias;
  // LlamaForCausalLM's forward ignores sliding_window but generate() may build a
  // sliding mask from it: honour it the way Mistral does (refused below the cache size).
  return ReadWindowForAllLayers(r, c);
}

absl::Status Write(const DecoderConfig& c, nlohmann::json* j) {
  if (c.qkv_bias != c.o_bias || c.qk_norm) {
    return absl::InvalidArgumentError("a llama config has q/k/v/o biases together and no q/k norms");
  }
  (*j)["attention_bias"] = c.qkv_bias;
  (*j)["mlp_bias"] = c.mlp_bias;
  return absl::OkStatus();
}

}  // namespace

const Family kLlamaFamily = {"llama", "LlamaForCausalLM", Read, Write};

}  // namespace loom::graph
