// A program for the megakernel as the host holds it (GpuProgram: per-SM queues, the tensor table, the shared
// memory layout), and what is done to it before a launch without the GPU: checked against what the kernel as built
// runs, laid out for the launch (PreparedProgram, GpuMachine::Prepare). No CUDA here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "instructions/instruction.h"
#include "instructions/kernel_variant.h"

namespace loom::runtime {

struct GpuProgram {
  std::vector<std::vector<isa::Instruction>> queues;  // one per SM
  std::vector<isa::TensorDesc> tensors;
  uint64_t arena_bytes = 0;
  uint32_t num_barriers = 0;
  uint32_t page_bytes = 16384;
  uint32_t num_pages = 11;
  uint32_t activation_bytes = 47104;  // the activation ring
  uint32_t activation_slots = 1;
  uint32_t matvec_pages_in_flight = 0;  // 0: the whole ring
  // The kernel variant, for a test of what the device does with an opcode its variant lacks: the program is then
  // not checked against it. Unset: the one the program needs (isa::KernelVariantOf), every instruction checked.
  std::optional<isa::KernelVariant> kernel_variant;
};

// A program for GpuMachine::RunOnce checked against the device and laid out for a launch on the host (Prepare): no
// CUDA call, so any thread may prepare one while the machine runs (runtime::Session::LowerAhead's does: at 2048 rows
// of Llama-3.2-1B the checks and the layout are milliseconds of a first prompt's TTFT).
struct PreparedProgram {
  std::shared_ptr<const GpuProgram> source;   // its tensors, and its queues for the watchdog's diagnosis
  std::vector<isa::Instruction> instructions;  // every queue's, concatenated
  std::vector<uint32_t> queue_begin;
  uint64_t arena_bytes = 0;
  uint32_t smem = 0, num_tensors = 0, num_barriers = 1, page_bytes = 0, num_pages = 0, activation_bytes = 0,
           activation_slots = 1, matvec_pages_in_flight = 0;
  isa::KernelVariant variant = isa::kDecodeKernel;
};

// Why a program cannot run on the megakernel as built (k not a multiple of 256, ...), or OK.
absl::Status CheckProgramForDevice(const GpuProgram& program);
// The arena ranges (offset, bytes; merged, ascending) of the tensors the program's instructions store step-tagged
// (kFlagTagOut): a decode program's; a run-once program has none.
std::vector<std::pair<uint64_t, uint64_t>> TaggedRanges(const GpuProgram& program);
// The program's queues end to end; `begin` gets each queue's first index, then their total.
std::vector<isa::Instruction> Flatten(const GpuProgram& program, std::vector<uint32_t>* begin);
// The kernel variant a program runs in (the largest its pages and instructions need), every instruction checked to
// run in it as written (isa::VariantRuns), or the variant a test forces.
absl::StatusOr<isa::KernelVariant> ProgramVariant(const GpuProgram& program);
// A kernel variant's name for messages ("decode", "tensor-core", ...).
const char* VariantName(isa::KernelVariant variant);

}  // namespace loom::runtime
