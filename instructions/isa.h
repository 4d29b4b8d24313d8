// Host-side view of the instruction set: opcode names, argument names, the
// per-opcode validation against a tensor table, the resource footprint the
// verifier and cost model use, and the float32 CPU reference of every opcode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.pb.h"
#include "instructions/instruction.h"

namespace loom::isa {

const char* OpcodeName(Opcode op);
absl::StatusOr<Opcode> OpcodeFromName(const std::string& name);
// Number of argument words and their names (from the Args struct's kFields).
int ArgCount(Opcode op);
const char* const* ArgNames(Opcode op);
// The argument words that hold a float (bit i: word i; kFloatWords of the opcode's Args).
uint32_t FloatWords(Opcode op);

// What validation knows of a tensor.
struct TensorInfo {
  std::string name;
  graph::DType dtype = graph::DTYPE_UNSPECIFIED;
  uint64_t elements = 0;
};

// Checks that every tensor the instruction names exists, has the right dtype
// and is large enough for every element the instruction may touch.
absl::Status ValidateInstruction(const Instruction& inst, const std::vector<TensorInfo>& tensors);

// Checks what the device's page ring imposes on the instruction beyond ValidateInstruction: a MATVEC's slots within
// one consumer warp's share of a page (MatvecSlotsFitPages). The schedule verifier and the GPU runtime run it.
absl::Status CheckPageBytes(const Instruction& inst, uint32_t page_bytes);

// What one instruction costs: weight bytes streamed through the page ring,
// other global bytes, shared memory it needs for activations, and flops.
struct Footprint {
  uint64_t weight_bytes = 0;
  uint64_t activation_bytes = 0;  // global reads + writes other than weights
  uint64_t smem_bytes = 0;        // activation buffer it needs on an SM
  uint64_t flops = 0;
};
// `context` is the context length assumed for attention (it is only known at run time).
Footprint InstructionFootprint(const Instruction& inst, uint32_t context);

// Executes one instruction with its float32 reference implementation.
void ExecuteReference(const Instruction& inst, const MachineView& machine);

}  // namespace loom::isa
