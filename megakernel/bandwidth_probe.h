// The memory-bandwidth floor, measured: how fast the GPU reads a buffer with a
// plain vectorised read kernel (no page ring, no interpreter).
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"

namespace loom::megakernel {

// Median GB/s (1e9 bytes/s) of `repeats` timed full reads of `bytes` at `data` (device memory).
absl::StatusOr<double> MeasureReadBandwidth(const void* data, size_t bytes, int repeats);

}  // namespace loom::megakernel
