// Llama-family models: the config (Hugging Face config.json), the decode graph
// Loom builds from it, presets, and deterministic random weights.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "nlohmann/json.hpp"

namespace loom::graph {

struct LlamaConfig {
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  std::optional<RopeScaling> llama3_scaling;
  bool tie_word_embeddings = false;

  absl::Status Validate() const;
  RopeAttrs rope() const;
  // Weight bytes read by one decode step (every weight once, bf16).
  int64_t DecodeWeightBytes() const;
};

// Parses a Hugging Face config.json; `path` is used in errors.
absl::StatusOr<LlamaConfig> ParseLlamaConfig(const std::string& json_text, const std::string& path);
// The config.json Hugging Face transformers loads as LlamaForCausalLM.
nlohmann::json LlamaConfigToJson(const LlamaConfig& config);

// Presets for random:<name> models: "llama-3.2-1b", "tiny".
absl::StatusOr<LlamaConfig> LlamaPreset(const std::string& name);
std::vector<std::string> LlamaPresetNames();

// Names of the Hugging Face weights of layer `layer` (or of the model when -1).
std::string LlamaWeightName(int layer, const std::string& suffix);
// Every weight tensor the config implies, with its [rows, cols] / [n] shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaWeightShapes(const LlamaConfig& config);

// The batch-1 decode graph: inputs token[1] (i32) and pos[1] (i32), one KV cache
// [kv_heads, max_seq, head_dim] per layer (STATE), outputs logits[1,vocab] and
// next_token[1].
absl::StatusOr<Graph> BuildLlamaDecodeGraph(const LlamaConfig& config, int max_seq);

// Deterministic random bf16 weights: the same (config, seed) gives the same bits
// on every machine. Linear weights are uniform with std 0.02, norms near 1.
WeightStore RandomLlamaWeights(const LlamaConfig& config, uint64_t seed);

}  // namespace loom::graph
