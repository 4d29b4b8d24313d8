// Shared-memory mbarriers and the bulk copy engine (sm_90): the hand-off
// between the loader and the consumers, for every page of every instruction.
#pragma once

#include <cstdint>

#include "megakernel/device_debug.h"

namespace loom::megakernel {

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddress(bar)), "r"(arrivals) : "memory");
}

// Makes mbarrier inits visible to the async proxy (the bulk copy engine).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
  asm volatile(
      "{\n\t.reg .b64 state;\n\t"
      "mbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n\t}" ::"r"(SmemAddress(bar))
      : "memory");
}

// Arrives once and tells the barrier to expect `bytes` of bulk-copy transactions.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n\t.reg .b64 state;\n\t"
      "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [%0], %1;\n\t}" ::"r"(SmemAddress(bar)),
      "r"(bytes)
      : "memory");
}

__device__ __forceinline__ bool MbarrierTryWait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(SmemAddress(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Like MbarrierTryWait, but the thread may sleep up to `suspend_ns` for the
// phase to complete (the hardware wakes it when it does): a waiting warp stops
// taking issue slots from the warps that compute.
__device__ __forceinline__ bool MbarrierTryWaitSuspend(uint64_t* bar, uint32_t parity, uint32_t suspend_ns) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2, %3;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(SmemAddress(bar)), "r"(parity), "r"(suspend_ns)
      : "memory");
  return done != 0;
}

// Sleep bound of one MbarrierWait poll. Debug builds poll without sleeping, so
// kDebugSpinLimit polls stay a bounded time.
inline constexpr uint32_t kMbarrierSuspendNs = kDeviceDebug ? 0 : 1'000'000;

// Waits until the mbarrier's phase with `parity` has completed. Debug builds
// give up after kDebugSpinLimit polls and report `where` (see device_debug.h).
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity, const StuckWhere& where) {
  uint64_t spins = 0;
  while (!(kDeviceDebug ? MbarrierTryWait(bar, parity) : MbarrierTryWaitSuspend(bar, parity, kMbarrierSuspendNs))) {
    if (kDeviceDebug && ++spins > kDebugSpinLimit) where.Report(parity);
  }
}

// Global -> shared bulk copy of `bytes` (multiple of 16, both addresses 16-byte
// aligned), completing `bytes` transactions on `bar`.
__device__ __forceinline__ void BulkCopyToShared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          SmemAddress(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddress(bar))
      : "memory");
}

// The same, with an L2 cache policy (CreatePolicyEvictFirst: a stream read once should not push others' data out).
__device__ __forceinline__ void BulkCopyToShared(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(SmemAddress(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddress(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t CreatePolicyEvictFirst() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Per-thread asynchronous copies global -> shared (cp.async, through L2), `size` of `kBytes` bytes read and the
// rest zero-filled (size 0: zeros, src not read); both addresses kBytes-aligned. They complete per thread, in
// commit groups: CpAsyncWait<n> waits until at most n of this thread's groups are still in flight.
template <uint32_t kBytes>
__device__ __forceinline__ void CpAsync(void* dst, const void* src, uint32_t size) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(SmemAddress(dst)), "l"(src), "r"(size)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(SmemAddress(dst)), "l"(src), "n"(kBytes),
                 "r"(size)
                 : "memory");
  }
}
// The same, 16 bytes to a shared-space address (no generic-to-shared conversion per copy).
__device__ __forceinline__ void CpAsync16Shared(uint32_t dst, const void* src, uint32_t size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(size) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <uint32_t kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Asks L2 to fetch `bytes` (multiple of 16, 16-byte aligned) of global memory; nothing waits for it.
__device__ __forceinline__ void BulkPrefetchL2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Named barrier among `threads` threads (a multiple of 32) that excludes the rest of the block.
__device__ __forceinline__ void NamedBarrierSync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace loom::megakernel
