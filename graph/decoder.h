// Llama-style decoder-only transformers: the configuration the supported
// Hugging Face families (llama, mistral, qwen2, qwen3; see families/) map onto,
// the decode graph Loom builds from it, its weights, presets, and
// deterministic random weights. The graph IR, lowering and kernel are shared.
#pragma once

#include <cstdint>
#include <optional>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "graph/quantization.h"

namespace loom::graph {

struct DecoderConfig {
  std::string family = "llama";  // the Hugging Face model_type
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  RopeAttrs rope;  // theta and scaling (rope.head_dim is set by RopeFor)
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj have biases
  bool o_bias = false;    // o_proj has a bias
  bool mlp_bias = false;  // gate_proj, up_proj, down_proj have biases
  bool qk_norm = false;   // per-head RMSNorm of q and k before RoPE (Qwen3)
  // Per layer, the sliding window of its attention in positions; empty or 0: full attention.
  std::vector<int> sliding_window;
  // How the checkpoint stores its projections (config.json's quantization_config), if quantized: read back to bf16.
  std::optional<QuantizationConfig> quantization;

  absl::Status Validate() const;
  RopeAttrs RopeFor() const;
  // Weight bytes read by one decode step (every weight once, bf16).
  int64_t DecodeWeightBytes() const;
  // Checks that every sliding window covers a KV cache of `max_seq` positions,
  // where full attention computes exactly the same; names the field otherwise.
  absl::Status CheckWindows(int max_seq) const;
  double Parameters() const;  // in units, for messages
};

// Presets for random:<name> models: "llama-3.2-1b", "tiny", "tiny-mistral", "tiny-qwen2", "tiny-qwen3".
absl::StatusOr<DecoderConfig> DecoderPreset(const std::string& name);
std::vector<std::string> DecoderPresetNames();

// Names of the Hugging Face weights of layer `layer` (or of the model when -1).
std::string DecoderWeightName(int layer, const std::string& suffix);
// Every weight tensor the config implies, with its [rows, cols] / [n] shape.
std::vector<std::pair<std::string, std::vector<int64_t>>> DecoderWeightShapes(const DecoderConfig& config);

// A bf16 weight of center + uniform(-half_width, half_width), element i from hash(seed, name, i) (what random:
// models are made of).
HostTensor RandomBf16Weight(const std::string& name, std::vector<int64_t> shape, uint64_t seed, float center,
                            float half_width);

// The batch-1 decode graph: inputs token[1] (i32) and pos[1] (i32), one KV cache
// [kv_heads, max_seq, head_dim] of kv_dtype (F32 or BF16) per layer (STATE), outputs logits[1,vocab] and
// next_token[1].
absl::StatusOr<Graph> BuildDecoderGraph(const DecoderConfig& config, int max_seq, DType kv_dtype = F32);

// Deterministic random bf16 weights: the same (config, seed) gives the same bits
// on every machine. Linear weights are uniform with std 0.02, norms near 1, biases small. `transform` (if set) is
// applied to each weight as it is made (name, bf16 tensor -> the tensor kept), so a quantized model never holds
// every weight in bf16 at once.
// The same, each weight handed to `visit` as it is made (none kept); stops at the first error `visit` returns.
absl::Status VisitRandomDecoderWeights(const DecoderConfig& config, uint64_t seed,
                                       const std::function<HostTensor(const std::string&, HostTensor)>& transform,
                                       const std::function<absl::Status(const std::string&, HostTensor)>& visit);
WeightStore RandomDecoderWeights(const DecoderConfig& config, uint64_t seed,
                                 const std::function<HostTensor(const std::string&, HostTensor)>& transform = {});

}  // namespace loom::graph
