#include "megakernel/tile/tile_selftest.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "megakernel/tile/slab_mma.cuh"

namespace loom::megakernel::tile {
namespace {

constexpr uint32_t kAlign = 1024;  // the largest swizzle atom

// Device memory freed when it goes out of scope.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p_, bytes) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p_); }
  bool ok() const { return p_ != nullptr; }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

template <uint32_t N, isa::Swizzle S, uint32_t kWarpgroups>
__global__ void __launch_bounds__(128 * kWarpgroups) TileProductKernel(const uint4* a_image, const uint4* b_image,
                                                                        uint32_t k, float* c) {
  constexpr uint32_t kM = 64 * kWarpgroups;
  using SlabA = SmemSlab<kM, S>;
  using SlabB = SmemSlab<N, S>;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kAlign - 1) / kAlign * kAlign);
  const uint32_t slabs = k / SlabA::kK;
  const uint32_t a_bytes = slabs * SlabA::kBytes, b_bytes = slabs * SlabB::kBytes;
  for (uint32_t i = threadIdx.x; i < a_bytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = a_image[i];
  for (uint32_t i = threadIdx.x; i < b_bytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(smem + a_bytes)[i] = b_image[i];
  }
  FenceProxyAsyncShared();  // ordinary stores, read next by the tensor cores
  __syncthreads();

  const uint32_t warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  Accumulator<N> acc;
  acc.Zero();
  WgmmaFence();
  for (uint32_t s = 0; s < slabs; ++s) {
    const SlabA a{smem + s * SlabA::kBytes};
    const SlabB b{smem + a_bytes + s * SlabB::kBytes};
    SlabMma(acc, a, warpgroup * 64, b, s > 0);
  }
  WgmmaCommit();
  WgmmaWait<0>();
#pragma unroll
  for (uint32_t i = 0; i < Accumulator<N>::kRegs; ++i) {
    c[(warpgroup * 64 + Accumulator<N>::Row(t, i)) * N + Accumulator<N>::Col(t, i)] = acc.d[i];
  }
}

template <uint32_t N, isa::Swizzle S, uint32_t kWarpgroups>
absl::Status Launch(const uint4* a, const uint4* b, uint32_t k, float* c, size_t smem) {
  auto kernel = TileProductKernel<N, S, kWarpgroups>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
      cudaSuccess) {
    return absl::InternalError("cudaFuncSetAttribute");
  }
  kernel<<<1, 128 * kWarpgroups, smem>>>(a, b, k, c);
  return absl::OkStatus();
}

template <isa::Swizzle S, uint32_t kWarpgroups>
absl::Status LaunchN(uint32_t n, const uint4* a, const uint4* b, uint32_t k, float* c, size_t smem) {
  switch (n) {
    case 64: return Launch<64, S, kWarpgroups>(a, b, k, c, smem);
    case 128: return Launch<128, S, kWarpgroups>(a, b, k, c, smem);
    case 256: return Launch<256, S, kWarpgroups>(a, b, k, c, smem);
    default: return absl::InvalidArgumentError(absl::StrCat("n = ", n, ": 64, 128 or 256"));
  }
}

template <uint32_t kWarpgroups>
absl::Status LaunchS(isa::Swizzle s, uint32_t n, const uint4* a, const uint4* b, uint32_t k, float* c, size_t smem) {
  switch (s) {
    case isa::Swizzle::k128B: return LaunchN<isa::Swizzle::k128B, kWarpgroups>(n, a, b, k, c, smem);
    case isa::Swizzle::k64B: return LaunchN<isa::Swizzle::k64B, kWarpgroups>(n, a, b, k, c, smem);
    case isa::Swizzle::k32B: return LaunchN<isa::Swizzle::k32B, kWarpgroups>(n, a, b, k, c, smem);
  }
  return absl::InvalidArgumentError("unknown swizzle");
}

}  // namespace

absl::StatusOr<std::vector<float>> RunTileProduct(const std::vector<uint16_t>& a_image,
                                                  const std::vector<uint16_t>& b_image, uint32_t warpgroups,
                                                  uint32_t n, uint32_t k, isa::Swizzle swizzle) {
  const uint32_t m = 64 * warpgroups;
  if ((warpgroups != 1 && warpgroups != 2) || k % (static_cast<uint32_t>(swizzle) / 2) != 0 ||
      a_image.size() != uint64_t{m} * k || b_image.size() != uint64_t{n} * k) {
    return absl::InvalidArgumentError("RunTileProduct: sizes do not match");
  }
  const size_t smem = (a_image.size() + b_image.size()) * 2 + kAlign;
  std::vector<float> out(uint64_t{m} * n, 0.0f);
  DeviceBuffer a(a_image.size() * 2), b(b_image.size() * 2), c(out.size() * 4);
  if (!a.ok() || !b.ok() || !c.ok()) return absl::InternalError("cudaMalloc");
  cudaMemcpy(a.get(), a_image.data(), a_image.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b.get(), b_image.data(), b_image.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(c.get(), 0xff, out.size() * 4);  // poisoned: NaN wherever nothing is written
  const uint4* ap = static_cast<const uint4*>(a.get());
  const uint4* bp = static_cast<const uint4*>(b.get());
  float* cp = static_cast<float*>(c.get());
  if (absl::Status s = warpgroups == 1 ? LaunchS<1>(swizzle, n, ap, bp, k, cp, smem)
                                       : LaunchS<2>(swizzle, n, ap, bp, k, cp, smem);
      !s.ok()) {
    return s;
  }
  if (cudaDeviceSynchronize() != cudaSuccess) {
    return absl::InternalError(absl::StrCat("tile product kernel: ", cudaGetErrorString(cudaGetLastError())));
  }
  cudaMemcpy(out.data(), cp, out.size() * 4, cudaMemcpyDeviceToHost);
  return out;
}

}  // namespace loom::megakernel::tile
