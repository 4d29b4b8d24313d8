// FLASH_ATTN on the device (isa::FlashAttnArgs): causal prefill attention of
// 128 query rows of one head on the tensor cores.
//
// The weight loader streams, for each 64-key tile, its f32 K rows then its V
// rows from the KV cache through the page ring (FlashPagesOf). All 256 consumer
// threads convert a tile into bf16 K [64 keys, hd] and Vᵀ [hd, 64 keys] slabs in
// the 128-byte swizzle (two buffers in the activation slot, so one named barrier
// per tile suffices), then warpgroup g runs its 64 query rows: S = Q·Kᵀ with Q in
// bf16 slabs beside them (converted once), causal mask, online softmax (row max /
// sum / exp2 in registers), O += P·V with P converted to A fragments. Tiles past
// a warpgroup's last row are converted but not computed.
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/ops/loader_context.cuh"
#include "megakernel/tile/row_ops.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

// The pages a FLASH_ATTN streams, in ring order: for each key tile, its K pages then its V pages
// (kFlashPageKeys keys of f32 rows each: 8 KB at head_dim 64, 16 KB at 128; half that from a bf16 cache), clamped to
// the cache's max_seq rows.
inline constexpr uint32_t kFlashPageKeys = 32;  // keys per page: 16 KB of f32 rows at head_dim 128
// A ring page of 32 KB or more holds two of these pages, kFlashPageStride bytes apart (one wait and release).
inline constexpr uint32_t kFlashPageStride = 16384;
__device__ __forceinline__ uint32_t FlashPagesPerRingPage(uint32_t page_bytes) {
  return page_bytes >= 2 * kFlashPageStride ? 2 : 1;
}
struct FlashPages {
  const uint8_t* k;  // the KV head's first cache row
  const uint8_t* v;
  uint32_t head_dim, max_seq, count, kv_bytes;  // kv_bytes: the cache's element (isa::KvBytes)

  static constexpr uint32_t PagesPerTensor() { return isa::kFlashKeys / kFlashPageKeys; }
  __device__ __forceinline__ uint32_t FirstKey(uint32_t i) const {
    const uint32_t per_tile = 2 * PagesPerTensor();
    return (i / per_tile) * isa::kFlashKeys + (i % PagesPerTensor()) * kFlashPageKeys;
  }
  __device__ __forceinline__ const void* Source(uint32_t i) const {
    const bool is_v = (i % (2 * PagesPerTensor())) >= PagesPerTensor();
    return (is_v ? v : k) + static_cast<uint64_t>(FirstKey(i)) * head_dim * kv_bytes;
  }
  __device__ __forceinline__ uint32_t Bytes(uint32_t i) const {
    const uint32_t key = FirstKey(i), keys = kFlashPageKeys;
    const uint32_t n = key >= max_seq ? 0 : (max_seq - key < keys ? max_seq - key : keys);
    return n * head_dim * kv_bytes;
  }
};

__device__ __forceinline__ FlashPages FlashPagesOf(const isa::FlashAttnArgs& a, const isa::MachineView& m) {
  const uint32_t start = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[isa::kStatePosition]);
  const uint32_t kv = a.head / (a.num_heads / a.num_kv_heads);
  const uint32_t kv_bytes = isa::KvBytes(m, a.k_cache);
  const uint64_t row = static_cast<uint64_t>(kv) * a.max_seq * a.head_dim * kv_bytes;
  return {m.ptr<uint8_t>(a.k_cache) + row, m.ptr<uint8_t>(a.v_cache) + row, a.head_dim, a.max_seq,
          isa::FlashKeyTiles(start, a) * 2 * FlashPages::PagesPerTensor(), kv_bytes};
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

template <uint32_t HD>
__device__ __forceinline__ void RunFlashAttnTile(const isa::FlashAttnArgs& a, ConsumerContext& ctx) {
  using KSlab = tile::SmemSlab<isa::kFlashKeys, isa::Swizzle::k128B>;  // 64 keys x 64 dims
  using VSlab = tile::SmemSlab<HD, isa::Swizzle::k128B>;               // HD dims x 64 keys
  using Acc = tile::Accumulator<HD>;
  using Scores = tile::Accumulator<isa::kFlashKeys>;
  static_assert(KSlab::kK == 64 && VSlab::kK == isa::kFlashKeys, "a slab row is 64 bf16");
  static_assert(kConsumerThreads == 2 * 128, "two consumer warpgroups, 64 query rows each");
  constexpr uint32_t kPages = FlashPages::PagesPerTensor();  // pages per tensor per key tile
  static_assert(kPages % 2 == 0 && kFlashPageKeys * HD * 4 <= kFlashPageStride, "two pages to a 32 KB ring page");
  const uint32_t per_ring_page = FlashPagesPerRingPage(ctx.page_bytes);
  constexpr uint32_t kPageKeys = kFlashPageKeys;
  constexpr uint32_t kKBytes = isa::kFlashKeys * HD * 2;
  static_assert(kPageKeys % 8 == 0 && kPageKeys * 2 == 64, "Vᵀ stores take 8 keys of a page, half a Vᵀ row");

  const isa::MachineView& m = ctx.machine;
  const uint32_t wg = ctx.tid / 128, t = ctx.tid % 128;
  const uint32_t start = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[isa::kStatePosition]);
  const uint32_t row0 = a.row_tile * isa::kFlashRows + wg * 64;
  const bool active = row0 < a.rows;
  const uint32_t wg_end = active ? (row0 + 64 < a.rows ? row0 + 64 : a.rows) : row0;
  const uint32_t valid_keys = start + a.rows;  // cache rows [0, start + rows) hold keys
  const uint32_t tiles = isa::FlashKeyTiles(start, a);
  const uint32_t wg_tiles = active ? (start + wg_end - 1) / isa::kFlashKeys + 1 : 0;
  uint8_t* slot = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(ctx.act) + isa::kSwizzleAtomAlign - 1) & ~uintptr_t{isa::kSwizzleAtomAlign - 1});

  // Q rows of this warpgroup -> its bf16 Q slabs (zeros past the prompt), read by the score wgmma from shared
  // memory; written before the first tile's barrier, which publishes them with the tile.
  using QSlab = tile::SmemSlab<64, isa::Swizzle::k128B>;
  uint8_t* qbuf = slot + 2 * isa::FlashBufferBytes(HD) + wg * (HD / 64) * QSlab::kBytes;
  const uint32_t q_width = a.num_heads * HD;
  const float* q = m.ptr<float>(a.q) + a.head * HD;
  {  // every load first (one round trip), then the packs and stores
    constexpr uint32_t kChunks = 64 * HD / 8 / 128;  // 8 dims of a row per chunk
    float4 x[kChunks][2];
#pragma unroll
    for (uint32_t i = 0; i < kChunks; ++i) {
      const uint32_t ch = t + i * 128, r = ch / (HD / 8), d0 = (ch % (HD / 8)) * 8;
      x[i][0] = x[i][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row0 + r < a.rows) {
        const float* src = q + static_cast<uint64_t>(row0 + r) * q_width + d0;
        x[i][0] = *reinterpret_cast<const float4*>(src);
        x[i][1] = *reinterpret_cast<const float4*>(src + 4);
      }
    }
#pragma unroll
    for (uint32_t i = 0; i < kChunks; ++i) {
      const uint32_t ch = t + i * 128, r = ch / (HD / 8), d0 = (ch % (HD / 8)) * 8;
      tile::StoreShared128(tile::SharedAddress(qbuf) + isa::Swizzled128Offset(HD, 64, r, d0),
                           make_uint4(PackBf16(x[i][0].x, x[i][0].y), PackBf16(x[i][0].z, x[i][0].w),
                                      PackBf16(x[i][1].x, x[i][1].y), PackBf16(x[i][1].z, x[i][1].w)));
    }
  }

  // Each thread converts the same chunks of every key tile: their page and slab offsets, computed once. A K
  // chunk is 8 dims of one key (two 16-byte loads, one from a bf16 cache; one 16-byte store); a V chunk 8 keys of
  // one dim (eight 4- or 2-byte loads down a column, one 16-byte store into the Vᵀ row). Page p of a tile adds
  // p * 32 rows to a K offset and flips bit 6 (chunk p * 4 of the 128-byte row) of a Vᵀ offset.
  const bool bf16 = m.IsBf16(a.k_cache);
  const uint32_t kv_bytes = bf16 ? 2 : 4;
  constexpr uint32_t kKChunks = kPageKeys * HD / 8 / kConsumerThreads;
  constexpr uint32_t kVChunks = HD * kPageKeys / 8 / kConsumerThreads;
  static_assert(kKChunks * kConsumerThreads * 8 == kPageKeys * HD && kVChunks == kKChunks && kPages == 2,
                "whole chunks per thread; a page's keys are one half of the Vᵀ row");
  uint32_t k_src[kKChunks], k_dst[kKChunks], v_src[kVChunks], v_dst[kVChunks];
#pragma unroll
  for (uint32_t c = 0; c < kKChunks; ++c) {
    const uint32_t ch = ctx.tid + c * kConsumerThreads, key = ch / (HD / 8), d0 = (ch % (HD / 8)) * 8;
    k_src[c] = (key * HD + d0) * kv_bytes;
    k_dst[c] = static_cast<uint32_t>(isa::Swizzled128Offset(HD, isa::kFlashKeys, key, d0));
    const uint32_t d = ch % HD, k_local = (ch / HD) * 8;
    v_src[c] = (k_local * HD + d) * kv_bytes;
    v_dst[c] = static_cast<uint32_t>(isa::Swizzled128Offset(isa::kFlashKeys, HD, d, k_local));
  }

  const float log2_scale = a.scale * 1.4426950408889634f;  // exp(x * scale) = exp2(x * log2_scale)
  tile::RowPair row_max{{-INFINITY, -INFINITY}}, row_sum{{0.0f, 0.0f}};
  Acc o;
  o.Zero();
  for (uint32_t j = 0; j < tiles; ++j) {
    uint8_t* kbuf = slot + (j % 2) * isa::FlashBufferBytes(HD);
    uint8_t* vbuf = kbuf + kKBytes;
    const uint32_t key0 = j * isa::kFlashKeys;
    // The last tile holds keys past valid_keys (and pages past max_seq that were never copied): zeros there.
    const bool whole = key0 + isa::kFlashKeys <= valid_keys;
    const uint32_t kb = tile::SharedAddress(kbuf), vb = tile::SharedAddress(vbuf);
    uint32_t page = 0;
    for (uint32_t p = 0; p < kPages; ++p) {  // K rows -> K slab
      if (p % per_ring_page == 0) page = tile::SharedAddress(ctx.AcquirePage());
      else page += kFlashPageStride;
#pragma unroll
      for (uint32_t c = 0; c < kKChunks; ++c) {
        const uint32_t key = p * kPageKeys + (ctx.tid + c * kConsumerThreads) / (HD / 8);
        const bool zero = !whole && key0 + key >= valid_keys;
        uint4 packed;
        if (bf16) {
          packed = zero ? make_uint4(0, 0, 0, 0) : tile::LoadShared128Bits(page + k_src[c]);
        } else {
          float4 x0 = tile::LoadShared128(page + k_src[c]), x1 = tile::LoadShared128(page + k_src[c] + 16);
          if (zero) x0 = x1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          packed = make_uint4(PackBf16(x0.x, x0.y), PackBf16(x0.z, x0.w), PackBf16(x1.x, x1.y), PackBf16(x1.z, x1.w));
        }
        tile::StoreShared128(kb + k_dst[c] + p * kPageKeys * 128, packed);
      }
      if (p % per_ring_page == per_ring_page - 1) ctx.ReleasePage();
    }
    for (uint32_t p = 0; p < kPages; ++p) {  // V rows -> Vᵀ slab
      if (p % per_ring_page == 0) page = tile::SharedAddress(ctx.AcquirePage());
      else page += kFlashPageStride;
#pragma unroll
      for (uint32_t c = 0; c < kVChunks; ++c) {
        const uint32_t key = p * kPageKeys + ((ctx.tid + c * kConsumerThreads) / HD) * 8;
        uint32_t w[4];
        if (bf16) {  // the values' bits as they are, a pair to a word (the earlier key low)
          uint32_t h[8];
#pragma unroll
          for (uint32_t e = 0; e < 8; ++e) {
            h[e] = tile::LoadShared16(page + v_src[c] + e * HD * 2);
            if (!whole && key0 + key + e >= valid_keys) h[e] = 0;
          }
#pragma unroll
          for (uint32_t e = 0; e < 4; ++e) w[e] = h[2 * e] | h[2 * e + 1] << 16;
        } else {
          float v[8];
#pragma unroll
          for (uint32_t e = 0; e < 8; ++e) v[e] = tile::LoadShared32(page + v_src[c] + e * HD * 4);
          if (!whole) {
#pragma unroll
            for (uint32_t e = 0; e < 8; ++e) v[e] = key0 + key + e < valid_keys ? v[e] : 0.0f;
          }
#pragma unroll
          for (uint32_t e = 0; e < 4; ++e) w[e] = PackBf16(v[2 * e], v[2 * e + 1]);
        }
        tile::StoreShared128(vb + (v_dst[c] ^ (p * 64)), make_uint4(w[0], w[1], w[2], w[3]));
      }
      if (p % per_ring_page == per_ring_page - 1) ctx.ReleasePage();
    }
    tile::FenceProxyAsyncShared();  // generic stores, read next by wgmma
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    if (j >= wg_tiles) continue;

    Scores s;
    tile::WgmmaFence();
#pragma unroll
    for (uint32_t kk = 0; kk < HD / 16; ++kk) {
      tile::MmaAsync<isa::kFlashKeys>(s.d, QSlab{qbuf + (kk / 4) * QSlab::kBytes}.Descriptor(0, kk % 4),
                                      KSlab{kbuf + (kk / 4) * KSlab::kBytes}.Descriptor(0, kk % 4), kk > 0 ? 1u : 0u);
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
    const tile::RowPair correction{{tile::Exp2Approx((row_max.v[0] - m_new.v[0]) * log2_scale),
                                    tile::Exp2Approx((row_max.v[1] - m_new.v[1]) * log2_scale)}};
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
    const VSlab vt{vbuf};
#pragma unroll
    for (uint32_t kk = 0; kk < isa::kFlashKeys / 16; ++kk) tile::MmaAsyncRegA<HD>(o.d, pf[kk], vt.Descriptor(0, kk), 1u);
    tile::WgmmaCommit();
    tile::WgmmaWait<0>();
    tile::FenceRegisters(o.d);
#pragma unroll
    for (uint32_t kk = 0; kk < isa::kFlashKeys / 16; ++kk) tile::FenceRegisters(pf[kk]);
  }
  if (!active) return;
  tile::ScaleRows(o, tile::RowPair{{1.0f / row_sum.v[0], 1.0f / row_sum.v[1]}});
  uint8_t* image = m.ptr<uint8_t>(a.out);
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
    const uint32_t r = row0 + Acc::Row(t, i);
    if (r < a.rows && start + r < a.max_seq) {
      *reinterpret_cast<uint32_t*>(image + isa::Swizzled128Offset(q_width, isa::kGemmTileM, r, a.head * HD + Acc::Col(t, i))) =
          PackBf16(o.d[i], o.d[i + 1]);
    }
  }
}

// Inlined, like RunGemm (see there): a call would serialise every wgmma of the kernel.
__device__ __forceinline__ void RunFlashAttn(const isa::FlashAttnArgs& a, ConsumerContext& ctx) {
  if (a.head_dim == 64) RunFlashAttnTile<64>(a, ctx);
  else RunFlashAttnTile<128>(a, ctx);
}

// FLASH_ATTN's pages (its loader hook), once its waits are met (K and V are activations): pages of 32 keys, two to
// a ring page when it holds 32 KB (FlashPagesPerRingPage); keys past the cache copy nothing (the consumers zero
// them).
template <>
inline constexpr bool kHasPageHook<isa::FlashAttnArgs> = true;
template <uint32_t kVariant>
__device__ __forceinline__ void LoadPages(const isa::FlashAttnArgs& a, const isa::Instruction& inst,
                                          LoaderContext& l) {
  l.WaitData(inst);
  const FlashPages flash = FlashPagesOf(a, l.p.machine);
  l.InstructionRead();
  const uint32_t per_page = FlashPagesPerRingPage(l.p.page_bytes);
  for (uint32_t i = 0; i < flash.count; i += per_page) {
    uint8_t* page = l.EmptyPage(inst.opcode);
    uint32_t bytes = 0;
    for (uint32_t j = 0; j < per_page; ++j) bytes += flash.Bytes(i + j);
    if (bytes == 0) {
      MbarrierArrive(l.Full());
    } else {
      MbarrierArriveExpectTx(l.Full(), bytes);
      for (uint32_t j = 0; j < per_page; ++j) {
        if (flash.Bytes(i + j) == 0) continue;
        BulkCopyToShared(page + j * kFlashPageStride, flash.Source(i + j), flash.Bytes(i + j), l.Full());
      }
    }
    ++l.ring;
  }
  if (flash.count > 0) l.Unthrottle();
}

}  // namespace loom::megakernel
