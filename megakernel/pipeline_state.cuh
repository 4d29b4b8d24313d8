// A position in a ring of mbarrier-guarded buffers: (index, phase). ++ moves to
// the next buffer and flips the phase when it wraps (as CUTLASS's PipelineState).
// The ring size is a run-time value: it comes from the schedule's SmemConfig.
#pragma once

#include <cstdint>

namespace loom::megakernel {

struct PipelineState {
  uint32_t index = 0;
  uint32_t phase = 0;
  uint32_t stages = 1;

  __device__ __forceinline__ PipelineState& operator++() {
    if (++index == stages) {
      index = 0;
      phase ^= 1u;
    }
    return *this;
  }
};

}  // namespace loom::megakernel
