// The activation loader (warp 11 of the megakernel): for each instruction in queue order it plans its activation
// slot, polls the waits not observed in the data, takes the slot from the activation ring and hands it to the
// consumers (docs/architecture.md).
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/global_barrier.cuh"
#include "megakernel/kernel_params.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/shared_layout.cuh"
#include "megakernel/ops/loader_context.cuh"
#include "megakernel/ops/ops.cuh"  // the activation hooks

namespace loom::megakernel {

// The opcodes' activation hooks (ops/loader_context.cuh), dispatched from the opcode table in table order over the
// opcodes that have one; every other instruction gets the slot of isa::ActivationBytes and reads no position.
// (Templates on the arguments, so an opcode without a hook instantiates none of its calls.)
template <typename Args>
__device__ __forceinline__ bool HookReadsPosition(const isa::Instruction& inst) {
  if constexpr (kHasActivationHook<Args>) return ActivationReadsPosition(inst.as<Args>());
  return false;
}
template <typename Args>
__device__ __forceinline__ uint32_t HookMaxSeq(const isa::Instruction& inst) {
  if constexpr (kHasActivationHook<Args>) return ActivationMaxSeq(inst.as<Args>());
  return 0;
}
template <bool kChunks, typename Args>
__device__ __forceinline__ void HookPlan(const isa::Instruction& inst, const KernelParams& p, uint32_t step,
                                         StepLength& length, ActivationPlan& plan) {
  if constexpr (kHasActivationHook<Args>) PlanActivation<kChunks>(inst.as<Args>(), p, step, length, plan);
}
// Only the opcodes kVariant compiles are tested (the others' tests compile away).
#define LOOM_IF_HOOKED(name, args, ...)                                                                      \
  if (kHasActivationHook<isa::args> &&                                                                      \
      isa::VariantCompiles(static_cast<isa::KernelVariant>(kVariant), isa::Opcode::name) &&                 \
      inst.op() == isa::Opcode::name)                                                                       \
    __VA_ARGS__;

template <uint32_t kVariant>
__device__ __forceinline__ bool ReadsPosition(const isa::Instruction& inst) {
#define LOOM_READS_POSITION(name, args) LOOM_IF_HOOKED(name, args, return HookReadsPosition<isa::args>(inst))
  LOOM_OPCODE_LIST(LOOM_READS_POSITION)
#undef LOOM_READS_POSITION
  return false;
}
// The KV-cache capacity of an instruction that reads the position (ReadsPosition).
template <uint32_t kVariant>
__device__ __forceinline__ uint32_t MaxSeqOf(const isa::Instruction& inst) {
#define LOOM_MAX_SEQ(name, args) LOOM_IF_HOOKED(name, args, return HookMaxSeq<isa::args>(inst))
  LOOM_OPCODE_LIST(LOOM_MAX_SEQ)
#undef LOOM_MAX_SEQ
  return 0;
}
// kChunks (the decode variants): ATTN_PARTIAL's rows that do not fit the slot may come through it in chunks (the
// others read them from the caches, their consumers' registers spent elsewhere).
template <uint32_t kVariant>
__device__ __forceinline__ ActivationPlan PlanActivations(const isa::Instruction& inst, const KernelParams& p,
                                                          uint32_t step, StepLength& length) {
  constexpr bool kChunks = isa::IsDecodeVariant(kVariant);
  ActivationPlan plan;
  plan.bytes = isa::ActivationBytes<kVariant>(inst);
#define LOOM_PLAN(name, args) LOOM_IF_HOOKED(name, args, HookPlan<kChunks, isa::args>(inst, p, step, length, plan))
  LOOM_OPCODE_LIST(LOOM_PLAN)
#undef LOOM_PLAN
  return plan;
}
#undef LOOM_IF_HOOKED

// The activation ring: instructions take byte ranges of it in queue order, up
// to activation_slots of them in flight between the activation loader and the
// consumers. Allocation q uses slot q % slots; the consumers' release of it is
// the (q / slots)-th completion of that slot's `empty` mbarrier. Kept by the
// activation loader's one thread.
struct ActivationRing {
  uint32_t begin[kMaxActivationSlots];
  uint32_t end[kMaxActivationSlots];
  uint32_t made = 0;      // allocations so far
  uint32_t released = 0;  // allocations known to be released (the oldest in flight)

  __device__ __forceinline__ void WaitOldest(const KernelParams& p, const SharedLayout& s, const StuckWhere& where) {
    const uint32_t q = released++;
    MbarrierWait(&s.act_empty[q % p.activation_slots], (q / p.activation_slots) & 1u, where);
  }
  __device__ __forceinline__ bool Overlaps(const KernelParams& p, uint32_t b, uint32_t e) const {
    for (uint32_t q = released; q < made; ++q) {
      const uint32_t slot = q % p.activation_slots;
      if (b < end[slot] && begin[slot] < e) return true;
    }
    return false;
  }
  // Takes `bytes` (a multiple of 16, at most the ring) once they are free; returns the slot.
  __device__ __forceinline__ uint32_t Allocate(const KernelParams& p, const SharedLayout& s, uint32_t bytes,
                                               StuckWhere where) {
    while (released + p.activation_slots <= made) WaitOldest(p, s, where);
    uint32_t start = 0;
    if (released < made) {
      start = end[(made - 1) % p.activation_slots];
      if (start + bytes > p.activation_bytes) start = 0;  // wrap: the tail is too short
    }
    while (bytes > 0 && Overlaps(p, start, start + bytes)) WaitOldest(p, s, where);
    const uint32_t slot = made++ % p.activation_slots;
    begin[slot] = start;
    end[slot] = start + bytes;
    return slot;
  }
};

// Decode: an empty split has no rows for the weight loader's hold to wait for. Counted when planned (before the
// waits, but in a launch's first step), the SM's next pages need not wait for this step's QKV tiles (docs/
// docs/history/performance_log.md); its consumers do not count it.
__device__ __forceinline__ void CountEmptySplit(const ActivationPlan& plan, const SharedLayout& s) {
  if (plan.flags & kActivationEmpty) atomicAdd(s.split_rows, 1u);
}

template <uint32_t kVariant>
__device__ void ActivationLoader(const KernelParams& p, const SharedLayout& s, uint32_t sm) {
  ActivationRing ring;
  StepLength length;
  for (QueueWalk w(p, sm); w.more(p); w.advance()) {
    MbarrierWait(&s.inst_full[w.slot.index], w.slot.phase, w.Where(p, sm, 0, w.slot.index, kStuckInstructionWait));
    const isa::Instruction& inst = s.inst[w.slot.index];
    const uint32_t step = p.first_step + w.local;
    // Planned before the waits where it can be (the plan is the slot's size, and for ATTN_PARTIAL and MATVEC's RoPE
    // this step's position once known): after them only the slot is taken and handed over (-1.1% ms/token).
    ActivationPlan plan;
    // A wait observed in the data is skipped below unless the plan must read the position after it: in a decode
    // program, only in the launch's first step (StepLength::Follow; the step's first RoPE tile on each SM).
    const bool early = !ReadsPosition<kVariant>(inst) ||
                       (isa::IsDecodeVariant(kVariant) ? length.Follow(step, MaxSeqOf<kVariant>(inst))
                                                       : length.step == step);
    if (early) plan = PlanActivations<kVariant>(inst, p, step, length);
    if (isa::IsDecodeVariant(kVariant) && early) CountEmptySplit(plan, s);
    // ATTN_PARTIAL with its rows (or chunks of them) in the slot, its position known: handed over before the waits,
    // so the consumers copy the rows earlier steps wrote (final: this SM's wait in the step before acquired them)
    // while the waits are polled (of a chunked split, its first chunk's); they copy q and this step's row after
    // `act_waited`.
    // (Only ATTN_PARTIAL's plan puts rows in the slot.)
    uint32_t slot = kMaxActivationSlots;
    if (isa::IsDecodeVariant(kVariant) && early && (plan.flags & (kActivationKv | kActivationChunked)) &&
        inst.num_waits > 0) {
      slot = ring.Allocate(p, s, plan.bytes, w.Where(p, sm, inst.opcode, ring.made % p.activation_slots,
                                                     kStuckActivationWait));
      s.act_offset[slot] = ring.begin[slot];
      s.act_info[slot] = (plan.flags | kActivationEarly) | static_cast<uint64_t>(plan.length) << 32;
      MbarrierArrive(&s.act_full[slot]);
    }
    for (uint32_t k = 0; k < inst.num_waits; ++k) {
      // A wait observed in the data is the consumers' (step tags: instructions/instruction.h), except where the
      // plan reads this step's position: that read must follow an acquire of what the previous step's
      // ARGMAX_REDUCE wrote, and the plain wait is one (on each SM, the first RoPE instruction of a launch's first
      // step; later steps follow the position from the step before: StepLength::Follow).
      // (Decode programs only: the other variants observe every wait on its barrier and ignore the tags.)
      if (isa::IsDecodeVariant(kVariant) && inst.waits[k].in_data() && early) continue;
      // An empty split reads nothing its waits order (its outputs and pairs are no longer read by the step before's
      // reduce: the SM's earlier instructions waited for that step to end).
      if (isa::IsDecodeVariant(kVariant) && early && (plan.flags & kActivationEmpty)) continue;
      // Spinning, no backoff: a poll is one thread's round trip, and detecting the barrier up to 256 ns late cost
      // 1.4% ms/token (docs/history/performance_log.md).
      WaitGlobal(p.counters, inst.waits[k], step, p.error, sm, w.i - w.begin, inst.opcode, /*backoff=*/false);
    }
    const uint64_t ready = p.trace != nullptr ? GlobalTimer() : 0;
    if (slot == kMaxActivationSlots) {
      // A plan that reads the position is made after the waits.
      if (!early) plan = PlanActivations<kVariant>(inst, p, step, length);
      if (isa::IsDecodeVariant(kVariant) && !early) CountEmptySplit(plan, s);
      slot = ring.Allocate(p, s, plan.bytes, w.Where(p, sm, inst.opcode, ring.made % p.activation_slots,
                                                     kStuckActivationWait));
      s.act_offset[slot] = ring.begin[slot];
      s.act_info[slot] = plan.flags | static_cast<uint64_t>(plan.length) << 32;
      s.act_ready[slot] = ready;
      MbarrierArrive(&s.act_full[slot]);  // (release: the consumers' loads of what the waits acquired come after)
    } else {
      s.act_ready[slot] = ready;
      MbarrierArrive(&s.act_waited[slot]);  // (release, as act_full's: the consumers' copies of this step's rows)
    }
    MbarrierArrive(&s.inst_empty[w.slot.index]);
  }
}

}  // namespace loom::megakernel
