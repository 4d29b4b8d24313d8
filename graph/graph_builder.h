// GraphBuilder: the C++ way to write a graph. Each op method declares its output
// tensor (shape inferred from the inputs) and returns the output's name; Build()
// verifies the result, so mistakes surface there with the op's name.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace loom::graph {

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name);

  std::string Input(const std::string& name, std::vector<int64_t> shape, DType dtype);
  std::string Weight(const std::string& name, std::vector<int64_t> shape, DType dtype = BF16);
  std::string State(const std::string& name, std::vector<int64_t> shape, DType dtype = F32);

  std::string Embedding(const std::string& out, const std::string& table, const std::string& ids);
  // group_size 0: the whole row; g: each run of g elements (per-head norm, weight [g]).
  std::string RmsNorm(const std::string& out, const std::string& x, const std::string& weight, float eps,
                      int group_size = 0);
  std::string LayerNorm(const std::string& out, const std::string& x, const std::string& weight,
                        const std::string& bias, float eps);
  std::string Linear(const std::string& out, const std::string& x, const std::string& weight,
                     const std::string& bias = "");
  std::string Rope(const std::string& out, const std::string& x, const std::string& pos, const RopeAttrs& attrs);
  std::string Attention(const std::string& out, const std::string& q, const std::string& k, const std::string& v,
                        const std::string& k_cache, const std::string& v_cache, const std::string& pos,
                        const AttentionAttrs& attrs);
  std::string SiluMul(const std::string& out, const std::string& gate, const std::string& up);
  std::string Add(const std::string& out, const std::string& a, const std::string& b);
  std::string Conv1d(const std::string& out, const std::string& x, const std::string& weight,
                     const std::string& state, const std::string& bias = "");
  std::string Conv2d(const std::string& out, const std::string& x, const std::string& weight,
                     const std::string& bias, const Conv2dAttrs& attrs);
  std::string Argmax(const std::string& out, const std::string& x);

  void MarkOutput(const std::string& name);
  absl::StatusOr<Graph> Build() &&;

 private:
  std::string Declare(const std::string& name, std::vector<int64_t> shape, DType dtype, TensorKind kind);
  OpDef* AddOp(const std::string& out, OpType type, std::vector<std::string> inputs);
  std::vector<int64_t> ShapeOf(const std::string& name) const;

  GraphDef def_;
  absl::flat_hash_map<std::string, int> index_;
};

}  // namespace loom::graph
