// ATTN_PARTIAL's loader hooks (ops/loader_context.cuh): the decode loader's hold behind a split's rows, and its
// activation plan (the split's K / V rows in the slot, whole or in chunks). Its consumer code: ops/attention.cuh.
#pragma once

#include <cstdint>

#include "megakernel/ops/attention.cuh"
#include "megakernel/ops/loader_context.cuh"

namespace loom::megakernel {

// ATTN_PARTIAL's loader hook (no pages). Decode: no page of the instructions after an attention split goes out
// before the split's K / V rows are in its slot. Issued sooner, they share the SM's bandwidth with the rows, and the
// split (the chain) ends later: -2% ms/token at context 1024, -0.4% at 128 (docs/history/performance_log.md).
// Counted, not an mbarrier's phase: an SM's consecutive splits need no pages between them, so its consumers may be
// two splits on before this thread looks.
template <>
inline constexpr bool kHasPageHook<isa::AttnPartialArgs> = true;
template <uint32_t kVariant>
__device__ __forceinline__ void LoadPages(const isa::AttnPartialArgs&, const isa::Instruction& inst,
                                          LoaderContext& l) {
  l.InstructionRead();
  if constexpr (isa::IsDecodeVariant(kVariant)) {
    ++l.splits;
    const StuckWhere where = l.Where(inst.opcode, l.splits, kStuckSplitRows);
    for (uint64_t spins = 0; atomicOr(l.s.split_rows, 0u) < l.splits;) {
      if (kDeviceDebug && ++spins > kDebugSpinLimit) where.Report(atomicOr(l.s.split_rows, 0u));
    }
  }
}

// ATTN_PARTIAL's activation hook: room for the split's K and V rows too when they fit (the consumers load them),
// else for chunks of them (kChunks: the decode variant's form; the others read them from the caches, their
// consumers' registers spent elsewhere); an empty split (no positions this step) is flagged.
template <>
inline constexpr bool kHasActivationHook<isa::AttnPartialArgs> = true;
__device__ __forceinline__ bool ActivationReadsPosition(const isa::AttnPartialArgs&) { return true; }
__device__ __forceinline__ uint32_t ActivationMaxSeq(const isa::AttnPartialArgs& a) { return a.max_seq; }
template <bool kChunks>
__device__ __forceinline__ void PlanActivation(const isa::AttnPartialArgs& a, const KernelParams& p, uint32_t step,
                                               StepLength& length, ActivationPlan& plan) {
  plan.length = length.Get(p.machine, a.step_state, step);
  uint32_t begin, end;
  isa::SplitRange(plan.length, a.split, a.num_splits, a.min_positions, &begin, &end);
  const uint32_t group = a.num_heads / a.num_kv_heads;
  const uint32_t kv_bytes = isa::KvBytes(p.machine, a.k_cache);
  const isa::AttnPartialSlot kv = isa::AttnPartialLayout(group, a.head_dim, end - begin, true, kv_bytes);
  const uint32_t chunk =
      kChunks ? min(isa::AttnChunkPositions(group, a.head_dim, p.activation_bytes, kv_bytes), end - begin) : 0;
  if (end == begin) {
    plan.flags = kActivationEmpty;
  } else if (kv.bytes <= p.activation_bytes) {
    plan.bytes = static_cast<uint32_t>(kv.bytes);
    plan.flags = kActivationKv;
  } else if (chunk > 0) {
    plan.bytes = static_cast<uint32_t>(isa::AttnChunkLayout(group, a.head_dim, chunk, kv_bytes).bytes);
    plan.flags = kActivationChunked | chunk << kActivationChunkShift;
  }
}

}  // namespace loom::megakernel
