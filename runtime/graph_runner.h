// GraphRunner: a general graph's pass (scheduler::CompileGraphPass) resident on the CPU reference VM or the GPU.
// Each Run writes the inputs into their arena tensors by name, runs the pass once and reads every output back.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "scheduler/schedule.pb.h"

namespace loom::runtime {

class GpuMachine;
struct GpuProgram;
class ReferenceVm;

using TensorMap = absl::flat_hash_map<std::string, graph::HostTensor>;

// The relative RMS error ||loom - float32 reference|| / ||reference|| a graph's outputs are held to (loom run
// --check, the tests): the GEMM operands are bf16 (8 bits of mantissa), so each GEMM adds ~2^-9 of relative
// rounding, and a ResNet-18's 20 layers compound it.
inline constexpr double kGraphTolerance = 3e-2;

class GraphRunner {
 public:
  enum class Backend { kCpu, kGpu };
  // Packs `weights` for `pass` and uploads them (GPU: fails with the reason when no usable GPU exists).
  static absl::StatusOr<std::unique_ptr<GraphRunner>> Create(const scheduler::Schedule& pass,
                                                             const graph::WeightStore& weights, Backend backend);
  ~GraphRunner();

  // Runs the pass once. `inputs` holds every input of the graph (f32, its shape); returns every output. With
  // `trace` (GPU only), every instruction's timing is kept for TraceReport.
  absl::StatusOr<TensorMap> Run(const TensorMap& inputs, bool trace = false);
  // After a traced run: the time per opcode and per stage (the graph's ops), and the Chrome trace JSON written
  // to `chrome_path` unless it is empty.
  absl::StatusOr<std::string> TraceReport(const std::string& chrome_path) const;
  // GPU: the kernel time of the last Run in ms (CUDA events); CPU: its wall time.
  float last_ms() const { return last_ms_; }

 private:
  GraphRunner() = default;
  absl::Status WriteInputs(const TensorMap& inputs);

  scheduler::Schedule pass_;
  std::unique_ptr<GpuProgram> program_;
  std::unique_ptr<GpuMachine> gpu_;
  std::unique_ptr<ReferenceVm> vm_;
  float last_ms_ = 0;
};

}  // namespace loom::runtime
