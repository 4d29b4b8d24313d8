// What the host hands the persistent kernel (by value, __grid_constant__), and
// the thread layout both sides agree on.
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/device_debug.h"

namespace loom::megakernel {

// Thread layout of a block: two consumer warpgroups, then one producer
// warpgroup: the weight loader, the storer, the controller and the activation
// loader, one warp each (lane 0 does the work).
inline constexpr uint32_t kConsumerWarps = 8;
inline constexpr uint32_t kConsumerThreads = kConsumerWarps * 32;
inline constexpr uint32_t kLoaderWarp = kConsumerWarps;
inline constexpr uint32_t kStorerWarp = kConsumerWarps + 1;
inline constexpr uint32_t kControllerWarp = kConsumerWarps + 2;
inline constexpr uint32_t kActivationWarp = kConsumerWarps + 3;
// Instructions the consumers may finish before the storer has signalled them.
inline constexpr uint32_t kSignalSlots = 4;
// The SMEM instruction ring the controller fills: how far ahead of the
// consumers the weight loader can read instructions.
inline constexpr uint32_t kInstructionSlots = 16;
// Roles that release an instruction slot: the weight loader and the activation
// loader (lane 0 each), the storer, and every consumer thread (each read it).
inline constexpr uint32_t kInstructionReleases = 3 + 256;
// Activation slots: byte ranges of the SM's activation ring, one per
// instruction in flight between the activation loader and the consumers;
// 1..kMaxActivationSlots of them, from the schedule.
inline constexpr uint32_t kMaxActivationSlots = 4;
// Activation slot flags (activation loader -> consumers).
inline constexpr uint32_t kActivationKv = 1;  // ATTN_PARTIAL: the split's K and V rows are in the slot
// ATTN_PARTIAL: the slot was handed over before the waits (kActivationKv too): the consumers copy the rows of earlier
// steps, then wait on the slot's `act_waited` for the rest.
inline constexpr uint32_t kActivationEarly = 2;
// ATTN_PARTIAL: the split's rows do not fit the slot; they come through it in chunks of (flags >> 8) positions
// (isa::AttnChunkLayout).
inline constexpr uint32_t kActivationChunked = 4;
// ATTN_PARTIAL: the split is empty this step (a short context fills fewer splits: isa::ActiveSplits). In the decode
// variant the activation loader counts it for the weight loader's hold when it plans it (its consumers do not) and
// polls none of its waits; the other variants only see no rows.
inline constexpr uint32_t kActivationEmpty = 8;
inline constexpr uint32_t kActivationChunkShift = 8;
inline constexpr uint32_t kBlockThreads = kConsumerThreads + 128;
static_assert(kConsumerThreads % 128 == 0, "consumers must be whole warpgroups");

// Named barrier ids (0 is __syncthreads).
inline constexpr uint32_t kConsumerBarrier = 1;
// kWarpgroupBarrier + g: consumer warpgroup g's 128 threads alone.
inline constexpr uint32_t kWarpgroupBarrier = 2;

// Matvec: one 16-byte vector (8 bf16) per lane, so a warp covers a 256-column segment.
inline constexpr uint32_t kSegmentElems = 256;
// Per-lane reduction granularity when k is a multiple of it: one partial per 1024 columns.
inline constexpr uint32_t kWideSlotElems = 1024;
// Query heads per KV head that ATTN_PARTIAL keeps accumulators for.
inline constexpr uint32_t kMaxGroupHeads = isa::kAttnMaxGroupHeads;
static_assert(isa::kAttnThreads == kConsumerThreads, "ATTN_PARTIAL's layout assumes every consumer thread");
// Shared memory the kernel keeps beside the activation buffer and the pages.
inline constexpr uint32_t kMaxPages = 32;
inline constexpr uint32_t kScratchFloats = 64;
static_assert(kInstructionReleases == 3 + kConsumerThreads);

// One instruction, in %globaltimer nanoseconds: when the consumers reached it,
// when its global waits were met (never before start), when it was done
// (after its signal), when the consumers held its activation slot.
struct TraceEvent {
  uint64_t start;
  uint64_t ready;
  uint64_t end;
  uint64_t handed;  // past the slot's act_full mbarrier (0: not recorded); the consumers then load what they read
  uint64_t pages_begin;  // a streaming opcode (MATVEC*) done with its prologue, about to take its first page (0: none)
  uint64_t pages_end;    // ... done with its last page, about to start its epilogue (0: none)
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
  uint32_t activation_bytes;  // the activation ring, a multiple of 16
  uint32_t activation_slots;
  uint32_t matvec_pages_in_flight;  // 1..num_pages (the loader's cap on MATVEC pages issued but not yet landed)
  // Diagnostic (loom_bench): the loader marks pages full without copying, so
  // matvecs compute on stale pages. Shows what compute and the dependency
  // chain cost with weight loading taken away. Results are garbage.
  uint32_t skip_weight_loads;
  // The isa::KernelVariant the program needs (its largest opcode's): the launcher runs the kernel compiled for it
  // (decode programs run the one without the tensor-core opcodes, which keeps their registers free of spills).
  uint32_t kernel_variant;
  TraceEvent* trace;  // [num_steps][total instructions], or null
  uint32_t* smids;    // with the trace: [block] the %smid each block ran on
  DeviceError* error; // mapped host memory, or null
  // [block]: launch << 32 | the instructions whose signal the block's storer has issued in that launch (the
  // watchdog's: where each SM is when a launch stops moving), or null. Tagged with the launch instead of zeroed
  // before it: a memset per launch would add its own time to every decode step.
  uint64_t* retired;
  uint32_t launch;
};

// Shared memory one block needs: mbarriers, the instruction ring, scratch,
// the activation slots and the page ring.
// Pages start at a multiple of the largest swizzle atom: wgmma reads swizzled GEMM slabs in place.
inline constexpr uint32_t kPageAlign = 1024;
// The decode loader's count of attention splits whose K / V rows landed (megakernel.cu's Loader), after the scratch
// floats: one word, and room to keep the activation ring after it 1024-byte aligned.
inline constexpr uint32_t kSplitCountBytes = 512;
// Where that count is, in floats from the scratch floats' start (Carve lays it out, CountSplitRows counts into it).
inline constexpr uint32_t kSplitCountAfterScratch = 2 * kScratchFloats;
// Where the activation ring starts (shared_layout.cuh's Carve lays out the same). A multiple of 128 at least: 16 bytes
// off that, decode measured 5-9% slower (docs/history/performance_log.md). 1024 here (it was at 512
// before the split count): at 128, ResNet-18 at batch 8 measured ~1% slower, at 1024 level.
inline constexpr uint32_t kActivationRingOffset =
    kInstructionSlots * isa::kInstructionBytes +
    (2 * kMaxPages + 2 * kSignalSlots + 2 * kInstructionSlots + 6 * kMaxActivationSlots) * 8 + kScratchFloats * 8 +
    kSplitCountBytes;
static_assert(kActivationRingOffset % 1024 == 0, "the activation ring starts 1024-byte aligned");
inline constexpr uint32_t SmemFixedBytes() { return kActivationRingOffset + kPageAlign; }
inline constexpr uint32_t SmemBytes(uint32_t page_bytes, uint32_t num_pages, uint32_t activation_bytes) {
  return SmemFixedBytes() + activation_bytes + page_bytes * num_pages;
}

using isa::MatvecSlotElems;
static_assert(kWideSlotElems == 1024 && kSegmentElems == 256, "isa::MatvecSlotElems assumes these widths");
static_assert(isa::kMatvecRowAlign == kSegmentElems, "matvec rows are padded to whole warp segments");
static_assert(isa::kMatvecPageSegmentBytes == kConsumerWarps * kSegmentElems * 2, "a page's segment a warp");

}  // namespace loom::megakernel
