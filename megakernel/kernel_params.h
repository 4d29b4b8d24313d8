// What the host hands the persistent kernel (by value, __grid_constant__), and
// the thread layout both sides agree on.
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/device_debug.h"

namespace loom::megakernel {

// Thread layout of a block: two consumer warpgroups, then one producer
// warpgroup whose first warp is the loader and second the storer.
inline constexpr uint32_t kConsumerWarps = 8;
inline constexpr uint32_t kConsumerThreads = kConsumerWarps * 32;
inline constexpr uint32_t kLoaderWarp = kConsumerWarps;
inline constexpr uint32_t kStorerWarp = kConsumerWarps + 1;
// Instructions the consumers may finish before the storer has signalled them.
inline constexpr uint32_t kSignalSlots = 4;
inline constexpr uint32_t kBlockThreads = kConsumerThreads + 128;
static_assert(kConsumerThreads % 128 == 0, "consumers must be whole warpgroups");

// Named barrier ids (0 is __syncthreads).
inline constexpr uint32_t kConsumerBarrier = 1;

// Matvec: one 16-byte vector (8 bf16) per lane, so a warp covers a 256-column segment.
inline constexpr uint32_t kSegmentElems = 256;
// Per-lane reduction granularity when k is a multiple of it: one partial per 1024 columns.
inline constexpr uint32_t kWideSlotElems = 1024;
// Query heads per KV head that ATTN_PARTIAL keeps accumulators for.
inline constexpr uint32_t kMaxGroupHeads = 8;
static_assert(isa::kAttnThreads == kConsumerThreads, "ATTN_PARTIAL's layout assumes every consumer thread");
// Shared memory the kernel keeps beside the activation buffer and the pages.
inline constexpr uint32_t kMaxPages = 32;
inline constexpr uint32_t kScratchFloats = 64;

// One instruction, in %globaltimer nanoseconds: when the consumers reached it,
// when its global waits were met, when it was done (after its signal).
struct TraceEvent {
  uint64_t start;
  uint64_t ready;
  uint64_t end;
};

struct KernelParams {
  const isa::Instruction* instructions;  // every SM's queue, concatenated
  const uint32_t* queue_begin;           // [num_sms + 1]: where each SM's queue starts
  isa::MachineView machine;
  uint32_t* counters;  // one per barrier, never reset
  uint32_t first_step;
  uint32_t num_steps;
  uint32_t page_bytes;
  uint32_t num_pages;
  uint32_t activation_bytes;
  uint32_t l2_prefetch_bytes;  // per SM, beyond the page ring; 0: off
  TraceEvent* trace;  // [num_steps][total instructions], or null
  DeviceError* error; // mapped host memory, or null
};

// Shared memory one block needs for a page ring and activation buffer.
inline constexpr uint32_t SmemBytes(uint32_t page_bytes, uint32_t num_pages, uint32_t activation_bytes) {
  return 2 * kMaxPages * 8 + 2 * kSignalSlots * 8 + kScratchFloats * 8 + activation_bytes + 128 /* page alignment */ +
         page_bytes * num_pages;
}

using isa::MatvecSlotElems;
static_assert(kWideSlotElems == 1024 && kSegmentElems == 256, "isa::MatvecSlotElems assumes these widths");

}  // namespace loom::megakernel
