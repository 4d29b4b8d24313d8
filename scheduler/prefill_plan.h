// The prefill lowering's view of a decode graph: the decoder pattern matched op by op (embedding; per layer
// RMSNorm -> q/k/v (+ per-head norms) -> RoPE -> attention -> o + residual -> RMSNorm -> gate/up -> SiLU-mul ->
// down + residual; final norm -> LM head -> argmax), by graph names. Internal to scheduler/prefill.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace loom::scheduler::prefill_internal {

struct Linear {
  std::string weight, bias;  // graph weight names (bias may be empty)
  uint32_t n = 0, k = 0;
};

// One decoder layer of the graph, by graph names.
struct Layer {
  std::string norm1;
  float eps1 = 0;
  Linear q, k, v, o, gate, up, down;
  std::string k_cache, v_cache;
  graph::RopeAttrs rope;
  uint32_t heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0;
  std::string norm2;
  float eps2 = 0;
  std::string q_norm, k_norm;  // per-head RMSNorm weights [head_dim] (Qwen3), or empty
  float qk_eps = 0;
};

struct Plan {
  std::string table;
  uint32_t hidden = 0, vocab = 0;
  std::vector<Layer> layers;
  std::string final_norm;
  float final_eps = 0;
  std::string lm_head;
};

// The plan, or why the graph has no prefill lowering (one line naming the op and the reason).
absl::StatusOr<Plan> ParsePlan(const graph::Graph& g);

}  // namespace loom::scheduler::prefill_internal
