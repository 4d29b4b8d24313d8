// A block's shared memory as the megakernel carves it (SharedLayout, Carve: the mbarriers, instruction ring, scratch,
// split count, activation ring and page ring), and the walk every warp role makes over its SM's queue (QueueWalk).
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/device_debug.h"
#include "megakernel/kernel_params.h"
#include "megakernel/pipeline_state.cuh"

namespace loom::megakernel {

struct SharedLayout {
  uint64_t* full;        // [kMaxPages] page loaded
  uint64_t* empty;       // [kMaxPages] page consumed
  uint64_t* done;        // [kSignalSlots] consumers -> storer: an instruction's stores are issued
  uint64_t* freed;       // [kSignalSlots] storer -> consumers: its signal is out, the slot is free
  uint64_t* inst_full;   // [kInstructionSlots] instruction copied in
  uint64_t* inst_empty;  // [kInstructionSlots] every role is done with it
  uint64_t* act_full;    // [kMaxActivationSlots] the slot planned (and the waits met, unless handed over early)
  uint64_t* act_empty;   // [kMaxActivationSlots] consumers done with the slot
  uint64_t* act_waited;  // [kMaxActivationSlots] the waits met (after act_full, for a slot handed over early)
  uint64_t* act_ready;   // [kMaxActivationSlots] %globaltimer when the waits were met (tracing)
  uint64_t* act_offset;  // [kMaxActivationSlots] where the slot's bytes start in the ring
  uint64_t* act_info;    // [kMaxActivationSlots] flags | context length << 32 (ActivationPlan)
  isa::Instruction* inst;  // [kInstructionSlots]
  float* scratch;
  uint32_t* split_rows;  // decode: the attention splits whose K / V rows landed, counted by consumer thread 0
  uint8_t* act;          // the activation ring: activation_bytes
  uint8_t* pages;
};

__device__ __forceinline__ SharedLayout Carve(uint8_t* smem, const KernelParams& p) {
  SharedLayout s;
  // The instruction ring first: bulk-copy destinations want 16-byte alignment.
  s.inst = reinterpret_cast<isa::Instruction*>(smem);
  s.full = reinterpret_cast<uint64_t*>(s.inst + kInstructionSlots);
  s.empty = s.full + kMaxPages;
  s.done = s.empty + kMaxPages;
  s.freed = s.done + kSignalSlots;
  s.inst_full = s.freed + kSignalSlots;
  s.inst_empty = s.inst_full + kInstructionSlots;
  s.act_full = s.inst_empty + kInstructionSlots;
  s.act_empty = s.act_full + kMaxActivationSlots;
  s.act_waited = s.act_empty + kMaxActivationSlots;
  s.act_ready = s.act_waited + kMaxActivationSlots;
  s.act_offset = s.act_ready + kMaxActivationSlots;
  s.act_info = s.act_offset + kMaxActivationSlots;
  s.scratch = reinterpret_cast<float*>(s.act_info + kMaxActivationSlots);
  s.split_rows = reinterpret_cast<uint32_t*>(s.scratch + kSplitCountAfterScratch);
  s.act = reinterpret_cast<uint8_t*>(s.split_rows) + kSplitCountBytes;  // smem + kActivationRingOffset
  const uintptr_t pages = reinterpret_cast<uintptr_t>(s.act + p.activation_bytes);
  s.pages = reinterpret_cast<uint8_t*>((pages + kPageAlign - 1) & ~uintptr_t{kPageAlign - 1});
  return s;
}

// Walks this SM's instructions in the ring, step after step, as every role does.
struct QueueWalk {
  uint32_t begin, end;  // this SM's queue in p.instructions
  uint32_t local = 0;   // step, relative to the launch
  uint32_t i;           // absolute instruction index
  PipelineState slot{0, 0, kInstructionSlots};

  __device__ __forceinline__ QueueWalk(const KernelParams& p, uint32_t sm)
      : begin(p.queue_begin[sm]), end(p.queue_begin[sm + 1]), i(p.queue_begin[sm]) {}
  __device__ __forceinline__ bool more(const KernelParams& p) const { return local < p.num_steps && begin < end; }
  __device__ __forceinline__ void advance() {
    ++slot;
    if (++i == end) {
      i = begin;
      ++local;
    }
  }
  __device__ __forceinline__ StuckWhere Where(const KernelParams& p, uint32_t sm, uint32_t opcode, uint32_t index,
                                              uint32_t kind) const {
    return {p.error, sm, i - begin, opcode, index, kind};
  }
};

}  // namespace loom::megakernel
