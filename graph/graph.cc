#include "graph/graph.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/proto_file.h"

namespace loom::graph {

int64_t NumElements(const TensorDef& tensor) {
  int64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d;
  return n;
}

std::string ShapeString(const TensorDef& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ","), "]");
}

absl::StatusOr<Graph> Graph::Create(GraphDef def) {
  Graph graph;
  if (absl::Status s = VerifyGraph(def, &graph.topological_order_); !s.ok()) return s;
  graph.def_ = std::move(def);
  for (int i = 0; i < graph.def_.tensors_size(); ++i) graph.tensor_index_[graph.def_.tensors(i).name()] = i;
  for (int i = 0; i < graph.def_.ops_size(); ++i) {
    for (const std::string& out : graph.def_.ops(i).outputs()) graph.producer_index_[out] = i;
  }
  for (int index : graph.topological_order_) {
    const OpDef& op = graph.def_.ops(index);
    for (int k = 0; k < op.inputs_size(); ++k) {
      std::vector<int>& readers = graph.consumer_index_[op.inputs(k)];
      if (readers.empty() || readers.back() != index) readers.push_back(index);  // an op reading it twice: once
    }
  }
  return graph;
}

absl::StatusOr<Graph> Graph::Load(const std::string& path) {
  GraphDef def;
  if (absl::Status s = ReadProtoFile(path, &def); !s.ok()) return s;
  absl::StatusOr<Graph> graph = Create(std::move(def));
  if (!graph.ok()) {
    return absl::Status(graph.status().code(), absl::StrCat(path, ": ", graph.status().message()));
  }
  return graph;
}

absl::Status Graph::Save(const std::string& path) const { return WriteProtoFile(path, def_); }

const TensorDef& Graph::tensor(const std::string& name) const {
  return def_.tensors(tensor_index_.at(name));
}

const OpDef* Graph::producer(const std::string& name) const {
  auto it = producer_index_.find(name);
  return it == producer_index_.end() ? nullptr : &def_.ops(it->second);
}

std::vector<const OpDef*> Graph::consumers(const std::string& name) const {
  std::vector<const OpDef*> result;
  if (auto it = consumer_index_.find(name); it != consumer_index_.end()) {
    for (int index : it->second) result.push_back(&def_.ops(index));
  }
  return result;
}

std::vector<const TensorDef*> Graph::TensorsOfKind(TensorKind kind) const {
  std::vector<const TensorDef*> result;
  for (const TensorDef& t : def_.tensors()) {
    if (t.kind() == kind) result.push_back(&t);
  }
  return result;
}

}  // namespace loom::graph
