// Step tags on the device (instructions/instruction.h "Step tags"; docs/architecture.md): the lowest mantissa bit
// of a tagged f32 is the parity of the step that stored it. A reader that finds this step's parity in every value
// has this step's values: each 4-byte store is single-copy atomic, and the reads go to L2 (cp.async.cg, ld.cg),
// where every store lands, so the tag and the value it rides on arrive together. Tagging costs the value 2^-23 of
// relative precision (it replaces the last mantissa bit); an infinity tagged odd becomes a NaN.
#pragma once

#include <cstdint>

#include "instructions/instruction.h"

namespace loom::megakernel {

__device__ __forceinline__ uint32_t StepParity(uint32_t step) { return step & 1u; }

__device__ __forceinline__ float Tag(float v, uint32_t parity) {
  return __uint_as_float((__float_as_uint(v) & ~1u) | parity);
}

__device__ __forceinline__ bool Tagged(float v, uint32_t parity) { return (__float_as_uint(v) & 1u) == parity; }

// Four floats' bits: whether all carry `parity`.
__device__ __forceinline__ bool Tagged4(const uint4& v, uint32_t parity) {
  return (parity ? v.x & v.y & v.z & v.w & 1u : ~(v.x | v.y | v.z | v.w) & 1u) != 0;
}

// `tag` < 2: the parity to store; otherwise the value as it is (an untagged output).
__device__ __forceinline__ float MaybeTag(float v, uint32_t tag) { return tag < 2 ? Tag(v, tag) : v; }

// The tag an instruction with `flags` stores its output with in `step` (kNoTag: none).
constexpr uint32_t kNoTag = 2;
__device__ __forceinline__ uint32_t OutputTag(uint32_t flags, uint32_t step) {
  return (flags & isa::kFlagTagOut) != 0 ? StepParity(step) : kNoTag;
}

}  // namespace loom::megakernel
