// l2_probe: how fast can the SMs pull L2-resident data into shared memory with bulk copies, the path every GEMM
// page takes? One block per SM (or fewer), one thread issuing `cp.async.bulk` copies of `page_kb` into a ring of
// `pages` shared-memory pages, each waited on its mbarrier and re-issued at once (nothing consumes the data).
// The source is a `region_mb` buffer read by every SM at its own staggered offset, small enough to stay in L2.
// Prints the aggregate GB/s for each (SMs, pages, page size, region, sharing) in the sweep, then the same with 2-CTA
// clusters and multicast.
//
//   l2_probe [--repeats=N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "megakernel/mbarrier.cuh"

namespace {

using loom::megakernel::BulkCopyToShared;
using loom::megakernel::FenceBarrierInit;
using loom::megakernel::MbarrierArriveExpectTx;
using loom::megakernel::MbarrierInit;
using loom::megakernel::MbarrierTryWait;
using loom::megakernel::SmemAddress;

constexpr int kMaxPages = 16;
constexpr uint32_t kChunkBytes = 16 * 1024;

// The ring: `pages` issued, then each waited on in turn, `between()`, and refilled until `iterations` pages landed.
template <typename Issue, typename Between>
__device__ __forceinline__ void RunRing(uint64_t* full, uint32_t pages, uint32_t iterations, Issue& issue,
                                        Between between) {
  for (uint32_t p = 0; p < pages && p < iterations; ++p) issue(p);
  for (uint32_t i = 0; i < iterations; ++i) {
    const uint32_t p = i % pages;
    while (!MbarrierTryWait(&full[p], (i / pages) & 1)) {
    }
    between();
    if (i + pages < iterations) issue(p);
  }
}

__global__ void PullPages(const uint8_t* region, uint64_t region_bytes, uint32_t page_bytes, uint32_t pages,
                          uint32_t iterations, uint32_t sharing, uint32_t lag, uint32_t far) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kMaxPages];
  if (threadIdx.x != 0) return;
  for (uint32_t p = 0; p < pages; ++p) MbarrierInit(&full[p], 1);
  FenceBarrierInit();
  // Each group of `sharing` SMs starts at its own offset and walks the region page by page (offsets wrap): the SMs
  // of a group read the same pages at about the same time, as the SMs of a GEMM that share an A or W tile do.
  // `lag`: the group's k-th SM reads k * lag pages behind the first; `far`: a group's SMs are gridDim / sharing
  // blocks apart (not neighbours).
  const uint32_t groups = gridDim.x / sharing;
  const uint32_t group = far ? blockIdx.x % groups : blockIdx.x / sharing;
  const uint32_t member = far ? blockIdx.x / groups : blockIdx.x % sharing;
  uint64_t offset = (static_cast<uint64_t>(group) * 7919 * page_bytes + uint64_t{region_bytes} -
                     static_cast<uint64_t>(member) * lag * page_bytes) % region_bytes;
  offset -= offset % page_bytes;
  auto issue = [&](uint32_t p) {
    MbarrierArriveExpectTx(&full[p], page_bytes);
    for (uint32_t c = 0; c < page_bytes; c += kChunkBytes) {  // in 16 KB copies, as a GEMM page's slabs
      BulkCopyToShared(smem + static_cast<uint64_t>(p) * page_bytes + c, region + offset + c, kChunkBytes, &full[p]);
    }
    offset += page_bytes;
    if (offset + page_bytes > region_bytes) offset = 0;
  };
  RunRing(full, pages, iterations, issue, [] {});
}

// The same ring in a 2-CTA cluster with TMA multicast: each CTA copies half of every page from L2 into the page of
// both CTAs (`.multicast::cluster`), so each SM's page fills with half its bytes read from L2 by itself. Each CTA's
// page barrier expects the whole page (both halves); a cluster barrier after every page keeps the two CTAs on the
// same page, so neither refills one its partner has not seen complete. That barrier bounds this mode: it measured
// 40-50 GB/s into each SM (H100), below the plain ring's 58-64, so it says nothing yet about multicast's own rate;
// a GEMM would release a page to the pair with a remote mbarrier arrive per page instead
// (docs/history/performance_log.md).
__global__ void __cluster_dims__(2, 1, 1) PullPagesMulticast(const uint8_t* region, uint64_t region_bytes,
                                                            uint32_t page_bytes, uint32_t pages, uint32_t iterations) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kMaxPages];
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    for (uint32_t p = 0; p < pages; ++p) MbarrierInit(&full[p], 1);
    FenceBarrierInit();
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (threadIdx.x != 0) {  // (the other lanes still take part in the cluster barriers below)
    for (uint32_t i = 0; i < iterations; ++i) {
      asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
    }
    return;
  }
  const uint32_t half = page_bytes / 2;
  uint64_t offset = (static_cast<uint64_t>(blockIdx.x / 2) * 7919 * page_bytes) % region_bytes;
  offset -= offset % page_bytes;
  auto issue = [&](uint32_t p) {
    MbarrierArriveExpectTx(&full[p], page_bytes);
    for (uint32_t c = 0; c < half; c += kChunkBytes / 2) {
      const uint32_t dst = SmemAddress(smem + static_cast<uint64_t>(p) * page_bytes + rank * half + c);
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
          "%4;" ::"r"(dst),
          "l"(region + offset + rank * half + c), "r"(kChunkBytes / 2), "r"(SmemAddress(&full[p])), "h"(uint16_t{3})
          : "memory");
    }
    offset += page_bytes;
    if (offset + page_bytes > region_bytes) offset = 0;
  };
  RunRing(full, pages, iterations, issue,
          [] { asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory"); });
}

// Milliseconds of one launch (`launch()` enqueues it), by CUDA events.
template <typename Launch>
float TimeLaunch(Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  launch();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

float TimeMulticast(const uint8_t* region, uint64_t region_bytes, int blocks, uint32_t page_bytes, uint32_t pages,
                    uint32_t iterations) {
  return TimeLaunch([&] {
    PullPagesMulticast<<<blocks, 32, page_bytes * pages>>>(region, region_bytes, page_bytes, pages, iterations);
  });
}

float TimeOnce(const uint8_t* region, uint64_t region_bytes, int blocks, uint32_t page_bytes, uint32_t pages,
               uint32_t iterations, uint32_t sharing, uint32_t lag, uint32_t far) {
  return TimeLaunch([&] {
    PullPages<<<blocks, 32, page_bytes * pages>>>(region, region_bytes, page_bytes, pages, iterations, sharing, lag,
                                                  far);
  });
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--repeats=", 10) == 0) {
      repeats = std::atoi(argv[i] + 10);
    } else {
      std::fprintf(stderr, "l2_probe: unknown argument %s (usage: l2_probe [--repeats=N])\n", argv[i]);
      return 2;
    }
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(PullPages, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  const uint64_t max_region = 64ull << 20;
  uint8_t* region = nullptr;
  if (cudaMalloc(&region, max_region) != cudaSuccess) {
    std::fprintf(stderr, "l2_probe: cudaMalloc of %llu bytes failed\n", static_cast<unsigned long long>(max_region));
    return 1;
  }
  cudaMemset(region, 1, max_region);
  std::printf("%6s %6s %8s %10s %8s %4s %4s %12s %12s\n", "SMs", "pages", "page_kb", "region_mb", "sharing", "lag",
              "far", "GB/s total", "GB/s per SM");
  struct Case {
    int blocks;
    uint32_t pages, page_kb, region_mb, sharing = 1, lag = 0, far = 0;
  };
  std::vector<Case> cases;
  for (uint32_t region_mb : {16u, 48u}) {
    for (uint32_t page_kb : {16u, 32u, 48u}) {
      for (uint32_t pages : {2u, 3u, 4u, 6u, 8u, 12u}) {
        if (pages * page_kb > 192) continue;
        cases.push_back({sms, pages, page_kb, region_mb});
      }
    }
  }
  for (int blocks : {8, 33, 66, 99}) cases.push_back({blocks, 6, 32, 16});
  for (uint32_t sharing : {2u, 4u, 8u}) cases.push_back({sms, 6, 32, 16, sharing});
  for (uint32_t far : {0u, 1u}) {
    for (uint32_t lag : {0u, 1u, 12u}) cases.push_back({sms, 6, 32, 16, 2, lag, far});
  }
  for (uint32_t sharing : {2u, 8u}) cases.push_back({sms, 4, 48, 16, sharing});
  for (const Case& c : cases) {
    const uint32_t page_bytes = c.page_kb * 1024;
    const uint64_t region_bytes = static_cast<uint64_t>(c.region_mb) << 20;
    // About 2 GB in all (a few hundred microseconds: the launch's own cost is then a few percent).
    const uint32_t iterations = static_cast<uint32_t>((2048ull << 20) / page_bytes / c.blocks) + 64;
    std::vector<float> ms;
    TimeOnce(region, region_bytes, c.blocks, page_bytes, c.pages, iterations, c.sharing, c.lag, c.far);  // warm-up
    for (int r = 0; r < repeats; ++r) {
      ms.push_back(TimeOnce(region, region_bytes, c.blocks, page_bytes, c.pages, iterations, c.sharing, c.lag, c.far));
    }
    if (cudaGetLastError() != cudaSuccess) {
      std::fprintf(stderr, "l2_probe: kernel failed at SMs=%d pages=%u page_kb=%u\n", c.blocks, c.pages, c.page_kb);
      return 1;
    }
    std::sort(ms.begin(), ms.end());
    const double bytes = static_cast<double>(c.blocks) * iterations * page_bytes;
    const double gbs = bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
    std::printf("%6d %6u %8u %10u %8u %4u %4u %12.0f %12.1f\n", c.blocks, c.pages, c.page_kb, c.region_mb, c.sharing,
                c.lag, c.far, gbs, gbs / c.blocks);
  }
  // 2-CTA clusters with multicast: how fast each SM's pages fill when each reads half of them from L2.
  cudaFuncSetAttribute(PullPagesMulticast, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  std::printf("\n2-CTA clusters, each page half read by each CTA and multicast to both:\n");
  std::printf("%6s %6s %8s %10s %14s %14s\n", "SMs", "pages", "page_kb", "region_mb", "GB/s into SMs",
              "per SM (L2 half)");
  for (uint32_t page_kb : {32u, 48u}) {
    for (uint32_t pages : {3u, 4u, 6u}) {
      if (pages * page_kb > 192) continue;
      const uint32_t page_bytes = page_kb * 1024, blocks = static_cast<uint32_t>(sms) / 2 * 2;
      const uint64_t region_bytes = 16ull << 20;
      const uint32_t iterations = static_cast<uint32_t>((2048ull << 20) / page_bytes / blocks) + 64;
      std::vector<float> ms;
      TimeMulticast(region, region_bytes, blocks, page_bytes, pages, iterations);
      for (int r = 0; r < repeats; ++r) {
        ms.push_back(TimeMulticast(region, region_bytes, blocks, page_bytes, pages, iterations));
      }
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
        std::fprintf(stderr, "l2_probe: multicast kernel failed: %s\n", cudaGetErrorString(e));
        return 1;
      }
      std::sort(ms.begin(), ms.end());
      const double gbs = static_cast<double>(blocks) * iterations * page_bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
      std::printf("%6u %6u %8u %10u %14.0f %9.1f (%.1f)\n", blocks, pages, page_kb, 16u, gbs, gbs / blocks,
                  gbs / blocks / 2);
    }
  }
  cudaFree(region);
  return 0;
}
