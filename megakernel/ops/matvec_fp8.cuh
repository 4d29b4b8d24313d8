// MATVEC_FP8 on the device: y = scales[rows] * (W[row_begin : row_begin+rows, :] . x) (+ bias), W e4m3, x f32.
//
// The tile is rows * stride bytes (stride = isa::MatvecFp8RowStride(k): rows padded with zeros to a multiple of 512
// columns), contiguous in the packed weight, and arrives through the ring in 16 KB pages (the decode variant's:
// isa::CheckPageBytes refuses others). Each consumer warp takes 4 runs of 512 bytes of a page (2048 columns); lane l
// loads 16 bytes of each run, which hold columns 128 q + 4 l + e (isa::MatvecFp8Position), widens them with
// cvt.rn.f16x2.e4m3x2 (exact: every e4m3 value is an f16 value) and multiplies them by x in f32. A warp sums its
// runs while they stay in one partial-sum slot (2048 columns where the row allows: a warp's whole share of a
// page, else 512) and writes each slot's sum once: deterministic, no atomics. The prologue (input, RMSNorm) and the
// epilogues are MATVEC's (ops/matvec.cuh), the row's scale applied to its sum there.
//
// Activation slot: x[stride] | partial[rows * stride / slot]   (floats)
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "megakernel/ops/matvec.cuh"

namespace loom::megakernel {

inline constexpr uint32_t kFp8RunBytes = isa::kMatvecFp8RowAlign;  // a warp's 16-byte loads, once over its lanes
inline constexpr uint32_t kFp8Runs = 4;                            // runs of a warp in a 16 KB page
inline constexpr uint32_t kFp8PageElems = isa::kDecodePageBytes;   // one byte an element
static_assert(kFp8Runs * kConsumerWarps * kFp8RunBytes == kFp8PageElems, "a page is every warp's runs");
static_assert(kFp8Runs * kFp8RunBytes == isa::kMatvecFp8WarpColumns, "a warp's share is one wide slot");

// acc + the dot of word q of a lane's 16 bytes (4 e4m3 values) with the float4 of x they multiply.
__device__ __forceinline__ float Fp8Dot4(uint32_t w, const float4& x, float acc) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  acc = fmaf(a.x, x.x, acc);
  acc = fmaf(a.y, x.y, acc);
  acc = fmaf(b.x, x.z, acc);
  acc = fmaf(b.y, x.w, acc);
  return acc;
}
__device__ __forceinline__ float Fp8Dot16(const uint4& w, const float4 (&x)[4], float acc) {
  acc = Fp8Dot4(w.x, x[0], acc);
  acc = Fp8Dot4(w.y, x[1], acc);
  acc = Fp8Dot4(w.z, x[2], acc);
  return Fp8Dot4(w.w, x[3], acc);
}

// The 4 float4s of x a lane multiplies in the run that starts at column `col` (shared memory).
__device__ __forceinline__ void LoadFp8X(uint32_t x_lane, uint32_t col, float4 (&xr)[4]) {
#pragma unroll
  for (uint32_t q = 0; q < 4; ++q) xr[q] = tile::LoadShared128(x_lane + (col + 128 * q) * 4);
}

// Rows that tile the page (16384 % stride == 0) in slots of a warp's share (stride % 2048 == 0): a warp covers the
// same columns in every page and keeps its x in registers for the tile; each lane keeps one sum per page for a
// batch of 8 pages, reduced together (MultiWarpSum8).
__device__ __forceinline__ void StreamFp8XInRegisters(uint32_t tile_elems, uint32_t k, ConsumerContext& ctx,
                                                      const float* x, float* partial) {
  constexpr uint32_t kBatch = 8;
  const uint32_t warp_offset = ctx.warp * isa::kMatvecFp8WarpColumns;  // the warp's slot starts here in every page
  const uint32_t x_lane = tile::SharedAddress(x) + ctx.lane * 16;
  float4 xr[kFp8Runs][4];
#pragma unroll
  for (uint32_t s = 0; s < kFp8Runs; ++s) LoadFp8X(x_lane, (warp_offset + s * kFp8RunBytes) % k, xr[s]);
  const uint32_t lane_bytes = warp_offset + ctx.lane * 16;
  for (uint32_t batch_start = 0; batch_start < tile_elems; batch_start += kBatch * kFp8PageElems) {
    float v[kBatch];
#pragma unroll
    for (uint32_t j = 0; j < kBatch; ++j) {
      const uint32_t page_start = batch_start + j * kFp8PageElems;
      v[j] = 0.0f;
      if (page_start < tile_elems) {  // the same for every consumer: pages stay in ring order
        const uint32_t page = tile::SharedAddress(ctx.AcquirePage()) + lane_bytes;
        if (page_start + warp_offset < tile_elems) {  // a warp's slot is all in the tile or all out
          uint4 w[kFp8Runs];
#pragma unroll
          for (uint32_t s = 0; s < kFp8Runs; ++s) w[s] = tile::LoadShared128Bits(page + s * kFp8RunBytes);
          float dot[kFp8Runs];
#pragma unroll
          for (uint32_t s = 0; s < kFp8Runs; ++s) dot[s] = Fp8Dot16(w[s], xr[s], 0.0f);
#pragma unroll
          for (uint32_t s = 0; s < kFp8Runs; ++s) v[j] += dot[s];
        }
        ctx.ReleasePage();
      }
    }
    const float sum = MultiWarpSum8(v, ctx.lane);
    const uint32_t e0 = batch_start + MultiWarpSumIndex(ctx.lane) * kFp8PageElems + warp_offset;
    if ((ctx.lane & 3) == 0 && e0 < tile_elems) partial[e0 / isa::kMatvecFp8WarpColumns] = sum;
  }
}

// Any other row (a multiple of 512 columns): a warp's runs fall on other columns in every page, so x comes from the
// slot per run (4 conflict-free ld.shared.v4 per 16 weight bytes). kSlots: partial-sum slots in a warp's share (1
// with slots of 2048 columns, 4 with slots of 512); a lane keeps one sum per slot and page, and the warp reduces 8
// of them together every 8 / kSlots pages.
template <uint32_t kSlots>
__device__ __forceinline__ void StreamFp8XShared(uint32_t tile_elems, uint32_t k, ConsumerContext& ctx,
                                                 const float* x, float* partial) {
  static_assert(kFp8Runs % kSlots == 0 && 8 % kSlots == 0, "whole slots per warp, 8 sums per reduction");
  constexpr uint32_t kPages = 8 / kSlots, kRunsPerSlot = kFp8Runs / kSlots;
  constexpr uint32_t kSlotElems = kRunsPerSlot * kFp8RunBytes;
  const uint32_t warp_offset = ctx.warp * isa::kMatvecFp8WarpColumns;
  const uint32_t page_advance = kFp8PageElems % k;  // the warp's first column moves by this per page
  const uint32_t x_lane = tile::SharedAddress(x) + ctx.lane * 16;
  uint32_t col = warp_offset % k;
  for (uint32_t batch_start = 0; batch_start < tile_elems; batch_start += kPages * kFp8PageElems) {
    float v[8];
#pragma unroll
    for (uint32_t j = 0; j < kPages; ++j) {
      const uint32_t page_start = batch_start + j * kFp8PageElems;
#pragma unroll
      for (uint32_t t = 0; t < kSlots; ++t) v[j * kSlots + t] = 0.0f;
      if (page_start < tile_elems) {  // the same for every consumer: pages stay in ring order
        const uint32_t page = tile::SharedAddress(ctx.AcquirePage()) + warp_offset + ctx.lane * 16;
        uint32_t c = col;
#pragma unroll
        for (uint32_t s = 0; s < kFp8Runs; ++s) {
          if (page_start + warp_offset + s * kFp8RunBytes < tile_elems) {
            const uint4 w = tile::LoadShared128Bits(page + s * kFp8RunBytes);
            float4 xr[4];
            LoadFp8X(x_lane, c, xr);
            v[j * kSlots + s / kRunsPerSlot] = Fp8Dot16(w, xr, v[j * kSlots + s / kRunsPerSlot]);
          }
          c += kFp8RunBytes;
          if (c >= k) c -= k;
        }
        ctx.ReleasePage();
      }
      col += page_advance;
      if (col >= k) col -= k;
    }
    const float sum = MultiWarpSum8(v, ctx.lane);
    const uint32_t i = MultiWarpSumIndex(ctx.lane);
    const uint32_t e0 = batch_start + (i / kSlots) * kFp8PageElems + warp_offset + (i % kSlots) * kSlotElems;
    if ((ctx.lane & 3) == 0 && e0 < tile_elems) partial[e0 / kSlotElems] = sum;
  }
}

__device__ __forceinline__ void RunMatvecFp8(const isa::MatvecFp8Args& a, ConsumerContext& ctx) {
  const uint32_t k = isa::MatvecFp8RowStride(a.k);  // the padded row from here on
  float* x = ctx.act;
  const uint32_t slot_elems = isa::MatvecFp8SlotElems(k);
  float* partial = x + k;
  const MatvecEpilogueInputs in = MatvecPrologue(a, k, ctx, x);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // The input observed in the data: its wait ended here (the trace's "waits met").
  if (ctx.ready != nullptr && ctx.tid == 0 && (ctx.flags & isa::kFlagTaggedInput)) *ctx.ready = GlobalTimer();
  ctx.Mark(0);
  const uint32_t tile_elems = a.rows * k;  // 32-bit element indices: the host checks rows * stride < 2^32
  if (kFp8PageElems % k == 0 && slot_elems == isa::kMatvecFp8WarpColumns) {
    StreamFp8XInRegisters(tile_elems, k, ctx, x, partial);
  } else if (slot_elems == isa::kMatvecFp8WarpColumns) {
    StreamFp8XShared<1>(tile_elems, k, ctx, x, partial);
  } else {
    StreamFp8XShared<4>(tile_elems, k, ctx, x, partial);
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  ctx.Mark(1);
  FinishMatvec(a, ctx, in, partial, k / slot_elems);
}

}  // namespace loom::megakernel
