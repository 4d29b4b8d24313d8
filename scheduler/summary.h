// What a schedule is, as `loom inspect` prints it and the Python API's Schedule.summary() returns it:
// instructions per opcode, per-SM load, the simulator's predicted step time; optionally every instruction.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// `name` heads the text (the file the schedule came from, or the model).
absl::StatusOr<std::string> ScheduleSummary(const Schedule& schedule, const std::string& name,
                                            bool instructions = false);

}  // namespace loom::scheduler
