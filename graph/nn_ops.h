// The tensor ops general graphs bring (ONNX import): their shape rules and
// their float32 reference, in one place. CONV2D (groups, dilation, asymmetric
// pads), RELU, SIGMOID, GELU, ADD and MUL with numpy broadcasting, MATMUL
// (numpy matmul), SOFTMAX, TRANSPOSE, RESHAPE, CONCAT, and NHWC pools.
// The verifier checks a graph's declared shapes against InferNnShape; the
// oracle (Evaluator) runs EvalNnOp; the ONNX importer declares outputs with it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.pb.h"
#include "graph/host_tensor.h"

namespace loom::graph {

using Shape = std::vector<int64_t>;

bool IsNnOp(OpType type);
// The element-wise ops of one input (RELU, SIGMOID, GELU, ERF, TANH, EXP, SQRT) and of two with numpy broadcasting
// (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM): the one list the shape rules and the layout pass read.
bool IsUnaryElementwise(OpType type);
bool IsBinaryElementwise(OpType type);

// The output shape of `op` (an IsNnOp type) on inputs of these shapes, or why the op cannot take them (the
// message says what, without the op's name: the caller adds where). RESHAPE keeps `declared`, checking that it
// holds as many elements.
absl::StatusOr<Shape> InferNnShape(const OpDef& op, const std::vector<Shape>& inputs, const Shape& declared = {});

// Evaluates `op` (an IsNnOp type) in float32; `out` is allocated with its shape. Inputs may be bf16 or f32.
absl::Status EvalNnOp(const OpDef& op, const std::vector<const HostTensor*>& inputs, HostTensor* out);

// numpy broadcasting of two shapes, or an error naming both.
absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);

}  // namespace loom::graph
