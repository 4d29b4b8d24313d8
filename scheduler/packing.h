// Executes a schedule's packing plan: builds the WEIGHTS region, every packed
// weight laid out as the contiguous byte image its instructions load, plus the
// compile-time constants. Used by the CPU VM and the GPU runtime alike.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// Errors name the packed tensor and the source weight that does not fit the plan.
absl::StatusOr<std::vector<uint8_t>> PackWeights(const Schedule& schedule, const graph::WeightStore& weights);

// A window of the packed WEIGHTS region: `bytes` bytes at `offset`.
using WeightWindowSink = std::function<absl::Status(uint64_t offset, const uint8_t* data, uint64_t bytes)>;
// The region packed a window at a time, in offset order: each window of consecutive tensors as large as
// `window_bytes` allows (at least one tensor; the last runs to the region's end, bytes no tensor holds zero) is
// handed to `sink`, so the host holds two windows instead of the region (a Llama-3.1-70B's int4 weights pack to
// 40 GB, beside the 37 GB they are read as): the sink takes window k on a thread of its own while window k + 1
// packs (its calls in order, one at a time; its first error is returned). `whole`: the buffer to pack into
// (PackWeights: one window, the region).
absl::Status PackWeightsInWindows(const Schedule& schedule, const graph::WeightStore& weights, uint64_t window_bytes,
                                  const WeightWindowSink& sink, std::vector<uint8_t>* whole = nullptr);

}  // namespace loom::scheduler
