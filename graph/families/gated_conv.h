// A gated depthwise-conv language model (Hyena / Mamba / LFM2-style short-conv blocks, no attention): per layer
//
//   n = RMSNorm(x);  u = n·Wuᵀ;  g = n·Wgᵀ;  c = CausalDepthwiseConv1d(u) (kernel K, bias, state of K - 1 inputs)
//   x = x + (silu(g) * c)·Woᵀ
//   x = x + down(silu(gate(RMSNorm(x))) * up(RMSNorm(x)))
//
// then a final RMSNorm, the LM head (tied to the embedding or not) and the argmax. The decode graph is batch 1
// like the transformers' (inputs token[1] i32; outputs logits [1, vocab] and next_token [1]); each layer's conv
// state is a STATE tensor [hidden, K - 1] that carries the sequence from token to token, and from a one-pass
// prefill to decode. Weights are named "layers.<i>.<name>.weight" (and "layers.<i>.conv.bias"), plus "embed",
// "final_norm" and "lm_head".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"

namespace loom::graph {

struct GatedConvConfig {
  int hidden = 0;
  int layers = 0;
  int intermediate = 0;
  int kernel = 4;  // conv taps; the state holds kernel - 1 inputs per channel
  int vocab = 0;
  float eps = 1e-5f;
  bool tie_embeddings = false;

  absl::Status Validate() const;
};

// random:<name> presets: "gated-conv-tiny" (hidden 64, 2 layers, vocab 1000), "gated-conv-small" (hidden 512,
// 8 layers, vocab 32000).
absl::StatusOr<GatedConvConfig> GatedConvPreset(const std::string& name);
bool IsGatedConvPreset(const std::string& name);

// `max_seq`: the positions a decode may reach (GraphDef.max_seq).
// A folder's config.json for this family: {"model_type": "loom-gated-conv", "hidden_size", "num_hidden_layers",
// "intermediate_size", "conv_kernel", "vocab_size", "rms_norm_eps", "tie_word_embeddings"}; the weights in
// model.safetensors under the graph's names.
inline constexpr char kGatedConvModelType[] = "loom-gated-conv";
std::string GatedConvConfigJson(const GatedConvConfig& config);
// The config, or nullopt when the text is not this family's (another model_type); errors name the file and field.
absl::StatusOr<std::optional<GatedConvConfig>> ParseGatedConvConfig(const std::string& text, const std::string& path);

absl::StatusOr<Graph> BuildGatedConvGraph(const GatedConvConfig& config, int max_seq);

// Deterministic random weights for every WEIGHT tensor of the graph (the same seed, the same weights).
WeightStore RandomGatedConvWeights(const Graph& graph, uint64_t seed);

}  // namespace loom::graph
