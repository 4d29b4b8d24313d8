// The decode attention family's arguments (split-KV partials and their reduce), included by instruction.h (same
// rules). Host side: ops_attention.cc; device: megakernel/ops/attention.cuh (the merge: attention_merge.cuh).
#pragma once

namespace loom::isa {

// Split-KV decode attention for one KV head and one split of the context
// [0, position]: for each of the group's query heads, unnormalised
// o = sum_p exp(s_p - m) v_p, with m = max s_p and l = sum exp(s_p - m).
// With `out` set, the split that finishes last of its KV head's num_splits
// (an arrival counter per KV head in `arrivals`, zero between steps: the last
// arriver resets it) also merges the group's partials into out, as ATTN_REDUCE
// does: no separate reduce instruction, no barrier hop.
struct AttnPartialArgs {
  uint32_t q;  // f32 [heads * head_dim] (rotated)
  uint32_t k_cache;
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t partial_o;   // f32 [splits, heads, head_dim]
  uint32_t partial_ml;  // f32 [splits, heads, 2]
  uint32_t kv_head;
  uint32_t split;
  uint32_t num_splits;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  float scale;
  uint32_t out;       // f32 [heads * head_dim], or kNoTensor (an ATTN_REDUCE merges the partials)
  uint32_t arrivals;  // i32 [num_kv_heads] splits of the step done so far (with out), or kNoTensor
  // Positions a non-empty split covers at least (0 or 1: none): short contexts then fill fewer splits, and the
  // fused reduce merges only those (a merge costs a round trip per batch of splits).
  uint32_t min_positions;
  static constexpr const char* kFields[] = {"q", "k_cache", "v_cache", "step_state", "partial_o", "partial_ml",
                                            "kv_head", "split", "num_splits", "num_heads", "num_kv_heads",
                                            "head_dim", "max_seq", "scale", "out", "arrivals", "min_positions"};
};
template <>
inline constexpr uint32_t kFloatWords<AttnPartialArgs> = FloatWord(offsetof(AttnPartialArgs, scale));

// Positions per split of a context of `length` positions.
LOOM_HD uint32_t SplitChunk(uint32_t length, uint32_t num_splits, uint32_t min_positions) {
  const uint32_t chunk = (length + num_splits - 1) / num_splits;
  return chunk > min_positions ? chunk : (min_positions > 0 ? min_positions : 1);
}
// Split s of a context of `length` positions covers [begin, end) (maybe empty).
LOOM_HD void SplitRange(uint32_t length, uint32_t split, uint32_t num_splits, uint32_t min_positions, uint32_t* begin,
                        uint32_t* end) {
  const uint32_t chunk = SplitChunk(length, num_splits, min_positions);
  const uint32_t b = split * chunk;
  *begin = b < length ? b : length;
  *end = b + chunk < length ? b + chunk : length;
}
// The splits that are not empty: the first ActiveSplits(...) of them.
LOOM_HD uint32_t ActiveSplits(uint32_t length, uint32_t num_splits, uint32_t min_positions) {
  const uint32_t chunk = SplitChunk(length, num_splits, min_positions);
  const uint32_t active = (length + chunk - 1) / chunk;
  return active < num_splits ? active : num_splits;
}

// A KV cache holds f32 values (the default) or bf16 (ModelOptions::kv_dtype: half the bytes attention reads a
// position, K and V rounded to nearest even as they are appended); its dtype is the cache tensor's in the tensor
// table, the same for a layer's K and V (validation).
LOOM_HD uint32_t KvBytes(const MachineView& m, uint32_t cache) { return m.IsBf16(cache) ? 2 : 4; }

// ATTN_PARTIAL's activation slot on the device (byte offsets): q[group *
// head_dim], a score per (head, position), the partial outputs of
// kAttnThreads / head_dim position groups (each [group * head_dim]), and, when
// they fit, the split's K and V rows ([positions * head_dim] each, of kv_bytes: the cache's element).
inline constexpr uint32_t kAttnThreads = 256;
// Query heads per KV head that ATTN_PARTIAL keeps accumulators for.
inline constexpr uint32_t kAttnMaxGroupHeads = 8;
struct AttnPartialSlot {
  uint64_t q, scores, red, k, v, bytes;
};
LOOM_HD AttnPartialSlot AttnPartialLayout(uint32_t group, uint32_t head_dim, uint32_t positions, bool with_kv,
                                          uint32_t kv_bytes) {
  AttnPartialSlot s;
  s.q = 0;
  s.scores = 4ull * group * head_dim;
  s.red = s.scores + (4ull * group * positions + 15) / 16 * 16;
  s.k = s.red + 4ull * group * kAttnThreads;
  s.v = s.k + (with_kv ? uint64_t{kv_bytes} * positions * head_dim : 0);
  s.bytes = s.v + (with_kv ? uint64_t{kv_bytes} * positions * head_dim : 0);
  return s;
}
// Without K and V: what the slot must always have room for.
LOOM_HD uint64_t AttnPartialActivationBytes(uint32_t group, uint32_t head_dim, uint32_t positions) {
  return AttnPartialLayout(group, head_dim, positions, false, 4).bytes;
}
// A split whose rows do not fit the slot takes them `chunk` positions at a time through kAttnChunkBuffers K and V
// buffers (the copies of the next kAttnChunkBuffers - 1 chunks fly while one is computed; a running maximum and sum
// across chunks): q, the chunk's scores, the position groups' partial outputs, a rescale factor per head,
// K[kAttnChunkBuffers][chunk * head_dim], V alike. Two: three and four buffers (smaller chunks, more of them) were
// 7% and 10% slower at context 4096 (docs/history/performance_log.md).
inline constexpr uint32_t kAttnChunkBuffers = 2;
struct AttnChunkSlot {
  uint64_t q, scores, red, alpha, k, v, bytes;
};
LOOM_HD AttnChunkSlot AttnChunkLayout(uint32_t group, uint32_t head_dim, uint32_t chunk, uint32_t kv_bytes) {
  AttnChunkSlot s;
  s.q = 0;
  s.scores = 4ull * group * head_dim;
  s.red = s.scores + (4ull * group * chunk + 15) / 16 * 16;
  s.alpha = s.red + 4ull * group * kAttnThreads;
  s.k = s.alpha + 4ull * kAttnMaxGroupHeads;
  s.v = s.k + uint64_t{kv_bytes} * kAttnChunkBuffers * chunk * head_dim;
  s.bytes = s.v + uint64_t{kv_bytes} * kAttnChunkBuffers * chunk * head_dim;
  return s;
}
// The positions of the largest chunk whose layout fits `bytes` (0: none of kAttnMinChunk does).
inline constexpr uint32_t kAttnMinChunk = 8;
LOOM_HD uint32_t AttnChunkPositions(uint32_t group, uint32_t head_dim, uint64_t bytes, uint32_t kv_bytes) {
  const uint64_t fixed = AttnChunkLayout(group, head_dim, 0, kv_bytes).bytes + 16;
  const uint64_t per = 4ull * group + 2ull * kv_bytes * kAttnChunkBuffers * head_dim;
  const uint64_t chunk = bytes > fixed ? (bytes - fixed) / per : 0;
  return chunk >= kAttnMinChunk ? static_cast<uint32_t>(chunk < 0xffffu ? chunk : 0xffffu) : 0;
}

// out[head] = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s for heads [head_begin, +head_count).
// Step tags (decode): splits without the fused merge that carry kFlagTagOut store their partials tagged, every split
// every step (an empty one its -inf maxima); an ATTN_REDUCE with kFlagTaggedInput reads its heads' partials until
// they carry the step's tag, and with kFlagTagOut stores out tagged. Its activation slot holds the (max, sum) pairs.
struct AttnReduceArgs {
  uint32_t partial_o;
  uint32_t partial_ml;
  uint32_t out;  // f32 [heads * head_dim]
  uint32_t head_begin;
  uint32_t head_count;
  uint32_t num_splits;
  uint32_t num_heads;
  uint32_t head_dim;
  static constexpr const char* kFields[] = {"partial_o", "partial_ml", "out",     "head_begin",
                                            "head_count", "num_splits", "num_heads", "head_dim"};
};

// ATTN_REDUCE's slot: a (max, sum) float pair per split and head, [split][head], then 8 bytes a head.
LOOM_HD uint64_t AttnReduceActivationBytes(uint32_t num_splits, uint32_t head_count) {
  return 8ull * (num_splits + 1) * head_count;
}

}  // namespace loom::isa
