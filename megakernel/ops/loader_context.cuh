// What an opcode's loader hooks may use (the loaders' side of an opcode, beside its consumer code). The page hook
// (the weight loader's): the ring of pages it fills in order, the instruction's waits, and the MATVEC throttle's
// state. The activation hook (the activation loader's): the plan of its activation slot. Each opcode that streams pages
// defines `LoadPages<kVariant>(const Args&, const isa::Instruction&, LoaderContext&)` in its family's ops/ header
// and sets kHasPageHook<Args>; the loader calls the hook of an instruction's opcode (expanded from the opcode table).
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/device_debug.h"
#include "megakernel/global_barrier.cuh"
#include "megakernel/kernel_params.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/pipeline_state.cuh"
#include "megakernel/shared_layout.cuh"

namespace loom::megakernel {

struct LoaderContext {
  const KernelParams& p;
  const SharedLayout& s;
  uint32_t sm;
  const QueueWalk& w;
  PipelineState ring;  // the next page to fill
  // MATVEC pages in flight: `landed` trails `ring` by `in_flight` pages, at most `max_in_flight` (pages of the
  // other opcodes are not held back, nor counted).
  PipelineState landed;
  uint32_t in_flight;
  uint32_t max_in_flight;
  uint32_t splits;  // decode: the ATTN_PARTIALs walked

  __device__ __forceinline__ StuckWhere Where(uint32_t opcode, uint32_t index, uint32_t kind) const {
    return w.Where(p, sm, opcode, index, kind);
  }
  // The hook has read what it needs of the instruction (into registers): its slot may be refilled.
  __device__ __forceinline__ void InstructionRead() const { MbarrierArrive(&s.inst_empty[w.slot.index]); }
  // Pages that are activations (a GEMM's A, attention's K / V) are read only once the instruction's waits are met:
  // the loader runs ahead over weights only; everything before this instruction is issued.
  __device__ __forceinline__ void WaitData(const isa::Instruction& inst) const {
    for (uint32_t k = 0; k < inst.num_waits; ++k) {
      WaitGlobal(p.counters, inst.waits[k], p.first_step + w.local, p.error, sm, w.i - w.begin, inst.opcode);
    }
    FenceProxyAsyncGlobal();
  }
  // Waits until the ring's next page is free; returns it (its `full` barrier: Full()).
  __device__ __forceinline__ uint8_t* EmptyPage(uint32_t opcode) const {
    MbarrierWait(&s.empty[ring.index], ring.phase ^ 1u, Where(opcode, ring.index, kStuckPageWait));
    return s.pages + static_cast<size_t>(ring.index) * p.page_bytes;
  }
  __device__ __forceinline__ uint64_t* Full() const { return &s.full[ring.index]; }
  // Pages other than MATVEC's went out: the throttle starts over.
  __device__ __forceinline__ void Unthrottle() {
    landed = ring;
    in_flight = 0;
  }
};

// The activation slot an instruction gets once its waits are met (see each opcode's layout in ops/). The consumers
// fill it themselves (cp.async through L2: one round trip, where a bulk copy here, after the proxy fence it needs,
// took ~0.8 us longer from the waits to the slot; docs/history/performance_log.md).
struct ActivationPlan {
  uint32_t bytes = 0;   // slot size, a multiple of 16
  uint32_t flags = 0;   // kActivation*: ATTN_PARTIAL's K and V rows (all / in chunks) in the slot, or none (empty)
  uint32_t length = 0;  // ATTN_PARTIAL, MATVEC's RoPE epilogue: this step's position + 1 (the context length)
};

// This step's position + 1, read from the step state once per step (by the step's first instruction that needs it,
// after its waits: they order it after the previous step's ARGMAX_REDUCE advanced it) and kept: the position is
// the same for every instruction of a step, and each read was a round trip on the chain (attention's hand-off).
// Decode programs read it only in a launch's first step: in each later one it is the step before's + 1, as
// ARGMAX_REDUCE advances it by one (at the KV cache's end not at all: `max_seq` clamps it the same way).
struct StepLength {
  uint32_t step = ~0u;
  uint32_t length = 0;
  __device__ __forceinline__ uint32_t Get(const isa::MachineView& m, uint32_t state, uint32_t this_step) {
    if (this_step != step) {
      length = static_cast<uint32_t>(__ldcg(m.ptr<int32_t>(state) + isa::kStatePosition)) + 1;
      step = this_step;
    }
    return length;
  }
  // Whether this step's length follows from the step before's, known on this SM; if so it is kept.
  __device__ __forceinline__ bool Follow(uint32_t this_step, uint32_t max_seq) {
    if (step == ~0u || step + 1 != this_step) return step == this_step;
    length = min(length + 1, max_seq);
    step = this_step;
    return true;
  }
};

// Whether an opcode's arguments have an activation hook: `ActivationReadsPosition(const Args&)` (whether its plan
// reads this step's position), `ActivationMaxSeq(const Args&)` (the KV capacity that clamps it) and
// `PlanActivation<kChunks>(const Args&, p, step, length, plan)` beside its device code, true there. The others get
// the slot of isa::ActivationBytes (ActivationLoader).
template <typename Args>
inline constexpr bool kHasActivationHook = false;

// Whether an opcode's arguments have a page hook (LoadPages): true beside each hook. The loader tests only these
// opcodes, in table order, and lets every other instruction's slot go at once.
template <typename Args>
inline constexpr bool kHasPageHook = false;

}  // namespace loom::megakernel
