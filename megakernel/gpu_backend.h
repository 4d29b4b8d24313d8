// The GPU backend as the host sees it: upload a schedule and its packed
// weights, run decode steps inside the persistent megakernel, read back tokens.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "scheduler/schedule.pb.h"

namespace loom::megakernel {

struct GpuRunOptions {
  std::string trace_path;    // Chrome trace JSON of every instruction (empty: no trace)
  int steps_per_launch = 0;  // 0: every step in one launch
};

struct GpuRunResult {
  std::vector<int32_t> tokens;  // prompt + generated
  std::vector<float> logits;    // of the last step
  double ms_per_token = 0;
  std::string summary;          // trace summary, when tracing
};

// True when a CUDA device is present; `why` says why not otherwise.
bool GpuAvailable(std::string* why);

absl::StatusOr<GpuRunResult> RunOnGpu(const scheduler::Schedule& schedule, const graph::WeightStore& weights,
                                      const std::vector<int32_t>& prompt, int steps, const GpuRunOptions& options);

}  // namespace loom::megakernel
