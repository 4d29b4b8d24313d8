// K-major operand slabs in shared memory, in the swizzled layouts of
// instructions/swizzle.h, and the wgmma descriptors that read them. A layout
// or size mismatch is a compile-time error.
#pragma once

#include <cstdint>

#include "instructions/swizzle.h"

namespace loom::megakernel::tile {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Loads and stores by shared-window address. A pointer into the dynamic shared memory that has passed through a
// struct (a page, an activation slot) is generic to the compiler: ld / st through it are generic accesses, with
// the longer latency of the global path's scoreboard. Volatile, so they stay in order with the mbarrier waits and
// releases and the proxy fences around them (asm volatile statements are not reordered among themselves).
__device__ __forceinline__ float4 LoadShared128(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 LoadShared128Bits(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ float LoadShared32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t LoadShared16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 LoadShared64(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void StoreShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v));
}
__device__ __forceinline__ void StoreShared64(uint32_t addr, float2 v) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v.x), "f"(v.y));
}
__device__ __forceinline__ void StoreShared128(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

// kRows rows of Traits::kRowElems bf16 of K (one slab of K), swizzled; the base
// is aligned to the swizzle atom (1024 bytes for 128B), which the hardware's
// address-bit swizzle assumes.
template <uint32_t kRows, isa::Swizzle S>
struct SmemSlab {
  using Traits = isa::SwizzleTraits<S>;
  static_assert(kRows % Traits::kAtomRows == 0, "a slab is whole 8-row swizzle atoms");
  static constexpr uint32_t kBytes = kRows * Traits::kRowBytes;
  static constexpr uint32_t kK = Traits::kRowElems;  // K per slab
  static constexpr uint32_t kSteps = kK / 16;        // wgmma k16 steps per slab
  static_assert(kSteps >= 1);

  const uint8_t* base;

  // The descriptor of the 64 (A) or N (B) rows from row0 (a multiple of 8), at k16 step `step`:
  // start address, leading byte offset 1 (unused by swizzled K-major operands), stride byte
  // offset = one 8-row atom, the swizzle mode; addresses and offsets in 16-byte units.
  __device__ __forceinline__ uint64_t Descriptor(uint32_t row0, uint32_t step) const {
    const uint32_t address = SharedAddress(base) + row0 * Traits::kRowBytes + step * 32;
    return uint64_t{(address >> 4) & 0x3FFFu} | (uint64_t{1} << 16) |
           (uint64_t{(Traits::kAtomBytes >> 4) & 0x3FFFu} << 32) | (Traits::kDescriptorMode << 62);
  }
};

}  // namespace loom::megakernel::tile
