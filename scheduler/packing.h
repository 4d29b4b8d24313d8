// Executes a schedule's packing plan: builds the WEIGHTS region, every packed
// weight laid out as the contiguous byte image its instructions load, plus the
// compile-time constants. Used by the CPU VM and the GPU runtime alike.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// Errors name the packed tensor and the source weight that does not fit the plan.
absl::StatusOr<std::vector<uint8_t>> PackWeights(const Schedule& schedule, const graph::WeightStore& weights);

}  // namespace loom::scheduler
