// ScheduleVerifier: everything that must hold before a schedule may run.
//  - structure: queues per SM, known opcodes, waits within bounds (DecodeSchedule);
//  - barriers: declared signals per step match the instructions, every barrier
//    fires, every wait can be met;
//  - tensors: inside their region, no two arena tensors overlap, every
//    instruction's tensors exist with the right dtype and are large enough;
//  - shared memory: the page ring and activation buffer fit an SM, and every
//    instruction's activations fit the buffer;
//  - progress: the in-order queues, replayed for two steps, cannot deadlock
//    (proved by running them on counters);
//  - step order: every instruction of a step depends on the step's first
//    instruction and the step's last instruction depends on it.
#pragma once

#include "absl/status/status.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

absl::Status VerifySchedule(const Schedule& schedule);

}  // namespace loom::scheduler
