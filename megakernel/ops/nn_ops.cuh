// The general-graph opcodes on the device (instructions/instruction_nn.h): IM2COL writes a convolution's
// patches as a GEMM's A operand image, POOL and ELEMENTWISE map output elements over the consumer threads with
// the element functions the host reference uses (PoolElement, EwOffsets, EwApply).
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

// A warp per image row (output pixel), each lane a 16-byte chunk of 8 columns at a time: (ky, kx, ch) with ch
// fastest, so where the group's channels are a multiple of 8 a chunk is 8 consecutive channels of one input
// pixel (two float4 loads), else it is gathered column by column. Zeros outside the input, past the real rows
// (up to the 128-row tile) and past K (up to the 64-column slab).
__device__ __forceinline__ void RunImToCol(const isa::ImToColArgs& a, ConsumerContext& ctx) {
  const float* in = ctx.machine.ptr<float>(a.input);
  uint8_t* image = ctx.machine.ptr<uint8_t>(a.out);
  const uint32_t rows = isa::ImToColRows(a), k = isa::ImToColK(a);
  const uint32_t chunks = isa::GemmSlabs(k) * isa::kGemmSlabK / 8;
  const bool vector = a.group_c % 8 == 0 && a.c % 4 == 0 && a.c_begin % 4 == 0;
  for (uint32_t r = a.row_begin + ctx.warp; r < a.row_begin + a.rows; r += kConsumerWarps) {
    const uint32_t ox = r % a.ow, oy = r / a.ow % a.oh, b = r / a.ow / a.oh;
    const int32_t y0 = static_cast<int32_t>(oy * a.stride_h) - static_cast<int32_t>(a.pad_top);
    const int32_t x0 = static_cast<int32_t>(ox * a.stride_w) - static_cast<int32_t>(a.pad_left);
    for (uint32_t ch = ctx.lane; ch < chunks; ch += 32) {
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (r < rows && vector && ch * 8 < k) {
        const uint32_t col = ch * 8, c = col % a.group_c, kx = col / a.group_c % a.kw, ky = col / a.group_c / a.kw;
        const int32_t iy = y0 + static_cast<int32_t>(ky * a.dilation_h), ix = x0 + static_cast<int32_t>(kx * a.dilation_w);
        if (iy >= 0 && iy < static_cast<int32_t>(a.h) && ix >= 0 && ix < static_cast<int32_t>(a.w)) {
          const float4* p = reinterpret_cast<const float4*>(
              in + ((static_cast<uint64_t>(b) * a.h + iy) * a.w + ix) * a.c + a.c_begin + c);
          const float4 lo = p[0], hi = p[1];
          v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
        }
      } else if (r < rows) {
#pragma unroll
        for (uint32_t e = 0; e < 8; ++e) {
          const uint32_t col = ch * 8 + e;
          if (col >= k) break;
          const uint32_t c = col % a.group_c, kx = col / a.group_c % a.kw, ky = col / a.group_c / a.kw;
          const int32_t iy = y0 + static_cast<int32_t>(ky * a.dilation_h), ix = x0 + static_cast<int32_t>(kx * a.dilation_w);
          if (iy >= 0 && iy < static_cast<int32_t>(a.h) && ix >= 0 && ix < static_cast<int32_t>(a.w)) {
            v[e] = in[((static_cast<uint64_t>(b) * a.h + iy) * a.w + ix) * a.c + a.c_begin + c];
          }
        }
      }
      __nv_bfloat162 pairs[4];
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j) pairs[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
      *reinterpret_cast<uint4*>(image + isa::Swizzled128Offset(k, isa::kGemmTileM, r, ch * 8)) =
          *reinterpret_cast<const uint4*>(pairs);
    }
  }
}

__device__ __forceinline__ void RunPool(const isa::PoolArgs& a, ConsumerContext& ctx) {
  const float* in = ctx.machine.ptr<float>(a.input);
  float* out = ctx.machine.ptr<float>(a.out);
  for (uint64_t i = a.begin + ctx.tid; i < static_cast<uint64_t>(a.begin) + a.count; i += kConsumerThreads) {
    out[i] = isa::PoolElement(a, in, i);
  }
}

__device__ __forceinline__ void RunElementwise(const isa::ElementwiseArgs& a, ConsumerContext& ctx) {
  const float* x = ctx.machine.ptr<float>(a.a);
  const float* y = a.b != isa::kNoTensor ? ctx.machine.ptr<float>(a.b) : nullptr;
  float* out = ctx.machine.ptr<float>(a.out);
  for (uint64_t i = a.begin + ctx.tid; i < static_cast<uint64_t>(a.begin) + a.count; i += kConsumerThreads) {
    uint64_t oa, ob;
    isa::EwOffsets(a, i, &oa, &ob);
    out[i] = isa::EwApply(a.func, x[oa], y != nullptr ? y[ob] : 0.0f);
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

}  // namespace loom::megakernel
