// CONV_GEMM on the device (isa::ConvGemmArgs): one 128 x 128 output tile of a convolution as an implicit GEMM. The
// weight loader streams the tile's W slabs through the page ring as for GEMM, without waiting for the instruction's
// barriers (W is a weight), and leaves each slab's A half of the page (or A page, with 16 KB pages) to the
// consumers: consumer warpgroup g gathers the patches of its 64 rows for a K slab from the NHWC f32 input, rounds
// them to bf16 and stores them swizzled there, then multiplies them with the W slab on wgmma. The gather of slab
// s + 1 is issued right after slab s is stored, so its loads fly while slab s's wgmma runs; one slab of wgmma stays
// in flight, as in GEMM. Epilogue: GEMM's f32 store epilogues (bias, residual, ReLU; atomic adds split over K).
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/ops/gemm.cuh"
#include "megakernel/tile/slab_mma.cuh"

namespace loom::megakernel {

// The pages a CONV_GEMM streams, as GEMM's (A then W per K slab) with no source for A: the consumers fill it.
__device__ __forceinline__ GemmPages ConvGemmPagesOf(const isa::ConvGemmArgs& c, const isa::MachineView& m) {
  const uint32_t slabs = isa::GemmSlabs(isa::ConvGemmK(c));
  const isa::GemmSlabRange range = isa::ConvGemmSlabsOf(c);
  return {nullptr,
          m.ptr<uint8_t>(c.weight) + (static_cast<uint64_t>(c.n_tile) * slabs + range.begin) * isa::kGemmSlabBytes,
          2 * range.count};
}

// A thread's share of its warpgroup's patches: 64 rows x 8 chunks of 8 columns per K slab, so 4 chunks each, rows
// t / 8 + 16 j (j < 4) and chunk t % 8 of every slab. A warp's 32 chunks are 4 rows' 256 contiguous bytes of input
// where the channels of a tap run on (the stores of a chunk: 16 bytes, 8 rows of a swizzle atom without a
// conflict).
struct ConvGather {
  static constexpr uint32_t kRows = 4;
  isa::ConvRow rows[kRows];  // rows past the output: y0 far outside the input, so every tap reads zero
  float v[kRows][8];

  __device__ __forceinline__ ConvGather(const isa::ConvGemmArgs& a, const isa::ConvShape& s, uint32_t row0,
                                        uint32_t t) {
    const uint32_t m = isa::ConvGemmRows(a);
#pragma unroll
    for (uint32_t j = 0; j < kRows; ++j) {
      const uint32_t r = row0 + t / 8 + 16 * j;
      rows[j] = r < m ? isa::ConvRowOf(a, s, r) : isa::ConvRow{0, -(1 << 30), 0};
    }
  }

  // The loads of K slab `slab`'s chunks (into v; zeros outside the input and past K). `vector`: the group's
  // channels are a multiple of 8 and 16-byte aligned, so a chunk is 8 channels of one tap (two float4 loads).
  __device__ __forceinline__ void Load(const isa::ConvGemmArgs& a, const isa::ConvShape& s, const float* x,
                                       uint32_t k, bool vector, uint32_t slab, uint32_t t) {
    const uint32_t col = slab * isa::kGemmSlabK + (t % 8) * 8;
    if (vector) {
      const isa::ConvTap tap = isa::ConvTapOf(a, s, col < k ? col : 0);
#pragma unroll
      for (uint32_t j = 0; j < kRows; ++j) {
        const int32_t iy = rows[j].y0 + tap.dy, ix = rows[j].x0 + tap.dx;
        float4 lo = make_float4(0.0f, 0.0f, 0.0f, 0.0f), hi = lo;
        if (col < k && iy >= 0 && iy < static_cast<int32_t>(s.h) && ix >= 0 && ix < static_cast<int32_t>(s.w)) {
          const float4* p = reinterpret_cast<const float4*>(
              x + rows[j].plane + (static_cast<uint32_t>(iy) * s.w + static_cast<uint32_t>(ix)) * a.c + tap.ch);
          lo = p[0];
          hi = p[1];
        }
        v[j][0] = lo.x, v[j][1] = lo.y, v[j][2] = lo.z, v[j][3] = lo.w;
        v[j][4] = hi.x, v[j][5] = hi.y, v[j][6] = hi.z, v[j][7] = hi.w;
      }
      return;
    }
#pragma unroll
    for (uint32_t e = 0; e < 8; ++e) {  // column by column: a chunk may span taps (a few channels per group)
      const bool inside = col + e < k;
      const isa::ConvTap tap = isa::ConvTapOf(a, s, inside ? col + e : 0);
#pragma unroll
      for (uint32_t j = 0; j < kRows; ++j) {
        const int32_t iy = rows[j].y0 + tap.dy, ix = rows[j].x0 + tap.dx;
        v[j][e] = inside && iy >= 0 && iy < static_cast<int32_t>(s.h) && ix >= 0 && ix < static_cast<int32_t>(s.w)
                      ? x[rows[j].plane + (static_cast<uint32_t>(iy) * s.w + static_cast<uint32_t>(ix)) * a.c + tap.ch]
                      : 0.0f;
      }
    }
  }

  // The chunks as bf16 (ReLU'd when asked) into warpgroup g's 64 rows of the A slab at `slab`.
  __device__ __forceinline__ void Store(uint8_t* slab, bool relu, uint32_t warpgroup, uint32_t t) const {
#pragma unroll
    for (uint32_t j = 0; j < kRows; ++j) {
      uint32_t packed[4];
#pragma unroll
      for (uint32_t e = 0; e < 4; ++e) {
        float lo = v[j][2 * e], hi = v[j][2 * e + 1];
        if (relu) lo = fmaxf(lo, 0.0f), hi = fmaxf(hi, 0.0f);
        const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        packed[e] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      const uint32_t row = warpgroup * 64 + t / 8 + 16 * j;
      *reinterpret_cast<uint4*>(slab + isa::SwizzledOffset<isa::Swizzle::k128B>(row, (t % 8) * 16)) =
          make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
};

// Inlined into the graph variant's consumer loop only, like every wgmma path (gemm.cuh: a call serialises them).
__device__ __forceinline__ void RunConvGemm(const isa::ConvGemmArgs& g, ConsumerContext& ctx) {
  using Slab = tile::SmemSlab<isa::kGemmTileM, isa::Swizzle::k128B>;
  static_assert(Slab::kBytes == isa::kGemmSlabBytes && kConsumerThreads == 2 * 128, "GEMM slab layout");
  const uint32_t warpgroup = ctx.tid / 128, t = ctx.tid % 128;
  const isa::ConvShape s = isa::ConvShapeOf(g);
  const isa::GemmSlabRange slabs = isa::ConvGemmSlabsOf(g);
  const uint32_t k = isa::ConvGemmK(g);
  const bool vector = g.group_c % 8 == 0 && g.c % 4 == 0 && g.c_begin % 4 == 0;
  const float* x = ctx.machine.ptr<float>(g.input);
  const uint32_t row0 = g.m_tile * isa::kGemmTileM + warpgroup * 64, col0 = g.n_tile * isa::kGemmTileN;
  ConvGather gather(g, s, row0, t);
  gather.Load(g, s, x, k, vector, slabs.begin, t);
  GemmAcc acc;
  acc.Zero();
  tile::FenceRegisters(acc.d);  // (gemm.cuh: else ptxas serialises the wgmma pipeline, C7515)
  const uint32_t per_slab = GemmPagesPerSlab(ctx.page_bytes);
  PipelineState next = ctx.ring;  // the next page to wait for; ctx.ring is the oldest not yet released
  for (uint32_t i = 0; i < slabs.count; ++i) {
    // The A half (or page) is the consumers' once the page is full: the loader copies nothing into it.
    uint8_t* a = const_cast<uint8_t*>(ctx.WaitPage(next));
    ++next;
    const Slab w{per_slab == 1 ? a + isa::kGemmSlabBytes : ctx.WaitPage(next)};
    if (per_slab == 2) ++next;
    gather.Store(a, g.relu != 0, warpgroup, t);
    tile::FenceProxyAsyncShared();  // generic stores, read next by wgmma
    NamedBarrierSync(kWarpgroupBarrier + warpgroup, 128);
    if (i + 1 < slabs.count) gather.Load(g, s, x, k, vector, slabs.begin + i + 1, t);
    tile::WgmmaFence();
    tile::SlabMma(acc, Slab{a}, warpgroup * 64, w, i > 0);
    tile::WgmmaCommit();
    if (i > 0) {  // slab i-1 is done: its pages go back to the loader
      tile::WgmmaWait<1>();
      ctx.ReleasePage();
      if (per_slab == 2) ctx.ReleasePage();
    }
  }
  tile::WgmmaWait<0>();
  ctx.ReleasePage();
  if (per_slab == 2) ctx.ReleasePage();

  const isa::MachineView& m = ctx.machine;
  GemmStoreF32Tile({m.ptr<float>(g.out), g.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(g.bias) : nullptr,
                    g.residual != isa::kNoTensor ? m.ptr<float>(g.residual) : nullptr, g.epilogue,
                    isa::ConvGemmRows(g), g.n, g.slab_begin},
                   acc, t, row0, col0);
}

}  // namespace loom::megakernel
