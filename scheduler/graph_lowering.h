// General graphs (an ONNX import: convolutions, matmuls, pools, element-wise
// ops; no decoder) as ONE run-once pass of tile instructions, the way a prompt
// becomes one prefill pass. Per op:
//
//   CONV2D (groups 1)            IM2COL (patches -> bf16 operand image) + GEMM against the weight [OC, KH*KW*C]
//   LINEAR, MATMUL (constant B)  PACK_ROWS + GEMM (B packed transposed: W = Bᵀ)
//     ... each GEMM's epilogue adds the bias, and takes over a following ADD of a ready tensor of its shape
//     (the residual) and a following RELU, when it is their only reader
//   RELU, SIGMOID, GELU, ERF, TANH, EXP, ADD, SUB, MUL, DIV (broadcasting), TRANSPOSE
//                                ELEMENTWISE over up to 4 strided dimensions
//   MAX_POOL, AVG_POOL, GLOBAL_AVG_POOL   POOL
//   SOFTMAX                      SOFTMAX (any axis)
//   CONCAT                       ELEMENTWISE copies, each into its slice of the output (a view, strided)
//   RESHAPE                      a view of its input (no instruction)
//
// Every other op (and grouped convolutions, a MATMUL of two activations) is refused by name. Each graph tensor
// gets its own f32 arena tensor; the graph's inputs and outputs are named in Schedule.graph. A stage (barrier)
// per op: an instruction waits for the stages that produce what it reads.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/program.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// A decoder (token embedding, attention over a KV cache) compiles to decode steps; anything else to a graph pass.
bool IsDecoderGraph(const graph::Graph& graph);

// `options` must be resolved (ResolveOptions); num_sms and the cost model are read. Verifies the pass.
absl::StatusOr<Schedule> CompileGraphPass(const graph::Graph& graph, const std::string& model,
                                          const CompileOptions& options);

// The one-pass prefill of a decoder without attention (token embedding, norms, linears, causal CONV1D blocks,
// gated / residual element-wise ops, the argmax), lowered as a graph pass over the prompt's rows that continues
// from the decode schedule's state: CONV1D reads and updates the decode's conv states, ARGMAX writes the next token
// as a decode step's end does, the last row's logits land where decode writes them. Decoders with attention take
// scheduler/prefill.h's lowering (this is what it dispatches to otherwise).
absl::Status GeneralPrefillSupported(const graph::Graph& graph);
// Compile time: adds the pass's weights (GEMM operand images, f32 copies) to the decode program.
absl::Status AddGeneralPrefillWeights(const graph::Graph& graph, const CompileOptions& options, Program* program);
absl::StatusOr<Schedule> LowerGeneralPrefill(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                                               bool verify);

}  // namespace loom::scheduler
