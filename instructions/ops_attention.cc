// Host side of split-KV decode attention: ATTN_PARTIAL and ATTN_REDUCE.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>
#include "instructions/opcode_host.h"

namespace loom::isa::ref {

void Validate(const AttnPartialArgs& a, Checker& c) {
  c.Require(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 && a.kv_head < a.num_kv_heads,
            "bad kv_head / head counts");
  c.Require(a.num_splits > 0 && a.split < a.num_splits, "split outside num_splits");
  c.Require(a.min_positions <= a.max_seq, "min_positions above max_seq");
  c.Require(a.head_dim > 0 && a.scale > 0, "head_dim and scale must be positive");
  // What the device implementation covers (one thread per head dimension slice, accumulators per group head).
  c.Require(a.head_dim % 4 == 0 && kAttnThreads % a.head_dim == 0,
            absl::StrCat("head_dim ", a.head_dim, " must divide ", kAttnThreads, " and be a multiple of 4"));
  c.Require(a.num_kv_heads == 0 || a.num_heads / a.num_kv_heads <= kAttnMaxGroupHeads,
            absl::StrCat(a.num_kv_heads == 0 ? 0 : a.num_heads / a.num_kv_heads,
                         " query heads share a KV head; at most ", kAttnMaxGroupHeads, " can"));
  const uint64_t kv = U(a.num_kv_heads) * a.head_dim;
  c.Tensor("q", a.q, F32, U(a.num_heads) * a.head_dim);
  c.KvCaches(a.k_cache, a.v_cache, kv * a.max_seq);
  c.Require(!c.KvBf16(a.k_cache) || a.head_dim % 8 == 0,
            absl::StrCat("head_dim ", a.head_dim, " of a bf16 KV cache must be a multiple of 8 (16-byte rows)"));
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("partial_o", a.partial_o, F32, U(a.num_splits) * a.num_heads * a.head_dim);
  c.Tensor("partial_ml", a.partial_ml, F32, U(a.num_splits) * a.num_heads * 2);
  c.Require((a.out == kNoTensor) == (a.arrivals == kNoTensor), "out and arrivals come together (the fused reduce)");
  if (a.out != kNoTensor) {
    c.Tensor("out", a.out, F32, U(a.num_heads) * a.head_dim);
    c.Tensor("arrivals", a.arrivals, I32, a.num_kv_heads);
  }
}

void Validate(const AttnReduceArgs& a, Checker& c) {
  c.Require(a.num_splits > 0 && a.head_dim > 0 && a.head_count > 0, "sizes must be positive");
  c.Require(U(a.head_begin) + a.head_count <= a.num_heads, "heads outside num_heads");
  c.Tensor("partial_o", a.partial_o, F32, U(a.num_splits) * a.num_heads * a.head_dim);
  c.Tensor("partial_ml", a.partial_ml, F32, U(a.num_splits) * a.num_heads * 2);
  c.Tensor("out", a.out, F32, U(a.num_heads) * a.head_dim);
}

Footprint Cost(const AttnPartialArgs& a, uint32_t context) {
  const uint32_t length = std::max<uint32_t>(context, 1);
  uint32_t begin, end;
  SplitRange(length, a.split, a.num_splits, a.min_positions, &begin, &end);
  const uint64_t positions = end - begin, active = ActiveSplits(length, a.num_splits, a.min_positions);
  const uint64_t group = a.num_heads / a.num_kv_heads;
  Footprint f;
  f.activation_bytes = 2 * positions * a.head_dim * 4 + group * a.head_dim * 8;
  f.smem_bytes = AttnPartialActivationBytes(static_cast<uint32_t>(group), a.head_dim, static_cast<uint32_t>(positions));
  f.flops = 4 * group * positions * a.head_dim;
  if (a.out != kNoTensor) {  // one split in num_splits also merges the active splits' partials: its share
    const uint64_t merged = active * group * (a.head_dim + 2);
    f.activation_bytes += (4 * merged + 4 * group * a.head_dim) / a.num_splits;
    f.flops += 2 * merged / a.num_splits;
  }
  return f;
}

Footprint Cost(const AttnReduceArgs& a, uint32_t) {
  const uint64_t n = U(a.num_splits) * a.head_count * (a.head_dim + 2);
  return {0, 4 * n + 4ull * a.head_count * a.head_dim, AttnReduceActivationBytes(a.num_splits, a.head_count), 2 * n};
}

namespace {

// out[h] for heads [head_begin, +head_count): the partials of every split merged (ATTN_REDUCE, and the fused
// reduce of the last ATTN_PARTIAL of a KV head).
void MergePartials(uint32_t partial_o, uint32_t partial_ml, uint32_t out_id, uint32_t head_begin,
                   uint32_t head_count, uint32_t num_splits, uint32_t num_heads, uint32_t head_dim,
                   const MachineView& m) {
  const float* po = m.ptr<float>(partial_o);
  const float* pml = m.ptr<float>(partial_ml);
  float* out = m.ptr<float>(out_id);
  for (uint32_t h = head_begin; h < head_begin + head_count; ++h) {
    float global_max = -INFINITY;
    for (uint32_t s = 0; s < num_splits; ++s) global_max = std::max(global_max, pml[(s * num_heads + h) * 2]);
    float denom = 0.0f;
    std::vector<float> acc(head_dim, 0.0f);
    for (uint32_t s = 0; s < num_splits; ++s) {
      const float m_s = pml[(s * num_heads + h) * 2];
      if (m_s == -INFINITY) continue;  // empty split
      const float w = std::exp(m_s - global_max);
      denom += w * pml[(s * num_heads + h) * 2 + 1];
      const float* o = po + (static_cast<uint64_t>(s) * num_heads + h) * head_dim;
      for (uint32_t d = 0; d < head_dim; ++d) acc[d] += w * o[d];
    }
    for (uint32_t d = 0; d < head_dim; ++d) out[h * head_dim + d] = denom > 0 ? acc[d] / denom : 0.0f;
  }
}

}  // namespace

void Reference(const AttnPartialArgs& a, const MachineView& m) {
  const uint32_t length = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[kStatePosition]) + 1;
  uint32_t begin, end;
  SplitRange(length, a.split, a.num_splits, a.min_positions, &begin, &end);
  const uint32_t group = a.num_heads / a.num_kv_heads;
  const uint64_t row0 = static_cast<uint64_t>(a.kv_head) * a.max_seq * a.head_dim;
  std::vector<float> scores(end - begin);
  for (uint32_t h = a.kv_head * group; h < (a.kv_head + 1) * group; ++h) {
    const float* q = m.ptr<float>(a.q) + h * a.head_dim;
    float max_score = -INFINITY;
    for (uint32_t p = begin; p < end; ++p) {
      float s = 0.0f;
      for (uint32_t d = 0; d < a.head_dim; ++d) s += q[d] * KvLoad(m, a.k_cache, row0 + p * a.head_dim + d);
      scores[p - begin] = s * a.scale;
      max_score = std::max(max_score, scores[p - begin]);
    }
    float* o = m.ptr<float>(a.partial_o) + (static_cast<uint64_t>(a.split) * a.num_heads + h) * a.head_dim;
    for (uint32_t d = 0; d < a.head_dim; ++d) o[d] = 0.0f;
    float l = 0.0f;
    for (uint32_t p = begin; p < end; ++p) {
      const float e = std::exp(scores[p - begin] - max_score);
      l += e;
      for (uint32_t d = 0; d < a.head_dim; ++d) o[d] += e * KvLoad(m, a.v_cache, row0 + p * a.head_dim + d);
    }
    float* ml = m.ptr<float>(a.partial_ml) + (static_cast<uint64_t>(a.split) * a.num_heads + h) * 2;
    ml[0] = max_score;
    ml[1] = l;
  }
  if (a.out == kNoTensor) return;
  // The VM runs its SMs as threads, as the device does: the arrival publishes this split's partials (release) and
  // the last arriver acquires everyone's.
  std::atomic_ref<int32_t> arrived(m.ptr<int32_t>(a.arrivals)[a.kv_head]);
  if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 < static_cast<int32_t>(a.num_splits)) return;
  arrived.store(0, std::memory_order_relaxed);  // the last split of the step: ready for the next step
  // The splits past ActiveSplits are empty (their maxima -inf): the device merges only the others.
  MergePartials(a.partial_o, a.partial_ml, a.out, a.kv_head * group, group,
                ActiveSplits(length, a.num_splits, a.min_positions), a.num_heads, a.head_dim, m);
}

void Reference(const AttnReduceArgs& a, const MachineView& m) {
  MergePartials(a.partial_o, a.partial_ml, a.out, a.head_begin, a.head_count, a.num_splits, a.num_heads, a.head_dim,
                m);
}

}  // namespace loom::isa::ref
