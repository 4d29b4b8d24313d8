// Host side of FLASH_ATTN: causal prefill attention over the KV cache, its output
// in the O-projection GEMM's operand image. The reference follows the device's
// arithmetic: q, K, V and P rounded to bf16 as the tensor cores read them, the
// online softmax over 64-key tiles in f32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "instructions/opcode_host.h"
#include "instructions/swizzle.h"

namespace loom::isa::ref {

void Validate(const FlashAttnArgs& a, Checker& c) {
  c.Require(a.head_dim == 64 || a.head_dim == 128,
            absl::StrCat("head_dim ", a.head_dim, ": the tensor-core attention tiles cover 64 and 128"));
  c.Require(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 && a.head < a.num_heads,
            "bad head / head counts");
  c.Require(a.rows > 0 && a.row_tile * kFlashRows < a.rows,
            absl::StrCat("row tile ", a.row_tile, " outside the ", a.rows, " rows"));
  c.Require(a.rows <= a.max_seq, absl::StrCat(a.rows, " rows do not fit the KV cache of ", a.max_seq));
  c.Require(a.scale > 0, "scale must be positive");
  const uint64_t q_width = U(a.num_heads) * a.head_dim, kv = U(a.num_kv_heads) * a.head_dim;
  c.Tensor("q", a.q, F32, U(a.rows) * q_width);
  c.KvCaches(a.k_cache, a.v_cache, kv * a.max_seq);
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("out", a.out, BF16, GemmImageBytes(a.rows, static_cast<uint32_t>(q_width)) / 2);
}

Footprint Cost(const FlashAttnArgs& a, uint32_t context) {
  // Keys before the prompt are not known at compile time: `context` stands for the start position.
  const uint64_t keys = U(context) + (a.row_tile + 1) * uint64_t{kFlashRows};
  return {0, 2 * keys * a.head_dim * 4 + uint64_t{kFlashRows} * a.head_dim * 6, FlashActivationBytes(a.head_dim),
          4ull * kFlashRows * keys * a.head_dim};
}

void Reference(const FlashAttnArgs& a, const MachineView& m) {
  const int32_t start = m.ptr<int32_t>(a.step_state)[kStatePosition];
  const uint32_t hd = a.head_dim, kv = a.head / (a.num_heads / a.num_kv_heads);
  const uint32_t q_width = a.num_heads * hd;
  auto bf = [](float x) { return graph::Bf16ToFloat(graph::FloatToBf16(x)); };
  const uint64_t row0 = uint64_t{kv} * a.max_seq * hd;  // (a bf16 cache's values round to themselves)
  uint16_t* image = m.ptr<uint16_t>(a.out);
  // The device's order: 64-key tiles, a running max, exp2 with log2(e) folded into the scale, P rounded to bf16
  // for P·V while the row sum keeps it in f32.
  const float log2_scale = a.scale * 1.4426950408889634f;
  std::vector<float> q(hd), o(hd), s(kFlashKeys);
  const uint32_t end = std::min(a.rows, (a.row_tile + 1) * kFlashRows);
  for (uint32_t r = a.row_tile * kFlashRows; r < end; ++r) {
    const int64_t pos = start + static_cast<int64_t>(r);
    if (pos >= a.max_seq) break;
    for (uint32_t d = 0; d < hd; ++d) q[d] = bf(m.ptr<float>(a.q)[uint64_t{r} * q_width + a.head * hd + d]);
    float row_max = -INFINITY, row_sum = 0.0f;
    std::fill(o.begin(), o.end(), 0.0f);
    for (int64_t key0 = 0; key0 <= pos; key0 += kFlashKeys) {
      const int64_t keys = std::min<int64_t>(kFlashKeys, pos + 1 - key0);
      float tile_max = -INFINITY;
      for (int64_t k = 0; k < keys; ++k) {
        float dot = 0.0f;
        for (uint32_t d = 0; d < hd; ++d) dot += q[d] * bf(KvLoad(m, a.k_cache, row0 + (key0 + k) * hd + d));
        s[k] = dot;
        tile_max = std::max(tile_max, dot);
      }
      const float m_new = std::max(row_max, tile_max);
      const float correction = std::exp2((row_max - m_new) * log2_scale);
      row_sum *= correction;
      for (float& x : o) x *= correction;
      for (int64_t k = 0; k < keys; ++k) {
        const float p = std::exp2((s[k] - m_new) * log2_scale);
        row_sum += p;
        for (uint32_t d = 0; d < hd; ++d) o[d] += bf(p) * bf(KvLoad(m, a.v_cache, row0 + (key0 + k) * hd + d));
      }
      row_max = m_new;
    }
    const float sum = row_sum;
    for (uint32_t d = 0; d < hd; ++d) {
      image[Swizzled128Offset(q_width, kGemmTileM, r, a.head * hd + d) / 2] = graph::FloatToBf16(o[d] / sum);
    }
  }
}

}  // namespace loom::isa::ref
