// CONV_GEMM on the device (isa::ConvGemmArgs): one 128 x 128 output tile of a convolution as an implicit GEMM. The
// weight loader streams the tile's W slabs through the page ring as for GEMM, without waiting for the instruction's
// barriers (W is a weight), and leaves each slab's A half of the page (or A page, with 16 KB pages) to the
// consumers: consumer warpgroup g gathers the patches of its 64 rows for a K slab from the NHWC input into it, then
// multiplies them with the W slab on wgmma. The gather is asynchronous (cp.async), two slabs ahead, so the copies of
// slabs s + 1 and s + 2 fly while slab s's wgmma runs; one slab of wgmma stays in flight, as in GEMM.
// - f32 input: the copies go into two f32 stages in the activation slot, and the consumers round them to bf16 into
//   the A half (ReLU'd when the producer left its ReLU to its readers).
// - bf16 input (written by the producing CONV_GEMM's epilogue): the copies go straight into the A half of the slab's
//   page, swizzled, once its W has landed (the page is then the consumers' until they release it): no stage, no
//   conversion.
// Epilogue: GEMM's f32 store epilogues (bias, residual, ReLU; a split's part), into out and / or out_bf16.
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/ops/loader_context.cuh"
#include "megakernel/ops/gemm.cuh"
#include "megakernel/tile/slab_mma.cuh"

namespace loom::megakernel {

// The W slabs a CONV_GEMM streams (per K slab, the page ring holds the A slab the consumers write, then W).
struct ConvGemmPages {
  const uint8_t* w;  // the tile's first W slab
  uint32_t slabs;
};
__device__ __forceinline__ ConvGemmPages ConvGemmPagesOf(const isa::ConvGemmArgs& c, const isa::MachineView& m) {
  const uint32_t slabs = isa::GemmSlabs(isa::ConvGemmK(c));
  const isa::GemmSlabRange range = isa::ConvGemmSlabsOf(c);
  return {m.ptr<uint8_t>(c.weight) + (static_cast<uint64_t>(c.n_tile) * slabs + range.begin) * isa::kGemmSlabBytes,
          range.count};
}

// A thread's share of its warpgroup's patches: 64 rows x 8 chunks of 8 columns per K slab, so 4 chunks each, rows
// t / 8 + 16 j (j < 4) and chunk t % 8 of every slab. Each thread copies its chunks' f32 input into a stage of the
// activation slot with cp.async (zero-filled outside the input and past K; nothing held in registers while they
// fly), and later converts the same chunks to bf16 into the A slab: a thread reads only what it copied itself. A
// warp's 32 chunks are 4 rows' 256 contiguous bytes of input where a tap's channels run on; the A stores are 16
// bytes, 8 rows of a swizzle atom without a conflict.
struct ConvGather {
  static constexpr uint32_t kRows = 4;
  isa::ConvRow rows[kRows];  // rows past the output: y0 far outside the input, so every tap reads zero

  __device__ __forceinline__ ConvGather(const isa::ConvGemmArgs& a, const isa::ConvShape& s, uint32_t row0,
                                        uint32_t t) {
    const uint32_t m = isa::ConvGemmRows(a);
#pragma unroll
    for (uint32_t j = 0; j < kRows; ++j) {
      const uint32_t r = row0 + t / 8 + 16 * j;
      rows[j] = r < m ? isa::ConvRowOf(a, s, r) : isa::ConvRow{0, -(1 << 30), 0};
    }
  }

  // Where chunk j of this thread sits in a stage (rows of the CTA tile, kConvStageRowBytes apart).
  __device__ __forceinline__ static uint32_t StageOffset(uint32_t j, uint32_t warpgroup, uint32_t t) {
    return (warpgroup * 64 + t / 8 + 16 * j) * isa::kConvStageRowBytes + (t % 8) * 32;
  }

  // Issues K slab `slab`'s copies into `stage` and commits them as one group. `vector`: the group's channels are a
  // multiple of 8 and 16-byte aligned, so a chunk is 8 channels of one tap (two 16-byte copies); else column by
  // column (4-byte copies: a chunk may span taps when a group has few channels).
  __device__ __forceinline__ void Issue(const isa::ConvGemmArgs& a, const isa::ConvShape& s, const float* x,
                                        uint32_t k, bool vector, uint32_t slab, uint8_t* stage, uint32_t warpgroup,
                                        uint32_t t) const {
    const uint32_t col = slab * isa::kGemmSlabK + (t % 8) * 8;
    if (vector) {
      const isa::ConvTap tap = isa::ConvTapOf(a, s, col < k ? col : 0);
#pragma unroll
      for (uint32_t j = 0; j < kRows; ++j) {
        const int32_t iy = rows[j].y0 + tap.dy, ix = rows[j].x0 + tap.dx;
        const bool inside =
            col < k && iy >= 0 && iy < static_cast<int32_t>(s.h) && ix >= 0 && ix < static_cast<int32_t>(s.w);
        const float* src =
            inside ? x + rows[j].plane + (static_cast<uint32_t>(iy) * s.w + static_cast<uint32_t>(ix)) * a.c + tap.ch
                   : x;
        uint8_t* dst = stage + StageOffset(j, warpgroup, t);
        CpAsync<16>(dst, src, inside ? 16 : 0);
        CpAsync<16>(dst + 16, src + (inside ? 4 : 0), inside ? 16 : 0);
      }
    } else {
#pragma unroll
      for (uint32_t e = 0; e < 8; ++e) {
        const bool column = col + e < k;
        const isa::ConvTap tap = isa::ConvTapOf(a, s, column ? col + e : 0);
#pragma unroll
        for (uint32_t j = 0; j < kRows; ++j) {
          const int32_t iy = rows[j].y0 + tap.dy, ix = rows[j].x0 + tap.dx;
          const bool inside =
              column && iy >= 0 && iy < static_cast<int32_t>(s.h) && ix >= 0 && ix < static_cast<int32_t>(s.w);
          const float* src =
              inside ? x + rows[j].plane + (static_cast<uint32_t>(iy) * s.w + static_cast<uint32_t>(ix)) * a.c + tap.ch
                     : x;
          CpAsync<4>(stage + StageOffset(j, warpgroup, t) + 4 * e, src, inside ? 4 : 0);
        }
      }
    }
    CpAsyncCommit();
  }

  // This thread's chunks of `stage` as bf16 (ReLU'd if kRelu) into warpgroup g's 64 rows of the A slab at shared
  // address `slab` (a store through the generic pointer would go the generic path).
  template <bool kRelu>
  __device__ __forceinline__ static void Convert(const uint8_t* stage, uint32_t slab, uint32_t warpgroup,
                                                 uint32_t t) {
#pragma unroll
    for (uint32_t j = 0; j < kRows; ++j) {
      const uint32_t src = tile::SharedAddress(stage) + StageOffset(j, warpgroup, t);
      const float4 lo = tile::LoadShared128(src), hi = tile::LoadShared128(src + 16);
      float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      uint32_t packed[4];
#pragma unroll
      for (uint32_t e = 0; e < 4; ++e) {
        float a = v[2 * e], b = v[2 * e + 1];
        if (kRelu) a = fmaxf(a, 0.0f), b = fmaxf(b, 0.0f);
        const __nv_bfloat162 pair = __floats2bfloat162_rn(a, b);
        packed[e] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      const uint32_t row = warpgroup * 64 + t / 8 + 16 * j;
      tile::StoreShared128(slab + isa::SwizzledOffset<isa::Swizzle::k128B>(row, (t % 8) * 16),
                           make_uint4(packed[0], packed[1], packed[2], packed[3]));
    }
  }
};

// A bf16 input's share of a thread: the same chunks as ConvGather's (rows t / 8 + 16 j of its warpgroup, chunk t % 8
// of 8 columns = 8 channels of one tap), each one 16-byte copy into its swizzled place in the page's A half. The
// tap is followed slab to slab without divisions: a slab moves a chunk 64 columns on.
struct ConvGatherBf16 {
  static constexpr uint32_t kRows = 4;
  int32_t base[kRows];     // row j's (0, 0) tap at the group's first channel, as an input element index (may lie
  int32_t y0[kRows];       //   outside the input: only inside positions are read)
  int32_t x0[kRows];
  uint32_t dst;            // chunk 0's byte offset in the A slab (chunk j: + j * 16 rows of 128 bytes)
  uint32_t ch, kx, ky;     // the current slab's tap of this thread's chunk (ky == kh: past K)

  // row0: the warpgroup's first row of the output.
  __device__ __forceinline__ ConvGatherBf16(const isa::ConvGemmArgs& a, const isa::ConvShape& s, uint32_t row0,
                                            uint32_t first_slab, uint32_t warpgroup, uint32_t t) {
    const uint32_t m = isa::ConvGemmRows(a);
#pragma unroll
    for (uint32_t j = 0; j < kRows; ++j) {
      const uint32_t r = row0 + t / 8 + 16 * j;
      const isa::ConvRow row = r < m ? isa::ConvRowOf(a, s, r) : isa::ConvRow{0, -(1 << 30), 0};
      y0[j] = row.y0;
      x0[j] = row.x0;
      base[j] = r < m ? static_cast<int32_t>(row.plane) +
                            (row.y0 * static_cast<int32_t>(s.w) + row.x0) * static_cast<int32_t>(a.c)
                      : 0;
    }
    dst = isa::SwizzledOffset<isa::Swizzle::k128B>(warpgroup * 64 + t / 8, (t % 8) * 16);
    const uint32_t col = first_slab * isa::kGemmSlabK + (t % 8) * 8, tap = col / a.group_c;
    ch = col % a.group_c;
    kx = tap % s.kw;
    ky = tap / s.kw;
  }

  // This slab's copies into the A slab at shared address `slab`, committed as one group; then the next slab's tap.
  __device__ __forceinline__ void Issue(const isa::ConvGemmArgs& a, const isa::ConvShape& s,
                                        const __nv_bfloat16* x, uint32_t slab) {
    const int32_t dy = static_cast<int32_t>(ky * s.dilation_h), dx = static_cast<int32_t>(kx * s.dilation_w);
    const int32_t tap = (dy * static_cast<int32_t>(s.w) + dx) * static_cast<int32_t>(a.c) + static_cast<int32_t>(ch);
    const bool column = ky < s.kh;
#pragma unroll
    for (uint32_t j = 0; j < kRows; ++j) {
      const bool inside = column && static_cast<uint32_t>(y0[j] + dy) < s.h && static_cast<uint32_t>(x0[j] + dx) < s.w;
      CpAsync16Shared(slab + dst + j * 16 * 128, inside ? x + (base[j] + tap) : x, inside ? 16 : 0);
    }
    CpAsyncCommit();
    ch += isa::kGemmSlabK;
    while (ch >= a.group_c) {
      ch -= a.group_c;
      if (++kx == s.kw) kx = 0, ++ky;
    }
  }
};

// The tile's K loop with a bf16 input (see the top of the file): slab i + kAhead's copies go into its page once
// slab i is on the tensor cores and slab i - 1's pages are released, so the ring holds kAhead + 1 slabs' pages
// for it (GpuMachine checks; the loader needs no more to keep going).
__device__ __forceinline__ void ConvGemmBf16Slabs(const isa::ConvGemmArgs& g, const isa::ConvShape& s, GemmAcc& acc,
                                                  uint32_t warpgroup, uint32_t t, uint32_t row0,
                                                  ConsumerContext& ctx) {
  constexpr uint32_t kAhead = isa::kConvBf16SlabsAhead;
  static_assert(kAhead >= 1, "CpAsyncWait<kAhead - 1> below");
  const isa::GemmSlabRange slabs = isa::ConvGemmSlabsOf(g);
  const __nv_bfloat16* x = ctx.machine.ptr<__nv_bfloat16>(g.input);
  const uint32_t per_slab = GemmPagesPerSlab(ctx.page_bytes);
  ConvGatherBf16 gather(g, s, row0, slabs.begin, warpgroup, t);
  PipelineState fill = ctx.ring;  // the next slab's pages to gather into
  for (uint32_t i = 0; i < kAhead; ++i) {
    if (i < slabs.count) {
      gather.Issue(g, s, x, SmemAddress(ctx.WaitPage(fill)));
      for (uint32_t p = 0; p < per_slab; ++p) ++fill;
    } else {
      CpAsyncCommit();
    }
  }
  PipelineState next = ctx.ring;  // the next page to wait for; ctx.ring is the oldest not yet released
  for (uint32_t i = 0; i < slabs.count; ++i) {
    const uint8_t* a = ctx.WaitPage(next);
    ++next;
    const GemmSlab w{per_slab == 1 ? a + isa::kGemmSlabBytes : ctx.WaitPage(next)};
    if (per_slab == 2) ++next;
    CpAsyncWait<kAhead - 1>();
    tile::FenceProxyAsyncShared();  // cp.async's writes, read next by wgmma
    NamedBarrierSync(kWarpgroupBarrier + warpgroup, 128);
    GemmSlabStep(acc, GemmSlab{a}, w, warpgroup, i, per_slab, ctx);
    if (i + kAhead < slabs.count) {
      gather.Issue(g, s, x, SmemAddress(ctx.WaitPage(fill)));
      for (uint32_t p = 0; p < per_slab; ++p) ++fill;
    } else {
      CpAsyncCommit();
    }
  }
  GemmSlabsDone(per_slab, ctx);
  CpAsyncWait<0>();  // (only empty groups are left)
}

// The tile's K loop with an f32 input (see the top of the file).
__device__ __forceinline__ void ConvGemmF32Slabs(const isa::ConvGemmArgs& g, const isa::ConvShape& s, GemmAcc& acc,
                                                 uint32_t warpgroup, uint32_t t, uint32_t row0,
                                                 ConsumerContext& ctx) {
  static_assert(isa::kConvStages == 2, "the loop keeps two slabs' copies in flight");
  const isa::GemmSlabRange slabs = isa::ConvGemmSlabsOf(g);
  const uint32_t k = isa::ConvGemmK(g);
  const bool vector = g.group_c % 8 == 0 && g.c % 4 == 0 && g.c_begin % 4 == 0, relu = g.flags & isa::kConvReluInput;
  const float* x = ctx.machine.ptr<float>(g.input);
  uint8_t* stages = reinterpret_cast<uint8_t*>(ctx.act);
  constexpr uint32_t kStageBytes = isa::kGemmTileM * isa::kConvStageRowBytes;
  const ConvGather gather(g, s, row0, t);
  // Slabs 0 and 1 in flight before the first wait; then one group committed per slab (empty past the last), so
  // CpAsyncWait<1> always means "this slab's copies are in".
  gather.Issue(g, s, x, k, vector, slabs.begin, stages, warpgroup, t);
  if (slabs.count > 1) gather.Issue(g, s, x, k, vector, slabs.begin + 1, stages + kStageBytes, warpgroup, t);
  else CpAsyncCommit();
  const uint32_t per_slab = GemmPagesPerSlab(ctx.page_bytes);
  PipelineState next = ctx.ring;  // the next page to wait for; ctx.ring is the oldest not yet released
  for (uint32_t i = 0; i < slabs.count; ++i) {
    // The A half (or page) is the consumers' once the page is full: the loader copies nothing into it.
    const uint8_t* a = ctx.WaitPage(next);
    ++next;
    const GemmSlab w{per_slab == 1 ? a + isa::kGemmSlabBytes : ctx.WaitPage(next)};
    if (per_slab == 2) ++next;
    uint8_t* stage = stages + (i % 2) * kStageBytes;
    CpAsyncWait<1>();
    if (relu) ConvGather::Convert<true>(stage, SmemAddress(a), warpgroup, t);
    else ConvGather::Convert<false>(stage, SmemAddress(a), warpgroup, t);
    tile::FenceProxyAsyncShared();  // generic stores, read next by wgmma
    NamedBarrierSync(kWarpgroupBarrier + warpgroup, 128);
    // The stage is free again (this thread converted its own chunks): slab i + 2's copies go into it.
    if (i + 2 < slabs.count) gather.Issue(g, s, x, k, vector, slabs.begin + i + 2, stage, warpgroup, t);
    else CpAsyncCommit();
    GemmSlabStep(acc, GemmSlab{a}, w, warpgroup, i, per_slab, ctx);
  }
  GemmSlabsDone(per_slab, ctx);
  CpAsyncWait<0>();  // (only empty groups are left)
}

// The tile's bias (bf16, its 128 columns, zeros past n) into the slot at isa::kConvBiasOffset, in the caller's next
// commit group (the K loop's waits cover it; the epilogue reads it after a consumers' barrier).
__device__ __forceinline__ void IssueConvBias(const isa::ConvGemmArgs& g, const isa::MachineView& m, uint32_t col0,
                                              uint8_t* slot, uint32_t tid) {
  constexpr uint32_t kChunks = isa::kGemmTileN * 2 / 16;
  if (g.bias == isa::kNoTensor || tid >= kChunks) return;
  const uint32_t c = col0 + tid * 8, valid = c < g.n ? min(8u, g.n - c) * 2 : 0;
  CpAsync<16>(slot + isa::kConvBiasOffset + tid * 16, m.ptr<__nv_bfloat16>(g.bias) + (valid != 0 ? c : 0), valid);
}

// The staged epilogues' shared steps (ConvStoreTileStaged, ConvStoreTallTile). The bias pair of columns (c, c + 1),
// copied into the slot by IssueConvBias at `bias_at`.
__device__ __forceinline__ float2 StagedBiasPair(uint32_t bias_at, uint32_t c) {
  const float b = tile::LoadShared32(bias_at + c * 2);
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&b));
}
// A fragment's values rounded to bf16 into the slot's rows from `row_base` (`pitch` bytes apart).
template <typename Acc>
__device__ __forceinline__ void StageBf16Rows(const Acc& acc, uint32_t t, uint32_t row_base, uint32_t base,
                                              uint32_t pitch) {
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
    const uint32_t r = row_base + Acc::Row(t, i), c = Acc::Col(t, i);
    const __nv_bfloat162 pair = __floats2bfloat162_rn(acc.d[i], acc.d[i + 1]);
    tile::StoreShared32(base + r * pitch + c * 2, *reinterpret_cast<const uint32_t*>(&pair));
  }
}
// The slot's f32 rows [0, tile_rows) of kCols columns (kCols + 4 floats apart) to `out` (its first row; rows n
// floats apart), their first `cols` columns, 16 bytes a lane (a warp a 128-column row): stores, or with add_into
// float4 atomic adds (out += the tile in place: one add per element).
template <uint32_t kCols>
__device__ __forceinline__ void StoreSlotRowsF32(uint32_t base, float* out, uint32_t n, uint32_t cols,
                                                 uint32_t tile_rows, bool add_into, uint32_t tid) {
  constexpr uint32_t kChunks = kCols / 4, kPitch = kCols * 4 + 16;
  for (uint32_t j = tid; j < tile_rows * kChunks; j += kConsumerThreads) {
    const uint32_t r = j / kChunks, c = (j % kChunks) * 4;
    if (c < cols) {
      const float4 v = tile::LoadShared128(base + r * kPitch + c * 4);
      float4* dst = reinterpret_cast<float4*>(out + static_cast<uint64_t>(r) * n + c);
      if (add_into) atomicAdd(dst, v);
      else *dst = v;
    }
  }
}
// The same for the slot's bf16 rows (kCols + 8 bf16 apart).
template <uint32_t kCols>
__device__ __forceinline__ void StoreSlotRowsBf16(uint32_t base, __nv_bfloat16* out, uint32_t n, uint32_t cols,
                                                  uint32_t tile_rows, uint32_t tid) {
  constexpr uint32_t kChunks = kCols / 8, kPitch = kCols * 2 + 16;
  for (uint32_t j = tid; j < tile_rows * kChunks; j += kConsumerThreads) {
    const uint32_t r = j / kChunks, c = (j % kChunks) * 8;
    if (c < cols) {
      *reinterpret_cast<uint4*>(out + static_cast<uint64_t>(r) * n + c) =
          tile::LoadShared128Bits(base + r * kPitch + c * 2);
    }
  }
}
static_assert(isa::kConvOutRowBytes == isa::kGemmTileN * 4 + 16 &&
                  isa::kConvOutBf16RowBytes == isa::kGemmTileN * 2 + 16,
              "StoreSlotRows*'s pitches");

// The store epilogue through the activation slot (isa::ConvStagesOutput): bias (from the slot), residual, ReLU in
// registers as GemmStoreF32Tile's; then the tile's rows into the slot, and from there a warp a row, 16 bytes a lane,
// to `out` (float4 atomic adds where the tile adds into it in place: out += the tile); then the same in bf16 to
// `out_bf16`. Against GemmStoreF32Tile's stores straight from the registers (8 bytes of 8 rows a warp instruction)
// and its bias loaded after the K loop (a round trip behind the loader's pages), ResNet-18 at batch 8 took 0.585
// against 0.623 ms (docs/history/performance_log.md). Bulk copies a row (cp.async.bulk from the slot) measured 0.595.
__device__ __forceinline__ void ConvStoreTileStaged(const isa::ConvGemmArgs& g, const isa::MachineView& m,
                                                    GemmAcc& acc, uint32_t tid, uint32_t warpgroup, uint32_t col0,
                                                    uint32_t staged, uint8_t* slot) {
  const uint32_t t = tid % 128, rows = isa::ConvGemmRows(g), base = tile::SharedAddress(slot);
  const uint32_t grow0 = g.m_tile * isa::kGemmTileM, row0 = grow0 + warpgroup * 64;
  const bool has_out = g.out != isa::kNoTensor;
  const bool add_into = g.epilogue == isa::kGemmStoreF32 && has_out && g.residual == g.out;  // out += the tile
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // the bias copies (threads 0-15's) are in
  if (g.bias != isa::kNoTensor && (g.epilogue != isa::kGemmPartialF32 || isa::GemmSplitBegin(g) == 0)) {
#pragma unroll
    for (uint32_t i = 0; i < GemmAcc::kRegs; i += 2) {
      const float2 pair = StagedBiasPair(base + isa::kConvBiasOffset, GemmAcc::Col(t, i));
      acc.d[i] += pair.x;
      acc.d[i + 1] += pair.y;
    }
  }
  if (!add_into) {
    if (staged != 0) {
      ForEachGemmPair<GemmAcc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t, bool) {
        const float2 v = tile::LoadShared64(staged + i / 2 * kConsumerThreads * 8);
        acc.d[i] += v.x;
        acc.d[i + 1] += v.y;
      });
    } else if (g.residual != isa::kNoTensor) {
      const float* residual = m.ptr<float>(g.residual);
      ForEachGemmPair<GemmAcc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t at, bool) {
        const float2 v = *reinterpret_cast<const float2*>(residual + at);  // (n % 4 == 0: pairs)
        acc.d[i] += v.x;
        acc.d[i + 1] += v.y;
      });
    }
    if (g.epilogue == isa::kGemmStoreF32Relu) {
#pragma unroll
      for (uint32_t i = 0; i < GemmAcc::kRegs; ++i) acc.d[i] = fmaxf(acc.d[i], 0.0f);
    }
  }
  const uint32_t cols = min(isa::kGemmTileN, g.n - col0), tile_rows = min(isa::kGemmTileM, rows - grow0);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // the staged residual is read: the slot is free
  if (has_out) {
#pragma unroll
    for (uint32_t i = 0; i < GemmAcc::kRegs; i += 2) {
      const uint32_t r = warpgroup * 64 + GemmAcc::Row(t, i), c = GemmAcc::Col(t, i);
      tile::StoreShared64(base + r * isa::kConvOutRowBytes + c * 4, make_float2(acc.d[i], acc.d[i + 1]));
    }
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    StoreSlotRowsF32<isa::kGemmTileN>(base, m.ptr<float>(g.out) + static_cast<uint64_t>(grow0) * g.n + col0, g.n,
                                      cols, tile_rows, add_into, tid);
  }
  if (g.out_bf16 != isa::kNoTensor && !add_into) {
    if (has_out) NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // the f32 rows are read: free again
    StageBf16Rows(acc, t, warpgroup * 64, base, isa::kConvOutBf16RowBytes);
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    __nv_bfloat16* out = m.ptr<__nv_bfloat16>(g.out_bf16) + static_cast<uint64_t>(grow0) * g.n + col0;
    StoreSlotRowsBf16<isa::kGemmTileN>(base, out, g.n, cols, tile_rows, tid);
  }
}

// A tall tile's store epilogue (isa::kConvTall; always through the slot, isa::ConvStagesOutput): the residual's
// rows copied into the slot once the K loop is done with its A buffers, then bias, residual and ReLU applied as the
// two accumulators' fragments are written there (f32 rows kConvTallCols + 4 floats apart), then stored a warp two
// rows, 16 bytes a lane; then the bf16 rows likewise.
__device__ __forceinline__ void ConvStoreTallTile(const isa::ConvGemmArgs& g, const isa::MachineView& m,
                                                  tile::Accumulator<64>& acc0, tile::Accumulator<64>& acc1,
                                                  uint32_t tid, uint32_t warpgroup, uint8_t* slot) {
  using Acc = tile::Accumulator<64>;
  constexpr uint32_t kPitch = isa::kConvTallCols * 4 + 16, kPitchBf16 = isa::kConvTallCols * 2 + 16;
  const uint32_t t = tid % 128, base = tile::SharedAddress(slot), grow0 = g.m_tile * isa::kConvTallRows;
  const uint32_t tile_rows = min(isa::kConvTallRows, isa::ConvGemmRows(g) - grow0), cols = g.n;
  const bool residual = g.residual != isa::kNoTensor;
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // both warpgroups are done with the A buffers
  if (residual) {
    const float* src = m.ptr<float>(g.residual) + static_cast<uint64_t>(grow0) * g.n;
    for (uint32_t j = tid; j < tile_rows * 16; j += kConsumerThreads) {
      const uint32_t r = j / 16, c = (j % 16) * 4;
      if (c < cols) CpAsync16Shared(base + r * kPitch + c * 4, src + static_cast<uint64_t>(r) * g.n + c, 16);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  }
  const bool relu = g.epilogue == isa::kGemmStoreF32Relu, bias = g.bias != isa::kNoTensor;
  auto stage = [&](Acc& acc, uint32_t row_base) {
#pragma unroll
    for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
      const uint32_t r = row_base + Acc::Row(t, i), c = Acc::Col(t, i), at = base + r * kPitch + c * 4;
      float2 v = make_float2(acc.d[i], acc.d[i + 1]);
      if (bias) {
        const float2 pair = StagedBiasPair(base + isa::kConvBiasOffset, c);
        v.x += pair.x, v.y += pair.y;
      }
      if (residual) {
        const float2 add = tile::LoadShared64(at);
        v.x += add.x, v.y += add.y;
      }
      if (relu) v.x = fmaxf(v.x, 0.0f), v.y = fmaxf(v.y, 0.0f);
      acc.d[i] = v.x, acc.d[i + 1] = v.y;
      tile::StoreShared64(at, v);
    }
  };
  stage(acc0, warpgroup * 128);
  stage(acc1, warpgroup * 128 + 64);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  if (g.out != isa::kNoTensor) {
    StoreSlotRowsF32<isa::kConvTallCols>(base, m.ptr<float>(g.out) + static_cast<uint64_t>(grow0) * g.n, g.n, cols,
                                         tile_rows, false, tid);
  }
  if (g.out_bf16 == isa::kNoTensor) return;
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // the f32 rows are read
  StageBf16Rows(acc0, t, warpgroup * 128, base, kPitchBf16);
  StageBf16Rows(acc1, t, warpgroup * 128 + 64, base, kPitchBf16);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  StoreSlotRowsBf16<isa::kConvTallCols>(base, m.ptr<__nv_bfloat16>(g.out_bf16) + static_cast<uint64_t>(grow0) * g.n,
                                        g.n, cols, tile_rows, tid);
}

// A tall tile (isa::kConvTall): K slab i's patches (256 rows, 32 KB) gathered into A buffer i % 2 of the activation
// slot (aligned to the swizzle atom), slab i + 1's in flight while slab i is on the tensor cores; warpgroup g's rows
// [128g, +128) as two m64n64 products with the W slab's first 64 rows (the page as the loader streams it for any
// CONV_GEMM).
__device__ __forceinline__ void RunConvGemmTall(const isa::ConvGemmArgs& g, ConsumerContext& ctx) {
  using Acc = tile::Accumulator<64>;
  constexpr uint32_t kSlabBytes = isa::kConvTallRows * isa::kGemmSlabK * 2;
  const uint32_t warpgroup = ctx.tid / 128, t = ctx.tid % 128;
  const isa::ConvShape s = isa::ConvShapeOf(g);
  uint8_t* slot = reinterpret_cast<uint8_t*>(ctx.act);
  IssueConvBias(g, ctx.machine, 0, slot, ctx.tid);
  CpAsyncCommit();
  const uint32_t slot_base = tile::SharedAddress(slot), a_base = (slot_base + 1023) & ~1023u;
  const uint8_t* a_ptr = slot + (a_base - slot_base);
  const uint32_t slabs = isa::GemmSlabs(isa::ConvGemmK(g));
  const __nv_bfloat16* x = ctx.machine.ptr<__nv_bfloat16>(g.input);
  const uint32_t row0 = g.m_tile * isa::kConvTallRows + warpgroup * 128;
  ConvGatherBf16 lo(g, s, row0, 0, 2 * warpgroup, t), hi(g, s, row0 + 64, 0, 2 * warpgroup + 1, t);
  auto issue = [&](uint32_t i) {  // two commit groups a slab
    const uint32_t buffer = a_base + (i % 2) * kSlabBytes;
    lo.Issue(g, s, x, buffer);
    hi.Issue(g, s, x, buffer);
  };
  issue(0);
  if (slabs > 1) {
    issue(1);
  } else {
    CpAsyncCommit();
    CpAsyncCommit();
  }
  Acc acc0, acc1;
  acc0.Zero();
  acc1.Zero();
  tile::FenceRegisters(acc0.d);
  tile::FenceRegisters(acc1.d);
  const uint32_t per_slab = GemmPagesPerSlab(ctx.page_bytes);
  PipelineState next = ctx.ring;
  for (uint32_t i = 0; i < slabs; ++i) {
    const uint8_t* page = ctx.WaitPage(next);
    ++next;
    const uint8_t* w = per_slab == 1 ? page + isa::kGemmSlabBytes : ctx.WaitPage(next);
    if (per_slab == 2) ++next;
    CpAsyncWait<2>();               // slab i's two groups (slab i + 1's may fly)
    tile::FenceProxyAsyncShared();  // cp.async's writes, read next by wgmma
    NamedBarrierSync(kWarpgroupBarrier + warpgroup, 128);
    const tile::SmemSlab<isa::kConvTallRows, isa::Swizzle::k128B> a{a_ptr + (i % 2) * kSlabBytes};
    const tile::SmemSlab<isa::kConvTallCols, isa::Swizzle::k128B> b{w};
    tile::WgmmaFence();
    tile::SlabMma(acc0, a, warpgroup * 128, b, i > 0);
    tile::SlabMma(acc1, a, warpgroup * 128 + 64, b, i > 0);
    tile::WgmmaCommit();
    tile::WgmmaWait<0>();  // the buffer is read: slab i + 2's copies go into it
    ctx.ReleasePage();
    if (per_slab == 2) ctx.ReleasePage();
    if (i + 2 < slabs) {
      issue(i + 2);
    } else {
      CpAsyncCommit();
      CpAsyncCommit();
    }
  }
  CpAsyncWait<0>();
  ConvStoreTallTile(g, ctx.machine, acc0, acc1, ctx.tid, warpgroup, slot);
}

// Inlined into the graph variant's consumer loop only, like every wgmma path (gemm.cuh: a call serialises them).
__device__ __forceinline__ void RunConvGemm(const isa::ConvGemmArgs& g, ConsumerContext& ctx) {
  static_assert(GemmSlab::kBytes == isa::kGemmSlabBytes && kConsumerThreads == 2 * 128, "GEMM slab layout");
  if (g.flags & isa::kConvTall) {
    RunConvGemmTall(g, ctx);
    return;
  }
  const uint32_t warpgroup = ctx.tid / 128, t = ctx.tid % 128;
  const isa::ConvShape s = isa::ConvShapeOf(g);
  const uint32_t row0 = g.m_tile * isa::kGemmTileM + warpgroup * 64, col0 = g.n_tile * isa::kGemmTileN;
  // The residual's pairs staged in the activation slot (isa::ConvStagesResidual), one commit group ahead of the
  // K loop's (its waits then cover it).
  uint32_t staged = 0;
  const bool stage_out = isa::ConvStagesOutput(g);
  if (stage_out) IssueConvBias(g, ctx.machine, col0, reinterpret_cast<uint8_t*>(ctx.act), ctx.tid);
  if (isa::ConvStagesResidual(g)) {
    static_assert(isa::kConvThreads == kConsumerThreads, "a staged place per consumer thread");
    staged = tile::SharedAddress(ctx.act) + ctx.tid * 8;
    const float* residual = ctx.machine.ptr<float>(g.residual);
    ForEachGemmPair<GemmAcc>(isa::ConvGemmRows(g), g.n, t, row0, col0, [&](uint32_t i, uint64_t at, bool) {
      CpAsync<8>(reinterpret_cast<uint8_t*>(ctx.act) + (i / 2 * kConsumerThreads + ctx.tid) * 8, residual + at, 8);
    });
  }
  if (stage_out || isa::ConvStagesResidual(g)) CpAsyncCommit();
  GemmAcc acc;
  acc.Zero();
  tile::FenceRegisters(acc.d);  // (gemm.cuh: else ptxas serialises the wgmma pipeline, C7515)
  if (g.flags & isa::kConvBf16Input) ConvGemmBf16Slabs(g, s, acc, warpgroup, t, row0, ctx);
  else ConvGemmF32Slabs(g, s, acc, warpgroup, t, row0, ctx);
  if (stage_out) {
    ConvStoreTileStaged(g, ctx.machine, acc, ctx.tid, warpgroup, col0, staged, reinterpret_cast<uint8_t*>(ctx.act));
  } else {
    GemmStoreF32Tile(g, ctx.machine, isa::ConvGemmRows(g), acc, t, row0, col0, staged);
  }
}

// CONV_GEMM's pages (its loader hook): only W streams (the consumers gather A), running ahead unless W itself is
// computed in the pass. Per K slab the A slab's room (the first half of a 32 KB page, or a page of its own: full at
// once, the consumers write it) and the W slab (the second half, or the next page).
template <>
inline constexpr bool kHasPageHook<isa::ConvGemmArgs> = true;
template <uint32_t kVariant>
__device__ __forceinline__ void LoadPages(const isa::ConvGemmArgs& c, const isa::Instruction& inst,
                                          LoaderContext& l) {
  if (l.p.machine.tensors[c.weight].region == isa::kArenaRegion) l.WaitData(inst);
  const ConvGemmPages conv = ConvGemmPagesOf(c, l.p.machine);
  l.InstructionRead();
  const bool shared_page = GemmPagesPerSlab(l.p.page_bytes) == 1;
  for (uint32_t i = 0; i < conv.slabs; ++i) {
    uint8_t* page = l.EmptyPage(inst.opcode);
    uint32_t offset = isa::kGemmSlabBytes;
    if (!shared_page) {
      MbarrierArrive(l.Full());
      ++l.ring;
      page = l.EmptyPage(inst.opcode);
      offset = 0;
    }
    MbarrierArriveExpectTx(l.Full(), isa::kGemmSlabBytes);
    BulkCopyToShared(page + offset, conv.w + static_cast<uint64_t>(i) * isa::kGemmSlabBytes, isa::kGemmSlabBytes,
                     l.Full());
    ++l.ring;
  }
  if (conv.slabs > 0) l.Unthrottle();
}

}  // namespace loom::megakernel
