// SUM_SPLITS on the device: the parts of a GEMM split over K added in part order (isa::SumSplitsArgs), so the
// sum is bitwise the same every run whichever split finished first. A consumer thread takes 16-byte chunks of
// the range; each chunk's parts are loaded kSumBatch at a time, all in flight together, then added in order.
// Loads go to L2 (ld.global.cg): the parts were stored by other SMs in this launch.
#pragma once

#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

constexpr uint32_t kSumBatch = 8;  // parts in flight per chunk

// max(0, .) as the reference writes it (NaN stays NaN).
__device__ __forceinline__ float SumSplitsRelu(float v) { return v < 0.0f ? 0.0f : v; }
__device__ __forceinline__ float4 SumSplitsRelu(float4 v) {
  return make_float4(SumSplitsRelu(v.x), SumSplitsRelu(v.y), SumSplitsRelu(v.z), SumSplitsRelu(v.w));
}

__device__ __forceinline__ void RunSumSplits(const isa::SumSplitsArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* parts = m.ptr<float>(a.parts);
  const float* base = a.base != isa::kNoTensor ? m.ptr<float>(a.base) : nullptr;
  float* out = m.ptr<float>(a.out);
  const uint64_t stride = a.elements;
  if (a.elements % 4 == 0 && a.begin % 4 == 0 && a.count % 4 == 0) {  // 16-byte chunks (tensors are 16-aligned)
    for (uint32_t c = a.begin / 4 + ctx.tid; c < (a.begin + a.count) / 4; c += kConsumerThreads) {
      const uint64_t at = uint64_t{c} * 4;
      float4 sum;
      uint32_t s = 0;
      if (base != nullptr) {
        const float4 b = __ldcg(reinterpret_cast<const float4*>(base + at));
        sum = (a.flags & isa::kSumReluBase) ? SumSplitsRelu(b) : b;
      } else {
        sum = __ldcg(reinterpret_cast<const float4*>(parts + at));
        s = 1;
      }
      while (s < a.splits) {
        float4 v[kSumBatch];
#pragma unroll
        for (uint32_t j = 0; j < kSumBatch; ++j) {
          if (s + j < a.splits) v[j] = __ldcg(reinterpret_cast<const float4*>(parts + (s + j) * stride + at));
        }
#pragma unroll
        for (uint32_t j = 0; j < kSumBatch; ++j) {  // in part order
          if (s + j < a.splits) {
            sum.x += v[j].x;
            sum.y += v[j].y;
            sum.z += v[j].z;
            sum.w += v[j].w;
          }
        }
        s += kSumBatch;
      }
      if (a.flags & isa::kSumReluOut) sum = SumSplitsRelu(sum);
      *reinterpret_cast<float4*>(out + at) = sum;
    }
    return;
  }
  for (uint32_t i = a.begin + ctx.tid; i < a.begin + a.count; i += kConsumerThreads) {
    float sum = base != nullptr ? isa::SumSplitsBase(a, __ldcg(base + i)) : __ldcg(parts + i);
    for (uint32_t s = base != nullptr ? 0 : 1; s < a.splits; ++s) sum += __ldcg(parts + s * stride + i);
    out[i] = (a.flags & isa::kSumReluOut) ? SumSplitsRelu(sum) : sum;
  }
}

}  // namespace loom::megakernel
