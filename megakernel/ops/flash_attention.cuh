// FLASH_ATTN on the device (isa::FlashAttnArgs): causal prefill attention of
// 128 query rows of one head on the tensor cores, straight from the bf16 K/V
// tile image the QKV GEMM wrote (isa::KvImageOffset).
//
// The weight loader streams the head's key tiles [0, last) through the page
// ring as one contiguous run (FlashPagesOf): a tile is K [64 keys, hd] then Vᵀ
// [hd, 64 keys], in the swizzled slabs wgmma reads, so a page is an operand as
// it lands (no conversion). Each consumer warpgroup converts its 64 query rows
// to bf16 Q slabs in the activation slot once, then for each key tile: S = Q·Kᵀ,
// causal mask, online softmax (row max / sum / exp2 in registers), O += P·V with
// P converted to A fragments. The two warpgroups share the pages but not their
// pace: neither waits for the other between tiles, so one's softmax overlaps the
// other's wgmma. Tiles past a warpgroup's last row are released, not computed.
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/tile/row_ops.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

// The key tiles one FLASH_ATTN streams: [0, FlashKeyTiles) of its KV head, clamped to the image.
__device__ __forceinline__ uint32_t FlashTilesOf(const isa::FlashAttnArgs& a, const isa::MachineView& m,
                                                 uint32_t* image_tiles) {
  const uint32_t start = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[isa::kStatePosition]);
  *image_tiles = isa::KvImageTiles(m.tensors[a.kv_image].bytes, a.num_kv_heads, a.head_dim);
  const uint32_t tiles = isa::FlashKeyTiles(start, a);
  return tiles < *image_tiles ? tiles : *image_tiles;
}

// The bytes a FLASH_ATTN streams through the page ring, in order: its head's first `tiles` key tiles.
struct FlashPages {
  const uint8_t* first;
  uint64_t bytes;
};
__device__ __forceinline__ FlashPages FlashPagesOf(const isa::FlashAttnArgs& a, const isa::MachineView& m) {
  uint32_t image_tiles;
  const uint32_t tiles = FlashTilesOf(a, m, &image_tiles);
  const uint32_t kv = a.head / (a.num_heads / a.num_kv_heads), tile_bytes = isa::KvTileBytes(a.head_dim);
  return {m.ptr<uint8_t>(a.kv_image) + static_cast<uint64_t>(kv) * image_tiles * tile_bytes,
          static_cast<uint64_t>(tiles) * tile_bytes};
}

template <uint32_t HD>
__device__ __forceinline__ void RunFlashAttnTile(const isa::FlashAttnArgs& a, ConsumerContext& ctx) {
  using KSlab = tile::SmemSlab<isa::kFlashKeys, isa::Swizzle::k128B>;  // 64 keys x 64 dims
  using VSlab = tile::SmemSlab<HD, isa::Swizzle::k128B>;               // HD dims x 64 keys
  using QSlab = tile::SmemSlab<64, isa::Swizzle::k128B>;               // 64 query rows x 64 dims
  using Acc = tile::Accumulator<HD>;
  using Scores = tile::Accumulator<isa::kFlashKeys>;
  static_assert(KSlab::kK == 64 && VSlab::kK == isa::kFlashKeys, "a slab row is 64 bf16");
  static_assert(kConsumerThreads == 2 * 128, "two consumer warpgroups, 64 query rows each");
  // A key tile is two halves of kHalfBytes: K (HD / 64 slabs of 64 keys), then Vᵀ (one slab of HD rows).
  constexpr uint32_t kHalfBytes = isa::kFlashKeys * HD * 2;
  static_assert((HD / 64) * KSlab::kBytes == kHalfBytes && VSlab::kBytes == kHalfBytes, "K/V tile image layout");
  // Ring pages hold whole halves (16 or 32 KB pages: half a head_dim-128 tile, one or two head_dim-64 tiles);
  // the loader fills them in order from one contiguous run, so half u sits in page u / halves_per_page.
  const uint32_t halves_per_page = ctx.page_bytes / kHalfBytes;

  const isa::MachineView& m = ctx.machine;
  const uint32_t wg = ctx.tid / 128, t = ctx.tid % 128;
  const uint32_t start = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[isa::kStatePosition]);
  uint32_t image_tiles;
  const uint32_t tiles = FlashTilesOf(a, m, &image_tiles);
  const uint32_t image_keys = image_tiles * isa::kFlashKeys;
  const uint32_t row0 = a.row_tile * isa::kFlashRows + wg * 64;
  const bool active = row0 < a.rows;
  const uint32_t wg_end = active ? (row0 + 64 < a.rows ? row0 + 64 : a.rows) : row0;
  const uint32_t wg_tiles = active ? (start + wg_end - 1) / isa::kFlashKeys + 1 : 0;
  uint8_t* slot = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(ctx.act) + isa::kSwizzleAtomAlign - 1) & ~uintptr_t{isa::kSwizzleAtomAlign - 1});

  // Q rows of this warpgroup -> its bf16 Q slabs (zeros past the prompt), read by the score wgmma from shared
  // memory: generic stores, so fenced for the async proxy and published to the warpgroup before the first wgmma.
  uint8_t* qbuf = slot + wg * (HD / 64) * QSlab::kBytes;
  const uint32_t q_width = a.num_heads * HD;
  if (active) {
    const float* q = m.ptr<float>(a.q) + a.head * HD;
    for (uint32_t ch = t; ch < 64 * HD / 8; ch += 128) {
      const uint32_t r = ch / (HD / 8), d0 = (ch % (HD / 8)) * 8;
      uint4 packed = make_uint4(0, 0, 0, 0);
      if (row0 + r < a.rows) {
        const float* src = q + static_cast<uint64_t>(row0 + r) * q_width + d0;
        const float4 x0 = *reinterpret_cast<const float4*>(src), x1 = *reinterpret_cast<const float4*>(src + 4);
        packed = make_uint4(tile::PackBf16(x0.x, x0.y), tile::PackBf16(x0.z, x0.w), tile::PackBf16(x1.x, x1.y),
                            tile::PackBf16(x1.z, x1.w));
      }
      *reinterpret_cast<uint4*>(qbuf + isa::Swizzled128Offset(HD, 64, r, d0)) = packed;
    }
    tile::FenceProxyAsyncShared();
    NamedBarrierSync(kWarpgroupBarrier + wg, 128);
  }

  const float log2_scale = a.scale * 1.4426950408889634f;  // exp(x * scale) = exp2(x * log2_scale)
  tile::RowPair row_max{{-INFINITY, -INFINITY}}, row_sum{{0.0f, 0.0f}};
  Acc o;
  o.Zero();
  PipelineState next = ctx.ring;  // the next page to wait for; ctx.ring is the oldest not yet released
  const uint8_t* page = nullptr;
  auto half_at = [&](uint32_t u) {
    if (u % halves_per_page == 0) {
      page = ctx.WaitPage(next);
      ++next;
    }
    return page + (u % halves_per_page) * kHalfBytes;
  };
  uint32_t released = 0;
  for (uint32_t j = 0; j < tiles; ++j) {
    const uint8_t* kp = half_at(2 * j);
    const uint8_t* vp = half_at(2 * j + 1);
    if (j < wg_tiles) {
      const uint32_t key0 = j * isa::kFlashKeys;
      Scores s;
      tile::WgmmaFence();
#pragma unroll
      for (uint32_t kk = 0; kk < HD / 16; ++kk) {
        tile::MmaAsync<isa::kFlashKeys>(s.d, QSlab{qbuf + (kk / 4) * QSlab::kBytes}.Descriptor(0, kk % 4),
                                        KSlab{kp + (kk / 4) * KSlab::kBytes}.Descriptor(0, kk % 4), kk > 0 ? 1u : 0u);
      }
      tile::WgmmaCommit();
      tile::WgmmaWait<0>();
      tile::FenceRegisters(s.d);
      const uint32_t first_pos = start + row0;
      if (key0 + isa::kFlashKeys - 1 > first_pos) {  // the tile crosses the diagonal of some row
#pragma unroll
        for (uint32_t i = 0; i < Scores::kRegs; ++i) {
          if (key0 + Scores::Col(t, i) > first_pos + Scores::Row(t, i)) s.d[i] = -INFINITY;
        }
      }
      const tile::RowPair tile_max = tile::RowMax(s);
      const tile::RowPair m_new{{fmaxf(row_max.v[0], tile_max.v[0]), fmaxf(row_max.v[1], tile_max.v[1])}};
      const tile::RowPair correction{{exp2f((row_max.v[0] - m_new.v[0]) * log2_scale),
                                      exp2f((row_max.v[1] - m_new.v[1]) * log2_scale)}};
      tile::Exp2Rows(s, m_new, log2_scale);
      const tile::RowPair tile_sum = tile::RowSum(s);
      row_sum = {{row_sum.v[0] * correction.v[0] + tile_sum.v[0], row_sum.v[1] * correction.v[1] + tile_sum.v[1]}};
      row_max = m_new;
      tile::ScaleRows(o, correction);
      uint32_t pf[isa::kFlashKeys / 16][4];
#pragma unroll
      for (uint32_t kk = 0; kk < isa::kFlashKeys / 16; ++kk) tile::ToOperandA(s, kk, pf[kk]);
      // P and the rescaled accumulators are written by ordinary instructions: pinned before the wgmma fence, so
      // the compiler cannot sink those writes past it (the tensor cores would read the old values).
      tile::FenceRegisters(o.d);
#pragma unroll
      for (uint32_t kk = 0; kk < isa::kFlashKeys / 16; ++kk) tile::FenceRegisters(pf[kk]);
      tile::WgmmaFence();
      const VSlab vt{vp};
#pragma unroll
      for (uint32_t kk = 0; kk < isa::kFlashKeys / 16; ++kk) {
        tile::MmaAsyncRegA<HD>(o.d, pf[kk], vt.Descriptor(0, kk), 1u);
      }
      tile::WgmmaCommit();
      tile::WgmmaWait<0>();
      tile::FenceRegisters(o.d);
#pragma unroll
      for (uint32_t kk = 0; kk < isa::kFlashKeys / 16; ++kk) tile::FenceRegisters(pf[kk]);
    }
    // Pages whose every half is consumed go back (the last tile's partly filled page too).
    const uint32_t halves = 2 * j + 2;
    const uint32_t done = j + 1 == tiles ? (halves + halves_per_page - 1) / halves_per_page : halves / halves_per_page;
    for (; released < done; ++released) ctx.ReleasePage();
  }
  if (!active) return;
  tile::ScaleRows(o, tile::RowPair{{1.0f / row_sum.v[0], 1.0f / row_sum.v[1]}});
  uint8_t* image = m.ptr<uint8_t>(a.out);
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
    const uint32_t r = row0 + Acc::Row(t, i);
    if (r < a.rows && start + r < image_keys) {
      *reinterpret_cast<uint32_t*>(image + isa::Swizzled128Offset(q_width, isa::kGemmTileM, r, a.head * HD + Acc::Col(t, i))) =
          tile::PackBf16(o.d[i], o.d[i + 1]);
    }
  }
}

// Inlined, like RunGemm (see there): a call would serialise every wgmma of the kernel.
__device__ __forceinline__ void RunFlashAttn(const isa::FlashAttnArgs& a, ConsumerContext& ctx) {
  if (a.head_dim == 64) RunFlashAttnTile<64>(a, ctx);
  else RunFlashAttnTile<128>(a, ctx);
}

}  // namespace loom::megakernel
