// A one-instruction program whose wait can never be met (the verifier would reject it; these tests bypass it): an
// ADD on SM 1, after an empty SM 0, waiting for one signal a step on barrier 0, which nothing sends. The debug build's
// bounded waits and the release build's watchdog must each report it as "SM 1 queue index 0 opcode ADD barrier 0
// value 0 target 1" instead of hanging.
#pragma once

#include "instructions/instruction.h"
#include "runtime/gpu_machine.h"

namespace loom::megakernel {

using runtime::GpuMachine;  // (runtime/)
using runtime::GpuProgram;

inline GpuProgram StuckProgram() {
  GpuProgram p;
  p.tensors = {{0, 1024, isa::kArenaRegion, 2 /* F32 */}};
  p.arena_bytes = 1024;
  p.num_barriers = 2;
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(isa::Opcode::ADD);
  inst.as<isa::AddArgs>() = {0, 0, 0, 0, 16};
  inst.signal = 1;
  inst.num_waits = 1;
  inst.waits[0] = {0, 1u | (1u << 16)};
  p.queues = {{}, {inst}};
  return p;
}
inline constexpr const char* kStuckWhere = "SM 1 queue index 0 opcode ADD barrier 0 value 0 target 1";

}  // namespace loom::megakernel
