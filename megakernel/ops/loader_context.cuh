// What an opcode's page hook may use (the weight loader's side of an opcode, beside its consumer code): the ring of
// pages it fills in order, the instruction's waits, and the MATVEC throttle's state. Each opcode that streams pages
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

// Whether an opcode's arguments have a page hook (LoadPages): true beside each hook. The loader tests only these
// opcodes, in table order, and lets every other instruction's slot go at once.
template <typename Args>
inline constexpr bool kHasPageHook = false;

}  // namespace loom::megakernel
