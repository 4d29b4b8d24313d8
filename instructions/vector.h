// The vector family's arguments (the decode step's row-wise opcodes), included by instruction.h (same rules:
// 32-bit words, tensor ids, kFields). Host side: ops_vector.cc; device: megakernel/ops/vector.cuh.
//   EMBED, RMS_NORM, ROPE_KV_APPEND, SILU_MUL, ADD, ARGMAX_PARTIAL, ARGMAX_REDUCE
#pragma once

namespace loom::isa {

// out[r, 0:hidden] = table[tokens[state[position] + r], :] for r in [row_begin, row_begin + rows)  (bf16 -> f32)
// (decode: one row; a prefill pass embeds its prompt rows in chunks)
struct EmbedArgs {
  uint32_t table;  // bf16 [vocab, row_stride] (a packed weight, shared with a tied LM head)
  uint32_t tokens; // i32 [max_seq + 1]: token at each position
  uint32_t step_state;
  uint32_t out;  // f32 [row_begin + rows, hidden]
  uint32_t hidden;
  uint32_t vocab;
  uint32_t row_stride;  // elements between rows of the table (>= hidden)
  uint32_t row_begin;
  uint32_t rows;
  uint32_t folded = 0;  // 1: the step before's ARGMAX_REDUCE stored this row (its embed_out), so on the device it runs only
                        // in a launch's first step (the VM runs it every step: the same values)
  static constexpr const char* kFields[] = {"table", "tokens", "step_state", "out", "hidden", "vocab", "row_stride",
                                            "row_begin", "rows", "folded"};
};

// out = x * rsqrt(mean(x^2) + eps) * weight
struct RmsNormArgs {
  uint32_t input;   // f32 [n]
  uint32_t weight;  // bf16 [n]
  uint32_t out;     // f32 [n]
  uint32_t n;
  float eps;
  static constexpr const char* kFields[] = {"input", "weight", "out", "n", "eps"};
};
template <>
inline constexpr uint32_t kFloatWords<RmsNormArgs> = FloatWord(offsetof(RmsNormArgs, eps));

// Unfused RoPE + KV append: q_out = rope(q_in); caches[pos] = rope(k_in), v_in.
// With q_norm / k_norm (not kNoTensor), each q and k head is first RMS-normed
// over its head_dim with that weight (Qwen3's per-head norms).
struct RopeAppendArgs {
  uint32_t q_in;
  uint32_t k_in;
  uint32_t v_in;
  uint32_t q_out;
  uint32_t k_cache;
  uint32_t v_cache;
  uint32_t step_state;
  uint32_t rope_table;
  uint32_t num_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t max_seq;
  uint32_t q_norm;  // bf16 [head_dim] or kNoTensor
  uint32_t k_norm;  // bf16 [head_dim] or kNoTensor
  float norm_eps;
  static constexpr const char* kFields[] = {"q_in", "k_in", "v_in", "q_out", "k_cache", "v_cache", "step_state",
                                            "rope_table", "num_heads", "num_kv_heads", "head_dim", "max_seq",
                                            "q_norm", "k_norm", "norm_eps"};
};
template <>
inline constexpr uint32_t kFloatWords<RopeAppendArgs> = FloatWord(offsetof(RopeAppendArgs, norm_eps));

// out[i] = silu(gate[i]) * up[i] for i in [begin, begin + count)
struct SiluMulArgs {
  uint32_t gate;
  uint32_t up;
  uint32_t out;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"gate", "up", "out", "begin", "count"};
};

// out[i] = a[i] + b[i] for i in [begin, begin + count)
struct AddArgs {
  uint32_t a;
  uint32_t b;
  uint32_t out;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"a", "b", "out", "begin", "count"};
};

// partials[tile_index] = (max logits[begin:begin+count], its index); lowest index wins ties.
struct ArgmaxPartialArgs {
  uint32_t logits;
  uint32_t begin;
  uint32_t count;
  uint32_t partials;  // f32 [tiles, 2]: value, index (exact in f32 below 2^24)
  uint32_t tile_index;
  static constexpr const char* kFields[] = {"logits", "begin", "count", "partials", "tile_index"};
};

// Picks the best partial, writes it as the token at position+1 (unless that
// position is still inside the prompt) and advances the position: the end of
// a decode step.
// With embed_out (the next step's EMBED folded in), the device also stores the next step's EMBED row a step early:
// table[the token at the new position] into embed_out, with the next step's tag where it carries kFlagTagOut; not in
// a launch's last step, and that EMBED (`folded`) then runs only in a launch's first step. The values are the EMBED's
// own, so the reference (the VM runs that EMBED every step) leaves embed_out alone. Sound because the step's last
// instruction depends on every other (the verifier's step order): no reader of this step's row is still reading.
struct ArgmaxReduceArgs {
  uint32_t partials;
  uint32_t num_partials;
  uint32_t step_state;
  uint32_t tokens;  // i32 [max_seq + 1]
  uint32_t max_seq;
  uint32_t embed_table = kNoTensor;  // bf16 [vocab, row_stride]: the folded EMBED's table
  uint32_t embed_out = kNoTensor;    // f32 [hidden]: its output (kNoTensor: no EMBED folded in)
  uint32_t hidden = 0;
  uint32_t vocab = 0;
  uint32_t row_stride = 0;
  static constexpr const char* kFields[] = {"partials", "num_partials", "step_state", "tokens", "max_seq",
                                            "embed_table", "embed_out", "hidden", "vocab", "row_stride"};
};

}  // namespace loom::isa
