// The cost model: how long one instruction takes on one SM, from its footprint.
//   weight part  = weight bytes / sm_gbps                (streamed through the page ring)
//   compute part = overhead + max(other bytes / sm_gbps, flops / sm_gflops)
// The simulator overlaps a next instruction's weight part with the current one.
#pragma once

#include "instructions/instruction.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

struct InstructionCost {
  double weight_ns = 0;
  double compute_ns = 0;
  double total_ns() const { return weight_ns > compute_ns ? weight_ns : compute_ns; }
};

InstructionCost CostOf(const isa::Instruction& inst, const CostModel& model);

}  // namespace loom::scheduler
