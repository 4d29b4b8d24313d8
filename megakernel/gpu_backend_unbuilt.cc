// Placeholder until the megakernel lands: says so, clearly.
#include "megakernel/gpu_backend.h"

namespace loom::megakernel {

bool GpuAvailable(std::string* why) {
  *why = "this build has no GPU backend yet";
  return false;
}

absl::StatusOr<GpuRunResult> RunOnGpu(const scheduler::Schedule&, const graph::WeightStore&,
                                      const std::vector<int32_t>&, int, const GpuRunOptions&) {
  return absl::UnimplementedError("--backend=gpu: this build has no GPU backend yet");
}

}  // namespace loom::megakernel
