// Transpose cancellation: the ONNX importer wraps every NHWC spatial op of an
// NCHW graph in a pair of TRANSPOSEs; this pass sinks a TRANSPOSE below the
// ops that do not care about layout (the unary elementwise ones; ADD, SUB, MUL
// and DIV when both operands carry the same transpose or one is a weight;
// CONCAT when every input carries it), merges twin transposes of one tensor and
// cancels inverse pairs, so a chain of convolutions, activations, pools,
// residual adds and channel concats stays NHWC from the input's one transpose
// to the end. A TRANSPOSE that only moves size-1 dimensions becomes a RESHAPE.
// The result computes exactly what the input did.
#pragma once

#include "absl/status/statusor.h"
#include "graph/graph.pb.h"
#include "graph/host_tensor.h"

namespace loom::graph {

// Rewrites `def` (graph outputs keep their names and shapes); returns how many TRANSPOSE ops were removed. With
// `weights`, a transpose also sinks past an ADD / SUB / MUL / DIV with a weight operand (a bias or a scale), which
// gets a permuted f32 copy; weights nothing reads any more are dropped from both.
absl::StatusOr<int> CancelTransposes(GraphDef* def, WeightStore* weights = nullptr);

}  // namespace loom::graph
