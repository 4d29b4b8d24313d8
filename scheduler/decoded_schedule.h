// A Schedule turned back into 128-byte instructions (what the VM and the GPU
// runtime execute), with the structural checks that decoding needs: known
// opcodes, the right number of argument words, at most kMaxWaits waits, barrier
// ids inside the table and counts within each barrier's signals per step.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "instructions/instruction.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

struct DecodedSchedule {
  std::vector<std::vector<isa::Instruction>> queues;  // per SM, one decode step
  std::vector<std::vector<double>> cost_ns;           // per SM, per instruction
  std::vector<uint32_t> signals_per_step;             // per barrier
};

// The proto form of one instruction (waits carry counts; strides come from the barrier table).
Instruction EncodeInstruction(const isa::Instruction& inst);
// The same into an existing (empty) message: no copy of a temporary.
void EncodeInstructionInto(const isa::Instruction& inst, Instruction* proto);
absl::StatusOr<isa::Instruction> DecodeInstruction(const Instruction& proto, const Schedule& schedule);
absl::StatusOr<DecodedSchedule> DecodeSchedule(const Schedule& schedule);

}  // namespace loom::scheduler
