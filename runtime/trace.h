// Per-instruction GPU timings -> a Chrome trace JSON (opens in Perfetto or
// chrome://tracing: one track per SM) and a printed summary: time per opcode,
// idle gaps per SM, achieved weight bandwidth.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/gpu_machine.h"
#include "scheduler/schedule.pb.h"

namespace loom::runtime {

struct TraceInput {
  const GpuProgram* program;
  const std::vector<uint32_t>* queue_begin;
  const std::vector<TraceEvent>* events;  // [steps][instruction]
  uint32_t steps = 0;
  uint64_t weight_bytes_per_step = 0;
  // [sm][index]: the lowered op of each instruction ("layers.3.qkv"), written into the trace so a tool can pick
  // one layer (OpNames of the schedule); optional.
  const std::vector<std::vector<std::string>>* op_names = nullptr;
};

// The op name of every instruction of `schedule`, by SM and queue index.
std::vector<std::vector<std::string>> OpNames(const scheduler::Schedule& schedule);

absl::Status WriteChromeTrace(const std::string& path, const TraceInput& in);
// Time per opcode, gaps, bandwidth; with op names, StageSummary's table too.
std::string TraceSummary(const TraceInput& in);
// Per stage of a layer (op names without their "layers.N." prefix, every layer summed): instructions, SM time
// computing after the waits were met and waiting for them, per step, and the stage's span per layer; then the
// mean span of a layer. Needs in.op_names.
std::string StageSummary(const TraceInput& in);

}  // namespace loom::runtime
