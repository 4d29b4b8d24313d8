// The element-wise family on the device (instructions/elementwise.h): ELEMENTWISE maps output elements over the
// consumer threads with the host reference's element functions (EwOffsets, EwApply); SOFTMAX and NORM_ROWS take a
// row a warp.
#pragma once

#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

// Each thread takes kEwBatch elements (float4s on the contiguous path: no broadcast, transpose or slice, 16-byte
// aligned)
// kConsumerThreads apart, every load issued before the first store: an instruction is a few thousand elements, so
// one load's latency after another would be most of its time.
constexpr uint32_t kEwBatch = 4;
__device__ __forceinline__ void RunElementwise(const isa::ElementwiseArgs& a, ConsumerContext& ctx) {
  const float* x = ctx.machine.ptr<float>(a.a);
  const float* y = a.b != isa::kNoTensor ? ctx.machine.ptr<float>(a.b) : nullptr;
  float* out = ctx.machine.ptr<float>(a.out);
  const uint32_t end = a.begin + a.count;
  uint32_t scalar_begin = a.begin;
  const bool aligned =
      (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  if (isa::EwContiguous(a) && a.begin % 4 == 0 && aligned) {
    const uint32_t end4 = (a.begin + a.count / 4 * 4) / 4;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    for (uint32_t v0 = a.begin / 4 + ctx.tid; v0 < end4; v0 += kConsumerThreads * kEwBatch) {
      float4 p[kEwBatch], q[kEwBatch];
#pragma unroll
      for (uint32_t j = 0; j < kEwBatch; ++j) {
        const uint32_t v = v0 + j * kConsumerThreads;
        if (v < end4) p[j] = x4[v], q[j] = y4 != nullptr ? y4[v] : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (uint32_t j = 0; j < kEwBatch; ++j) {
        const uint32_t v = v0 + j * kConsumerThreads;
        if (v < end4) {
          reinterpret_cast<float4*>(out)[v] =
              make_float4(isa::EwApply(a.func, p[j].x, q[j].x), isa::EwApply(a.func, p[j].y, q[j].y),
                          isa::EwApply(a.func, p[j].z, q[j].z), isa::EwApply(a.func, p[j].w, q[j].w));
        }
      }
    }
    scalar_begin = end4 * 4;
  }
  for (uint32_t i0 = scalar_begin + ctx.tid; i0 < end; i0 += kConsumerThreads * kEwBatch) {
    float p[kEwBatch], q[kEwBatch];
    uint32_t at[kEwBatch];
#pragma unroll
    for (uint32_t j = 0; j < kEwBatch; ++j) {
      const uint32_t i = i0 + j * kConsumerThreads;
      if (i < end) {
        uint32_t oa, ob;
        isa::EwOffsets(a, i, &oa, &ob, &at[j]);
        p[j] = x[oa];
        q[j] = y != nullptr ? y[ob] : 0.0f;
      }
    }
#pragma unroll
    for (uint32_t j = 0; j < kEwBatch; ++j) {
      if (i0 + j * kConsumerThreads < end) out[at[j]] = isa::EwApply(a.func, p[j], q[j]);
    }
  }
}

// A warp per row: its maximum, the sum of exp(x - max) (each lane keeps its exps in out), then the division.
__device__ __forceinline__ void RunSoftmax(const isa::SoftmaxArgs& a, ConsumerContext& ctx) {
  const float* x = ctx.machine.ptr<float>(a.input);
  float* y = ctx.machine.ptr<float>(a.out);
  for (uint64_t r = a.begin + ctx.warp; r < static_cast<uint64_t>(a.begin) + a.count; r += kConsumerWarps) {
    const uint64_t base = r / a.inner * a.len * a.inner + r % a.inner;
    float mx = -INFINITY;
    for (uint32_t i = ctx.lane; i < a.len; i += 32) mx = fmaxf(mx, x[base + static_cast<uint64_t>(i) * a.inner]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (uint32_t i = ctx.lane; i < a.len; i += 32) {
      const uint64_t at = base + static_cast<uint64_t>(i) * a.inner;
      const float e = expf(x[at] - mx);
      y[at] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (uint32_t i = ctx.lane; i < a.len; i += 32) y[base + static_cast<uint64_t>(i) * a.inner] /= sum;
  }
}

// A warp per row: the mean (LayerNorm), the mean square of the deviations, then the scaled (and shifted) row.
__device__ __forceinline__ void RunNormRows(const isa::NormRowsArgs& a, ConsumerContext& ctx) {
  const float* x = ctx.machine.ptr<float>(a.input);
  float* y = ctx.machine.ptr<float>(a.out);
  const float* w = ctx.machine.ptr<float>(a.scale);
  const float* b = a.shift != isa::kNoTensor ? ctx.machine.ptr<float>(a.shift) : nullptr;
  for (uint32_t r = a.begin + ctx.warp; r < a.begin + a.count; r += kConsumerWarps) {
    const float* row = x + static_cast<uint64_t>(r) * a.len;
    float mean = 0.0f;
    if (a.mode == isa::kNormLayer) {
      for (uint32_t j = ctx.lane; j < a.len; j += 32) mean += row[j];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) mean += __shfl_xor_sync(0xffffffffu, mean, o);
      mean /= static_cast<float>(a.len);
    }
    float sum_sq = 0.0f;
    for (uint32_t j = ctx.lane; j < a.len; j += 32) sum_sq += (row[j] - mean) * (row[j] - mean);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
    const float scale = rsqrtf(sum_sq / static_cast<float>(a.len) + a.eps);
    float* out = y + static_cast<uint64_t>(r) * a.len;
    for (uint32_t j = ctx.lane; j < a.len; j += 32) {
      out[j] = (row[j] - mean) * scale * w[j] + (b != nullptr ? b[j] : 0.0f);
    }
  }
}

}  // namespace loom::megakernel
