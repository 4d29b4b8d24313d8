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

#include "instructions/swizzle.h"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/ops/matvec.cuh"  // Silu, RotatePairDevice
#include "megakernel/tile/row_ops.cuh"  // QuadSum
#include "megakernel/tile/slab_mma.cuh"

namespace loom::megakernel {

// The pages a GEMM streams, in ring order: for each K slab, its A slab, then its W slab.
struct GemmPages {
  const uint8_t* a;  // the tile's first A slab
  const uint8_t* w;  // the tile's first W slab
  uint32_t count;

  __device__ __forceinline__ const uint8_t* Source(uint32_t i) const {
    return (i % 2 == 0 ? a : w) + static_cast<uint64_t>(i / 2) * isa::kGemmSlabBytes;
  }
};

__device__ __forceinline__ GemmPages GemmPagesOf(const isa::GemmArgs& g, const isa::MachineView& m) {
  const uint32_t slabs = isa::GemmSlabs(g.k);
  const isa::GemmSlabRange range = isa::GemmSlabsOf(g);
  return {m.ptr<uint8_t>(g.a) + (static_cast<uint64_t>(g.m_tile) * slabs + range.begin) * isa::kGemmSlabBytes,
          m.ptr<uint8_t>(g.weight) + (static_cast<uint64_t>(g.n_tile) * slabs + range.begin) * isa::kGemmSlabBytes,
          2 * range.count};
}

// The QKV projection's epilogue (kGemmRopeKvAppend), not inlined: its head-norm reductions would otherwise add
// registers to the GEMM's slab loop in the shared consumer loop, which then spilled.
__device__ __noinline__ void GemmRopeKvEpilogue(const isa::GemmArgs& g, const isa::MachineView& m,
                                                tile::Accumulator<isa::kGemmTileN>& acc, uint32_t t, uint32_t row0,
                                                uint32_t col0) {
  float* out = m.ptr<float>(g.out);
  const __nv_bfloat16* bias = g.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(g.bias) : nullptr;
  // Registers 2p, 2p+1 hold columns (c, c + 1) of one token row, c even: a rotation pair of a q or k head
  // (dimensions j and j + head_dim/2 in the grouped QKV layout), or two adjacent v dimensions.
  const float* table = m.ptr<float>(g.rope_table);
  const uint32_t group = isa::GemmHeadsPerGroup(g);
  const uint32_t half = g.head_dim / 2, q_width = group * g.num_kv_heads * g.head_dim;
  const float factor = table[half];
  const int32_t pos0 = m.ptr<int32_t>(g.step_state)[isa::kStatePosition];
  using Acc = tile::Accumulator<isa::kGemmTileN>;
#pragma unroll
  for (uint32_t i = 0; i < Acc::kRegs; ++i) {  // biases first: the head norms see them
    const uint32_t c = col0 + Acc::Col(t, i);
    if (bias != nullptr && c < g.n) acc.d[i] += __bfloat162float(bias[c]);
  }
  if (g.qk_norm != isa::kNoTensor) {
    // Per-head RMSNorm of q and k heads (Qwen3), before RoPE. The tile holds whole heads (head_dim divides
    // 128); a thread's registers cover two rows (register pairs (i/2)%2) and, in each head, the columns of its
    // quad lane: a sum of squares per (row, head slot), then over the quad's 4 lanes.
    constexpr uint32_t kMaxSlots = isa::kGemmTileN / 64;  // head_dim 64 or 128 (validated)
    float sum_sq[2][kMaxSlots] = {};
#pragma unroll
    for (uint32_t i = 0; i < Acc::kRegs; ++i) {
      const uint32_t slot = Acc::Col(t, i) / g.head_dim;
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
    for (uint32_t i = 0; i < Acc::kRegs; ++i) {
      const uint32_t c = col0 + Acc::Col(t, i), slot = Acc::Col(t, i) / g.head_dim;
      if (c >= g.n) continue;
      const isa::QkvRow q = isa::QkvGroupedRow(c, group, g.head_dim);
      if (q.kind == isa::kQkvV) continue;
      float s = 0.0f;
#pragma unroll
      for (uint32_t k = 0; k < kMaxSlots; ++k) s = k == slot ? scale[(i / 2) % 2][k] : s;
      acc.d[i] *= s * __bfloat162float(w[(q.kind == isa::kQkvK ? g.head_dim : 0) + q.dim]);
    }
  }
#pragma unroll 4
  for (uint32_t i = 0; i < Acc::kRegs; i += 2) {
    const uint32_t r = row0 + Acc::Row(t, i);
    const uint32_t c = col0 + Acc::Col(t, i);
    if (r >= g.m || c >= g.n) continue;
    float v0 = acc.d[i], v1 = acc.d[i + 1];
    const int32_t pos = pos0 + static_cast<int32_t>(r);
    const isa::QkvRow q = isa::QkvGroupedRow(c, group, g.head_dim);
    if (q.kind != isa::kQkvV) RotatePairDevice(&v0, &v1, q.dim, pos, table, factor);
    if (q.kind == isa::kQkvQ) {
      float* dst = out + static_cast<uint64_t>(r) * q_width + q.head * g.head_dim;
      dst[q.dim] = v0;
      dst[q.dim + half] = v1;
    } else if (pos < static_cast<int32_t>(g.max_seq)) {
      float* cache = m.ptr<float>(q.kind == isa::kQkvK ? g.k_cache : g.v_cache) +
                     (static_cast<uint64_t>(q.head) * g.max_seq + pos) * g.head_dim;
      cache[q.dim] = v0;
      cache[q.kind == isa::kQkvK ? q.dim + half : q.dim + 1] = v1;
    }
  }
}

// Inlined into the tensor-core variant of the consumer loop only (Consumers<true>): its 64 accumulator registers
// would push the decode opcodes of a shared loop into spills, and a call would serialise the wgmma pipeline.
__device__ __forceinline__ void RunGemm(const isa::GemmArgs& g, ConsumerContext& ctx) {
  using Slab = tile::SmemSlab<isa::kGemmTileM, isa::Swizzle::k128B>;
  static_assert(Slab::kBytes == isa::kGemmSlabBytes && Slab::kK == isa::kGemmSlabK, "GEMM slab layout");
  static_assert(kConsumerThreads == 2 * 128, "two consumer warpgroups, 64 rows each");
  const uint32_t warpgroup = ctx.tid / 128, t = ctx.tid % 128;
  const uint32_t slabs = isa::GemmSlabsOf(g).count;
  tile::Accumulator<isa::kGemmTileN> acc;
  acc.Zero();
  PipelineState next = ctx.ring;  // the next page to wait for; ctx.ring is the oldest not yet released
  for (uint32_t s = 0; s < slabs; ++s) {
    const Slab a{ctx.WaitPage(next)};
    ++next;
    const Slab w{ctx.WaitPage(next)};
    ++next;
    tile::WgmmaFence();
    tile::SlabMma(acc, a, warpgroup * 64, w, s > 0);
    tile::WgmmaCommit();
    if (s > 0) {  // slab s-1 is done: its two pages go back to the loader
      tile::WgmmaWait<1>();
      ctx.ReleasePage();
      ctx.ReleasePage();
    }
  }
  tile::WgmmaWait<0>();
  ctx.ReleasePage();
  ctx.ReleasePage();

  const isa::MachineView& m = ctx.machine;
  float* out = m.ptr<float>(g.out);
  const __nv_bfloat16* bias = g.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(g.bias) : nullptr;
  const float* residual = g.residual != isa::kNoTensor ? m.ptr<float>(g.residual) : nullptr;
  const uint32_t row0 = g.m_tile * isa::kGemmTileM + warpgroup * 64, col0 = g.n_tile * isa::kGemmTileN;
  if (g.epilogue == isa::kGemmRopeKvAppend) {
    GemmRopeKvEpilogue(g, m, acc, t, row0, col0);
    return;
  }
  if (g.epilogue == isa::kGemmSiluMulToImage) {
    // Registers 2p, 2p+1 hold columns (c, c + 1) of one row with c even: a (gate, up) pair.
    uint8_t* image = m.ptr<uint8_t>(g.out);
#pragma unroll
    for (uint32_t i = 0; i < tile::Accumulator<isa::kGemmTileN>::kRegs; i += 2) {
      const uint32_t r = row0 + tile::Accumulator<isa::kGemmTileN>::Row(t, i);
      const uint32_t c = col0 + tile::Accumulator<isa::kGemmTileN>::Col(t, i);
      if (r < g.m && c < g.n) {
        float gate = acc.d[i], up = acc.d[i + 1];
        if (bias != nullptr) gate += __bfloat162float(bias[c]), up += __bfloat162float(bias[c + 1]);
        *reinterpret_cast<__nv_bfloat16*>(image + isa::Swizzled128Offset(g.n / 2, isa::kGemmTileM, r, c / 2)) =
            __float2bfloat16(Silu(gate) * up);
      }
    }
    return;
  }
  if (g.epilogue == isa::kGemmAccumulateF32) {
    const bool first = g.slab_begin == 0;
#pragma unroll
    for (uint32_t i = 0; i < tile::Accumulator<isa::kGemmTileN>::kRegs; ++i) {
      const uint32_t r = row0 + tile::Accumulator<isa::kGemmTileN>::Row(t, i);
      const uint32_t c = col0 + tile::Accumulator<isa::kGemmTileN>::Col(t, i);
      if (r < g.m && c < g.n) {
        const float v = acc.d[i] + (first && bias != nullptr ? __bfloat162float(bias[c]) : 0.0f);
        atomicAdd(out + static_cast<uint64_t>(r) * g.n + c, v);
      }
    }
    return;
  }
#pragma unroll
  for (uint32_t i = 0; i < tile::Accumulator<isa::kGemmTileN>::kRegs; ++i) {
    const uint32_t r = row0 + tile::Accumulator<isa::kGemmTileN>::Row(t, i);
    const uint32_t c = col0 + tile::Accumulator<isa::kGemmTileN>::Col(t, i);
    if (r < g.m && c < g.n) {
      float v = acc.d[i];
      if (bias != nullptr) v += __bfloat162float(bias[c]);
      const uint64_t at = static_cast<uint64_t>(r) * g.n + c;
      if (residual != nullptr) v += residual[at];
      out[at] = v;
    }
  }
}

}  // namespace loom::megakernel
