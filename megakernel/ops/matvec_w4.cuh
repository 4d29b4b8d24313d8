// MATVEC_W4 on the device: y = W[row_begin : row_begin+rows, :] . x (+ bias), W int4 in groups (isa::MatvecW4Args),
// on the tensor cores.
//
// For each row and group the value is s * (sum (128 + u) x - (128 + z) sum x), in f32: lop3 puts two nibbles into
// two bf16 values 128 + u (exact), mma.sync.m16n8k16 multiplies them by x split exactly into three bf16 pieces (x =
// p0 + p1 + p2, each the top 8 significant bits of what is left, in B's columns 0-2), so each product is exact in f32;
// then the group's part of the accumulator takes the zero point's term (x's sum over the same columns, from the
// prologue) and the scale, and is added into the row's sum. Two integer operations and a quarter of an mma a pair of
// weights: dequantizing each element to bf16 first (a subtract and a multiply more a pair) made the page loop issue
// 364 instructions a warp per 16 KB page and run at 21 GB/s an SM, below HBM's 34 (H200).
//
// Pages are 16 KB: 32 chunks of 512 bytes (16 rows x 64 columns); warp w takes chunks 4w .. 4w+3 of each page. A
// warp sums its chunks of one band in running sums of its own and writes one partial sum per row and slot
// (isa::MatvecW4Slots), and the epilogue adds a row's slots in order: deterministic, no atomics. The tile's meta
// words come through the ring first (the loader streams them with the weights, so they are not a load on the
// critical path). The prologue and epilogues are MATVEC's (ops/matvec.cuh).
//
// Activation slot (isa::MatvecW4ActivationBytes): B image [columns / 64][3 pieces][4 lanes][4 steps][2 words] (x,
// f32, arrives at its byte 2 * columns) | 32 zero bytes (the B of lanes 12-31: columns 3-7) | meta [rows / 16][groups]
// [16] | partial[rows][row slots] | x's sums over isa::MatvecW4SumColumns. `columns` is the padded row's, or for a row
// in pieces (isa::MatvecW4Pieces: wider than 16384 columns) a piece's: the piece's x is loaded, its image built and
// its pages (each band's part of the piece, whole pages) streamed, then the next piece's.
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
// every write after the reads it overwrites. A warp's pairs of one round are 64 consecutive columns (a chunk): their
// sums over kSumColumns (32 or 64: isa::MatvecW4SumColumns) go to `sums`, reduced in a fixed order.
template <uint32_t kSumColumns>
__device__ __forceinline__ void BuildW4Image(const float* x, uint32_t stride, uint32_t image, float* sums,
                                             uint32_t tid) {
  constexpr uint32_t kPairs = 8;  // column pairs a thread a round
  constexpr uint32_t kRoundColumns = 2 * kPairs * kConsumerThreads;
  const uint32_t lane = tid % 32;
  for (uint32_t base = 0; base < stride; base += kRoundColumns) {
    float2 v[kPairs];
#pragma unroll
    for (uint32_t i = 0; i < kPairs; ++i) {
      const uint32_t col = base + 2 * (tid + i * kConsumerThreads);
      v[i] = col < stride ? *reinterpret_cast<const float2*>(x + col) : float2{0.0f, 0.0f};
    }
    // The eight sums' shuffles level by level (independent chains: eight chains one after another made this
    // prologue 2.7 us longer on a 14336-column row, H200); whole warps: stride is a multiple of 64, so a warp's
    // chunk is in or out.
    float sum[kPairs];
#pragma unroll
    for (uint32_t i = 0; i < kPairs; ++i) sum[i] = v[i].x + v[i].y;
#pragma unroll
    for (uint32_t d = 1; d < kSumColumns / 2; d *= 2) {
#pragma unroll
      for (uint32_t i = 0; i < kPairs; ++i) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], d);
    }
#pragma unroll
    for (uint32_t i = 0; i < kPairs; ++i) {
      const uint32_t col = base + 2 * (tid + i * kConsumerThreads);
      if (lane % (kSumColumns / 2) == 0 && col < stride) sums[col / kSumColumns] = sum[i];
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
__device__ __forceinline__ void MmaBf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// One 16-column step: the lane's word of nibbles (its A fragment, as 128 + u) times B into d.
__device__ __forceinline__ void MmaW4Step(float (&d)[4], uint32_t word, uint32_t b0, uint32_t b1) {
  MmaBf16(d, W4Pair<0>(word), W4Pair<1>(word), W4Pair<2>(word), W4Pair<3>(word), b0, b1);
}

// A lane's running sums of rows g (lo) and g + 8 (hi) over its columns of D (2t, 2t + 1: lanes t = 0, 1 hold the
// three pieces between them, lanes 2, 3 zeros), each group's part already scaled.
struct W4Sums {
  float lo = 0.0f, hi = 0.0f;
};

// Adds e, D over one group's part of a band (four values: rows g, g + 8 at the lane's two columns), into the sums:
// less (128 + z) times x's sum over the same columns (`xsum`, given to lanes t = 0 only, so the term counts once a
// row), times the group's scale. `meta_at`: the group's word of row g (row g + 8's 32 bytes on).
__device__ __forceinline__ void FoldW4(const float (&e)[4], uint32_t meta_at, float xsum, W4Sums& sums) {
  const uint32_t lo = __float_as_uint(tile::LoadShared32(meta_at));
  const uint32_t hi = __float_as_uint(tile::LoadShared32(meta_at + 32));
  // 128 + z: the bytes 0x43, z, 0, 0 (isa::MatvecW4MetaWord), one permute; the scale: one AND.
  const float e_lo = fmaf(-__uint_as_float(__byte_perm(lo, 0x43000000u, 0x7044)), xsum, e[0] + e[1]);
  const float e_hi = fmaf(-__uint_as_float(__byte_perm(hi, 0x43000000u, 0x7044)), xsum, e[2] + e[3]);
  sums.lo = fmaf(__uint_as_float(lo & isa::kMatvecW4ScaleMask), e_lo, sums.lo);
  sums.hi = fmaf(__uint_as_float(hi & isa::kMatvecW4ScaleMask), e_hi, sums.hi);
}

// Rows g's and g + 8's sums into their partial-sum slot (lanes t = 0 add lane t = 1's), in a fixed order; cleared.
__device__ __forceinline__ void FlushW4(W4Sums& sums, uint32_t band, uint32_t slot, uint32_t slots, uint32_t lane,
                                        float* partial) {
  const float lo = sums.lo + __shfl_down_sync(0xffffffffu, sums.lo, 1);
  const float hi = sums.hi + __shfl_down_sync(0xffffffffu, sums.hi, 1);
  const uint32_t row = band * isa::kMatvecW4BandRows + (lane >> 2);
  if ((lane & 3) == 0) {
    partial[row * slots + slot] = lo;
    partial[(row + 8) * slots + slot] = hi;
  }
  sums = W4Sums{};
}

// Where a lane reads its groups: meta words of band `band`, group `group` at row + (band * groups + group) * 64; x's
// sums (lane t = 0: sum j at xsum + 4 j; the others the zero block, step 0). chunk0: the piece's first chunk (chunks
// and fold units below count from the piece's start, groups from the row's).
struct W4Lane {
  uint32_t meta_row;  // meta + 4 g
  uint32_t groups;
  uint32_t xsum, xsum_step;
  uint32_t chunk0;
  __device__ __forceinline__ uint32_t Meta(uint32_t band, uint32_t group) const {
    return meta_row + (band * groups + group) * (4 * isa::kMatvecW4BandRows);
  }
  __device__ __forceinline__ float Sum(uint32_t j) const { return tile::LoadShared32(xsum + j * xsum_step); }
};

// kFold: the columns one fold covers: 32 (groups of 32: half a chunk, x's sums over 32 columns), 64 (groups of 64:
// a chunk) or 128 (larger groups: two chunks of one group, x's sums over 64 columns added).
template <uint32_t kFold>
inline constexpr uint32_t kW4Halves = kFold == 32 ? 2 : 1;  // accumulators a chunk

// A warp's four consecutive chunks of one band (columns 64 cc .., cc a multiple of 4): every load first, then the
// four chunks' mma chains interleaved step by step (independent accumulators), then the folds.
template <uint32_t kFold>
__device__ __forceinline__ void W4Quad(uint32_t page_chunk, uint32_t b_chunk, uint32_t b_stride, const W4Lane& ln,
                                       uint32_t band, uint32_t cc, uint32_t group_shift, W4Sums& sums) {
  constexpr uint32_t kHalves = kW4Halves<kFold>;
  uint4 q[kW4ChunksPerWarp], b01[kW4ChunksPerWarp], b23[kW4ChunksPerWarp];
#pragma unroll
  for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
    q[s] = tile::LoadShared128Bits(page_chunk + s * kW4ChunkBytes);
    b01[s] = tile::LoadShared128Bits(b_chunk + s * b_stride);
    b23[s] = tile::LoadShared128Bits(b_chunk + s * b_stride + 16);
  }
  float d[kW4ChunksPerWarp * kHalves][4] = {};
#pragma unroll
  for (uint32_t step = 0; step < 4; ++step) {
#pragma unroll
    for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
      const uint32_t w = step == 0 ? q[s].x : step == 1 ? q[s].y : step == 2 ? q[s].z : q[s].w;
      const uint32_t b0 = step < 2 ? (step == 0 ? b01[s].x : b01[s].z) : (step == 2 ? b23[s].x : b23[s].z);
      const uint32_t b1 = step < 2 ? (step == 0 ? b01[s].y : b01[s].w) : (step == 2 ? b23[s].y : b23[s].w);
      MmaW4Step(d[s * kHalves + (kHalves == 2 ? step / 2 : 0)], w, b0, b1);
    }
  }
  if constexpr (kFold == 128) {
#pragma unroll
    for (uint32_t p = 0; p < 2; ++p) {
      float e[4];
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) e[i] = d[2 * p][i] + d[2 * p + 1][i];
      const uint32_t c = cc + 2 * p;
      FoldW4(e, ln.Meta(band, ((ln.chunk0 + c) * isa::kMatvecW4ChunkColumns) >> group_shift),
             ln.Sum(c) + ln.Sum(c + 1), sums);
    }
  } else {
#pragma unroll
    for (uint32_t a = 0; a < kW4ChunksPerWarp * kHalves; ++a) {
      const uint32_t unit = cc * kHalves + a;  // the group (a fold is one group's columns) and its sum of x
      FoldW4(d[a], ln.Meta(band, ln.chunk0 * kHalves + unit), ln.Sum(unit), sums);
    }
  }
}

// One chunk (columns 64 cc ..) of one band into the sums.
template <uint32_t kFold>
__device__ __forceinline__ void W4Chunk(uint32_t page_chunk, uint32_t b_chunk, const W4Lane& ln, uint32_t band,
                                        uint32_t cc, uint32_t group_shift, W4Sums& sums) {
  constexpr uint32_t kHalves = kW4Halves<kFold>;
  const uint4 q = tile::LoadShared128Bits(page_chunk);
  const uint4 b01 = tile::LoadShared128Bits(b_chunk);
  const uint4 b23 = tile::LoadShared128Bits(b_chunk + 16);
  float d[kHalves][4] = {};
  MmaW4Step(d[0], q.x, b01.x, b01.y);
  MmaW4Step(d[0], q.y, b01.z, b01.w);
  MmaW4Step(d[kHalves - 1], q.z, b23.x, b23.y);
  MmaW4Step(d[kHalves - 1], q.w, b23.z, b23.w);
#pragma unroll
  for (uint32_t h = 0; h < kHalves; ++h) {
    const uint32_t unit = cc * kHalves + h;  // x's sum over this fold's columns
    FoldW4(d[h], ln.Meta(band, ((ln.chunk0 * kHalves + unit) * (isa::kMatvecW4ChunkColumns / kHalves)) >> group_shift),
           ln.Sum(unit), sums);
  }
}

// kMode (isa::MatvecW4Slots): 2, rows a multiple of 2048 columns: every page is 32 chunks of one band and a warp
// keeps its sums over the band's pages, one slot a warp; 1, a multiple of 256: a warp's four chunks of a page are one
// band's consecutive columns, one slot a page; 0: a slot a chunk.
// `stride`: the piece's columns (the row's where it is one piece); its partial sums are slots [slot0, slot0 +
// MatvecW4Slots(stride)) of the row's `row_slots`.
template <uint32_t kFold, uint32_t kMode>
__device__ __forceinline__ void StreamW4(const isa::MatvecW4Args& a, uint32_t stride, ConsumerContext& ctx,
                                         uint32_t image, uint32_t zero, const W4Lane& ln, uint32_t slot0,
                                         uint32_t row_slots, float* partial) {
  const uint32_t chunks_per_band = stride / isa::kMatvecW4ChunkColumns;
  const uint32_t tile_chunks = a.rows / isa::kMatvecW4BandRows * chunks_per_band;
  const uint32_t g = ctx.lane >> 2, t = ctx.lane & 3;
  // B: lanes of groups 0-2 read their piece's 32 bytes of each chunk's image; the others the zero block (ln.xsum's
  // step is 0 there too: the same 32 zero bytes).
  const uint32_t b_lane = g < 3 ? image + (g * 4 + t) * 32 : zero;
  const uint32_t b_stride = g < 3 ? kW4ImageChunkBytes : 0;
  constexpr uint32_t kPageChunks = kConsumerWarps * kW4ChunksPerWarp;
  const uint32_t warp_first = ctx.warp * kW4ChunksPerWarp;
  uint32_t band = warp_first / chunks_per_band, cc = warp_first % chunks_per_band;  // this warp's next chunk
  W4Sums sums;
  for (uint32_t page_start = 0; page_start < tile_chunks; page_start += kPageChunks) {
    const uint32_t page = tile::SharedAddress(ctx.AcquirePage()) + warp_first * kW4ChunkBytes + ctx.lane * 16;
    const bool mine = page_start + warp_first < tile_chunks;  // the same for the warp: mma.sync needs every lane
    const uint32_t page_band = band, page_slot = kMode == 2 ? ctx.warp : cc / 4;
    if constexpr (kMode != 0) {
      if (mine) W4Quad<kFold>(page, b_lane + cc * b_stride, b_stride, ln, band, cc, a.group_shift, sums);
      cc += kW4ChunksPerWarp;
      if (cc >= chunks_per_band) cc -= chunks_per_band, ++band;
    } else {
#pragma unroll
      for (uint32_t s = 0; s < kW4ChunksPerWarp; ++s) {
        if (page_start + warp_first + s < tile_chunks) {
          W4Chunk<kFold>(page + s * kW4ChunkBytes, b_lane + cc * b_stride, ln, band, cc, a.group_shift, sums);
          FlushW4(sums, band, slot0 + cc, row_slots, ctx.lane, partial);
        }
        if (++cc == chunks_per_band) cc = 0, ++band;
      }
    }
    ctx.ReleasePage();
    // On to this warp's chunks of the next page.
    cc += kPageChunks - kW4ChunksPerWarp;
    while (cc >= chunks_per_band) cc -= chunks_per_band, ++band;
    // Mode 2: the band's last page (the warp's next chunk is in the next band).
    if (kMode == 1 && mine) FlushW4(sums, page_band, slot0 + page_slot, row_slots, ctx.lane, partial);
    if (kMode == 2 && mine && band != page_band) {
      FlushW4(sums, page_band, slot0 + page_slot, row_slots, ctx.lane, partial);
    }
  }
}

template <uint32_t kFold>
__device__ __forceinline__ void StreamW4Modes(const isa::MatvecW4Args& a, uint32_t stride, ConsumerContext& ctx,
                                              uint32_t image, uint32_t zero, const W4Lane& ln, uint32_t slot0,
                                              uint32_t row_slots, float* partial) {
  if (stride % 2048 == 0) {
    StreamW4<kFold, 2>(a, stride, ctx, image, zero, ln, slot0, row_slots, partial);
  } else if (stride % 256 == 0) {
    StreamW4<kFold, 1>(a, stride, ctx, image, zero, ln, slot0, row_slots, partial);
  } else {
    StreamW4<kFold, 0>(a, stride, ctx, image, zero, ln, slot0, row_slots, partial);
  }
}

// A piece's x (isa::MatvecW4Pieces): input columns [begin, begin + columns) into x, past k zeros; with a tagged input
// each float4 read until it carries this step's tag, as the prologue does.
__device__ __forceinline__ void LoadW4Piece(const isa::MatvecW4Args& a, ConsumerContext& ctx, float* x,
                                            uint32_t begin, uint32_t columns) {
  const uint32_t n = min(a.k, begin + columns) - begin;
  const float* src = ctx.machine.ptr<float>(a.input) + begin;
  IssueMatvecInput(src, x, n, ctx.tid);
  CpAsyncWait<0>();
  if (ctx.flags & isa::kFlagTaggedInput) {
    for (uint32_t j = ctx.tid; j < n / 4; j += kConsumerThreads) {
      AwaitTaggedFloat4(a.input, reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(x), j, ctx);
    }
  }
  for (uint32_t i = n + ctx.tid; i < columns; i += kConsumerThreads) x[i] = 0.0f;
}

// The tile's meta words, the first of its pages through the ring (the loader's hook), copied into the slot: after the
// input's wait, which their load overlaps.
__device__ __forceinline__ void CopyW4Meta(const isa::MatvecW4Args& a, ConsumerContext& ctx, uint32_t meta) {
  const uint32_t meta_bytes = static_cast<uint32_t>(isa::MatvecW4MetaBytes(a.rows, a.k, a.group_shift));
  for (uint32_t done = 0; done < meta_bytes; done += ctx.page_bytes) {
    const uint32_t page = tile::SharedAddress(ctx.AcquirePage());
    const uint32_t bytes = min(ctx.page_bytes, meta_bytes - done);
    for (uint32_t j = 16 * ctx.tid; j < bytes; j += 16 * kConsumerThreads) {
      tile::StoreShared128(meta + done + j, tile::LoadShared128Bits(page + j));
    }
    ctx.ReleasePage();
  }
}

__device__ __forceinline__ W4Lane MakeW4Lane(const ConsumerContext& ctx, uint32_t meta, uint32_t groups,
                                             const float* xsums, uint32_t zero, uint32_t chunk0) {
  const bool first_of_row = (ctx.lane & 3) == 0;
  return W4Lane{meta + 4 * (ctx.lane >> 2), groups,
                first_of_row ? static_cast<uint32_t>(tile::SharedAddress(xsums)) : zero, first_of_row ? 4u : 0u,
                chunk0};
}

// A row in pieces (isa::MatvecW4Pieces; no prologue): piece by piece, its x loaded, its image and sums built over it,
// its pages streamed (whole pages of one band: the slot layout of rows of a multiple of 2048 columns), its partial
// sums in its own slots. The first piece's x is in the slot already.
template <uint32_t kFold>
__device__ __forceinline__ void StreamW4Pieces(const isa::MatvecW4Args& a, ConsumerContext& ctx, uint32_t stride,
                                               uint32_t piece, uint32_t image, uint32_t meta, float* xsums,
                                               float* partial) {
  const uint32_t zero = image + 6 * piece, groups = isa::MatvecW4Groups(a.k, a.group_shift);
  const uint32_t row_slots = isa::MatvecW4RowSlots(stride);
  for (uint32_t begin = 0; begin < stride; begin += piece) {
    const uint32_t columns = min(piece, stride - begin);
    float* x = ctx.act + columns / 2;
    if (begin > 0) {  // every warp is done with the last piece's image and sums
      NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
      LoadW4Piece(a, ctx, x, begin, columns);
      NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    }
    BuildW4Image<kFold == 32 ? 32 : isa::kMatvecW4ChunkColumns>(x, columns, image, xsums, ctx.tid);
    if (begin == 0) CopyW4Meta(a, ctx, meta);
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    if (begin == 0) ctx.Mark(0);  // (the meta page taken: the weights' pages begin)
    const W4Lane ln = MakeW4Lane(ctx, meta, groups, xsums, zero, begin / isa::kMatvecW4ChunkColumns);
    StreamW4<kFold, 2>(a, columns, ctx, image, zero, ln, begin / piece * isa::MatvecW4Slots(piece), row_slots, partial);
  }
}

// A row of one piece: x and the epilogue's inputs from the prologue, then the image, the meta words, the pages.
__device__ __forceinline__ void RunMatvecW4Whole(const isa::MatvecW4Args& a, ConsumerContext& ctx, uint32_t stride) {
  const uint32_t groups = isa::MatvecW4Groups(a.k, a.group_shift);
  const uint32_t slots = isa::MatvecW4Slots(stride);
  const uint32_t image = tile::SharedAddress(ctx.act);
  float* x = ctx.act + stride / 2;  // byte 2 * stride: the image's last two thirds (BuildW4Image)
  const uint32_t zero = image + 6 * stride;
  const uint32_t meta = zero + 32;
  float* partial = ctx.act + (6 * stride + 32) / 4 + a.rows * groups;
  float* xsums = partial + a.rows * slots;
  if (ctx.tid < 8) tile::StoreShared32(zero + 4 * ctx.tid, 0u);
  const MatvecEpilogueInputs in = MatvecPrologue(a, stride, ctx, x);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // The input observed in the data: its wait ended here (the trace's "waits met").
  if (ctx.ready != nullptr && ctx.tid == 0 && (ctx.flags & isa::kFlagTaggedInput)) *ctx.ready = GlobalTimer();
  if (a.group_shift == 5) {
    BuildW4Image<32>(x, stride, image, xsums, ctx.tid);
  } else {
    BuildW4Image<isa::kMatvecW4ChunkColumns>(x, stride, image, xsums, ctx.tid);
  }
  CopyW4Meta(a, ctx, meta);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  ctx.Mark(0);  // (the meta page taken: the weights' pages begin)
  const W4Lane ln = MakeW4Lane(ctx, meta, groups, xsums, zero, 0);
  if (a.group_shift == 5) {
    StreamW4Modes<32>(a, stride, ctx, image, zero, ln, 0, slots, partial);
  } else if (a.group_shift == 6) {
    StreamW4Modes<64>(a, stride, ctx, image, zero, ln, 0, slots, partial);
  } else {
    StreamW4Modes<128>(a, stride, ctx, image, zero, ln, 0, slots, partial);
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  ctx.Mark(1);
  FinishMatvec(a, ctx, in, partial, slots);
}

// A row in pieces (isa::MatvecW4Pieces; no prologue, isa::Validate): the slot holds one piece's image at a time.
__device__ __forceinline__ void RunMatvecW4Pieces(const isa::MatvecW4Args& a, ConsumerContext& ctx, uint32_t stride) {
  const uint32_t piece = isa::MatvecW4PieceColumns(stride);
  const uint32_t groups = isa::MatvecW4Groups(a.k, a.group_shift);
  const uint32_t row_slots = isa::MatvecW4RowSlots(stride);
  const uint32_t image = tile::SharedAddress(ctx.act);
  const uint32_t zero = image + 6 * piece;
  const uint32_t meta = zero + 32;
  float* partial = ctx.act + (6 * piece + 32) / 4 + a.rows * groups;
  float* xsums = partial + a.rows * row_slots;
  if (ctx.tid < 8) tile::StoreShared32(zero + 4 * ctx.tid, 0u);
  MatvecEpilogueInputs in = LoadEpilogueInputs(a, ctx);
  if (a.epilogue == isa::kEpilogueRopeKvAppend && 2 * ctx.tid < a.rows) LoadRopeInputs(a, ctx, 2 * ctx.tid, &in);
  LoadW4Piece(a, ctx, ctx.act + piece / 2, 0, piece);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  if (ctx.ready != nullptr && ctx.tid == 0 && (ctx.flags & isa::kFlagTaggedInput)) *ctx.ready = GlobalTimer();
  if (a.group_shift == 5) {
    StreamW4Pieces<32>(a, ctx, stride, piece, image, meta, xsums, partial);
  } else if (a.group_shift == 6) {
    StreamW4Pieces<64>(a, ctx, stride, piece, image, meta, xsums, partial);
  } else {
    StreamW4Pieces<128>(a, ctx, stride, piece, image, meta, xsums, partial);
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  ctx.Mark(1);
  FinishMatvec(a, ctx, in, partial, row_slots);
}

__device__ __forceinline__ void RunMatvecW4(const isa::MatvecW4Args& a, ConsumerContext& ctx) {
  const uint32_t stride = isa::MatvecW4RowStride(a.k);  // the padded row from here on
  if (isa::MatvecW4Pieces(stride) > 1) {
    RunMatvecW4Pieces(a, ctx, stride);
  } else {
    RunMatvecW4Whole(a, ctx, stride);
  }
}

}  // namespace loom::megakernel
