// Where a stuck launch's SMs are: the watchdog's message (GpuMachine::SetWatchdog), from what it read beside the
// launch: the barrier counters and each SM's retired mark (KernelParams::retired). Host code alone (tested without a
// GPU: stuck_report_test).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "instructions/instruction.h"

namespace loom::runtime {

// For each SM of `queues` that has not retired its whole queue for the steps [first_step, +steps): the instruction
// after those it retired (its retired mark, if tagged with `launch`, else none), named as stuck inside it when the
// counters meet its waits, else as waiting on the first wait they do not meet (barrier, value, target); the first
// few of each kind, then how many more. When no SM is stuck inside, a barrier the waiting SMs wait on whose
// signalling instructions have all retired is named too: a lost signal.
std::string StuckReport(const std::vector<uint32_t>& counters, const std::vector<uint64_t>& retired, uint32_t launch,
                        const std::vector<std::vector<isa::Instruction>>& queues, uint32_t first_step, uint32_t steps);

}  // namespace loom::runtime
