// MATVEC_W4 on the device: y = W[row_begin : row_begin+rows, :] . x (+ bias), W int4 in groups (isa::MatvecW4Args),
// on the tensor cores.
//
// Each element is dequantized to its exact bf16 value, bf16((u - z) * s) (lop3 puts two nibbles into two bf16 values
// 128 + u, then sub.rn.bf16x2 by 128 + z, exact, and mul.rn.bf16x2 by s, one rounding: the graph's value), and
// multiplied on mma.sync.m16n8k16 (bf16 in, f32 accumulation). A tile is bands of 16 rows (the mma's M); x is B,
// split exactly into three bf16 pieces (x = p0 + p1 + p2: each the top 8 significant bits of what is left, so the
// three hold x's 24 bits) in B's columns 0-2, so each product is exact in f32 and the row's value is the sum of D's
// three columns. Converting x per instruction (in the prologue, 6 bytes a column) rather than per weight keeps the
// page loop free of conversions, which bound MATVEC_FP8 (its ~1000 cycles a 16 KB page against ~1230 of HBM).
//
// Pages are 16 KB: 32 chunks of 512 bytes (16 rows x 64 columns); warp w takes chunks 4w .. 4w+3 of each page. A
// warp sums its chunks of one band in one D and writes one partial sum per row and slot (256 columns where the row
// is a multiple of 256: a warp's four chunks; else 64: each chunk), and the epilogue adds a row's slots in order:
// deterministic, no atomics. The prologue and epilogues are MATVEC's (ops/matvec.cuh).
//
// Activation slot (isa::MatvecW4ActivationBytes): B image [stride / 64][3 pieces][4 lanes][4 steps][2 words] (x, f32,
// arrives at its byte 2 * stride) | 32 zero bytes (the B of lanes 12-31: columns 3-7) | meta [rows / 16][groups][16]
// | partial[rows][slots]
#pragma once

#include <cuda_bf16.h>

#include "megakernel/ops/matvec.cuh"

namespace loom::megakernel {

inline constexpr uint32_t kW4ChunkBytes = isa::kMatvecW4ChunkBytes;
inline constexpr uint32_t kW4ImageChunkBytes = isa::kMatvecW4ChunkColumns * 6;  // 3 bf16 pieces a column
inline constexpr uint32_t kW4ChunksPerWarp = 4;
static_assert(kW4ChunksPerWarp * kConsumerWarps * kW4ChunkBytes == isa::kDecodePageBytes, "a page is every warp's chunks");

// The top 8 significant bits of f (bf16 by truncation: exact, and f minus it is exact in f32).
__device__ __forceinline__ float TopBf16(float f) { return __uint_as_float(__float_as_uint(f) & 0xffff0000u); }

// x's three bf16 pieces in B's fragment order: for chunk j, piece n, lane t (its columns 2t, 2t+1 and 2t+8, 2t+9 of
// each 16-column step s), word 2s + h holds the pair at 16 s + 2 t + 8 h (low half the even column). x (f32) lies
// at byte 2 * stride of the slot and the image is written over it from byte 0, in rounds of kRoundColumns: a round
// reads its columns, waits for every thread's reads, then writes, and a round's writes end (byte 6 * its end
// column) before the next round's reads start (byte 2 * stride + 4 * that column), so one barrier a round orders
// every write after the reads it overwrites.
__device__ __forceinline__ void BuildW4Image(const float* x, uint32_t stride, uint32_t image, uint32_t tid) {
  constexpr uint32_t kPairs = 8;  // column pairs a thread a round
  constexpr uint32_t kRoundColumns = 2 * kPairs * kConsumerThreads;
  for (uint32_t base = 0; base < stride; base += kRoundColumns) {
    float2 v[kPairs];
#pragma unroll
    for (uint32_t i = 0; i < kPairs; ++i) {
      const uint32_t col = base + 2 * (tid + i * kConsumerThreads);
      if (col < stride) v[i] = *reinterpret_cast<const float2*>(x + col);
    }
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
#pragma unroll
    for (uint32_t i = 0; i < kPairs; ++i) {
      const uint32_t col = base + 2 * (tid + i * kConsumerThreads);
      if (col >= stride) continue;
      const uint32_t j = col / 64, c = col % 64, s = c / 16, kk = c % 16;
      const uint32_t word = j * kW4ImageChunkBytes + ((kk % 8) / 2) * 32 + s * 8 + (kk / 8) * 4;
      float r0 = v[i].x, r1 = v[i].y;
#pragma unroll
      for (uint32_t n = 0; n < 3; ++n) {
        const float p0 = TopBf16(r0), p1 = TopBf16(r1);
        tile::StoreShared32(image + word + n * 128, (__float_as_uint(p1) & 0xffff0000u) | (__float_as_uint(p0) >> 16));
        r0 -= p0;
        r1 -= p1;
      }
    }
  }
}

// Register i of a step's A fragment from the lane's word: nibbles i and i + 4 as the bf16 pair (128 + u0, 128 + u1).
template <uint32_t kI>
__device__ __forceinline__ uint32_t W4Pair(uint32_t word) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(word >> (4 * kI)), "n"(0x000f000f), "n"(0x43004300));
  return r;
}
// (pair - zero) * scale, each a bf16x2: the subtraction exact, the product rounded once.
__device__ __forceinline__ uint32_t W4Dequant(uint32_t pair, uint32_t zero, uint32_t scale) {
  uint32_t d, r;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(pair), "r"(zero));
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(d), "r"(scale));
  return r;
}
__device__ __forceinline__ uint32_t Broadcast16(uint32_t word, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(word), "r"(selector));
  return r;
}
__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The scale and zero point of rows g and g + 8 of `band` for group `group`, as bf16 pairs.
struct W4Meta {
  uint32_t scale_lo, zero_lo, scale_hi, zero_hi;
};
__device__ __forceinline__ W4Meta LoadW4Meta(uint32_t meta, uint32_t band, uint32_t group, uint32_t groups,
                                             uint32_t g) {
  const uint32_t at = meta + ((band * groups + group) * isa::kMatvecW4BandRows + g) * 4;
  const uint32_t lo = __float_as_uint(tile::LoadShared32(at)), hi = __float_as_uint(tile::LoadShared32(at + 32));
  return {Broadcast16(lo, 0x1010), Broadcast16(lo, 0x3232), Broadcast16(hi, 0x1010), Broadcast16(hi, 0x3232)};
}

// Row g's and row g + 8's sums of D (columns 0-2: the pieces), into their partial-sum slot; D is cleared.
__device__ __forceinline__ void FlushW4(float (&d)[4], uint32_t band, uint32_t slot, uint32_t slots, uint32_t lane,
                                        float* partial) {
  float lo = d[0] + d[1], hi = d[2] + d[3];  // lane 4g + t: columns 2t, 2t + 1
  lo += __shfl_down_sync(0xffffffffu, lo, 1);
  hi += __shfl_down_sync(0xffffffffu, hi, 1);
  const uint32_t row = band * isa::kMatvecW4BandRows + (lane >> 2);
  if ((lane & 3) == 0) {
    partial[row * slots + slot] = lo;
    partial[(row + 8) * slots + slot] = hi;
  }
  d[0] = d[1] = d[2] = d[3] = 0.0f;
}

// kStepsPerGroup: 16-column steps a group holds within a chunk (2 for groups of 32, else 4: one group a chunk).
// kQuad: rows a multiple of 256 columns, so a warp's four chunks of a page are one band's consecutive columns.
template <uint32_t kStepsPerGroup, bool kQuad>
__device__ __forceinline__ void StreamW4(const isa::MatvecW4Args& a, uint32_t stride, ConsumerContext& ctx,
                                         uint32_t image, uint32_t zero, uint32_t meta, float* partial) {
  const uint32_t chunks_per_band = stride / isa::kMatvecW4ChunkColumns;
  const uint32_t tile_chunks = a.rows / isa::kMatvecW4BandRows * chunks_per_band;
  const uint32_t groups = isa::MatvecW4Groups(a.k, a.group_shift);
  const uint32_t slots = stride / isa::MatvecW4SlotColumns(stride);
  const uint32_t g = ctx.lane >> 2, t = ctx.lane & 3;
  // B: lanes of groups 0-2 read their piece's 32 bytes of each chunk's image; the others the zero block.
  const uint32_t b_lane = g < 3 ? image + (g * 4 + t) * 32 : zero;
  const uint32_t b_stride = g < 3 ? kW4ImageChunkBytes : 0;
  const uint32_t warp_first = ctx.warp * kW4ChunksPerWarp;
  uint32_t band = warp_first / chunks_per_band, cc = warp_first % chunks_per_band;  // this warp's next chunk
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (uint32_t page_start = 0; page_start < tile_chunks; page_start += kConsumerWarps * kW4ChunksPerWarp) {
    const uint32_t page = tile::SharedAddress(ctx.AcquirePage()) + warp_first * kW4ChunkBytes + ctx.lane * 16;
    const bool mine = page_start + warp_first < tile_chunks;  // the same for the warp: mma.sync needs every lane
    const uint32_t quad_band = band, quad_slot = cc / 4;
#pragma unroll
    for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
      if (page_start + warp_first + s < tile_chunks) {
        const uint4 q = tile::LoadShared128Bits(page + s * kW4ChunkBytes);
        const uint4 b01 = tile::LoadShared128Bits(b_lane + cc * b_stride);
        const uint4 b23 = tile::LoadShared128Bits(b_lane + cc * b_stride + 16);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
        const uint32_t b[8] = {b01.x, b01.y, b01.z, b01.w, b23.x, b23.y, b23.z, b23.w};
        W4Meta m;
#pragma unroll
        for (uint32_t step = 0; step < 4; ++step) {
          if (step % kStepsPerGroup == 0) {
            m = LoadW4Meta(meta, band, (cc * isa::kMatvecW4ChunkColumns + step * 16) >> a.group_shift, groups, g);
          }
          const uint32_t w = words[step];
          MmaBf16(d, W4Dequant(W4Pair<0>(w), m.zero_lo, m.scale_lo), W4Dequant(W4Pair<1>(w), m.zero_hi, m.scale_hi),
                  W4Dequant(W4Pair<2>(w), m.zero_lo, m.scale_lo), W4Dequant(W4Pair<3>(w), m.zero_hi, m.scale_hi),
                  b[2 * step], b[2 * step + 1]);
        }
        if (!kQuad) FlushW4(d, band, cc, slots, ctx.lane, partial);
      }
      if (++cc == chunks_per_band) cc = 0, ++band;
    }
    ctx.ReleasePage();
    if (kQuad && mine) FlushW4(d, quad_band, quad_slot, slots, ctx.lane, partial);
    // On to this warp's chunks of the next page.
    cc += (kConsumerWarps - 1) * kW4ChunksPerWarp;
    while (cc >= chunks_per_band) cc -= chunks_per_band, ++band;
  }
}

__device__ __forceinline__ void RunMatvecW4(const isa::MatvecW4Args& a, ConsumerContext& ctx) {
  const uint32_t stride = isa::MatvecW4RowStride(a.k);  // the padded row from here on
  const uint32_t groups = isa::MatvecW4Groups(a.k, a.group_shift);
  const uint32_t image = tile::SharedAddress(ctx.act);
  float* x = ctx.act + stride / 2;  // byte 2 * stride: the image's last two thirds (BuildW4Image)
  const uint32_t zero = image + 6 * stride;
  const uint32_t meta = zero + 32;
  float* partial = ctx.act + (6 * stride + 32) / 4 + a.rows * groups;
  // The tile's meta words (contiguous: whole bands), copied beside x; MatvecPrologue's wait covers them.
  const uint32_t meta_words = a.rows * groups;
  const uint4* meta_src = ctx.machine.ptr<uint4>(a.meta) + a.row_begin * groups / 4;
  for (uint32_t j = ctx.tid; j < meta_words / 4; j += kConsumerThreads) {
    CpAsync16Shared(meta + 16 * j, meta_src + j, 16);
  }
  CpAsyncCommit();
  if (ctx.tid < 8) tile::StoreShared32(zero + 4 * ctx.tid, 0u);
  const MatvecEpilogueInputs in = MatvecPrologue(a, stride, ctx, x);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // The input observed in the data: its wait ended here (the trace's "waits met").
  if (ctx.ready != nullptr && ctx.tid == 0 && (ctx.flags & isa::kFlagTaggedInput)) *ctx.ready = GlobalTimer();
  BuildW4Image(x, stride, image, ctx.tid);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  const bool quad = isa::MatvecW4SlotColumns(stride) == 256;
  if (a.group_shift == 5) {
    if (quad) {
      StreamW4<2, true>(a, stride, ctx, image, zero, meta, partial);
    } else {
      StreamW4<2, false>(a, stride, ctx, image, zero, meta, partial);
    }
  } else if (quad) {
    StreamW4<4, true>(a, stride, ctx, image, zero, meta, partial);
  } else {
    StreamW4<4, false>(a, stride, ctx, image, zero, meta, partial);
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  FinishMatvec(a, ctx, in, partial, stride / isa::MatvecW4SlotColumns(stride));
}

}  // namespace loom::megakernel
