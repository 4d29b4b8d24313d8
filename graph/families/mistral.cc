// Mistral (model_type "mistral", MistralForCausalLM): Llama without biases, with
// a sliding window on every layer unless sliding_window is null (its config
// class defaults to 4096 when the field is absent).
#include "graph/families/families.h"

namespace loom::graph {
namespace {

absl::Status Read(HfConfigReader& r, DecoderConfig* c) {
  FamilyDefaults defaults;
  defaults.max_position_embeddings = 4096 * 32;
  defaults.num_kv_heads = 8;
  if (absl::Status s = ReadCommonConfig(r, defaults, c); !s.ok()) return s;
  if (!r.Contains("sliding_window")) {
    c->sliding_window.assign(c->num_layers, 4096);
    return absl::OkStatus();
  }
  return ReadWindowForAllLayers(r, c);
}

absl::Status Write(const DecoderConfig& c, nlohmann::json* j) {
  if (c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm) {
    return absl::InvalidArgumentError("a mistral config has no biases and no q/k norms");
  }
  (*j)["sliding_window"] = c.sliding_window.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.sliding_window[0]);
  return absl::OkStatus();
}

}  // namespace

const Family kMistralFamily = {"mistral", "MistralForCausalLM", Read, Write};

}  // namespace loom::graph
