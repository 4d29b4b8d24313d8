// MATVEC's, MATVEC_FP8's and MATVEC_W4's loader hooks (ops/loader_context.cuh): their pages for the weight loader,
// their activation plan (the RoPE epilogue's position) for the activation loader. Their consumer code:
// ops/matvec.cuh, ops/matvec_fp8.cuh, ops/matvec_w4.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include "megakernel/ops/loader_context.cuh"
#include "megakernel/ops/matvec.cuh"
#include "megakernel/ops/matvec_fp8.cuh"
#include "megakernel/ops/matvec_w4.cuh"

namespace loom::megakernel {

// MATVEC's pages (its loader hook): the tile's rows of W, a page at a time, held back while max_in_flight of its
// pages are in flight: an SM with the whole ring in flight ran ahead of the others, and every other load of the SM
// (a barrier poll, the activations) queued behind its pages.
// The tile's bytes: rows of MatvecRowStride(k) bf16 values, or of MatvecFp8RowStride(k) e4m3 bytes.
__device__ __forceinline__ uint64_t MatvecRowBytes(const isa::MatvecArgs& a) {
  return uint64_t{isa::MatvecRowStride(a.k)} * 2;
}
__device__ __forceinline__ uint64_t MatvecRowBytes(const isa::MatvecFp8Args& a) { return isa::MatvecFp8RowStride(a.k); }
// (int4: bands of 16 rows are contiguous, so a tile of whole bands starts at row_begin rows' bytes.)
__device__ __forceinline__ uint64_t MatvecRowBytes(const isa::MatvecW4Args& a) {
  return isa::MatvecW4RowStride(a.k) / 2;
}
template <typename Args>
inline constexpr bool kIsMatvec = std::is_same_v<Args, isa::MatvecArgs> || std::is_same_v<Args, isa::MatvecFp8Args> ||
                                  std::is_same_v<Args, isa::MatvecW4Args>;
template <typename Args>
__device__ __forceinline__ constexpr isa::Opcode MatvecOpcode() {
  return std::is_same_v<Args, isa::MatvecFp8Args>  ? isa::Opcode::MATVEC_FP8
         : std::is_same_v<Args, isa::MatvecW4Args> ? isa::Opcode::MATVEC_W4
                                                   : isa::Opcode::MATVEC;
}

template <>
inline constexpr bool kHasPageHook<isa::MatvecArgs> = true;
template <>
inline constexpr bool kHasPageHook<isa::MatvecFp8Args> = true;
template <>
inline constexpr bool kHasPageHook<isa::MatvecW4Args> = true;
// `total` bytes from `src` into the ring, a page at a time, throttled (above).
__device__ __forceinline__ void StreamMatvecPages(const uint8_t* src, uint64_t total, uint32_t opcode,
                                                  LoaderContext& l) {
  for (uint64_t offset = 0; offset < total; offset += l.p.page_bytes) {
    const uint32_t bytes = static_cast<uint32_t>(total - offset < l.p.page_bytes ? total - offset : l.p.page_bytes);
    uint8_t* page = l.EmptyPage(opcode);
    while (l.in_flight >= l.max_in_flight) {
      MbarrierWait(&l.s.full[l.landed.index], l.landed.phase, l.Where(opcode, l.landed.index, kStuckPageWait));
      ++l.landed;
      --l.in_flight;
    }
    ++l.in_flight;
    if (l.p.skip_weight_loads) {
      MbarrierArrive(l.Full());
    } else {
      // Evict-first: a MATVEC weight is read once per step, and the step's gigabytes of them would otherwise push
      // out of L2 what is read again (the KV cache, activations): -3% ms/token (docs/history/performance_log.md).
      MbarrierArriveExpectTx(l.Full(), bytes);
      BulkCopyToShared(page, src + offset, bytes, l.Full(), CreatePolicyEvictFirst());
    }
    ++l.ring;
  }
}

template <uint32_t kVariant, typename Args, typename = std::enable_if_t<kIsMatvec<Args>>>
__device__ __forceinline__ void LoadPages(const Args& a, const isa::Instruction&, LoaderContext& l) {
  const uint64_t row_bytes = MatvecRowBytes(a);
  l.InstructionRead();
  constexpr uint32_t kOpcode = static_cast<uint32_t>(MatvecOpcode<Args>());
  if constexpr (std::is_same_v<Args, isa::MatvecW4Args>) {  // the tile's meta words first (contiguous: whole bands)
    const uint64_t groups = isa::MatvecW4Groups(a.k, a.group_shift);
    StreamMatvecPages(l.p.machine.ptr<uint8_t>(a.meta) + 4 * a.row_begin * groups,
                      isa::MatvecW4MetaBytes(a.rows, a.k, a.group_shift), kOpcode, l);
    // A row in pieces (isa::MatvecW4Pieces): each piece's columns of each band, whole pages, piece after piece (a
    // chunk of 64 columns of a band is 512 bytes: 8 a column).
    const uint32_t stride = isa::MatvecW4RowStride(a.k), piece = isa::MatvecW4PieceColumns(stride);
    if (piece != stride) {
      const uint8_t* weight = l.p.machine.ptr<uint8_t>(a.weight) + a.row_begin * row_bytes;
      const uint32_t bands = a.rows / isa::kMatvecW4BandRows, runs = isa::MatvecW4Pieces(stride) * bands;
#pragma unroll 1
      for (uint32_t run = 0; run < runs; ++run) {  // (one loop: two nested ones made the loader spill)
        const uint32_t begin = run / bands * piece;
        StreamMatvecPages(weight + 8ull * (run % bands * stride + begin), 8 * min(piece, stride - begin), kOpcode, l);
      }
      return;
    }
  }
  StreamMatvecPages(l.p.machine.ptr<uint8_t>(a.weight) + a.row_begin * row_bytes, a.rows * row_bytes, kOpcode, l);
}

// MATVEC's activation hook: the RoPE epilogue needs this step's position (for the consumers' prologue).
template <>
inline constexpr bool kHasActivationHook<isa::MatvecArgs> = true;
template <>
inline constexpr bool kHasActivationHook<isa::MatvecFp8Args> = true;
template <>
inline constexpr bool kHasActivationHook<isa::MatvecW4Args> = true;
template <typename Args, typename = std::enable_if_t<kIsMatvec<Args>>>
__device__ __forceinline__ bool ActivationReadsPosition(const Args& a) {
  return a.epilogue == isa::kEpilogueRopeKvAppend;
}
template <typename Args, typename = std::enable_if_t<kIsMatvec<Args>>>
__device__ __forceinline__ uint32_t ActivationMaxSeq(const Args& a) { return a.max_seq; }
template <bool kChunks, typename Args, typename = std::enable_if_t<kIsMatvec<Args>>>
__device__ __forceinline__ void PlanActivation(const Args& a, const KernelParams& p, uint32_t step,
                                               StepLength& length, ActivationPlan& plan) {
  if (a.epilogue == isa::kEpilogueRopeKvAppend) plan.length = length.Get(p.machine, a.step_state, step);
}

}  // namespace loom::megakernel
