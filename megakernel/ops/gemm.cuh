// GEMM on the device: one 128 x 128 output tile of C = A · Wᵀ on the tensor
// cores (isa::GemmArgs). The weight loader streams the tile's K slabs through
// the page ring, A slab then W slab (each one 16 KB bulk copy of the swizzled
// image into one page), after the instruction's waits are met (A is an
// activation). Consumer warpgroup g multiplies rows [64g, 64g + 64) of each A
// slab with the W slab on wgmma, keeping one slab in flight: the pages of slab
// s are released once slab s+1 is issued and slab s has completed. Epilogue in
// registers: bias, residual, guarded stores of the tile's rows and columns.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "instructions/swizzle.h"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/ops/loader_context.cuh"
#include "megakernel/ops/matvec.cuh"  // Silu, RotatePairAt
#include "megakernel/tile/row_ops.cuh"  // QuadSum
#include "megakernel/tile/slab_mma.cuh"

namespace loom::megakernel {

// What a GEMM streams. 128-column tiles: `count` slabs in ring order, for each K step its A slab, then its W slab.
// A wide tile: `wide_steps` K steps, each one page of its A slab, its W slab and the W slab of the next 128-row W
// tile, w2 (nullptr when n has none: that third of the page is left as it is, and only output columns past n read
// it). The loader walks them with adds and shifts only: it runs on few registers, and its arithmetic and spills
// delay every page (a division per slab cost the GEMM half its speed).
// a_bytes: the bytes of each A slab copied, its first rows up to the tile's last row of A rounded up to a swizzle atom
// (8 rows, 1 KB): the rows past it reach only accumulator rows the epilogues never store (row i of a product reads
// row i of A alone), and a short prompt's tile is mostly such rows: at one row, 1 KB of each 16 KB A slab.
struct GemmPages {
  const uint8_t* a;  // the tile's first A slab; consecutive K steps are kGemmSlabBytes apart in each operand
  const uint8_t* w;  // the tile's first W slab
  uint32_t count;
  const uint8_t* w2;
  uint32_t wide_steps;
  uint32_t a_bytes;

  __device__ __forceinline__ const uint8_t* Source(uint32_t i) const {
    return (i % 2 == 0 ? a : w) + static_cast<uint64_t>(i / 2) * isa::kGemmSlabBytes;
  }
  __device__ __forceinline__ uint32_t Bytes(uint32_t i) const { return i % 2 == 0 ? a_bytes : isa::kGemmSlabBytes; }
};

__device__ __forceinline__ GemmPages GemmPagesOf(const isa::GemmArgs& g, const isa::MachineView& m) {
  const uint32_t slabs = isa::GemmSlabs(g.k);
  const isa::GemmSlabRange range = isa::GemmSlabsOf(g);
  const uint32_t w_tile = g.wide ? 2 * isa::GemmNTile(g) : isa::GemmNTile(g);
  const uint8_t* a =
      m.ptr<uint8_t>(g.a) + (static_cast<uint64_t>(isa::GemmMTile(g)) * slabs + range.begin) * isa::kGemmSlabBytes;
  const uint8_t* w =
      m.ptr<uint8_t>(g.weight) + (static_cast<uint64_t>(w_tile) * slabs + range.begin) * isa::kGemmSlabBytes;
  const uint32_t a_bytes = isa::GemmSlabRowsLoaded(g) * (isa::kGemmSlabBytes / isa::kGemmTileM);
  if (!g.wide) return {a, w, 2 * range.count, nullptr, 0, a_bytes};
  const bool second = w_tile + 1 < isa::GemmTiles(g.n);
  return {a, w, 0, second ? w + static_cast<uint64_t>(slabs) * isa::kGemmSlabBytes : nullptr, range.count, a_bytes};
}

// Ring pages per K slab: 1 when a page holds the A and the W slab (pages of 32 KB or more), else 2.
__device__ __forceinline__ uint32_t GemmPagesPerSlab(uint32_t page_bytes) {
  return page_bytes >= 2 * isa::kGemmSlabBytes ? 1 : 2;
}

using GemmAcc = tile::Accumulator<isa::kGemmTileN>;
using GemmWideAcc = tile::Accumulator<isa::kGemmWideTileN>;

// Every epilogue issues all its global loads (bias, residual, RoPE frequencies, norm weights) before its first
// store: a store to `out` may alias them (the residual IS out), so a load after a store waits for it, and the
// tile's 64 loads per thread would each pay a round trip instead of overlapping.

// f(i, offset of (r, c) in a row-major [m, n] tensor, c + 1 < n) for each accumulator register pair (i, i + 1) of
// thread t inside the output (r < m, c < n): columns (c, c + 1) of row r. Fully unrolled (acc stays in registers).
template <typename Acc, typename F>
__device__ __forceinline__ void ForEachGemmPair(uint32_t m, uint32_t n, uint32_t t, uint32_t row0, uint32_t col0,
                                                F&& f) {
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
    const uint32_t r = row0 + Acc::Row(t, i), c = col0 + Acc::Col(t, i);
    if (r < m && c < n) f(i, static_cast<uint64_t>(r) * n + c, c + 1 < n);
  }
}

// acc += bias[column] (columns < n).
template <typename Acc>
__device__ __forceinline__ void GemmAddBias(Acc& acc, const __nv_bfloat16* bias, uint32_t n, uint32_t t,
                                            uint32_t col0) {
  if (bias == nullptr) return;
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; ++i) {
    const uint32_t c = col0 + Acc::Col(t, i);
    if (c < n) acc.d[i] += __bfloat162float(bias[c]);
  }
}

// The f32 store epilogues of a tile (kGemmStoreF32, kGemmStoreF32Relu, kGemmPartialF32), GEMM's and CONV_GEMM's
// (`g`: their args, read where they lie; m: the output's rows): bias (a split product's: from the split holding slab
// 0), residual, ReLU and the guarded stores of the tile's rows and columns, or atomic adds into out in place.
// CONV_GEMM's out may be kNoTensor (its out_bf16 alone), and out_bf16 takes the finished values rounded to bf16.
// staged (CONV_GEMM): the shared address of this thread's residual pair 0 (pair p kConsumerThreads * 8 bytes on;
// isa::ConvStagesResidual), or 0: the residual read from global memory.
template <typename Args, typename Acc>
__device__ __forceinline__ void GemmStoreF32Tile(const Args& g, const isa::MachineView& m, uint32_t rows, Acc& acc,
                                                 uint32_t t, uint32_t row0, uint32_t col0, uint32_t staged = 0) {
  constexpr bool kConv = std::is_same_v<Args, isa::ConvGemmArgs>;
  const __nv_bfloat16* bias = g.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(g.bias) : nullptr;
  float* out = !kConv || g.out != isa::kNoTensor ? m.ptr<float>(g.out) : nullptr;
  // One 8-byte access per register pair when n is even (the pair's offset is then even too).
  const bool pairs = g.n % 2 == 0;
  // Adding into out: a residual that is out itself (out += A·Wᵀ + bias, the prefill's O- and down-projections
  // whole). One add per element, so the in-place sum is the one a load, an add and a store would give (bit for bit,
  // but that an atomic f32 add flushes subnormals), without waiting a round trip for the loads: written as loads,
  // the compiler ran them one at a time (gemm_bench --residual at 2048³: 0.062 ms against 0.040 without).
  const bool in_place = g.epilogue == isa::kGemmStoreF32 && g.residual == g.out && (!kConv || out != nullptr);
  if (in_place) {
    GemmAddBias(acc, bias, g.n, t, col0);
    ForEachGemmPair<Acc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t at, bool second) {
      if (pairs) {
        atomicAdd(reinterpret_cast<float2*>(out + at), make_float2(acc.d[i], acc.d[i + 1]));
      } else {
        atomicAdd(out + at, acc.d[i]);
        if (second) atomicAdd(out + at + 1, acc.d[i + 1]);
      }
    });
    return;
  }
  // A part of a split product (kGemmPartialF32) is stored as it is, the bias in the split holding slab 0 only.
  if (g.epilogue != isa::kGemmPartialF32 || isa::GemmSplitBegin(g) == 0) GemmAddBias(acc, bias, g.n, t, col0);
  if constexpr (kConv) {
    if (staged != 0) {  // (n even: pairs)
      ForEachGemmPair<Acc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t, bool) {
        const float2 v = tile::LoadShared64(staged + i / 2 * kConsumerThreads * 8);
        acc.d[i] += v.x;
        acc.d[i + 1] += v.y;
      });
    }
  }
  if (g.residual != isa::kNoTensor && staged == 0) {
    const float* residual = m.ptr<float>(g.residual);
    ForEachGemmPair<Acc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t at, bool second) {
      if (pairs) {
        const float2 v = *reinterpret_cast<const float2*>(residual + at);
        acc.d[i] += v.x;
        acc.d[i + 1] += v.y;
      } else {
        acc.d[i] += residual[at];
        if (second) acc.d[i + 1] += residual[at + 1];
      }
    });
  }
  if (g.epilogue == isa::kGemmStoreF32Relu) {
#pragma unroll
    for (uint32_t i = 0; i < Acc::kRegs; ++i) acc.d[i] = fmaxf(acc.d[i], 0.0f);
  }
  if constexpr (kConv) {
    if (g.out_bf16 != isa::kNoTensor) {
      __nv_bfloat16* image = m.ptr<__nv_bfloat16>(g.out_bf16);
      ForEachGemmPair<Acc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t at, bool second) {
        if (pairs) {
          *reinterpret_cast<__nv_bfloat162*>(image + at) = __floats2bfloat162_rn(acc.d[i], acc.d[i + 1]);
        } else {
          image[at] = __float2bfloat16_rn(acc.d[i]);
          if (second) image[at + 1] = __float2bfloat16_rn(acc.d[i + 1]);
        }
      });
    }
    if (out == nullptr) return;
  }
  ForEachGemmPair<Acc>(rows, g.n, t, row0, col0, [&](uint32_t i, uint64_t at, bool second) {
    if (pairs) {
      *reinterpret_cast<float2*>(out + at) = make_float2(acc.d[i], acc.d[i + 1]);
    } else {
      out[at] = acc.d[i];
      if (second) out[at + 1] = acc.d[i + 1];
    }
  });
}

// The QKV projection's epilogue (kGemmRopeKvAppend): bias, Qwen3's per-head q/k RMSNorm, RoPE, KV-cache append.
// Bias and norms work on the accumulator registers; then the warpgroup's 64 x 128 f32 tile goes through its half
// of the activation slot (stage, kGemmStageStride floats per row), so the rotation and the stores run as a short
// loop over (row, column pair) with a thread's pair fixed: fully unrolled over the fragment, the sincos and the
// QKV layout arithmetic of 32 pairs made the code too large for the instruction cache.
__device__ __forceinline__ void GemmRopeKvEpilogue(const isa::GemmArgs& g, const isa::MachineView& m, GemmAcc& acc,
                                                   uint32_t warpgroup, uint32_t t, uint32_t row0, uint32_t col0,
                                                   float* stage) {
  const uint32_t group = isa::GemmHeadsPerGroup(g);
  GemmAddBias(acc, g.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(g.bias) : nullptr, g.n, t, col0);
  if (g.qk_norm != isa::kNoTensor) {
    // Per-head RMSNorm of q and k heads (Qwen3), before RoPE. The tile holds whole heads (head_dim divides
    // 128); a thread's registers cover two rows (register pairs (i/2)%2) and, in each head, the columns of its
    // quad lane: a sum of squares per (row, head slot), then over the quad's 4 lanes.
    constexpr uint32_t kMaxSlots = isa::kGemmTileN / 64;  // head_dim 64 or 128 (validated)
    float sum_sq[2][kMaxSlots] = {};
#pragma unroll
    for (uint32_t i = 0; i < GemmAcc::kRegs; ++i) {
      const uint32_t slot = GemmAcc::Col(t, i) / g.head_dim;
      const float v = acc.d[i];
#pragma unroll
      for (uint32_t s = 0; s < kMaxSlots; ++s) {
        if (s == slot) sum_sq[(i / 2) % 2][s] += v * v;
      }
    }
    float scale[2][kMaxSlots];
#pragma unroll
    for (uint32_t row = 0; row < 2; ++row) {
#pragma unroll
      for (uint32_t s = 0; s < kMaxSlots; ++s) {
        scale[row][s] = rsqrtf(tile::QuadSum(sum_sq[row][s]) / static_cast<float>(g.head_dim) + g.norm_eps);
      }
    }
    const __nv_bfloat16* w = m.ptr<__nv_bfloat16>(g.qk_norm);
#pragma unroll
    for (uint32_t i = 0; i < GemmAcc::kRegs; ++i) {
      const uint32_t c = col0 + GemmAcc::Col(t, i), slot = GemmAcc::Col(t, i) / g.head_dim;
      if (c >= g.n) continue;
      const isa::QkvRow q = isa::QkvGroupedRow(c, group, g.head_dim);
      if (q.kind == isa::kQkvV) continue;
      float s = 0.0f;
#pragma unroll
      for (uint32_t k = 0; k < kMaxSlots; ++k) s = k == slot ? scale[(i / 2) % 2][k] : s;
      acc.d[i] *= s * __bfloat162float(w[(q.kind == isa::kQkvK ? g.head_dim : 0) + q.dim]);
    }
  }
  // Registers (i, i + 1), i even, are columns (c, c + 1) of one row.
#pragma unroll
  for (uint32_t i = 0; i < GemmAcc::kRegs; i += 2) {
    *reinterpret_cast<float2*>(stage + GemmAcc::Row(t, i) * isa::kGemmStageStride + GemmAcc::Col(t, i)) =
        make_float2(acc.d[i], acc.d[i + 1]);
  }
  NamedBarrierSync(kWarpgroupBarrier + warpgroup, 128);
  // Thread t takes column pair t % 64 of rows t / 64, t / 64 + 2, ...: one rotation pair of a q or k head
  // (dimensions j and j + head_dim/2 in the grouped QKV layout), or two adjacent v dimensions.
  const uint32_t pair = t % 64, c = col0 + 2 * pair;
  if (c >= g.n) return;  // n is even (the grouped layout), so c + 1 < n too
  const isa::QkvRow q = isa::QkvGroupedRow(c, group, g.head_dim);
  const float* table = m.ptr<float>(g.rope_table);
  const uint32_t half = g.head_dim / 2, q_width = group * g.num_kv_heads * g.head_dim;
  const float factor = table[half], frequency = q.kind != isa::kQkvV ? table[q.dim] : 0.0f;
  const int32_t pos0 = m.ptr<int32_t>(g.step_state)[isa::kStatePosition];
  float* out = m.ptr<float>(g.out);
  const uint32_t cache_id = q.kind == isa::kQkvK ? g.k_cache : g.v_cache;
  const bool bf16 = m.IsBf16(cache_id);
  const uint64_t head_row = static_cast<uint64_t>(q.head) * g.max_seq * g.head_dim;
  for (uint32_t row = t / 64; row < 64 && row0 + row < g.m; row += 2) {
    const float2 v = *reinterpret_cast<const float2*>(stage + row * isa::kGemmStageStride + 2 * pair);
    const uint32_t r = row0 + row;
    const int32_t pos = pos0 + static_cast<int32_t>(r);
    float v0 = v.x, v1 = v.y;
    if (q.kind != isa::kQkvV) RotatePairAt(&v0, &v1, pos, frequency, factor);
    if (q.kind == isa::kQkvQ) {
      float* dst = out + static_cast<uint64_t>(r) * q_width + q.head * g.head_dim;
      dst[q.dim] = v0;
      dst[q.dim + half] = v1;
    } else if (pos < static_cast<int32_t>(g.max_seq)) {
      const uint64_t dst = head_row + static_cast<uint64_t>(pos) * g.head_dim + q.dim;
      if (q.kind == isa::kQkvK) {
        StoreKv(m.ptr<float>(cache_id), bf16, dst, v0);
        StoreKv(m.ptr<float>(cache_id), bf16, dst + half, v1);
      } else if (bf16) {  // q.dim even: the pair is one aligned word
        *reinterpret_cast<__nv_bfloat162*>(m.ptr<__nv_bfloat16>(cache_id) + dst) = __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(m.ptr<float>(cache_id) + dst) = make_float2(v0, v1);
      }
    }
  }
}

using GemmSlab = tile::SmemSlab<isa::kGemmTileM, isa::Swizzle::k128B>;
using GemmWideSlab = tile::SmemSlab<isa::kGemmWideTileN, isa::Swizzle::k128B>;  // two W slabs side by side

// Slab s of a tile's K loop on warpgroup g's 64 rows, one slab in flight: issued; then slab s-1 is done and its
// pages (per_slab of them) go back to the loader. GEMM's and CONV_GEMM's.
template <typename Acc, typename WSlab>
__device__ __forceinline__ void GemmSlabStep(Acc& acc, const GemmSlab& a, const WSlab& w, uint32_t warpgroup,
                                             uint32_t s, uint32_t per_slab, ConsumerContext& ctx) {
  tile::WgmmaFence();
  tile::SlabMma(acc, a, warpgroup * 64, w, s > 0);
  tile::WgmmaCommit();
  if (s > 0) {
    tile::WgmmaWait<1>();
    ctx.ReleasePage();
    if (per_slab == 2) ctx.ReleasePage();
  }
}
// After the last slab: it is done, its pages go back.
__device__ __forceinline__ void GemmSlabsDone(uint32_t per_slab, ConsumerContext& ctx) {
  tile::WgmmaWait<0>();
  ctx.ReleasePage();
  if (per_slab == 2) ctx.ReleasePage();
}

// A deferred RMSNorm's row scales (isa::GemmArgs::row_norm): each warpgroup copies its 64 rows' slots into the
// activation slot (isa::GemmRowNormOffset) as the instruction starts, and after the K loop each thread adds its two
// rows' (Row(t, 0) and 8 below) as isa::RowNormScale does (the VM's float) and scales them. Rows past m keep 1.
__device__ __forceinline__ void GemmCopyRowNorm(const isa::GemmArgs& g, const ConsumerContext& ctx, uint32_t warpgroup,
                                                uint32_t t, uint32_t row0) {
  if (g.row_norm == isa::kNoTensor) return;
  const uint32_t slots = tile::SharedAddress(ctx.act) + isa::GemmRowNormOffset(g);
  const isa::MachineView& m = ctx.machine;
  constexpr uint32_t kChunks = isa::kRowNormSlots / 4;  // 16-byte chunks a row
  const float4* norm = m.ptr<float4>(g.row_norm);
  for (uint32_t j = t; j < 64 * kChunks; j += 128) {
    const uint32_t row = j / kChunks;
    if (row0 + row < g.m) {
      CpAsync16Shared(slots + ((warpgroup * 64 + row) * kChunks + j % kChunks) * 16,
                      norm + static_cast<uint64_t>(row0 + row) * kChunks + j % kChunks, 16);
    }
  }
  CpAsyncCommit();
}
template <typename Acc>
__device__ __forceinline__ void GemmScaleRows(const isa::GemmArgs& g, Acc& acc, const ConsumerContext& ctx,
                                              uint32_t warpgroup, uint32_t t, uint32_t row0) {
  if (g.row_norm == isa::kNoTensor) return;
  const uint32_t slots = tile::SharedAddress(ctx.act) + isa::GemmRowNormOffset(g);
  CpAsyncWait<0>();
  NamedBarrierSync(kWarpgroupBarrier + warpgroup, 128);
  float scale[2];
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h) {
    const uint32_t row = Acc::Row(t, 0) + 8 * h;
    float s[isa::kRowNormSlots];
#pragma unroll
    for (uint32_t q = 0; q < isa::kRowNormSlots / 4; ++q) {
      const float4 v = tile::LoadShared128(slots + ((warpgroup * 64 + row) * (isa::kRowNormSlots / 4) + q) * 16);
      s[4 * q] = v.x, s[4 * q + 1] = v.y, s[4 * q + 2] = v.z, s[4 * q + 3] = v.w;
    }
    scale[h] = row0 + row < g.m ? isa::RowNormScale(s) : 1.0f;
  }
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; ++i) acc.d[i] *= scale[(i / 2) % 2];
}

// kGemmSiluMulToImage: registers 2p, 2p+1 hold columns (c, c + 1) of one row with c even, a (gate, up) pair; out is
// the bf16 image of silu(gate) * up.
template <typename Acc>
__device__ __forceinline__ void GemmSiluMulEpilogue(const isa::GemmArgs& g, const isa::MachineView& m, Acc& acc,
                                                    uint32_t t, uint32_t row0, uint32_t col0) {
  GemmAddBias(acc, g.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(g.bias) : nullptr, g.n, t, col0);
  uint8_t* image = m.ptr<uint8_t>(g.out);
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
    const uint32_t r = row0 + Acc::Row(t, i), c = col0 + Acc::Col(t, i);
    if (r < g.m && c < g.n) {
      *reinterpret_cast<__nv_bfloat16*>(image + isa::Swizzled128Offset(g.n / 2, isa::kGemmTileM, r, c / 2)) =
          __float2bfloat16(Silu(acc.d[i]) * acc.d[i + 1]);
    }
  }
}

// A wide tile (isa::GemmArgs::wide): one ring page per K step holds the A slab and the two W slabs, and each
// warpgroup's m64n256 product keeps 128 accumulator registers per thread. f32 and SiLU-image epilogues.
__device__ __forceinline__ void RunGemmWide(const isa::GemmArgs& g, ConsumerContext& ctx) {
  const uint32_t warpgroup = ctx.tid / 128, t = ctx.tid % 128;
  const uint32_t slabs = isa::GemmSlabsOf(g).count;
  const uint32_t row0 = isa::GemmMTile(g) * isa::kGemmTileM + warpgroup * 64, col0 = isa::GemmNTile(g) * isa::kGemmWideTileN;
  GemmCopyRowNorm(g, ctx, warpgroup, t, row0);
  GemmWideAcc acc;
  acc.Zero();
  tile::FenceRegisters(acc.d);  // (see RunGemm)
  PipelineState next = ctx.ring;
  for (uint32_t s = 0; s < slabs; ++s) {
    const uint8_t* page = ctx.WaitPage(next);
    ++next;
    GemmSlabStep(acc, GemmSlab{page}, GemmWideSlab{page + isa::kGemmSlabBytes}, warpgroup, s, 1, ctx);
  }
  GemmSlabsDone(1, ctx);
  GemmScaleRows(g, acc, ctx, warpgroup, t, row0);
  if (g.epilogue == isa::kGemmSiluMulToImage) {
    GemmSiluMulEpilogue(g, ctx.machine, acc, t, row0, col0);
    return;
  }
  GemmStoreF32Tile(g, ctx.machine, g.m, acc, t, row0, col0);
}

// Inlined into the tensor-core variant of the consumer loop only (Consumers<true>), like everything there: a
// function call anywhere in a kernel that issues wgmma makes ptxas serialise every wgmma of it (C7510), and
// acc must stay in registers (fully unrolled indexing; never passed to a call), or ptxas serialises the wgmma
// pipeline again (C7514).
// kWide: the variant has the wide-tile path (isa::kWideKernel; the others never see a wide tile: GpuMachine picks it).
template <bool kWide>
__device__ __forceinline__ void RunGemm(const isa::GemmArgs& g, ConsumerContext& ctx) {
  using Slab = GemmSlab;
  static_assert(Slab::kBytes == isa::kGemmSlabBytes && Slab::kK == isa::kGemmSlabK, "GEMM slab layout");
  static_assert(GemmWideSlab::kBytes == 2 * isa::kGemmSlabBytes, "a wide tile's W slabs fill two 16 KB slabs");
  static_assert(kConsumerThreads == 2 * 128, "two consumer warpgroups, 64 rows each");
  if constexpr (kWide) {
    if (g.wide) {
      RunGemmWide(g, ctx);
      return;
    }
  }
  const uint32_t warpgroup = ctx.tid / 128, t = ctx.tid % 128;
  const uint32_t slabs = isa::GemmSlabsOf(g).count;
  const isa::MachineView& m = ctx.machine;
  const uint32_t row0 = isa::GemmMTile(g) * isa::kGemmTileM + warpgroup * 64, col0 = isa::GemmNTile(g) * isa::kGemmTileN;
  GemmCopyRowNorm(g, ctx, warpgroup, t, row0);
  GemmAcc acc;
  acc.Zero();
  // Without this, the compiler folds the zeros into the loop (its first iteration), and ptxas serialises every
  // wgmma for "non-wgmma instructions defining accumulator registers" (C7515) inside the pipeline.
  tile::FenceRegisters(acc.d);
  // Pages of 32 KB or more hold a slab's A and W together (one page, one wait and one release per slab);
  // smaller ones hold one slab each, A then W.
  const uint32_t per_slab = GemmPagesPerSlab(ctx.page_bytes);
  PipelineState next = ctx.ring;  // the next page to wait for; ctx.ring is the oldest not yet released
  for (uint32_t s = 0; s < slabs; ++s) {
    const uint8_t* first = ctx.WaitPage(next);
    ++next;
    const Slab a{first};
    const Slab w{per_slab == 1 ? first + isa::kGemmSlabBytes : ctx.WaitPage(next)};
    if (per_slab == 2) ++next;
    GemmSlabStep(acc, a, w, warpgroup, s, per_slab, ctx);
  }
  GemmSlabsDone(per_slab, ctx);
  GemmScaleRows(g, acc, ctx, warpgroup, t, row0);
  if (g.epilogue == isa::kGemmRopeKvAppend) {
    GemmRopeKvEpilogue(g, m, acc, warpgroup, t, row0, col0, ctx.act + warpgroup * 64 * isa::kGemmStageStride);
    return;
  }
  if (g.epilogue == isa::kGemmSiluMulToImage) {
    GemmSiluMulEpilogue(g, m, acc, t, row0, col0);
    return;
  }
  GemmStoreF32Tile(g, m, g.m, acc, t, row0, col0);
}

// GEMM's pages (its loader hook), once the instruction's waits are met (A is an activation). 128-column tiles: per
// K slab its A slab and its W slab, a page each or both in one page of 32 KB or more. A wide tile (the wide
// variant's): per K step one page of its A slab and two W slabs (GpuMachine checks the page holds them).
// skip_weight_loads: a diagnostic (gemm_bench --skip_loads), the consumers alone.
template <>
inline constexpr bool kHasPageHook<isa::GemmArgs> = true;
template <uint32_t kVariant>
__device__ __forceinline__ void LoadPages(const isa::GemmArgs& g, const isa::Instruction& inst, LoaderContext& l) {
  l.WaitData(inst);
  const GemmPages gemm = GemmPagesOf(g, l.p.machine);
  l.InstructionRead();
  const uint32_t opcode = inst.opcode;
  const uint32_t per_page = 3 - GemmPagesPerSlab(l.p.page_bytes);  // slabs (A or W) per page: 1 or 2
  for (uint32_t i = 0; i < gemm.count; i += per_page) {
    uint8_t* page = l.EmptyPage(opcode);
    MbarrierArriveExpectTx(l.Full(), per_page == 2 ? gemm.a_bytes + isa::kGemmSlabBytes : gemm.Bytes(i));
    for (uint32_t j = 0; j < per_page; ++j) {
      BulkCopyToShared(page + j * isa::kGemmSlabBytes, gemm.Source(i + j), gemm.Bytes(i + j), l.Full());
    }
    ++l.ring;
  }
  for (uint32_t k = 0; kVariant == isa::kWideKernel && k < gemm.wide_steps; ++k) {
    const uint64_t offset = static_cast<uint64_t>(k) * isa::kGemmSlabBytes;
    uint8_t* page = l.EmptyPage(opcode);
    if (l.p.skip_weight_loads) {
      MbarrierArrive(l.Full());
    } else {
      MbarrierArriveExpectTx(l.Full(), gemm.a_bytes + (gemm.w2 != nullptr ? 2 : 1) * isa::kGemmSlabBytes);
      BulkCopyToShared(page, gemm.a + offset, gemm.a_bytes, l.Full());
      BulkCopyToShared(page + isa::kGemmSlabBytes, gemm.w + offset, isa::kGemmSlabBytes, l.Full());
      if (gemm.w2 != nullptr) {
        BulkCopyToShared(page + 2 * isa::kGemmSlabBytes, gemm.w2 + offset, isa::kGemmSlabBytes, l.Full());
      }
    }
    ++l.ring;
  }
  if (gemm.count + gemm.wide_steps > 0) l.Unthrottle();
}

}  // namespace loom::megakernel
