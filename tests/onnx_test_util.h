// Helpers of the ONNX importer's tests (onnx_import_test.cc, onnx_ops_test.cc): inputs, the oracle's outputs, and
// a model's outputs lowered and run on each backend there is.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "graph/evaluator.h"
#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"
#include "runtime/gpu_backend.h"
#include "runtime/graph_runner.h"
#include "scheduler/compiler.h"

namespace loom::onnx_test {

inline std::vector<float> Ramp(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * scale) + offset;
  return v;
}
inline std::vector<float> Evaluate(const graph::OnnxModel& m, const graph::HostTensor& x, size_t output) {
  graph::Evaluator ev(m.graph, m.weights);
  EXPECT_TRUE(ev.Run({{m.inputs[0], x}}).ok());
  const graph::HostTensor& y = ev.Get(m.outputs[output]);
  std::vector<float> out(y.size());
  for (int64_t i = 0; i < y.size(); ++i) out[i] = y.Get(i);
  return out;
}

// `m` compiled to a graph pass and run on `inputs` (in the model's input order) on the CPU VM, and on the GPU where
// there is one: each backend's first output (a failed step fails the test and ends the list).
inline std::vector<std::vector<float>> RunLowered(const graph::OnnxModel& m, const std::vector<graph::HostTensor>& inputs,
                                                  const std::string& file) {
  std::vector<std::vector<float>> outs;
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m.graph, file, scheduler::CompileOptions());
  EXPECT_TRUE(pass.ok()) << pass.status();
  if (!pass.ok()) return outs;
  std::string why;
  for (auto backend : {runtime::GraphRunner::Backend::kCpu, runtime::GraphRunner::Backend::kGpu}) {
    if (backend == runtime::GraphRunner::Backend::kGpu && !runtime::GpuAvailable(&why)) continue;
    absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner =
        runtime::GraphRunner::Create(*pass, m.weights, backend);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return outs;
    runtime::TensorMap feed;
    for (size_t k = 0; k < inputs.size() && k < m.inputs.size(); ++k) feed.emplace(m.inputs[k], inputs[k]);
    absl::StatusOr<runtime::TensorMap> got = (*runner)->Run(feed);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return outs;
    const graph::HostTensor& y = got->at(m.outputs[0]);
    std::vector<float> values(y.size());
    for (int64_t i = 0; i < y.size(); ++i) values[i] = y.Get(i);
    outs.push_back(std::move(values));
  }
  return outs;
}
inline std::vector<std::vector<float>> RunLowered(const graph::OnnxModel& m, const graph::HostTensor& x,
                                                  const std::string& file) {
  return RunLowered(m, std::vector<graph::HostTensor>{x}, file);
}

inline void IntsAttr(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

}  // namespace loom::onnx_test
