// NumPy .npy files of float32 tensors (the inputs and outputs of `loom run` on a general graph): version 1.0 / 2.0
// headers, little-endian '<f4', C order. Anything else is refused naming the file and what it holds.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"

namespace loom::graph {

absl::StatusOr<HostTensor> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const HostTensor& tensor);  // f32

}  // namespace loom::graph
