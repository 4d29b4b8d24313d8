// One K slab of a warpgroup's product: acc[64, N] (+)= A[row0 : row0+64, slab] · B[0 : N, slab]ᵀ,
// every k16 step of the slab issued back to back (the caller fences, commits and waits).
#pragma once

#include "megakernel/tile/smem_tile.cuh"
#include "megakernel/tile/wgmma.cuh"

namespace loom::megakernel::tile {

template <uint32_t N, uint32_t kRowsA, isa::Swizzle S>
__device__ __forceinline__ void SlabMma(Accumulator<N>& acc, const SmemSlab<kRowsA, S>& a, uint32_t a_row0,
                                        const SmemSlab<N, S>& b, bool accumulate) {
  static_assert(kRowsA % 64 == 0, "A slabs hold whole 64-row wgmma tiles");
#pragma unroll
  for (uint32_t step = 0; step < SmemSlab<N, S>::kSteps; ++step) {
    MmaAsync<N>(acc.d, a.Descriptor(a_row0, step), b.Descriptor(0, step), accumulate || step > 0 ? 1u : 0u);
  }
}

}  // namespace loom::megakernel::tile
