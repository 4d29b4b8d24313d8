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
#include "megakernel/ops/sum_splits.cuh"

namespace loom::megakernel {

// Loads of kBatch chunks are issued before their stores: a store through the image pointer may alias the input
// as far as the compiler knows, so a load after a store would wait for it, one round trip per chunk.
constexpr uint32_t kPackBatch = 8;

__device__ __forceinline__ float PackRowScale(const isa::PackRowsArgs& a, const float* x, uint32_t lane) {
  float sum_sq = 0.0f;
  if (a.k % 4 == 0) {  // rows 16-byte aligned
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 16
    for (uint32_t c = lane; c < a.k / 4; c += 32) {
      const float4 v = x4[c];
      sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
#pragma unroll 8
    for (uint32_t c = lane; c < a.k; c += 32) sum_sq += x[c] * x[c];
  }
  return 1.0f / sqrtf(WarpSum(sum_sq) / static_cast<float>(a.k) + a.norm_eps);
}

// The RMSNorm of a row a warp holds in registers (k a multiple of 64 and at most 32 * kPackBatch chunks of 8, e.g.
// hidden 2048): its x and weight chunks are loaded once, all before the sum of squares, so a row costs one round
// trip instead of two (the sum's pass, then the scaled pass reading x again).
__device__ __forceinline__ void PackNormRowsInRegisters(const isa::PackRowsArgs& a, const float* in,
                                                        const __nv_bfloat16* w, uint8_t* image, uint32_t chunks,
                                                        const ConsumerContext& ctx) {
  for (uint32_t r = a.row_begin + ctx.warp; r < a.row_begin + a.rows; r += kConsumerWarps) {
    const float4* x4 = reinterpret_cast<const float4*>(in + static_cast<uint64_t>(r) * a.k);
    float4 lo[kPackBatch], hi[kPackBatch];
    uint4 wq[kPackBatch];
    float sum_sq = 0.0f;
#pragma unroll
    for (uint32_t b = 0; b < kPackBatch; ++b) {
      const uint32_t ch = b * 32 + ctx.lane;
      lo[b] = hi[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // past m: zero rows
      wq[b] = make_uint4(0, 0, 0, 0);
      if (r < a.m && ch < chunks) {
        lo[b] = x4[2 * ch];
        hi[b] = x4[2 * ch + 1];
        wq[b] = reinterpret_cast<const uint4*>(w)[ch];
      }
    }
#pragma unroll
    for (uint32_t b = 0; b < kPackBatch; ++b) {
      sum_sq += lo[b].x * lo[b].x + lo[b].y * lo[b].y + lo[b].z * lo[b].z + lo[b].w * lo[b].w;
      sum_sq += hi[b].x * hi[b].x + hi[b].y * hi[b].y + hi[b].z * hi[b].z + hi[b].w * hi[b].w;
    }
    const float scale = 1.0f / sqrtf(WarpSum(sum_sq) / static_cast<float>(a.k) + a.norm_eps);
#pragma unroll
    for (uint32_t b = 0; b < kPackBatch; ++b) {
      const uint32_t ch = b * 32 + ctx.lane;
      if (ch >= chunks) continue;
      const float v[8] = {lo[b].x, lo[b].y, lo[b].z, lo[b].w, hi[b].x, hi[b].y, hi[b].z, hi[b].w};
      const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wq[b]);
      uint32_t packed[4];
#pragma unroll
      for (uint32_t j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(w2[j]);
        // the reference's order: (x * scale) * w
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * j] * scale * f.x, v[2 * j + 1] * scale * f.y);
        packed[j] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      *reinterpret_cast<uint4*>(image + isa::Swizzled128Offset(a.k, isa::kGemmTileM, r, ch * 8)) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
}

// The parts of a split product added into the instruction's rows of the input, in part order (isa::PackRowsArgs),
// staged as SUM_SPLITS's (SumStaged, which ends in a consumers' barrier: the packing below reads every row).
__device__ __forceinline__ void FoldParts(const isa::PackRowsArgs& a, const isa::MachineView& m, ConsumerContext& ctx) {
  float* x = m.ptr<float>(a.input);
  const float* parts = m.ptr<float>(a.parts);
  const uint32_t end = min(a.row_begin + a.rows, a.m);
  if (isa::PackRowsActivationBytes(a) != 0) {
    SumStaged(reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(parts), a.m * a.k / 4, a.splits,
              reinterpret_cast<float4*>(x), a.row_begin * a.k / 4, end * a.k / 4, false, false, ctx);
    return;
  }
  for (uint32_t i = a.row_begin * a.k + ctx.tid; i < end * a.k; i += kConsumerThreads) {  // (k not whole chunks)
    float sum = x[i];
    for (uint32_t s = 0; s < a.splits; ++s) sum += __ldcg(parts + s * a.m * a.k + i);
    x[i] = sum;
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
}

// A deferred norm's slice (isa::PackRowsArgs::row_norm): the rows' x and parts over the slice, and the slice of the
// norm weight, are copied into the activation slot in one round (cp.async, all in flight together: one round trip
// for up to 48 KB); then each thread adds its 16-byte chunks' parts in part order, stores x and the bf16 image of
// x * w, and leaves the chunk's sum of squares over its x in the slot; a warp per row adds a row's in a fixed order
// (its lanes' chunks in order, then WarpSum) into the slice's slot.
__device__ __forceinline__ void PackSlice(const isa::PackRowsArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  float* x = m.ptr<float>(a.input);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const float4* p4 = a.splits != 0 ? m.ptr<float4>(a.parts) : nullptr;
  const __nv_bfloat16* w = m.ptr<__nv_bfloat16>(a.norm_weight);
  uint8_t* image = m.ptr<uint8_t>(a.out);
  const uint32_t cols = isa::PackRowsColumns(a), per_row = cols / 4, chunks = a.rows * per_row;
  const uint32_t staged = chunks * (a.splits + 1);
  const uint32_t slot = tile::SharedAddress(ctx.act), weights = slot + staged * 16;
  const uint64_t part_stride = static_cast<uint64_t>(a.m) * a.k / 4;  // float4s
  for (uint32_t j = ctx.tid; j < staged; j += kConsumerThreads) {
    const uint32_t part = j / chunks, c = j % chunks;
    const uint64_t at = (static_cast<uint64_t>(a.row_begin + c / per_row) * a.k + a.col_begin) / 4 + c % per_row;
    CpAsync16Shared(slot + j * 16, part == 0 ? x4 + at : p4 + (part - 1) * part_stride + at, 16);
  }
  for (uint32_t j = ctx.tid; j < cols / 8; j += kConsumerThreads) {
    CpAsync16Shared(weights + j * 16, w + a.col_begin + j * 8, 16);
  }
  CpAsyncCommit();
  CpAsyncWait<0>();
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  for (uint32_t c = ctx.tid; c < chunks; c += kConsumerThreads) {
    float4 sum = tile::LoadShared128(slot + c * 16);
    for (uint32_t s = 1; s <= a.splits; ++s) {  // in part order
      const float4 v = tile::LoadShared128(slot + (s * chunks + c) * 16);
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const uint32_t row = a.row_begin + c / per_row, col = a.col_begin + c % per_row * 4;
    if (a.splits != 0) reinterpret_cast<float4*>(x)[(static_cast<uint64_t>(row) * a.k + col) / 4] = sum;
    const float2 wbits = tile::LoadShared64(weights + c % per_row * 8);
    const __nv_bfloat162 w01 = *reinterpret_cast<const __nv_bfloat162*>(&wbits.x);
    const __nv_bfloat162 w23 = *reinterpret_cast<const __nv_bfloat162*>(&wbits.y);
    const float2 f01 = __bfloat1622float2(w01), f23 = __bfloat1622float2(w23);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x * f01.x, sum.y * f01.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(sum.z * f23.x, sum.w * f23.y);
    *reinterpret_cast<uint2*>(image + isa::Swizzled128Offset(a.k, isa::kGemmTileM, row, col)) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    const float sum_sq = sum.x * sum.x + sum.y * sum.y + sum.z * sum.z + sum.w * sum.w;
    tile::StoreShared32(slot + c * 16, __float_as_uint(sum_sq));  // over this thread's own chunk of x
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  float* slots = m.ptr<float>(a.row_norm);
  const uint32_t slices = isa::PackRowsSlices(a);
  for (uint32_t r = ctx.warp; r < a.rows; r += kConsumerWarps) {
    float sum_sq = 0.0f;
    for (uint32_t c = ctx.lane; c < per_row; c += 32) sum_sq += tile::LoadShared32(slot + (r * per_row + c) * 16);
    sum_sq = WarpSum(sum_sq);
    float* row = slots + static_cast<uint64_t>(a.row_begin + r) * isa::kRowNormSlots;
    if (ctx.lane == 0) {
      row[a.col_begin / a.cols] = sum_sq / static_cast<float>(a.k) + a.norm_eps / static_cast<float>(slices);
    }
    if (a.col_begin == 0 && ctx.lane >= slices && ctx.lane < isa::kRowNormSlots) row[ctx.lane] = 0.0f;
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // the slot read out before the next instruction takes it
}

__device__ __forceinline__ void RunPackRows(const isa::PackRowsArgs& a, ConsumerContext& ctx) {
  if (a.row_norm != isa::kNoTensor) {
    PackSlice(a, ctx);
    return;
  }
  const isa::MachineView& m = ctx.machine;
  if (a.splits != 0) FoldParts(a, m, ctx);
  const float* in = m.ptr<float>(a.input);
  uint8_t* image = m.ptr<uint8_t>(a.out);
  const __nv_bfloat16* w = a.norm_weight != isa::kNoTensor ? m.ptr<__nv_bfloat16>(a.norm_weight) : nullptr;
  const uint32_t chunks = isa::GemmSlabs(a.k) * isa::kGemmSlabK / 8;  // of the padded row
  if (w != nullptr && a.k % isa::kGemmSlabK == 0 && chunks <= 32 * kPackBatch) {
    PackNormRowsInRegisters(a, in, w, image, chunks, ctx);
    return;
  }
  const uint32_t first = a.row_begin, end = a.row_begin + a.rows;
  // Chunks of 8 whole columns inside k, 32-byte aligned (k % 8 == 0), load as two float4 and one uint4 of weights.
  const uint32_t vector_chunks = a.k % 8 == 0 ? a.k / 8 : 0;
  for (uint32_t r = first + ctx.warp; r < end; r += kConsumerWarps) {
    const float* x = in + static_cast<uint64_t>(r) * a.k;
    const float scale = w != nullptr && r < a.m ? PackRowScale(a, x, ctx.lane) : 1.0f;
    for (uint32_t ch0 = 0; ch0 < chunks; ch0 += 32 * kPackBatch) {
      uint4 packed[kPackBatch];
#pragma unroll
      for (uint32_t b = 0; b < kPackBatch; ++b) {
        const uint32_t ch = ch0 + b * 32 + ctx.lane;
        __nv_bfloat162 pairs[4];
        if (r < a.m && ch < vector_chunks) {
          const float4 lo = reinterpret_cast<const float4*>(x)[2 * ch], hi = reinterpret_cast<const float4*>(x)[2 * ch + 1];
          float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          if (w != nullptr) {
            const uint4 wq = reinterpret_cast<const uint4*>(w)[ch];
            const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wq);
#pragma unroll
            for (uint32_t j = 0; j < 4; ++j) {
              const float2 f = __bfloat1622float2(w2[j]);
              v[2 * j] = v[2 * j] * scale * f.x;  // the reference's order: (x * scale) * w
              v[2 * j + 1] = v[2 * j + 1] * scale * f.y;
            }
          }
#pragma unroll
          for (uint32_t j = 0; j < 4; ++j) pairs[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
        } else {  // past m or k (zeros), or a k that is not a multiple of 8
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
        }
        packed[b] = *reinterpret_cast<const uint4*>(pairs);
      }
#pragma unroll
      for (uint32_t b = 0; b < kPackBatch; ++b) {
        const uint32_t ch = ch0 + b * 32 + ctx.lane;
        if (ch < chunks) {
          *reinterpret_cast<uint4*>(image + isa::Swizzled128Offset(a.k, isa::kGemmTileM, r, ch * 8)) = packed[b];
        }
      }
    }
  }
}

}  // namespace loom::megakernel
