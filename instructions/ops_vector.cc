// Host side of the small opcodes: EMBED, RMS_NORM, ROPE_KV_APPEND, SILU_MUL, ADD, ARGMAX_PARTIAL, ARGMAX_REDUCE.
#include <algorithm>
#include <cmath>

#include "instructions/opcode_host.h"

namespace loom::isa::ref {

void Validate(const EmbedArgs& a, Checker& c) {
  c.Require(a.hidden > 0 && a.vocab > 0, "hidden and vocab must be positive");
  c.Require(a.row_stride >= a.hidden, "row_stride must be at least hidden");
  c.Require(a.rows > 0, "rows must be positive");
  c.Tensor("table", a.table, BF16, U(a.vocab) * a.row_stride);
  c.Tensor("tokens", a.tokens, I32, U(a.row_begin) + a.rows);
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("out", a.out, F32, (U(a.row_begin) + a.rows) * a.hidden);
  c.Require(a.folded <= 1, "folded must be 0 or 1");
  c.Require(a.folded == 0 || (a.row_begin == 0 && a.rows == 1), "a folded EMBED embeds the one decode row");
}

void Validate(const RmsNormArgs& a, Checker& c) {
  c.Require(a.n > 0 && a.eps > 0, "n and eps must be positive");
  c.Tensor("input", a.input, F32, a.n);
  c.Tensor("weight", a.weight, BF16, a.n);
  c.Tensor("out", a.out, F32, a.n);
}

void Validate(const RopeAppendArgs& a, Checker& c) {
  c.Require(a.head_dim > 0 && a.head_dim % 2 == 0 && a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0,
            "bad head layout");
  const uint64_t q = U(a.num_heads) * a.head_dim, kv = U(a.num_kv_heads) * a.head_dim;
  c.Tensor("q_in", a.q_in, F32, q);
  c.Tensor("k_in", a.k_in, F32, kv);
  c.Tensor("v_in", a.v_in, F32, kv);
  c.Tensor("q_out", a.q_out, F32, q);
  c.KvCaches(a.k_cache, a.v_cache, kv * a.max_seq);
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("rope_table", a.rope_table, F32, a.head_dim / 2 + 1);
  if (a.q_norm != kNoTensor) c.Tensor("q_norm", a.q_norm, BF16, a.head_dim);
  if (a.k_norm != kNoTensor) c.Tensor("k_norm", a.k_norm, BF16, a.head_dim);
  if (a.q_norm != kNoTensor || a.k_norm != kNoTensor) c.Require(a.norm_eps > 0, "norm_eps must be positive");
}

void Validate(const SiluMulArgs& a, Checker& c) {
  const uint64_t end = U(a.begin) + a.count;
  c.Tensor("gate", a.gate, F32, end);
  c.Tensor("up", a.up, F32, end);
  c.Tensor("out", a.out, F32, end);
}

void Validate(const AddArgs& a, Checker& c) {
  const uint64_t end = U(a.begin) + a.count;
  c.Tensor("a", a.a, F32, end);
  c.Tensor("b", a.b, F32, end);
  c.Tensor("out", a.out, F32, end);
}

void Validate(const ArgmaxPartialArgs& a, Checker& c) {
  c.Require(a.count > 0, "count must be positive");
  c.Tensor("logits", a.logits, F32, U(a.begin) + a.count);
  c.Tensor("partials", a.partials, F32, 2 * (U(a.tile_index) + 1));
}

void Validate(const ArgmaxReduceArgs& a, Checker& c) {
  c.Require(a.num_partials > 0, "num_partials must be positive");
  c.Tensor("partials", a.partials, F32, 2 * U(a.num_partials));
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("tokens", a.tokens, I32, U(a.max_seq) + 1);
  if (a.embed_out != kNoTensor) {
    c.Require(a.hidden > 0 && a.vocab > 0, "hidden and vocab must be positive");
    c.Require(a.row_stride >= a.hidden, "row_stride must be at least hidden");
    c.Tensor("embed_table", a.embed_table, BF16, U(a.vocab) * a.row_stride);
    c.Tensor("embed_out", a.embed_out, F32, a.hidden);
  }
}

Footprint Cost(const EmbedArgs& a, uint32_t) {
  return {2ull * a.hidden * a.rows, (4ull * a.hidden + 4) * a.rows + 16, 0, 0};
}

Footprint Cost(const RmsNormArgs& a, uint32_t) { return {2ull * a.n, 8ull * a.n, 0, 4ull * a.n}; }

Footprint Cost(const RopeAppendArgs& a, uint32_t) {
  const uint64_t n = (U(a.num_heads) + 2 * a.num_kv_heads) * a.head_dim;
  return {0, 8 * n, 0, 6 * n};
}

Footprint Cost(const SiluMulArgs& a, uint32_t) { return {0, 12ull * a.count, 0, 4ull * a.count}; }

Footprint Cost(const AddArgs& a, uint32_t) { return {0, 12ull * a.count, 0, 1ull * a.count}; }

Footprint Cost(const ArgmaxPartialArgs& a, uint32_t) { return {0, 4ull * a.count + 8, 0, a.count}; }

Footprint Cost(const ArgmaxReduceArgs& a, uint32_t) {
  // The next step's row, bf16 in and f32 out (its weight bytes are the folded EMBED's, counted there once a step).
  const uint64_t embed = a.embed_out != kNoTensor ? a.hidden : 0;
  return {0, 8ull * a.num_partials + 16 + 6 * embed, 0, a.num_partials};
}

void Reference(const EmbedArgs& a, const MachineView& m) {
  const int32_t* state = m.ptr<int32_t>(a.step_state);
  for (uint32_t r = a.row_begin; r < a.row_begin + a.rows; ++r) {
    int32_t token = m.ptr<int32_t>(a.tokens)[state[kStatePosition] + static_cast<int32_t>(r)];
    if (token < 0 || static_cast<uint32_t>(token) >= a.vocab) token = 0;  // the host validated the prompt
    const uint16_t* row = m.ptr<uint16_t>(a.table) + static_cast<uint64_t>(token) * a.row_stride;
    float* out = m.ptr<float>(a.out) + uint64_t{r} * a.hidden;
    for (uint32_t i = 0; i < a.hidden; ++i) out[i] = graph::Bf16ToFloat(row[i]);
  }
}

void Reference(const RmsNormArgs& a, const MachineView& m) {
  RmsNormInto(m.ptr<float>(a.input), m.ptr<uint16_t>(a.weight), a.n, a.eps, m.ptr<float>(a.out));
}

void Reference(const RopeAppendArgs& a, const MachineView& m) {
  const int32_t pos = m.ptr<int32_t>(a.step_state)[kStatePosition];
  const float* table = m.ptr<float>(a.rope_table);
  const uint32_t half = a.head_dim / 2;
  // Normalises (optional) then rotates head h of `in` into `o`.
  std::vector<float> o(a.head_dim);
  auto rotate = [&](const float* in, uint32_t h, uint32_t norm) {
    for (uint32_t d = 0; d < a.head_dim; ++d) o[d] = in[h * a.head_dim + d];
    if (norm != kNoTensor) RmsNormInto(o.data(), m.ptr<uint16_t>(norm), a.head_dim, a.norm_eps, o.data());
    for (uint32_t j = 0; j < half; ++j) RotatePair(&o[j], &o[j + half], j, pos, table, half);
  };
  for (uint32_t h = 0; h < a.num_heads; ++h) {
    rotate(m.ptr<float>(a.q_in), h, a.q_norm);
    std::copy(o.begin(), o.end(), m.ptr<float>(a.q_out) + h * a.head_dim);
  }
  for (uint32_t g = 0; g < a.num_kv_heads; ++g) {
    const uint64_t row = (uint64_t{g} * a.max_seq + pos) * a.head_dim;
    rotate(m.ptr<float>(a.k_in), g, a.k_norm);
    for (uint32_t d = 0; d < a.head_dim; ++d) KvStore(m, a.k_cache, row + d, o[d]);
    for (uint32_t d = 0; d < a.head_dim; ++d) KvStore(m, a.v_cache, row + d, m.ptr<float>(a.v_in)[g * a.head_dim + d]);
  }
}

void Reference(const SiluMulArgs& a, const MachineView& m) {
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    m.ptr<float>(a.out)[i] = Silu(m.ptr<float>(a.gate)[i]) * m.ptr<float>(a.up)[i];
  }
}

void Reference(const AddArgs& a, const MachineView& m) {
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    m.ptr<float>(a.out)[i] = m.ptr<float>(a.a)[i] + m.ptr<float>(a.b)[i];
  }
}

void Reference(const ArgmaxPartialArgs& a, const MachineView& m) {
  const float* logits = m.ptr<float>(a.logits);
  float best = -INFINITY;
  uint32_t best_index = a.begin;
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    if (logits[i] > best) best = logits[i], best_index = i;
  }
  m.ptr<float>(a.partials)[2 * a.tile_index] = best;
  m.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_index);
}

// embed_out: the device's early copy of the next step's EMBED, which the VM runs every step (instruction.h).
void Reference(const ArgmaxReduceArgs& a, const MachineView& m) {
  const float* partials = m.ptr<float>(a.partials);
  float best = partials[0], best_index = partials[1];
  for (uint32_t t = 1; t < a.num_partials; ++t) {
    const float v = partials[2 * t], index = partials[2 * t + 1];
    if (v > best || (v == best && index < best_index)) best = v, best_index = index;
  }
  int32_t* state = m.ptr<int32_t>(a.step_state);
  const int32_t next = state[kStatePosition] + 1;
  if (next >= static_cast<int32_t>(a.max_seq)) {
    state[kStateOverflow] = 1;
    return;
  }
  if (next >= state[kStatePromptLength]) m.ptr<int32_t>(a.tokens)[next] = static_cast<int32_t>(best_index);
  state[kStatePosition] = next;
}

}  // namespace loom::isa::ref
