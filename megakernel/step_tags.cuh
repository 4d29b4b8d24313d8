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

// A value read again until it carries the step's tag: volatile, so the compiler neither merges it with the read
// before (__ldcg is an ordinary load it may reuse: the poll then spins forever) nor hoists it out of the loop, and
// relaxed at GPU scope (from L2, where the other SMs' stores land).
__device__ __forceinline__ float ReloadRelaxed(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float2 ReloadRelaxed(const float2* p) {
  float2 v;
  asm volatile("ld.relaxed.gpu.global.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float4 ReloadRelaxed(const float4* p) {
  float4 v;
  asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// The tag an instruction with `flags` stores its output with in `step` (kNoTag: none).
constexpr uint32_t kNoTag = 2;
__device__ __forceinline__ uint32_t OutputTag(uint32_t flags, uint32_t step) {
  return (flags & isa::kFlagTagOut) != 0 ? StepParity(step) : kNoTag;
}

}  // namespace loom::megakernel
