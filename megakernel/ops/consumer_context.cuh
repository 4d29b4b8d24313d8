// What an opcode's consumer code may use: its thread index among the
// consumers, the machine (tensor ids -> addresses), shared memory, and the page
// ring it consumes in order. Reusable code never reads threadIdx itself.
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/device_debug.h"
#include "megakernel/kernel_params.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/pipeline_state.cuh"
#include "megakernel/step_tags.cuh"

namespace loom::megakernel {

// Tracing: an instruction's two marks (TraceEvent's pages_begin, pages_end), in the words after the split count.
__device__ __forceinline__ uint64_t* TraceMarks(float* scratch) {
  return reinterpret_cast<uint64_t*>(scratch + kSplitCountAfterScratch) + 1;
}

// ConsumerContext::flags' bit beside the instruction's isa::kFlag* bits (8 bits): this launch is traced.
inline constexpr uint32_t kContextTracing = 1u << 8;

struct ConsumerContext {
  uint32_t tid;   // 0 .. kConsumerThreads-1
  uint32_t warp;  // tid / 32
  uint32_t lane;  // tid % 32
  isa::MachineView machine;
  float* act;      // this instruction's activation slot
  uint32_t act_flags;   // kActivation* bits: what the activation loader put in the slot
  uint32_t act_length;  // ATTN_PARTIAL, MATVEC's RoPE epilogue: this step's position + 1 (activation loader)
  uint32_t flags;       // the instruction's isa::kFlag* bits (step tags), and kContextTracing
  uint64_t* act_waited; // kActivationEarly: completes once the waits are met
  uint32_t act_phase;
  uint64_t* ready;      // tracing: where the time the waits were met goes (a tagged input's consumers stamp it)
  float* scratch;  // kScratchFloats floats for reductions
  uint8_t* pages;
  uint64_t* full;
  uint64_t* empty;
  PipelineState ring;  // this thread's ring position; every consumer advances its own copy in lockstep
  uint32_t page_bytes;
  // Where we are, for debug records.
  DeviceError* error;
  uint32_t sm;
  uint32_t index;
  uint32_t step;
  uint32_t launch_step;   // the step's index in this launch (EMBED and ARGMAX_REDUCE fold the step boundary)
  uint32_t launch_steps;  // steps this launch runs

  // Tracing (kContextTracing in flags, decode variants): stamps mark `k` of this instruction's trace event
  // (TraceEvent: 0 its pages begin, 1 they are done), in shared memory beside the split count. Tested on the flags
  // word rather than a pointer: a pointer live across the page loop spilled 16 bytes in the decode variant.
  __device__ __forceinline__ void Mark(uint32_t k) const {
    if ((flags & kContextTracing) && tid == 0) TraceMarks(scratch)[k] = GlobalTimer();
  }

  // Waits until the next page of the ring is full; returns it.
  __device__ __forceinline__ const uint8_t* AcquirePage() const { return WaitPage(ring); }
  // Waits until the page at `at` (at or after the oldest held one) is full; returns it. Opcodes that hold
  // several pages at once (GEMM) walk their own position ahead of `ring`.
  __device__ __forceinline__ const uint8_t* WaitPage(const PipelineState& at) const {
    MbarrierWait(&full[at.index], at.phase, {error, sm, index, 0, at.index, kStuckPageWait});
    return pages + static_cast<size_t>(at.index) * page_bytes;
  }
  // This thread is done with the current page: every consumer thread arrives
  // itself (release), so each read is ordered before the bulk copy that refills
  // the page without relying on a warp-level hand-off; the ring moves on.
  __device__ __forceinline__ void ReleasePage() {
    MbarrierArrive(&empty[ring.index]);
    ++ring;
  }
};

}  // namespace loom::megakernel
