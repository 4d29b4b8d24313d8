// A decoder prefill's attention rules: the q, k and v projections of one normed input (with Qwen3's per-head norms)
// and RoPE as one GEMM over the grouped QKV image whose epilogue rotates q and k and appends K / V to the cache
// (the first of the three the walk meets lowers all of them), and ATTENTION as FLASH_ATTN per (128-row tile, head)
// into the operand image of the projection reading its output.
#include <cmath>

#include "absl/strings/str_join.h"
#include "graph/rope.h"
#include "scheduler/prefill_lowering.h"

namespace loom::scheduler::prefill_internal {
namespace {

// Through a per-head RMSNorm (group_size > 0) producing `t`, if any: its input, with the norm.
std::string ThroughHeadNorm(const graph::Graph& g, const std::string& t, const OpDef** norm) {
  const OpDef* p = g.producer(t);
  if (p == nullptr || p->type() != graph::RMS_NORM || p->norm().group_size() == 0) return t;
  *norm = p;
  return p->inputs(0);
}

}  // namespace

const OpDef* DecoderPrefill::AttentionOf(const OpDef& linear) const {
  for (const OpDef* c : Readers(linear.outputs(0))) {
    if (c->type() == graph::RMS_NORM && c->norm().group_size() > 0) {  // a per-head norm, then RoPE
      for (const OpDef* r : Readers(c->outputs(0))) {
        if (r->type() == graph::ROPE) c = r;
      }
    }
    if (c->type() == graph::ATTENTION) return c;
    if (c->type() == graph::ROPE) {
      for (const OpDef* a : Readers(c->outputs(0))) {
        if (a->type() == graph::ATTENTION) return a;
      }
    }
  }
  return nullptr;
}

absl::Status DecoderPrefill::LowerQkv(const OpDef& attention) {
  const graph::AttentionAttrs& at = attention.attention();
  if (!at.causal()) return Refuse(attention, "only causal attention has a prefill lowering");
  const OpDef* rope_q = g_.producer(attention.inputs(0));
  const OpDef* rope_k = g_.producer(attention.inputs(1));
  if (rope_q == nullptr || rope_k == nullptr || rope_q->type() != graph::ROPE || rope_k->type() != graph::ROPE ||
      rope_q->rope().SerializeAsString() != rope_k->rope().SerializeAsString()) {
    return Refuse(attention, "q and k must come from RoPE ops with the same attributes");
  }
  const OpDef* q_norm = nullptr;
  const OpDef* k_norm = nullptr;
  const std::string q_in = ThroughHeadNorm(g_, rope_q->inputs(0), &q_norm);
  const std::string k_in = ThroughHeadNorm(g_, rope_k->inputs(0), &k_norm);
  if ((q_norm == nullptr) != (k_norm == nullptr) ||
      (q_norm != nullptr && q_norm->norm().eps() != k_norm->norm().eps())) {
    return Refuse(attention, "q and k must both have per-head norms with the same eps, or neither");
  }
  for (const OpDef* norm : {q_norm, k_norm}) {
    if (norm != nullptr && graph::NumElements(g_.tensor(norm->inputs(1))) != at.head_dim()) {
      return Refuse(attention, absl::StrCat("per-head norm weight '", norm->inputs(1), "' is not [head_dim]"));
    }
  }
  const OpDef* q = g_.producer(q_in);
  const OpDef* k = g_.producer(k_in);
  const OpDef* v = g_.producer(attention.inputs(2));
  for (const auto& [p, user, t] : {std::tuple{q, rope_q, &q_in}, {k, rope_k, &k_in}, {v, &attention, &attention.inputs(2)}}) {
    if (p == nullptr || p->type() != graph::LINEAR || p->inputs(0) != q->inputs(0)) {
      return Refuse(*user, absl::StrCat("input '", *t, "' is not a projection of the layer's normed input"));
    }
    if (g_.tensor(p->inputs(1)).kind() != graph::WEIGHT) return Refuse(*p, "a weight computed at run time");
    if (Readers(p->outputs(0)).size() != 1 || g_.tensor(p->outputs(0)).is_output()) {
      return Refuse(*p, "its output is read by more than its attention's path");
    }
  }
  if (q->inputs_size() != k->inputs_size() || q->inputs_size() != v->inputs_size()) {
    return Refuse(*q, "q, k and v must all have biases or none");
  }
  // What the tensor-core opcodes cover.
  if (at.head_dim() != 64 && at.head_dim() != 128) {
    return Refuse(attention,
                  absl::StrCat("head_dim ", at.head_dim(), ": the flash-attention tiles cover 64 and 128"));
  }
  const uint32_t head_dim = at.head_dim(), kv_heads = at.num_kv_heads();
  const uint32_t k_width = static_cast<uint32_t>(g_.tensor(q->inputs(1)).shape(1));
  const uint64_t rows = g_.tensor(q->inputs(1)).shape(0) + g_.tensor(k->inputs(1)).shape(0) +
                        g_.tensor(v->inputs(1)).shape(0);
  absl::StatusOr<uint32_t> k_cache = Decode(attention.inputs(3));
  if (!k_cache.ok()) return k_cache.status();
  absl::StatusOr<uint32_t> v_cache = Decode(attention.inputs(4));
  if (!v_cache.ok()) return v_cache.status();
  // The rope table the decode schedule holds for these attributes (a compile-time constant: found by its values).
  uint32_t rope = 0;
  if (!d_.check_only) {
    const std::vector<float> table = graph::RopeTable(rope_q->rope());
    const Constant* found = nullptr;
    for (const Constant* c : d_.constants) {
      if (c->values_size() == static_cast<int>(table.size()) &&
          std::equal(table.begin(), table.end(), c->values().begin())) {
        found = c;
        break;
      }
    }
    if (found == nullptr) return absl::FailedPreconditionError("prefill: the schedule has no rope table for the graph's RoPE");
    absl::StatusOr<uint32_t> id = Decode(found->tensor());
    if (!id.ok()) return id.status();
    rope = *id;
  }
  absl::StatusOr<Image> a = ImageOf(*q, q->inputs(0));
  if (!a.ok()) return a.status();

  isa::GemmArgs g{};
  g.a = a->image;
  g.weight = Weight("image:", {q->inputs(1), k->inputs(1), v->inputs(1)}, ROWS_QKV_GROUPED, rows, k_width, true,
                    head_dim, kv_heads);
  g.out = q_rows_;
  g.m = P_;
  g.n = static_cast<uint32_t>(rows);
  g.k = k_width;
  g.bias = q->inputs_size() > 2 ? Weight("bias:", {q->inputs(2), k->inputs(2), v->inputs(2)}, ROWS_QKV_GROUPED, rows,
                                         1, false, head_dim, kv_heads)
                                : isa::kNoTensor;
  g.residual = isa::kNoTensor;
  g.epilogue = isa::kGemmRopeKvAppend;
  g.k_cache = *k_cache;
  g.v_cache = *v_cache;
  g.step_state = d_.io.step_state();
  g.rope_table = rope;
  g.qk_norm = isa::kNoTensor;
  if (q_norm != nullptr) {
    g.qk_norm = Weight("vec:", {q_norm->inputs(1), k_norm->inputs(1)}, ROWS_IDENTITY, 2ull * head_dim, 1, false);
    g.norm_eps = q_norm->norm().eps();
  }
  g.num_kv_heads = kv_heads;
  g.head_dim = head_dim;
  g.max_seq = d_.max_seq;
  g.row_norm = a->row_norm;
  std::vector<std::string> ops = {q->name(), k->name(), v->name()};
  if (q_norm != nullptr) ops.insert(ops.end(), {q_norm->name(), k_norm->name()});
  ops.insert(ops.end(), {rope_q->name(), rope_k->name()});
  // One barrier: FLASH_ATTN's row tile t reads the keys of every tile up to t.
  qkv_stage_[attention.name()] =
      Gemm(absl::StrJoin({q->name(), k->name(), v->name()}, "+"), absl::StrJoin(ops, ","), g, a->stage, false);
  Consume({q, k, v, rope_q, rope_k});
  if (q_norm != nullptr) Consume({q_norm, k_norm});
  return absl::OkStatus();
}

absl::Status DecoderPrefill::LowerAttention(const OpDef& op) {
  auto qkv = qkv_stage_.find(op.name());
  if (qkv == qkv_stage_.end()) return Refuse(op, "its q, k and v are not projections of one normed input");
  if (g_.tensor(op.outputs(0)).is_output()) return Refuse(op, "its output is a graph output");
  for (const OpDef* r : Readers(op.outputs(0))) {
    if (r->type() != graph::LINEAR || r->inputs(0) != op.outputs(0)) {
      return Refuse(op, absl::StrCat("its output is read by '", r->name(), "', not a projection"));
    }
  }
  const graph::AttentionAttrs& at = op.attention();
  const float scale = at.scale() > 0 ? at.scale() : 1.0f / std::sqrt(static_cast<float>(at.head_dim()));
  absl::StatusOr<uint32_t> k_cache = Decode(op.inputs(3));
  if (!k_cache.ok()) return k_cache.status();
  absl::StatusOr<uint32_t> v_cache = Decode(op.inputs(4));
  if (!v_cache.ok()) return v_cache.status();
  const uint32_t heads = at.num_heads(), kv_heads = at.num_kv_heads(), head_dim = at.head_dim();
  const StageRef flash = b_.Stages(op.name(), tiles_m_, tiled_);
  for (uint32_t t = 0; t * isa::kFlashRows < P_; ++t) {
    for (uint32_t h = 0; h < heads; ++h) {
      const isa::FlashAttnArgs f{q_rows_, *k_cache, *v_cache, d_.io.step_state(), image_attn_, P_, t, h,
                                 heads, kv_heads, head_dim, d_.max_seq, scale};
      b_.Emit(isa::Opcode::FLASH_ATTN, f, flash.Of(t), qkv->second.Of(t), op.name());
    }
  }
  images_[op.outputs(0)] = image_attn_;
  ready_[op.outputs(0)] = flash;
  return absl::OkStatus();
}

}  // namespace loom::scheduler::prefill_internal
