// The oracle's decode loop: the graph evaluated op by op, one token per step,
// the prompt forced, then greedy (argmax) tokens. What every backend must match.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "graph/model.h"

namespace loom::graph {

struct OracleDecode {
  std::vector<int32_t> tokens;               // prompt followed by generated tokens
  std::vector<std::vector<float>> logits;    // per step
};

// Runs prompt.size() - 1 + new_tokens steps.
absl::StatusOr<OracleDecode> DecodeWithOracle(const Model& model, const std::vector<int32_t>& prompt, int new_tokens);

}  // namespace loom::graph
