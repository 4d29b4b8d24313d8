// PACK_ROWS on the device: f32 rows -> the bf16 swizzled operand image of a
// GEMM's A (isa::PackRowsArgs), with an optional RMSNorm of each row. A warp
// takes a row: lanes sum its squares (when normalising), then each lane writes
// 16-byte chunks of 8 bf16 (a swizzle moves whole chunks, so a chunk of 8
// consecutive columns stays contiguous), zeros past m and k.
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

__device__ __forceinline__ void RunPackRows(const isa::PackRowsArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* in = m.ptr<float>(a.input);
  uint8_t* image = m.ptr<uint8_t>(a.out);
  const __nv_bfloat16* w = a.norm_weight != isa::kNoTensor ? m.ptr<__nv_bfloat16>(a.norm_weight) : nullptr;
  const uint32_t chunks = isa::GemmSlabs(a.k) * isa::kGemmSlabK / 8;  // of the padded row
  const uint32_t first = a.row_begin, end = a.row_begin + a.rows;
  for (uint32_t r = first + ctx.warp; r < end; r += kConsumerWarps) {
    const float* x = in + static_cast<uint64_t>(r) * a.k;
    float scale = 1.0f;
    if (w != nullptr && r < a.m) {
      float sum_sq = 0.0f;
      for (uint32_t c = ctx.lane; c < a.k; c += 32) sum_sq += x[c] * x[c];
      scale = 1.0f / sqrtf(WarpSum(sum_sq) / static_cast<float>(a.k) + a.norm_eps);
    }
    for (uint32_t ch = ctx.lane; ch < chunks; ch += 32) {
      __nv_bfloat162 pairs[4];
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j) {
        float v[2];
#pragma unroll
        for (uint32_t e = 0; e < 2; ++e) {
          const uint32_t c = ch * 8 + 2 * j + e;
          v[e] = r < a.m && c < a.k ? x[c] * scale * (w != nullptr ? __bfloat162float(w[c]) : 1.0f) : 0.0f;
        }
        pairs[j] = __floats2bfloat162_rn(v[0], v[1]);
      }
      *reinterpret_cast<uint4*>(image + isa::Swizzled128Offset(a.k, isa::kGemmTileM, r, ch * 8)) =
          *reinterpret_cast<const uint4*>(pairs);
    }
  }
}

}  // namespace loom::megakernel
