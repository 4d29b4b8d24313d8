// The simulator: predicted time of a schedule from the cost model, per SM
// busy / waiting / tail time, so schedules can be compared without a GPU.
// Model: an SM runs its queue in order; an instruction starts when its SM is
// free and its waits are met (+ barrier latency); its weights may stream in
// while the previous instruction runs (the page ring's look-ahead).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

struct SmTimes {
  double busy_ns = 0;  // running instructions
  double wait_ns = 0;  // idle between instructions, blocked on barriers
  double tail_ns = 0;  // idle after its last instruction until the step ends
};

struct SimulationResult {
  double first_step_ns = 0;   // one step from a cold start
  double steady_step_ns = 0;  // a step in a long run (step 2 end - step 1 end)
  std::vector<SmTimes> sms;   // over the steady step
  double weight_bytes_per_step = 0;
  double predicted_gbps() const { return steady_step_ns > 0 ? weight_bytes_per_step / steady_step_ns : 0; }
};

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule);

}  // namespace loom::scheduler
