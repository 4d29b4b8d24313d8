#include "megakernel/tile/tile_selftest.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "megakernel/tile/row_ops.cuh"
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

__global__ void __launch_bounds__(128) AttentionTileKernel(const uint4* q_image, const uint4* k_image,
                                                           const uint4* vt_image, uint32_t keys, uint32_t q0,
                                                           float scale, float* o) {
  using Slab = SmemSlab<64, isa::Swizzle::k128B>;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + kAlign - 1) / kAlign * kAlign);
  const uint32_t tiles = keys / 64;
  uint8_t* k_base = smem + Slab::kBytes;
  uint8_t* vt_base = k_base + tiles * Slab::kBytes;
  for (uint32_t i = threadIdx.x; i < Slab::kBytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = q_image[i];
  for (uint32_t i = threadIdx.x; i < tiles * Slab::kBytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(k_base)[i] = k_image[i];
    reinterpret_cast<uint4*>(vt_base)[i] = vt_image[i];
  }
  FenceProxyAsyncShared();
  __syncthreads();
  const Slab q{smem};
  const uint32_t t = threadIdx.x;
  const float log2_scale = scale * 1.4426950408889634f;  // exp(x * scale) = exp2(x * log2_scale)
  RowPair m{{-INFINITY, -INFINITY}}, l{{0.0f, 0.0f}};
  Accumulator<64> out;
  out.Zero();
  const uint32_t last_tile = (q0 + 63) / 64;  // tiles past the diagonal hold only masked keys
  for (uint32_t j = 0; j <= last_tile && j < tiles; ++j) {
    Accumulator<64> s;  // scores of the 64 queries x this tile's 64 keys
    WgmmaFence();
    SlabMma(s, q, 0, Slab{k_base + j * Slab::kBytes}, false);
    WgmmaCommit();
    WgmmaWait<0>();
    if (64 * j + 63 > q0) {  // the tile crosses the diagonal: mask keys after each query's position
#pragma unroll
      for (uint32_t i = 0; i < Accumulator<64>::kRegs; ++i) {
        if (64 * j + Accumulator<64>::Col(t, i) > q0 + Accumulator<64>::Row(t, i)) s.d[i] = -INFINITY;
      }
    }
    const RowPair tile_max = RowMax(s);
    const RowPair m_new{{fmaxf(m.v[0], tile_max.v[0]), fmaxf(m.v[1], tile_max.v[1])}};
    const RowPair correction{{exp2f((m.v[0] - m_new.v[0]) * log2_scale), exp2f((m.v[1] - m_new.v[1]) * log2_scale)}};
    Exp2Rows(s, m_new, log2_scale);
    const RowPair tile_sum = RowSum(s);
    l = {{l.v[0] * correction.v[0] + tile_sum.v[0], l.v[1] * correction.v[1] + tile_sum.v[1]}};
    m = m_new;
    ScaleRows(out, correction);
    uint32_t p[4][4];
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k) ToOperandA(s, k, p[k]);
    WgmmaFence();  // P's registers and the rescaled accumulators were written by this warpgroup
    const Slab vt{vt_base + j * Slab::kBytes};
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k) MmaAsyncRegA<64>(out.d, p[k], vt.Descriptor(0, k), 1u);
    WgmmaCommit();
    WgmmaWait<0>();
  }
  ScaleRows(out, RowPair{{1.0f / l.v[0], 1.0f / l.v[1]}});
#pragma unroll
  for (uint32_t i = 0; i < Accumulator<64>::kRegs; ++i) {
    o[Accumulator<64>::Row(t, i) * 64 + Accumulator<64>::Col(t, i)] = out.d[i];
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

absl::StatusOr<std::vector<float>> RunAttentionTile(const std::vector<uint16_t>& q_image,
                                                    const std::vector<uint16_t>& k_image,
                                                    const std::vector<uint16_t>& vt_image, uint32_t keys,
                                                    uint32_t q0, float scale) {
  constexpr size_t kTile = 64 * 64;
  if (keys == 0 || keys % 64 != 0 || q0 + 64 > keys || q_image.size() != kTile ||
      k_image.size() != keys * 64ull || vt_image.size() != keys * 64ull) {
    return absl::InvalidArgumentError("RunAttentionTile: sizes do not match");
  }
  DeviceBuffer q(kTile * 2), k(keys * 128ull), vt(keys * 128ull), o(kTile * 4);
  if (!q.ok() || !k.ok() || !vt.ok() || !o.ok()) return absl::InternalError("cudaMalloc");
  cudaMemcpy(q.get(), q_image.data(), kTile * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(k.get(), k_image.data(), keys * 128ull, cudaMemcpyHostToDevice);
  cudaMemcpy(vt.get(), vt_image.data(), keys * 128ull, cudaMemcpyHostToDevice);
  cudaMemset(o.get(), 0xff, kTile * 4);  // poisoned
  const size_t smem = kTile * 2 + 2 * keys * 128ull + kAlign;
  if (cudaFuncSetAttribute(AttentionTileKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess) {
    return absl::InvalidArgumentError("RunAttentionTile: too many keys for one block's shared memory");
  }
  AttentionTileKernel<<<1, 128, smem>>>(static_cast<const uint4*>(q.get()), static_cast<const uint4*>(k.get()),
                                        static_cast<const uint4*>(vt.get()), keys, q0, scale,
                                        static_cast<float*>(o.get()));
  if (cudaDeviceSynchronize() != cudaSuccess) {
    return absl::InternalError(absl::StrCat("attention tile kernel: ", cudaGetErrorString(cudaGetLastError())));
  }
  std::vector<float> out(kTile);
  cudaMemcpy(out.data(), o.get(), kTile * 4, cudaMemcpyDeviceToHost);
  return out;
}

}  // namespace loom::megakernel::tile
