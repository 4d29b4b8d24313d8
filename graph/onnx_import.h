// The ONNX front-end: an ONNX model file (the schema is Debian's libonnx-dev
// onnx.proto, compiled into Loom) mapped onto Loom's graph IR, initializers as
// weights. Float32 tensors with static shapes; the default-domain ops of
// opsets 7-18 that Loom covers (OnnxSupportedOps). Anything else is refused
// with one line naming the node, its op type and the attribute or tensor.
//
// ONNX's spatial ops are NCHW; Loom's CONV2D and pools are NHWC, so each is
// wrapped in TRANSPOSEs (the lowering can cancel adjacent pairs); Conv weights
// are permuted to [OC, KH, KW, C/groups] at import, and a BatchNormalization
// that alone consumes a Conv is folded into its weights and bias. Then the
// transposes are sunk through activations and residual adds and cancelled in
// pairs (graph/layout_pass.h), so a network stays NHWC after its input's one.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"

namespace loom::graph {

struct OnnxModel {
  Graph graph;
  WeightStore weights;
  std::vector<std::string> inputs;   // the graph's inputs, in the ONNX graph's order (initializers excluded)
  std::vector<std::string> outputs;  // the IR tensor of each ONNX graph output, in order
  int64_t opset = 0;                 // of the default domain
};

absl::StatusOr<OnnxModel> ImportOnnx(const std::string& path);
// The same from the bytes of a ModelProto; `name` stands for the file in messages. `cancel_transposes` false
// keeps every NCHW <-> NHWC pair (tests compare the two).
absl::StatusOr<OnnxModel> ImportOnnxBytes(const std::string& bytes, const std::string& name,
                                          bool cancel_transposes = true);

// A serialized onnx.TensorProto file (the backend test data's input_N.pb / output_N.pb): float32 (bools as 0 / 1
// floats), or integers as i32.
absl::StatusOr<HostTensor> ReadOnnxTensor(const std::string& path);

// The op types the importer maps, sorted.
std::vector<std::string> OnnxSupportedOps();

}  // namespace loom::graph
