// The compiler: decode graph + options -> a verified Schedule.
//   lower (lowering.h) -> cost each instruction (cost_model.h) -> assign to SMs
//   (assign.h) -> assemble the Schedule -> VerifySchedule.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "scheduler/program.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// A general graph's pass models each instruction's fixed cost at this (CostModel.instruction_overhead_ns unset).
inline constexpr double kGraphInstructionOverheadNs = 1500;
inline constexpr uint32_t kScheduleFormatVersion = 9;  // 2: padded matvec rows, biases, rope tables, head norms;
                                                       // 3: EMBED rows, GEMM split-K / head norms, prefill passes;
                                                       // 4: ATTN_PARTIAL with the fused reduce (out, arrivals);
                                                       // 5: GEMM's K range packed in `slabs`, `wide` tiles;
                                                       // 6: CONV_GEMM's `slabs`, `out_bf16`, `flags`; POOL's `out_bf16`
                                                       // 7: packing's `column_group` (padded conv weights), NHWC_BF16
                                                       // 8: ARGMAX_REDUCE's folded EMBED, EMBED's `folded`
                                                       // 9: split-K parts stored (kGemmPartialF32), SUM_SPLITS

// `model` names what was compiled (recorded in the schedule). Options are resolved here.
absl::StatusOr<Schedule> Compile(const graph::Graph& graph, const std::string& model, const CompileOptions& options);

// Costs a lowered program, assigns it to SMs and assembles the Schedule (queues, barriers, tensors, packing,
// constants, io, sizes). Consumes the program; the caller verifies.
Schedule AssembleSchedule(Program& program, const CompileOptions& options, const std::string& model);
// The same into `out` (empty; it may live on a protobuf Arena, where a pass's tens of thousands of instruction
// messages cost no heap allocation each).
void AssembleScheduleInto(Program& program, const CompileOptions& options, const std::string& model, Schedule* out);

// Reads a .pb / .pbtxt schedule and verifies it; errors name the file.
absl::StatusOr<Schedule> LoadSchedule(const std::string& path);

}  // namespace loom::scheduler
