// What a stuck kernel leaves behind in debug builds (LOOM_DEVICE_DEBUG): the
// first bounded wait that ran out records where it was and traps; the record
// lives in mapped host memory so the host can print it after the trap.
#pragma once

#include <cstdint>

namespace loom::megakernel {

#ifdef LOOM_DEVICE_DEBUG
inline constexpr bool kDeviceDebug = true;
#else
inline constexpr bool kDeviceDebug = false;
#endif
// Polls of one wait before a debug build declares it stuck (~seconds with backoff).
inline constexpr uint64_t kDebugSpinLimit = 20'000'000;

enum DeviceErrorKind : uint32_t {
  kNoError = 0,
  kStuckGlobalWait = 1,       // barrier = global barrier id
  kStuckPageWait = 2,         // barrier = page index
  kStuckInstructionWait = 3,  // barrier = instruction slot
  kStuckActivationWait = 4,   // barrier = activation slot
  kStuckSignalWait = 5,       // barrier = consumer -> storer signal slot
  kStuckTaggedRead = 6,       // barrier = tensor id; value = the bits read; target = the step's parity
  kStuckSplitRows = 7,        // the decode loader: barrier = attention splits walked; value = those whose rows landed
  // In every build: an instruction whose opcode the running kernel variant does not compile (isa::VariantCompiles),
  // or no opcode of the table; value = the variant. Recorded, not trapped: the launch ends and the host fails it.
  kOpcodeNotCompiled = 8,
  // In every build: the storer found its instruction slot holding another instruction (barrier = the slot's signal,
  // value = the instruction's): the slot was refilled before every role let it go. Recorded, not trapped.
  kInstructionSlotRefilled = 9,
};

struct DeviceError {
  uint32_t kind;
  uint32_t sm;
  uint32_t queue_index;
  uint32_t opcode;
  uint32_t barrier;  // global barrier id, or page index for page waits
  uint32_t value;
  uint32_t target;
  uint32_t step;
};

#if defined(__CUDACC__)
__device__ __forceinline__ void ReportStuck(DeviceError* error, uint32_t sm, uint32_t index, uint32_t opcode,
                                            uint32_t barrier, uint32_t value, uint32_t target,
                                            uint32_t kind = kStuckGlobalWait) {
  if (error != nullptr && atomicCAS(&error->kind, kNoError, kind) == kNoError) {
    error->sm = sm;
    error->queue_index = index;
    error->opcode = opcode;
    error->barrier = barrier;
    error->value = value;
    error->target = target;
    __threadfence_system();
  }
  __trap();
}

// The first instruction of a launch whose opcode this variant does not compile (kOpcodeNotCompiled).
__device__ __forceinline__ void ReportNotCompiled(DeviceError* error, uint32_t sm, uint32_t index, uint32_t opcode,
                                                  uint32_t variant) {
  if (error != nullptr && atomicCAS(&error->kind, kNoError, kOpcodeNotCompiled) == kNoError) {
    error->sm = sm;
    error->queue_index = index;
    error->opcode = opcode;
    error->value = variant;
    __threadfence_system();
  }
}

// The first instruction of a launch whose slot was refilled under the storer (kInstructionSlotRefilled).
__device__ __forceinline__ void ReportSlotRefilled(DeviceError* error, uint32_t sm, uint32_t index,
                                                   uint32_t slot_signal, uint32_t signal) {
  if (error != nullptr && atomicCAS(&error->kind, kNoError, kInstructionSlotRefilled) == kNoError) {
    error->sm = sm;
    error->queue_index = index;
    error->barrier = slot_signal;
    error->value = signal;
    __threadfence_system();
  }
}

// Where a shared-memory (mbarrier) wait is, for the record a stuck debug build leaves.
struct StuckWhere {
  DeviceError* error;
  uint32_t sm;
  uint32_t index;   // queue index of the instruction the waiter is on
  uint32_t opcode;
  uint32_t slot;    // page, instruction slot, activation slot or signal slot
  uint32_t kind;    // DeviceErrorKind
  __device__ __forceinline__ void Report(uint32_t parity) const {
    ReportStuck(error, sm, index, opcode, slot, parity, 0, kind);
  }
};
#endif

}  // namespace loom::megakernel
