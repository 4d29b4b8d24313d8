// graph::Graph: a verified GraphDef with name lookups and a topological order.
// Everything downstream (evaluator, lowering) takes a Graph, never a raw GraphDef,
// so it may assume every name resolves and every op's shapes agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.pb.h"

namespace loom::graph {

int64_t NumElements(const TensorDef& tensor);
std::string ShapeString(const TensorDef& tensor);

// Checks a GraphDef: names, kinds, single definition of each activation, no
// cycles, and every op's shapes and dtypes. Errors name the op and tensor.
// On success fills `topological_order` (op indices) when it is non-null.
absl::Status VerifyGraph(const GraphDef& def, std::vector<int>* topological_order = nullptr);

class Graph {
 public:
  // Verifies `def` and indexes it.
  static absl::StatusOr<Graph> Create(GraphDef def);
  // Reads a .pb or .pbtxt file and verifies it; errors name the file.
  static absl::StatusOr<Graph> Load(const std::string& path);
  absl::Status Save(const std::string& path) const;

  const GraphDef& def() const { return def_; }
  const TensorDef& tensor(const std::string& name) const;
  bool HasTensor(const std::string& name) const { return tensor_index_.contains(name); }
  // The op that defines `name`, or nullptr for inputs, weights and state.
  const OpDef* producer(const std::string& name) const;
  // Ops that read `name`, in topological order.
  std::vector<const OpDef*> consumers(const std::string& name) const;
  // Op indices of def().ops() in an order where producers come first.
  const std::vector<int>& topological_order() const { return topological_order_; }
  std::vector<const TensorDef*> TensorsOfKind(TensorKind kind) const;

 private:
  GraphDef def_;
  absl::flat_hash_map<std::string, int> tensor_index_;
  absl::flat_hash_map<std::string, int> producer_index_;
  absl::flat_hash_map<std::string, std::vector<int>> consumer_index_;  // op indices, in topological order
  std::vector<int> topological_order_;
};

}  // namespace loom::graph
