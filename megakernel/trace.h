// Per-instruction GPU timings -> a Chrome trace JSON (opens in Perfetto or
// chrome://tracing: one track per SM) and a printed summary: time per opcode,
// idle gaps per SM, achieved weight bandwidth.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "megakernel/gpu_machine.h"

namespace loom::megakernel {

struct TraceInput {
  const GpuProgram* program;
  const std::vector<uint32_t>* queue_begin;
  const std::vector<TraceEvent>* events;  // [steps][instruction]
  uint32_t steps = 0;
  uint64_t weight_bytes_per_step = 0;
};

absl::Status WriteChromeTrace(const std::string& path, const TraceInput& in);
std::string TraceSummary(const TraceInput& in);

}  // namespace loom::megakernel
