#include "scheduler/cost_model.h"

#include <algorithm>

#include "instructions/isa.h"

namespace loom::scheduler {

InstructionCost CostOf(const isa::Instruction& inst, const CostModel& model) {
  const isa::Footprint f = isa::InstructionFootprint(inst, model.context_length());
  InstructionCost c;
  c.weight_ns = static_cast<double>(f.weight_bytes) / model.sm_gbps();  // GB/s == bytes/ns
  const bool tensor_cores = isa::UsesTensorCores(inst.op());
  c.compute_ns = model.instruction_overhead_ns() +
                 std::max(static_cast<double>(f.activation_bytes) / model.sm_gbps(),
                          static_cast<double>(f.flops) / (tensor_cores ? model.sm_tensor_gflops() : model.sm_gflops()));
  return c;
}

}  // namespace loom::scheduler
