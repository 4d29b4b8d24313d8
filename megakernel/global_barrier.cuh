// Cross-SM barriers: uint32 counters in global memory with epoch-based targets.
// The producer makes its stores visible and adds with release semantics; the
// consumer spins with acquire loads (with or without a nanosleep backoff) until the target is
// reached. Debug builds bound the spin and trap with a record the host prints.
#pragma once

#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/device_debug.h"

namespace loom::megakernel {

__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void AddRelease(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A store other SMs and the host may read while the kernel runs (no ordering: a progress mark).
__device__ __forceinline__ void StoreRelaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Orders this thread's generic-proxy view of global memory before later bulk-copy (async proxy) reads.
__device__ __forceinline__ void FenceProxyAsyncGlobal() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// Spins until counters[wait.barrier] reaches its target for `step`; with `backoff`, a nanosleep between polls
// (32 ns, doubling up to 256 ns).
__device__ __forceinline__ void WaitGlobal(const uint32_t* counters, const isa::Wait& wait, uint32_t step,
                                           DeviceError* error, uint32_t sm, uint32_t index, uint32_t opcode,
                                           bool backoff = true) {
  const uint32_t target = wait.target(step);
  const uint32_t* counter = counters + wait.barrier();
  uint32_t sleep_ns = 32;
  uint64_t spins = 0;
  uint32_t value;
  while (!isa::Reached(value = LoadAcquire(counter), target)) {
    if (backoff) __nanosleep(sleep_ns);
    if (sleep_ns < 256) sleep_ns *= 2;
    if (kDeviceDebug && ++spins > kDebugSpinLimit) ReportStuck(error, sm, index, opcode, wait.barrier(), value, target);
  }
}

}  // namespace loom::megakernel
