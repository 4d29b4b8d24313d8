// Split-KV decode attention on the device (ATTN_PARTIAL, ATTN_REDUCE). K/V rows
// are activations: read with ordinary loads after the instruction's waits.
//
// ATTN_PARTIAL, activation slot: q[group * head_dim] (bulk-copied by the
// activation loader) | scores[group * positions] | per-position-group outputs
#pragma once

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

__device__ __forceinline__ void RunAttnPartial(const isa::AttnPartialArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const uint32_t length = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[isa::kStatePosition]) + 1;
  uint32_t begin, end;
  isa::SplitRange(length, a.split, a.num_splits, &begin, &end);
  const uint32_t group = a.num_heads / a.num_kv_heads, hd = a.head_dim, n = end - begin, hd4 = hd / 4;
  const uint32_t first_head = a.kv_head * group;
  float* q = ctx.act;
  float* scores = q + group * hd;  // [group][n]
  float* red = scores + group * n;  // [position groups][group][hd]
  // q (the group's heads) is already in the slot: the activation loader copied it.

  const float* kc = m.ptr<float>(a.k_cache) + static_cast<uint64_t>(a.kv_head) * a.max_seq * hd;
  const float* vc = m.ptr<float>(a.v_cache) + static_cast<uint64_t>(a.kv_head) * a.max_seq * hd;
  // Scores: a thread per position, every head of the group (each K row read once).
  const float4* q4 = reinterpret_cast<const float4*>(q);
  for (uint32_t p = ctx.tid; p < n; p += kConsumerThreads) {
    const float4* krow = reinterpret_cast<const float4*>(kc + static_cast<uint64_t>(begin + p) * hd);
    float acc[kMaxGroupHeads] = {};
    for (uint32_t d = 0; d < hd4; d += 4) {
      float4 kv[4];
#pragma unroll
      for (uint32_t u = 0; u < 4; ++u) {
        if (d + u < hd4) kv[u] = krow[d + u];
      }
#pragma unroll
      for (uint32_t u = 0; u < 4; ++u) {
        if (d + u >= hd4) break;
#pragma unroll
        for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
          if (h < group) {
            const float4 qv = q4[h * hd4 + d + u];
            acc[h] += qv.x * kv[u].x + qv.y * kv[u].y + qv.z * kv[u].z + qv.w * kv[u].w;
          }
        }
      }
    }
#pragma unroll
    for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
      if (h < group) scores[h * n + p] = acc[h] * a.scale;
    }
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  float* ml = m.ptr<float>(a.partial_ml);
  for (uint32_t h = ctx.warp; h < group; h += kConsumerWarps) {  // a warp per head: max, exp, sum
    float mx = -INFINITY;
    for (uint32_t p = ctx.lane; p < n; p += 32) mx = fmaxf(mx, scores[h * n + p]);
    for (int offset = 16; offset > 0; offset >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
    float l = 0.0f;
    for (uint32_t p = ctx.lane; p < n; p += 32) {
      const float e = expf(scores[h * n + p] - mx);
      scores[h * n + p] = e;
      l += e;
    }
    l = WarpSum(l);
    if (ctx.lane == 0) {
      ml[(static_cast<uint64_t>(a.split) * a.num_heads + first_head + h) * 2] = mx;
      ml[(static_cast<uint64_t>(a.split) * a.num_heads + first_head + h) * 2 + 1] = l;
    }
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // Output: a thread per (position group, dim), every head of the group (each V element read once).
  const uint32_t groups = kConsumerThreads / hd, d = ctx.tid % hd, pg = ctx.tid / hd;
  float acc[kMaxGroupHeads] = {};
  for (uint32_t p = pg; p < n; p += 4 * groups) {
    float v[4];
#pragma unroll
    for (uint32_t u = 0; u < 4; ++u) {
      if (p + u * groups < n) v[u] = vc[static_cast<uint64_t>(begin + p + u * groups) * hd + d];
    }
#pragma unroll
    for (uint32_t u = 0; u < 4; ++u) {
      if (p + u * groups >= n) break;
#pragma unroll
      for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
        if (h < group) acc[h] += scores[h * n + p + u * groups] * v[u];
      }
    }
  }
#pragma unroll
  for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
    if (h < group) red[(pg * group + h) * hd + d] = acc[h];
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  float* po = m.ptr<float>(a.partial_o);
  for (uint32_t i = ctx.tid; i < group * hd; i += kConsumerThreads) {
    float sum = 0.0f;
    for (uint32_t g = 0; g < groups; ++g) sum += red[g * group * hd + i];
    po[(static_cast<uint64_t>(a.split) * a.num_heads + first_head) * hd + i] = sum;
  }
}

__device__ __forceinline__ void RunAttnReduce(const isa::AttnReduceArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* po = m.ptr<float>(a.partial_o);
  const float* pml = m.ptr<float>(a.partial_ml);
  float* out = m.ptr<float>(a.out);
  for (uint32_t i = ctx.tid; i < a.head_count * a.head_dim; i += kConsumerThreads) {
    const uint32_t h = a.head_begin + i / a.head_dim, d = i % a.head_dim;
    float global_max = -INFINITY;
    for (uint32_t s = 0; s < a.num_splits; ++s) global_max = fmaxf(global_max, pml[(s * a.num_heads + h) * 2]);
    float denom = 0.0f, acc = 0.0f;
    for (uint32_t s = 0; s < a.num_splits; ++s) {
      const float m_s = pml[(s * a.num_heads + h) * 2];
      if (m_s == -INFINITY) continue;
      const float w = expf(m_s - global_max);
      denom += w * pml[(s * a.num_heads + h) * 2 + 1];
      acc += w * po[(static_cast<uint64_t>(s) * a.num_heads + h) * a.head_dim + d];
    }
    out[h * a.head_dim + d] = denom > 0.0f ? acc / denom : 0.0f;
  }
}

}  // namespace loom::megakernel
