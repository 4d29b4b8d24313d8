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
// warp sums its chunks of one band in accumulators of its own and writes one partial sum per row and slot
// (isa::MatvecW4Slots), and the epilogue adds a row's slots in order: deterministic, no atomics. The tile's meta
// words come through the ring first (the loader streams them with the weights, so they are not a load on the
// critical path). The prologue and epilogues are MATVEC's (ops/matvec.cuh).
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
static_assert(kW4ChunksPerWarp * kConsumerWarps * kW4ChunkBytes == isa::kDecodePageBytes,
              "a page is every warp's chunks");

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

// Row g's and row g + 8's sums of the chunks' accumulators (each D's columns 0-2: the pieces), into their
// partial-sum slot, in a fixed order; the accumulators are cleared.
template <uint32_t kAcc>
__device__ __forceinline__ void FlushW4(float (&d)[kAcc][4], uint32_t band, uint32_t slot, uint32_t slots,
                                        uint32_t lane, float* partial) {
  float e[4];
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
    e[i] = kAcc == 4 ? (d[0][i] + d[1][i]) + (d[2 % kAcc][i] + d[3 % kAcc][i]) : d[0][i];
#pragma unroll
    for (uint32_t c = 0; c < kAcc; ++c) d[c][i] = 0.0f;
  }
  float lo = e[0] + e[1], hi = e[2] + e[3];  // lane 4g + t: columns 2t, 2t + 1
  lo += __shfl_down_sync(0xffffffffu, lo, 1);
  hi += __shfl_down_sync(0xffffffffu, hi, 1);
  const uint32_t row = band * isa::kMatvecW4BandRows + (lane >> 2);
  if ((lane & 3) == 0) {
    partial[row * slots + slot] = lo;
    partial[(row + 8) * slots + slot] = hi;
  }
}

// The four 16-column steps of one chunk: A from the page (the lane's 16 bytes), B from the image, into d.
template <uint32_t kStepsPerGroup>
__device__ __forceinline__ void W4Chunk(uint32_t page_chunk, uint32_t b_chunk, uint32_t meta, uint32_t band,
                                        uint32_t cc, uint32_t group_shift, uint32_t groups, uint32_t g,
                                        float (&d)[4]) {
  const uint4 q = tile::LoadShared128Bits(page_chunk);
  const uint4 b01 = tile::LoadShared128Bits(b_chunk);
  const uint4 b23 = tile::LoadShared128Bits(b_chunk + 16);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  const uint32_t b[8] = {b01.x, b01.y, b01.z, b01.w, b23.x, b23.y, b23.z, b23.w};
  W4Meta m;
#pragma unroll
  for (uint32_t step = 0; step < 4; ++step) {
    if (step % kStepsPerGroup == 0) {
      m = LoadW4Meta(meta, band, (cc * isa::kMatvecW4ChunkColumns + step * 16) >> group_shift, groups, g);
    }
    const uint32_t w = words[step];
    MmaBf16(d, W4Dequant(W4Pair<0>(w), m.zero_lo, m.scale_lo), W4Dequant(W4Pair<1>(w), m.zero_hi, m.scale_hi),
            W4Dequant(W4Pair<2>(w), m.zero_lo, m.scale_lo), W4Dequant(W4Pair<3>(w), m.zero_hi, m.scale_hi),
            b[2 * step], b[2 * step + 1]);
  }
}

// A warp's four consecutive chunks of one band (columns 64 cc ..), into one accumulator each.
template <uint32_t kStepsPerGroup>
__device__ __forceinline__ void W4Quad(uint32_t page_chunk, uint32_t b_chunk, uint32_t b_stride, uint32_t meta,
                                       uint32_t band, uint32_t cc, uint32_t group_shift, uint32_t groups, uint32_t g,
                                       float (&d)[kW4ChunksPerWarp][4]) {
  constexpr uint32_t kMetas = 4 / kStepsPerGroup;  // groups a chunk
  uint4 q[kW4ChunksPerWarp], b01[kW4ChunksPerWarp], b23[kW4ChunksPerWarp];
  W4Meta m[kW4ChunksPerWarp][kMetas];
#pragma unroll
  for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
    q[s] = tile::LoadShared128Bits(page_chunk + s * kW4ChunkBytes);
    b01[s] = tile::LoadShared128Bits(b_chunk + s * b_stride);
    b23[s] = tile::LoadShared128Bits(b_chunk + s * b_stride + 16);
#pragma unroll
    for (uint32_t h = 0; h < kMetas; ++h) {
      const uint32_t column = (cc + s) * isa::kMatvecW4ChunkColumns + h * kStepsPerGroup * 16;
      m[s][h] = LoadW4Meta(meta, band, column >> group_shift, groups, g);
    }
  }
#pragma unroll
  for (uint32_t step = 0; step < 4; ++step) {
#pragma unroll
    for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
      const uint32_t w = step == 0 ? q[s].x : step == 1 ? q[s].y : step == 2 ? q[s].z : q[s].w;
      const uint32_t b0 = step < 2 ? (step == 0 ? b01[s].x : b01[s].z) : (step == 2 ? b23[s].x : b23[s].z);
      const uint32_t b1 = step < 2 ? (step == 0 ? b01[s].y : b01[s].w) : (step == 2 ? b23[s].y : b23[s].w);
      const W4Meta& mm = m[s][step / kStepsPerGroup];
      MmaBf16(d[s], W4Dequant(W4Pair<0>(w), mm.zero_lo, mm.scale_lo), W4Dequant(W4Pair<1>(w), mm.zero_hi, mm.scale_hi),
              W4Dequant(W4Pair<2>(w), mm.zero_lo, mm.scale_lo), W4Dequant(W4Pair<3>(w), mm.zero_hi, mm.scale_hi),
              b0, b1);
    }
  }
}

// kStepsPerGroup: 16-column steps a group holds within a chunk (2 for groups of 32, else 4: one group a chunk).
// kMode (isa::MatvecW4Slots): 2, rows a multiple of 2048 columns: every page is 32 chunks of one band and a warp
// keeps a chunk's accumulator each over the band's pages (its four chunks' mma chains independent), one slot a warp;
// 1, a multiple of 256: a warp's four chunks of a page are one band's consecutive columns, one slot a page; 0: a
// slot a chunk.
template <uint32_t kStepsPerGroup, uint32_t kMode>
__device__ __forceinline__ void StreamW4(const isa::MatvecW4Args& a, uint32_t stride, ConsumerContext& ctx,
                                         uint32_t image, uint32_t zero, uint32_t meta, float* partial) {
  constexpr uint32_t kAcc = kMode == 0 ? 1 : kW4ChunksPerWarp;
  const uint32_t chunks_per_band = stride / isa::kMatvecW4ChunkColumns;
  const uint32_t tile_chunks = a.rows / isa::kMatvecW4BandRows * chunks_per_band;
  const uint32_t groups = isa::MatvecW4Groups(a.k, a.group_shift);
  const uint32_t slots = isa::MatvecW4Slots(stride);
  const uint32_t g = ctx.lane >> 2, t = ctx.lane & 3;
  // B: lanes of groups 0-2 read their piece's 32 bytes of each chunk's image; the others the zero block.
  const uint32_t b_lane = g < 3 ? image + (g * 4 + t) * 32 : zero;
  const uint32_t b_stride = g < 3 ? kW4ImageChunkBytes : 0;
  constexpr uint32_t kPageChunks = kConsumerWarps * kW4ChunksPerWarp;
  const uint32_t warp_first = ctx.warp * kW4ChunksPerWarp;
  uint32_t band = warp_first / chunks_per_band, cc = warp_first % chunks_per_band;  // this warp's next chunk
  float d[kAcc][4] = {};
  for (uint32_t page_start = 0; page_start < tile_chunks; page_start += kPageChunks) {
    const uint32_t page = tile::SharedAddress(ctx.AcquirePage()) + warp_first * kW4ChunkBytes + ctx.lane * 16;
    const bool mine = page_start + warp_first < tile_chunks;  // the same for the warp: mma.sync needs every lane
    const uint32_t page_band = band, page_slot = kMode == 2 ? ctx.warp : cc / 4;
    if constexpr (kMode != 0) {
      // The warp's four chunks are one band's consecutive columns: every load first, then the four chunks' mma
      // chains interleaved step by step (four independent accumulators), so no chain waits on a load or on itself.
      if (mine) {
        W4Quad<kStepsPerGroup>(page, b_lane + cc * b_stride, b_stride, meta, band, cc, a.group_shift, groups, g, d);
      }
      cc += kW4ChunksPerWarp;
      if (cc >= chunks_per_band) cc -= chunks_per_band, ++band;
    } else {
#pragma unroll
      for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
        if (page_start + warp_first + s < tile_chunks) {
          W4Chunk<kStepsPerGroup>(page + s * kW4ChunkBytes, b_lane + cc * b_stride, meta, band, cc, a.group_shift,
                                  groups, g, d[0]);
          FlushW4(d, band, cc, slots, ctx.lane, partial);
        }
        if (++cc == chunks_per_band) cc = 0, ++band;
      }
    }
    ctx.ReleasePage();
    // On to this warp's chunks of the next page.
    cc += kPageChunks - kW4ChunksPerWarp;
    while (cc >= chunks_per_band) cc -= chunks_per_band, ++band;
    // Mode 2: the band's last page (the warp's next chunk is in the next band).
    if (kMode == 1 && mine) FlushW4(d, page_band, page_slot, slots, ctx.lane, partial);
    if (kMode == 2 && mine && band != page_band) FlushW4(d, page_band, page_slot, slots, ctx.lane, partial);
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
  if (ctx.tid < 8) tile::StoreShared32(zero + 4 * ctx.tid, 0u);
  const MatvecEpilogueInputs in = MatvecPrologue(a, stride, ctx, x);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // The input observed in the data: its wait ended here (the trace's "waits met").
  if (ctx.ready != nullptr && ctx.tid == 0 && (ctx.flags & isa::kFlagTaggedInput)) *ctx.ready = GlobalTimer();
  BuildW4Image(x, stride, image, ctx.tid);
  // The tile's meta words, the first of its pages through the ring (the loader's hook), copied into the slot: after
  // the input's wait, which their load overlaps.
  const uint32_t meta_bytes = static_cast<uint32_t>(isa::MatvecW4MetaBytes(a.rows, a.k, a.group_shift));
  for (uint32_t done = 0; done < meta_bytes; done += ctx.page_bytes) {
    const uint32_t page = tile::SharedAddress(ctx.AcquirePage());
    const uint32_t bytes = min(ctx.page_bytes, meta_bytes - done);
    for (uint32_t j = 16 * ctx.tid; j < bytes; j += 16 * kConsumerThreads) {
      tile::StoreShared128(meta + done + j, tile::LoadShared128Bits(page + j));
    }
    ctx.ReleasePage();
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  const uint32_t mode = stride % 2048 == 0 ? 2 : stride % 256 == 0 ? 1 : 0;
  if (a.group_shift == 5) {
    if (mode == 2) {
      StreamW4<2, 2>(a, stride, ctx, image, zero, meta, partial);
    } else if (mode == 1) {
      StreamW4<2, 1>(a, stride, ctx, image, zero, meta, partial);
    } else {
      StreamW4<2, 0>(a, stride, ctx, image, zero, meta, partial);
    }
  } else if (mode == 2) {
    StreamW4<4, 2>(a, stride, ctx, image, zero, meta, partial);
  } else if (mode == 1) {
    StreamW4<4, 1>(a, stride, ctx, image, zero, meta, partial);
  } else {
    StreamW4<4, 0>(a, stride, ctx, image, zero, meta, partial);
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  FinishMatvec(a, ctx, in, partial, isa::MatvecW4Slots(stride));
}

}  // namespace loom::megakernel
