// The op-by-op float32 evaluator: the oracle every later stage is checked against.
// It runs ops in topological order over HostTensors; STATE tensors (KV caches,
// conv states) persist between Run() calls and are updated in place.
#pragma once

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"

namespace loom::graph {

class Evaluator {
 public:
  // `weights` must outlive the evaluator and hold every WEIGHT tensor of `graph`.
  Evaluator(const Graph& graph, const WeightStore& weights);

  // Evaluates every op once. `inputs` must hold every INPUT tensor.
  absl::Status Run(const absl::flat_hash_map<std::string, HostTensor>& inputs);

  // Any input, state or activation tensor after the last Run().
  const HostTensor& Get(const std::string& name) const { return values_.at(name); }
  HostTensor& MutableState(const std::string& name) { return values_.at(name); }

 private:
  absl::Status RunOp(const OpDef& op);
  const HostTensor& In(const OpDef& op, int i) const;

  const Graph& graph_;
  const WeightStore& weights_;
  absl::flat_hash_map<std::string, HostTensor> values_;
};

}  // namespace loom::graph
