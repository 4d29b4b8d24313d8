// Split-KV decode attention on the device (ATTN_PARTIAL, ATTN_REDUCE). K/V rows
// are activations: read with ordinary loads after the instruction's waits.
//
// ATTN_PARTIAL, activation buffer: q[group * head_dim] | scores[group * positions]
#pragma once

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"

namespace loom::megakernel {

__device__ __forceinline__ void RunAttnPartial(const isa::AttnPartialArgs& a, const ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const uint32_t length = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[isa::kStatePosition]) + 1;
  uint32_t begin, end;
  isa::SplitRange(length, a.split, a.num_splits, &begin, &end);
  const uint32_t group = a.num_heads / a.num_kv_heads, hd = a.head_dim, n = end - begin;
  const uint32_t first_head = a.kv_head * group;
  float* q = ctx.act;
  float* scores = q + group * hd;
  for (uint32_t i = ctx.tid; i < group * hd; i += kConsumerThreads) q[i] = m.ptr<float>(a.q)[first_head * hd + i];
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);

  const float* kc = m.ptr<float>(a.k_cache) + static_cast<uint64_t>(a.kv_head) * a.max_seq * hd;
  const float* vc = m.ptr<float>(a.v_cache) + static_cast<uint64_t>(a.kv_head) * a.max_seq * hd;
  for (uint32_t p = ctx.warp; p < n; p += kConsumerWarps) {  // a warp per position
    const float* krow = kc + static_cast<uint64_t>(begin + p) * hd;
    for (uint32_t h = 0; h < group; ++h) {
      float s = 0.0f;
      for (uint32_t d = ctx.lane; d < hd; d += 32) s += q[h * hd + d] * krow[d];
      s = WarpSum(s);
      if (ctx.lane == 0) scores[h * n + p] = s * a.scale;
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
  float* po = m.ptr<float>(a.partial_o);
  for (uint32_t i = ctx.tid; i < group * hd; i += kConsumerThreads) {  // a thread per (head, dim)
    const uint32_t h = i / hd, d = i % hd;
    float acc = 0.0f;
    for (uint32_t p = 0; p < n; ++p) acc += scores[h * n + p] * vc[static_cast<uint64_t>(begin + p) * hd + d];
    po[(static_cast<uint64_t>(a.split) * a.num_heads + first_head + h) * hd + d] = acc;
  }
}

__device__ __forceinline__ void RunAttnReduce(const isa::AttnReduceArgs& a, const ConsumerContext& ctx) {
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
