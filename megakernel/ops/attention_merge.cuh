// Merging split-KV attention's partials on the device: ATTN_REDUCE, and the merge the last split of a KV head runs
// when the reduce is fused into ATTN_PARTIAL (ops/attention.cuh).
#pragma once

#include <type_traits>

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

// The partial outputs a merging thread loads at once: kVec consecutive floats of one head.
template <uint32_t kVec>
using MergeVec = std::conditional_t<kVec == 4, float4, std::conditional_t<kVec == 2, float2, float>>;

// out[h] for heads [head_begin, +head_count), a thread per kVec consecutive output elements (of one head). The
// partials come from other SMs (L2 or HBM latency, read past L1: this SM may hold an earlier step's lines of them):
// each batch of kBatch splits is loaded at once, then merged into a running (max, denominator, numerator), so a
// reduction costs one round trip per kBatch splits for each kVec elements a thread owns.
template <uint32_t kVec>
__device__ __forceinline__ void MergePartialsVec(const isa::MachineView& m, uint32_t partial_o, uint32_t partial_ml,
                                                 uint32_t out_id, uint32_t head_begin, uint32_t head_count,
                                                 uint32_t num_splits, uint32_t num_heads, uint32_t head_dim,
                                                 uint32_t tid, uint32_t tag) {
  constexpr uint32_t kBatch = kVec == 4 ? 8 : 16;
  using Vec = MergeVec<kVec>;
  const float* po = m.ptr<float>(partial_o);
  const float2* pml = m.ptr<float2>(partial_ml);
  float* out = m.ptr<float>(out_id);
  for (uint32_t i = tid * kVec; i < head_count * head_dim; i += kConsumerThreads * kVec) {
    const uint32_t h = head_begin + i / head_dim, d = i % head_dim;
    float running_max = -INFINITY, denom = 0.0f, acc[kVec] = {};
    for (uint32_t s0 = 0; s0 < num_splits; s0 += kBatch) {
      float2 ml[kBatch];
      Vec o[kBatch];
#pragma unroll
      for (uint32_t u = 0; u < kBatch; ++u) {
        const uint32_t s = s0 + u;
        ml[u] = make_float2(-INFINITY, 0.0f);
        o[u] = Vec{};
        if (s < num_splits) {
          ml[u] = __ldcg(pml + s * num_heads + h);
          o[u] = __ldcg(reinterpret_cast<const Vec*>(po + (static_cast<uint64_t>(s) * num_heads + h) * head_dim + d));
        }
      }
      float batch_max = -INFINITY;
#pragma unroll
      for (uint32_t u = 0; u < kBatch; ++u) batch_max = fmaxf(batch_max, ml[u].x);
      if (batch_max == -INFINITY) continue;  // only empty splits
      const float new_max = fmaxf(running_max, batch_max);
      const float rescale = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
      denom *= rescale;
#pragma unroll
      for (uint32_t e = 0; e < kVec; ++e) acc[e] *= rescale;
#pragma unroll
      for (uint32_t u = 0; u < kBatch; ++u) {
        if (ml[u].x == -INFINITY) continue;
        const float w = expf(ml[u].x - new_max);
        denom += w * ml[u].y;
        const float* ou = reinterpret_cast<const float*>(&o[u]);
#pragma unroll
        for (uint32_t e = 0; e < kVec; ++e) acc[e] += w * ou[e];
      }
      running_max = new_max;
    }
#pragma unroll
    for (uint32_t e = 0; e < kVec; ++e) {
      out[h * head_dim + d + e] = MaybeTag(denom > 0.0f ? acc[e] / denom : 0.0f, tag);
    }
  }
}

// The merge with as few round trips as the group allows: a thread per element while they fit the consumers, else
// two or four consecutive ones (a head_dim-64 group of 8 heads merged 32 splits in four round trips a thread, now
// two).
__device__ __forceinline__ void MergePartials(const isa::MachineView& m, uint32_t partial_o, uint32_t partial_ml,
                                              uint32_t out_id, uint32_t head_begin, uint32_t head_count,
                                              uint32_t num_splits, uint32_t num_heads, uint32_t head_dim,
                                              uint32_t tid, uint32_t tag = kNoTag) {
  const uint32_t elems = head_count * head_dim;
  if (elems > 2 * kConsumerThreads && head_dim % 4 == 0) {
    MergePartialsVec<4>(m, partial_o, partial_ml, out_id, head_begin, head_count, num_splits, num_heads, head_dim,
                        tid, tag);
  } else if (elems > kConsumerThreads && head_dim % 2 == 0) {
    MergePartialsVec<2>(m, partial_o, partial_ml, out_id, head_begin, head_count, num_splits, num_heads, head_dim,
                        tid, tag);
  } else {
    MergePartialsVec<1>(m, partial_o, partial_ml, out_id, head_begin, head_count, num_splits, num_heads, head_dim,
                        tid, tag);
  }
}

// The fused reduce's merge of the group's heads over the first `active` splits (at most kSplits), in one round trip
// where MergePartials pays one per 16 splits (a group of 8 heads of 64 merged 32 splits in two): each thread loads
// the partial outputs of its kVec elements for every split at once, while the maxima and sums, shared by a head's
// elements, go through the slot (`pairs`: [active][group] float2), a (split, head) pair a thread. Run with two
// elements a thread only (32 splits: 64 registers of partials); a form for every group size, with a second batch
// past 64 / kVec splits, spilled 1.2 KB in the decode kernel.
template <uint32_t kVec>
__device__ __forceinline__ void MergeThroughSlot(const isa::MachineView& m, const isa::AttnPartialArgs& a,
                                                 uint32_t first_head, uint32_t group, uint32_t active, uint32_t pairs,
                                                 uint32_t tid, uint32_t tag) {
  constexpr uint32_t kSplits = 64 / kVec;
  using Vec = MergeVec<kVec>;
  const uint32_t hd = a.head_dim, i = min(tid * kVec, group * hd - kVec), h = i / hd, d = i % hd;
  const float* po = m.ptr<float>(a.partial_o) + static_cast<uint64_t>(first_head + h) * hd + d;
  const uint32_t split_stride = a.num_heads * hd;
  Vec o[kSplits];
#pragma unroll
  for (uint32_t u = 0; u < kSplits; ++u) {
    o[u] = __ldcg(reinterpret_cast<const Vec*>(po + min(u, active - 1) * split_stride));
  }
  const float2* pml = m.ptr<float2>(a.partial_ml) + first_head;
  for (uint32_t j = tid; j < active * group; j += kConsumerThreads) {
    tile::StoreShared64(pairs + 8 * j, __ldcg(pml + (j / group) * a.num_heads + j % group));
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  float mx = -INFINITY;
  for (uint32_t s = 0; s < active; ++s) mx = fmaxf(mx, tile::LoadShared64(pairs + 8 * (s * group + h)).x);
  float denom = 0.0f, acc[kVec] = {};
#pragma unroll
  for (uint32_t u = 0; u < kSplits; ++u) {
    const float2 l = tile::LoadShared64(pairs + 8 * (min(u, active - 1) * group + h));
    const float w = u < active && l.x != -INFINITY ? expf(l.x - mx) : 0.0f;  // empty splits have max -inf
    denom += w * l.y;
    const float* ou = reinterpret_cast<const float*>(&o[u]);
#pragma unroll
    for (uint32_t e = 0; e < kVec; ++e) acc[e] += w * ou[e];
  }
  if (tid * kVec >= group * hd) return;
  float* out = m.ptr<float>(a.out) + static_cast<uint64_t>(first_head + h) * hd + d;
  const float inv = denom > 0.0f ? __frcp_rn(denom) : 0.0f;
#pragma unroll
  for (uint32_t e = 0; e < kVec; ++e) out[e] = MaybeTag(acc[e] * inv, tag);
}

// Whether every float of v carries `parity` (2: no tags, always).
template <typename Vec>
__device__ __forceinline__ bool TaggedVec(const Vec& v, uint32_t parity) {
  const float* f = reinterpret_cast<const float*>(&v);
  bool all = true;
#pragma unroll
  for (uint32_t e = 0; e < sizeof(Vec) / 4; ++e) all &= Tagged(f[e], parity);
  return parity > 1 || all;
}

// ATTN_REDUCE, kVec consecutive output elements (of one head) a thread. The (max, sum) pairs of every split first
// go through the slot ([split][head]); with tags (`parity` < 2) each is read until it carries the step's parity
// (every split stores its pairs every step, after its outputs; an empty split's maximum is -inf: the tag bit is
// cleared again, so an infinity tagged odd, a NaN, is -inf once more). A warp per head then turns its pairs into
// the weights exp(max_s - max) / sum in the slot, and how many splits are not empty (the empty ones are the last);
// each thread loads the outputs of those, 32 / kVec splits at once, each again until tagged, and sums them weighted:
// the reduce costs the round trip that finds the last split's pairs, one more for the outputs, and no per-thread
// pass over the splits' maxima.
template <uint32_t kVec>
__device__ __forceinline__ void ReduceThroughSlot(const isa::AttnReduceArgs& a, ConsumerContext& ctx, uint32_t parity,
                                                  uint32_t tag) {
  constexpr uint32_t kBatch = 32 / kVec;
  using Vec = MergeVec<kVec>;
  const isa::MachineView& m = ctx.machine;
  const uint32_t hd = a.head_dim, count = a.head_count, splits = a.num_splits;
  const uint32_t pairs = tile::SharedAddress(ctx.act), heads = pairs + 8 * splits * count;  // heads: (active, 0)
  const float2* pml = m.ptr<float2>(a.partial_ml) + a.head_begin;
  for (uint32_t j = ctx.tid; j < splits * count; j += kConsumerThreads) {
    const float2* src = pml + (j / count) * a.num_heads + j % count;
    float2 v = __ldcg(src);
    for (uint64_t reads = 0; !TaggedVec(v, parity); ++reads) {
      if (kDeviceDebug && reads > kDebugSpinLimit) {
        ReportStuck(ctx.error, ctx.sm, ctx.index, static_cast<uint32_t>(isa::Opcode::ATTN_REDUCE), a.partial_ml,
                    __float_as_uint(v.x), parity, kStuckTaggedRead);
      }
      v = ReloadRelaxed(src);
    }
    tile::StoreShared64(pairs + 8 * j, make_float2(Tag(v.x, 0), v.y));
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  if (ctx.ready != nullptr && ctx.tid == 0 && parity < 2) *ctx.ready = GlobalTimer();
  for (uint32_t h = ctx.warp; h < count; h += kConsumerWarps) {  // a warp per head: its weights
    float mx = -INFINITY;
    uint32_t active = 0;
    for (uint32_t s = ctx.lane; s < splits; s += 32) {
      const float x = tile::LoadShared64(pairs + 8 * (s * count + h)).x;
      if (x != -INFINITY) mx = fmaxf(mx, x), active = s + 1;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
      active = max(active, __shfl_xor_sync(0xffffffffu, active, offset));
    }
    float denom = 0.0f;
    for (uint32_t s = ctx.lane; s < active; s += 32) {
      const float2 l = tile::LoadShared64(pairs + 8 * (s * count + h));
      const float w = l.x != -INFINITY ? expf(l.x - mx) : 0.0f;
      denom += w * l.y;
      tile::StoreShared64(pairs + 8 * (s * count + h), make_float2(w, 0.0f));
    }
    denom = WarpSum(denom);
    const float inv = denom > 0.0f ? __frcp_rn(denom) : 0.0f;
    for (uint32_t s = ctx.lane; s < active; s += 32) {
      const float w = tile::LoadShared64(pairs + 8 * (s * count + h)).x;
      tile::StoreShared64(pairs + 8 * (s * count + h), make_float2(w * inv, 0.0f));
    }
    if (ctx.lane == 0) tile::StoreShared64(heads + 8 * h, make_float2(__uint_as_float(active), 0.0f));
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  const uint32_t split_stride = a.num_heads * hd;
  for (uint32_t i = ctx.tid * kVec; i < count * hd; i += kConsumerThreads * kVec) {
    const uint32_t h = i / hd, d = i % hd;
    const uint32_t active = __float_as_uint(tile::LoadShared64(heads + 8 * h).x);
    const float* po = m.ptr<float>(a.partial_o) + static_cast<uint64_t>(a.head_begin + h) * hd + d;
    float acc[kVec] = {};
    for (uint32_t s0 = 0; s0 < active; s0 += kBatch) {
      Vec o[kBatch];
#pragma unroll
      for (uint32_t u = 0; u < kBatch; ++u) {
        o[u] = Vec{};
        if (s0 + u < active) o[u] = __ldcg(reinterpret_cast<const Vec*>(po + (s0 + u) * split_stride));
      }
#pragma unroll
      for (uint32_t u = 0; u < kBatch; ++u) {
        if (s0 + u >= active) break;
        // (A split stores its outputs before its pairs, found tagged above: any still untagged is read again.)
        for (uint64_t reads = 0; !TaggedVec(o[u], parity); ++reads) {
          if (kDeviceDebug && reads > kDebugSpinLimit) {
            ReportStuck(ctx.error, ctx.sm, ctx.index, static_cast<uint32_t>(isa::Opcode::ATTN_REDUCE), a.partial_o,
                        reinterpret_cast<const uint32_t*>(&o[u])[0], parity, kStuckTaggedRead);
          }
          o[u] = ReloadRelaxed(reinterpret_cast<const Vec*>(po + (s0 + u) * split_stride));
        }
        const float w = tile::LoadShared64(pairs + 8 * ((s0 + u) * count + h)).x;
        const float* ou = reinterpret_cast<const float*>(&o[u]);
#pragma unroll
        for (uint32_t e = 0; e < kVec; ++e) acc[e] += w * ou[e];
      }
    }
    float* out = m.ptr<float>(a.out) + static_cast<uint64_t>(a.head_begin + h) * hd + d;
#pragma unroll
    for (uint32_t e = 0; e < kVec; ++e) out[e] = MaybeTag(acc[e], tag);
  }
}

// kWide: the forms of more than kConsumerThreads elements are compiled in (not in the decode variant: the lowering
// emits none, and isa::KernelVariantOf runs a program with one in the tensor variant).
template <bool kWide>
__device__ __forceinline__ void RunAttnReduce(const isa::AttnReduceArgs& a, ConsumerContext& ctx) {
  const uint32_t parity = (ctx.flags & isa::kFlagTaggedInput) != 0 ? StepParity(ctx.step) : 2;
  const uint32_t tag = OutputTag(ctx.flags, ctx.step), elems = a.head_count * a.head_dim;
  if (kWide && elems > 2 * kConsumerThreads && a.head_dim % 4 == 0) {
    ReduceThroughSlot<4>(a, ctx, parity, tag);
  } else if (kWide && elems > kConsumerThreads && a.head_dim % 2 == 0) {
    ReduceThroughSlot<2>(a, ctx, parity, tag);
  } else {
    ReduceThroughSlot<1>(a, ctx, parity, tag);
  }
}

}  // namespace loom::megakernel
