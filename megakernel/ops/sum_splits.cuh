// SUM_SPLITS on the device: the parts of a GEMM split over K added in part order (isa::SumSplitsArgs), so the
// sum is bitwise the same every run whichever split finished first. A consumer thread takes kSumChunks 16-byte
// chunks at once (kConsumerThreads apart) and adds part after part to them, the chunks' loads of a part in flight
// together. Loads go to L2 (ld.global.cg): the parts were stored by other SMs in this launch. Offsets are 32-bit
// (isa::Validate keeps splits x elements below 2^32): the inlined 64-bit forms cost the tensor-core variants'
// registers (spills).
#pragma once

#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

constexpr uint32_t kSumChunks = 4;

// max(0, .) as the reference writes it (NaN stays NaN).
__device__ __forceinline__ float SumSplitsRelu(float v) { return v < 0.0f ? 0.0f : v; }
__device__ __forceinline__ float4 SumSplitsRelu(float4 v) {
  return make_float4(SumSplitsRelu(v.x), SumSplitsRelu(v.y), SumSplitsRelu(v.z), SumSplitsRelu(v.w));
}
__device__ __forceinline__ void AddTo(float4& sum, const float4 v) {
  sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
}

__device__ __forceinline__ void RunSumSplits(const isa::SumSplitsArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* parts = m.ptr<float>(a.parts);
  const float* base = a.base != isa::kNoTensor ? m.ptr<float>(a.base) : nullptr;
  float* out = m.ptr<float>(a.out);
  const bool relu_base = (a.flags & isa::kSumReluBase) != 0, relu_out = (a.flags & isa::kSumReluOut) != 0;
  if (a.elements % 4 == 0 && a.begin % 4 == 0 && a.count % 4 == 0) {  // 16-byte chunks (tensors are 16-aligned)
    const float4* parts4 = reinterpret_cast<const float4*>(parts);
    const uint32_t stride = a.elements / 4, end = (a.begin + a.count) / 4;
    for (uint32_t c0 = a.begin / 4 + ctx.tid; c0 < end; c0 += kConsumerThreads * kSumChunks) {
      float4 sum[kSumChunks];
#pragma unroll
      for (uint32_t j = 0; j < kSumChunks; ++j) {
        const uint32_t c = c0 + j * kConsumerThreads;
        if (c >= end) continue;
        if (base == nullptr) {
          sum[j] = __ldcg(parts4 + c);
        } else {
          sum[j] = __ldcg(reinterpret_cast<const float4*>(base) + c);
          if (relu_base) sum[j] = SumSplitsRelu(sum[j]);
        }
      }
      for (uint32_t s = base == nullptr ? 1 : 0; s < a.splits; ++s) {  // in part order
#pragma unroll
        for (uint32_t j = 0; j < kSumChunks; ++j) {
          const uint32_t c = c0 + j * kConsumerThreads;
          if (c < end) AddTo(sum[j], __ldcg(parts4 + s * stride + c));
        }
      }
#pragma unroll
      for (uint32_t j = 0; j < kSumChunks; ++j) {
        const uint32_t c = c0 + j * kConsumerThreads;
        if (c < end) reinterpret_cast<float4*>(out)[c] = relu_out ? SumSplitsRelu(sum[j]) : sum[j];
      }
    }
    return;
  }
  for (uint32_t i = a.begin + ctx.tid; i < a.begin + a.count; i += kConsumerThreads) {
    float sum = base != nullptr ? isa::SumSplitsBase(a, __ldcg(base + i)) : __ldcg(parts + i);
    for (uint32_t s = base != nullptr ? 0 : 1; s < a.splits; ++s) sum += __ldcg(parts + s * a.elements + i);
    out[i] = relu_out ? SumSplitsRelu(sum) : sum;
  }
}

}  // namespace loom::megakernel
