// The small opcodes: EMBED, RMS_NORM, ROPE_KV_APPEND, SILU_MUL, ADD,
// ARGMAX_PARTIAL and ARGMAX_REDUCE. Plain loads and stores by the consumers.
#pragma once

#include <cuda_bf16.h>

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/ops/matvec.cuh"

namespace loom::megakernel {

// The embedding row of `token` (out of range: row 0; the host validated the prompt) into out[0, hidden), tagged:
// EMBED's, and the next step's row that ARGMAX_REDUCE stores when the EMBED is folded into it.
__device__ __forceinline__ void StoreEmbeddingRow(const __nv_bfloat16* table, uint32_t row_stride, uint32_t vocab,
                                                  int32_t token, float* out, uint32_t hidden, uint32_t tag,
                                                  uint32_t tid) {
  if (token < 0 || static_cast<uint32_t>(token) >= vocab) token = 0;
  const __nv_bfloat16* row = table + static_cast<uint64_t>(token) * row_stride;
  for (uint32_t i = tid; i < hidden; i += kConsumerThreads) out[i] = MaybeTag(__bfloat162float(row[i]), tag);
}

__device__ __forceinline__ void RunEmbed(const isa::EmbedArgs& a, ConsumerContext& ctx) {
  if (a.folded != 0 && ctx.launch_step > 0) return;  // the step before's ARGMAX_REDUCE stored the row
  const isa::MachineView& m = ctx.machine;
  const int32_t pos = m.ptr<int32_t>(a.step_state)[isa::kStatePosition];
  for (uint32_t r = a.row_begin; r < a.row_begin + a.rows; ++r) {
    const int32_t token = m.ptr<int32_t>(a.tokens)[pos + static_cast<int32_t>(r)];
    StoreEmbeddingRow(m.ptr<__nv_bfloat16>(a.table), a.row_stride, a.vocab, token,
                      m.ptr<float>(a.out) + static_cast<uint64_t>(r) * a.hidden, a.hidden,
                      OutputTag(ctx.flags, ctx.step), ctx.tid);
  }
}

__device__ __forceinline__ void RunRmsNorm(const isa::RmsNormArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* x = m.ptr<float>(a.input);
  float sum_sq = 0.0f;
  for (uint32_t j = ctx.tid; j < a.n; j += kConsumerThreads) sum_sq += x[j] * x[j];
  const float scale = 1.0f / sqrtf(ConsumerSum(sum_sq, ctx.tid, ctx.scratch) / static_cast<float>(a.n) + a.eps);
  const __nv_bfloat16* w = m.ptr<__nv_bfloat16>(a.weight);
  float* out = m.ptr<float>(a.out);
  for (uint32_t j = ctx.tid; j < a.n; j += kConsumerThreads) out[j] = x[j] * scale * __bfloat162float(w[j]);
}

// One warp per q or k head: lane l takes the rotation pairs (j, j + half) for
// j = l, l + 32, ..., so the head's optional RMS norm is a warp sum.
__device__ __forceinline__ void RunRopeAppend(const isa::RopeAppendArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const int32_t pos = m.ptr<int32_t>(a.step_state)[isa::kStatePosition];
  const float* table = m.ptr<float>(a.rope_table);
  const uint32_t half = a.head_dim / 2;
  const float factor = table[half];
  for (uint32_t head = ctx.warp; head < a.num_heads + a.num_kv_heads; head += kConsumerWarps) {
    const bool is_q = head < a.num_heads;
    const uint32_t h = is_q ? head : head - a.num_heads;
    const float* src = m.ptr<float>(is_q ? a.q_in : a.k_in) + h * a.head_dim;
    const bool bf16 = !is_q && m.IsBf16(a.k_cache);
    void* dst = is_q ? static_cast<void*>(m.ptr<float>(a.q_out) + h * a.head_dim)
                     : bf16 ? static_cast<void*>(m.ptr<__nv_bfloat16>(a.k_cache) +
                                                 (static_cast<uint64_t>(h) * a.max_seq + pos) * a.head_dim)
                            : static_cast<void*>(m.ptr<float>(a.k_cache) +
                                                 (static_cast<uint64_t>(h) * a.max_seq + pos) * a.head_dim);
    const uint32_t norm = is_q ? a.q_norm : a.k_norm;
    float scale = 1.0f;
    if (norm != isa::kNoTensor) {
      float sum_sq = 0.0f;
      for (uint32_t j = ctx.lane; j < half; j += 32) sum_sq += src[j] * src[j] + src[j + half] * src[j + half];
      scale = 1.0f / sqrtf(WarpSum(sum_sq) / static_cast<float>(a.head_dim) + a.norm_eps);
    }
    const __nv_bfloat16* w = norm != isa::kNoTensor ? m.ptr<__nv_bfloat16>(norm) : nullptr;
    for (uint32_t j = ctx.lane; j < half; j += 32) {
      float v0 = src[j], v1 = src[j + half];
      if (w != nullptr) {
        v0 = v0 * scale * __bfloat162float(w[j]);
        v1 = v1 * scale * __bfloat162float(w[j + half]);
      }
      RotatePairDevice(&v0, &v1, j, pos, table, factor);
      StoreKv(dst, bf16, j, v0);
      StoreKv(dst, bf16, j + half, v1);
    }
  }
  const bool v_bf16 = m.IsBf16(a.v_cache);
  void* v_cache = v_bf16 ? static_cast<void*>(m.ptr<__nv_bfloat16>(a.v_cache)) : static_cast<void*>(m.ptr<float>(a.v_cache));
  for (uint32_t i = ctx.tid; i < a.num_kv_heads * a.head_dim; i += kConsumerThreads) {
    const uint32_t head = i / a.head_dim, d = i % a.head_dim;
    StoreKv(v_cache, v_bf16, (static_cast<uint64_t>(head) * a.max_seq + pos) * a.head_dim + d, m.ptr<float>(a.v_in)[i]);
  }
}

__device__ __forceinline__ void RunSiluMul(const isa::SiluMulArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  for (uint32_t i = a.begin + ctx.tid; i < a.begin + a.count; i += kConsumerThreads) {
    m.ptr<float>(a.out)[i] = Silu(m.ptr<float>(a.gate)[i]) * m.ptr<float>(a.up)[i];
  }
}

__device__ __forceinline__ void RunAdd(const isa::AddArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  for (uint32_t i = a.begin + ctx.tid; i < a.begin + a.count; i += kConsumerThreads) {
    m.ptr<float>(a.out)[i] = m.ptr<float>(a.a)[i] + m.ptr<float>(a.b)[i];
  }
}

__device__ __forceinline__ void RunArgmaxPartial(const isa::ArgmaxPartialArgs& a, ConsumerContext& ctx) {
  const float* logits = ctx.machine.ptr<float>(a.logits);
  float best = -INFINITY;
  uint32_t best_index = a.begin;
  for (uint32_t i = a.begin + ctx.tid; i < a.begin + a.count; i += kConsumerThreads) {
    if (Better(logits[i], i, best, best_index)) best = logits[i], best_index = i;
  }
  ConsumerArgmax(&best, &best_index, ctx.tid, ctx.scratch);
  if (ctx.tid == 0) {
    ctx.machine.ptr<float>(a.partials)[2 * a.tile_index] = best;
    ctx.machine.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_index);
  }
}

__device__ __forceinline__ void RunArgmaxReduce(const isa::ArgmaxReduceArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* partials = m.ptr<float>(a.partials);
  int32_t* state = m.ptr<int32_t>(a.step_state);
  // The next step's EMBED folded in: every consumer needs the token (not in a launch's last step: the next launch's
  // first step embeds, and the tagged tensors must then hold this step's parity).
  const bool embed = a.embed_out != isa::kNoTensor && ctx.launch_step + 1 < ctx.launch_steps;
  // The state loaded beside the partials, one round trip for both (within a launch only this instruction writes it).
  int32_t position = 0, prompt_length = 0;
  if (ctx.tid == 0 || embed) position = state[isa::kStatePosition], prompt_length = state[isa::kStatePromptLength];
  float best = -INFINITY;
  uint32_t best_index = 0xffffffffu;
  for (uint32_t t = ctx.tid; t < a.num_partials; t += kConsumerThreads) {
    const float v = partials[2 * t];
    const uint32_t index = static_cast<uint32_t>(partials[2 * t + 1]);
    if (best_index == 0xffffffffu || Better(v, index, best, best_index)) best = v, best_index = index;
  }
  ConsumerArgmax(&best, &best_index, ctx.tid, ctx.scratch);
  const int32_t next = position + 1;
  const bool overflow = next >= static_cast<int32_t>(a.max_seq);
  if (ctx.tid == 0) {
    if (overflow) {
      state[isa::kStateOverflow] = 1;
    } else {
      if (next >= prompt_length) m.ptr<int32_t>(a.tokens)[next] = static_cast<int32_t>(best_index);
      state[isa::kStatePosition] = next;
    }
  }
  if (!embed) return;
  // The token at the next step's position, as its EMBED would read it: this one, a forced prompt token, or (the
  // cache full: the position stays) this step's own. Only thread 0 wrote tokens, at `next`, and only when no
  // consumer reads it there.
  int32_t token = static_cast<int32_t>(best_index);
  if (overflow) token = m.ptr<int32_t>(a.tokens)[position];
  else if (next < prompt_length) token = m.ptr<int32_t>(a.tokens)[next];
  StoreEmbeddingRow(m.ptr<__nv_bfloat16>(a.embed_table), a.row_stride, a.vocab, token, m.ptr<float>(a.embed_out),
                    a.hidden, OutputTag(ctx.flags, ctx.step + 1), ctx.tid);
}

}  // namespace loom::megakernel
