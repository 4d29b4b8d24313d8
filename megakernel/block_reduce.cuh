// Reductions across the consumer threads (warp shuffles + the scratch area +
// the consumer named barrier). `tid` is the consumer thread index.
#pragma once

#include <cfloat>
#include <cstdint>

#include "megakernel/kernel_params.h"
#include "megakernel/mbarrier.cuh"

namespace loom::megakernel {

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over all consumer threads; every consumer gets the result.
__device__ __forceinline__ float ConsumerSum(float v, uint32_t tid, float* scratch) {
  v = WarpSum(v);
  if (tid % 32 == 0) scratch[tid / 32] = v;
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  float total = 0.0f;
  for (uint32_t w = 0; w < kConsumerWarps; ++w) total += scratch[w];
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  return total;
}

// (value, index) max with the lowest index winning ties; NaN never wins.
__device__ __forceinline__ bool Better(float v, uint32_t i, float best, uint32_t best_i) {
  return v > best || (v == best && i < best_i);
}

// Argmax over all consumer threads; every consumer gets the result.
__device__ __forceinline__ void ConsumerArgmax(float* value, uint32_t* index, uint32_t tid, float* scratch) {
  float v = *value;
  uint32_t i = *index;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const uint32_t oi = __shfl_xor_sync(0xffffffffu, i, offset);
    if (Better(ov, oi, v, i)) v = ov, i = oi;
  }
  uint32_t* scratch_index = reinterpret_cast<uint32_t*>(scratch + kScratchFloats / 2);
  if (tid % 32 == 0) {
    scratch[tid / 32] = v;
    scratch_index[tid / 32] = i;
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  v = scratch[0];
  i = scratch_index[0];
  for (uint32_t w = 1; w < kConsumerWarps; ++w) {
    if (Better(scratch[w], scratch_index[w], v, i)) v = scratch[w], i = scratch_index[w];
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  *value = v;
  *index = i;
}

}  // namespace loom::megakernel
