// Lowering: a decode graph (batch 1) -> the tile instructions of one step.
//
// Fusion rules (each an option, see FusionOptions):
//   RMSNorm -> every LINEAR reading it           : matvec prologue
//   LINEAR q,k,v -> ROPE q,k -> ATTENTION       : one packed QKV matvec, RoPE + KV append epilogue
//   LINEAR -> ADD (residual)                     : matvec epilogue
//   LINEAR gate, up -> SILU_MUL                  : one interleaved matvec, SiLU-mul epilogue
//   LINEAR (LM head) -> ARGMAX                   : matvec epilogue emits argmax partials
// Unfused ops lower to RMS_NORM, MATVEC, ROPE_KV_APPEND, ADD, SILU_MUL and
// ARGMAX_PARTIAL instructions. Ops with no decode lowering yet (LayerNorm,
// convolutions, prefill attention, LINEAR with bias) are refused by name.
#pragma once

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/program.h"

namespace loom::scheduler {

// `options` must be resolved (ResolveOptions) and valid.
absl::StatusOr<Program> LowerDecodeGraph(const graph::Graph& graph, const CompileOptions& options);

}  // namespace loom::scheduler
