#include "graph/decode_oracle.h"

#include "graph/evaluator.h"

namespace loom::graph {

absl::StatusOr<OracleDecode> DecodeWithOracle(const Model& model, const std::vector<int32_t>& prompt,
                                              int new_tokens) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt needs at least one token");
  Evaluator ev(model.graph, model.weights);
  OracleDecode out;
  out.tokens = prompt;
  const int steps = static_cast<int>(prompt.size()) - 1 + new_tokens;
  for (int pos = 0; pos < steps; ++pos) {
    absl::flat_hash_map<std::string, HostTensor> inputs = {{"token", HostTensor::FromI32({1}, {out.tokens[pos]})}};
    if (model.graph.HasTensor("pos")) inputs["pos"] = HostTensor::FromI32({1}, {pos});  // decoders with attention
    absl::Status s = ev.Run(inputs);
    if (!s.ok()) return s;
    out.logits.push_back(ev.Get("logits").f32);
    if (pos + 1 >= static_cast<int>(prompt.size())) out.tokens.push_back(ev.Get("next_token").i32[0]);
  }
  return out;
}

}  // namespace loom::graph
