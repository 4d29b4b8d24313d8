// Lowering of attention: q/k/v projections fused with RoPE and the KV-cache
// append into one packed matvec (or ROPE_KV_APPEND, which also applies Qwen3's
// per-head q/k norms), then split-KV ATTN_PARTIAL and ATTN_REDUCE.
#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "scheduler/cost_model.h"
#include "scheduler/lowering_internal.h"

namespace loom::scheduler::lowering_internal {

// The count of splits a KV head, at most one a KV head per SM (and a split per 64 positions of the cache), whose
// longest split and reduce cost least together in the cost model (CostOf) at the context the schedule is for: the
// cost model's context_length, or half the cache when that is longer (a decode that fills the cache spends its steps
// around there). More splits shorten each split and lengthen the reduce (it merges every split's outputs). Counts
// whose split's K / V rows at that context do not fit the activation slot are passed over while one fits: the rows
// then come through it in chunks, which the cost model does not see (docs/history/performance_log.md;
// measured in the twenty-sixth).
uint32_t AutoAttentionSplits(uint32_t heads, uint32_t kv, uint32_t head_dim, uint32_t max_seq, uint32_t min_positions,
                             const CompileOptions& o, uint32_t kv_bytes) {
  const uint32_t cap = std::clamp<uint32_t>(o.num_sms() / kv, 1, std::max<uint32_t>(1, max_seq / 64));
  const uint32_t context = std::clamp<uint32_t>(std::max(o.cost().context_length(), max_seq / 2), 1, max_seq);
  const uint32_t group = heads / kv, per_reduce = AttnReduceHeadsPriced(head_dim);
  CostModel cost = o.cost();
  cost.set_context_length(context);
  uint32_t best = cap;
  double best_ns = 0;
  bool best_fits = false;
  for (uint32_t splits = 1; splits <= cap; ++splits) {
    isa::AttnPartialArgs p{};
    p.num_splits = splits, p.num_heads = heads, p.num_kv_heads = kv, p.head_dim = head_dim, p.max_seq = max_seq;
    p.min_positions = min_positions, p.out = isa::kNoTensor;
    isa::AttnReduceArgs r{};
    r.head_count = std::min(per_reduce, heads), r.num_splits = splits, r.num_heads = heads, r.head_dim = head_dim;
    Instruction partial{}, reduce{};
    partial.opcode = static_cast<uint8_t>(Opcode::ATTN_PARTIAL), partial.as<isa::AttnPartialArgs>() = p;
    reduce.opcode = static_cast<uint8_t>(Opcode::ATTN_REDUCE), reduce.as<isa::AttnReduceArgs>() = r;
    const double ns = CostOf(partial, cost).total_ns() + CostOf(reduce, cost).total_ns();
    uint32_t begin, end;
    isa::SplitRange(context, 0, splits, min_positions, &begin, &end);
    const bool fits =
        isa::AttnPartialLayout(group, head_dim, end - begin, true, kv_bytes).bytes <= o.smem().activation_bytes();
    if ((fits && !best_fits) || (fits == best_fits && (splits == 1 || ns < best_ns))) {
      best = splits, best_ns = ns, best_fits = fits;
    }
  }
  return best;
}

const OpDef* Lowering::HeadNorm(const OpDef& rope) const {
  const OpDef* norm = graph_.producer(rope.inputs(0));
  if (norm == nullptr || norm->type() != graph::RMS_NORM || norm->norm().group_size() == 0 ||
      norm->norm().group_size() != rope.rope().head_dim() || !OnlyConsumer(norm->outputs(0), rope)) {
    return nullptr;
  }
  return norm;
}

// q, k, v LINEARs of one input -> ROPE(q), ROPE(k) -> ATTENTION: one packed matvec.
std::optional<absl::Status> Lowering::TryQkv(const OpDef& linear) {
  // Find the attention this linear feeds, directly (v) or through a ROPE (q, k), maybe after a head norm.
  const OpDef* attention = nullptr;
  std::function<void(const std::string&, int)> find = [&](const std::string& tensor, int depth) {
    for (const OpDef* c : graph_.consumers(tensor)) {
      if (c->type() == graph::ATTENTION) attention = c;
      const bool through = c->type() == graph::ROPE || (c->type() == graph::RMS_NORM && c->norm().group_size() > 0);
      if (through && depth < 2) find(c->outputs(0), depth + 1);
    }
  };
  find(linear.outputs(0), 0);
  if (attention == nullptr) return std::nullopt;
  const OpDef* rope_q = graph_.producer(attention->inputs(0));
  const OpDef* rope_k = graph_.producer(attention->inputs(1));
  const OpDef* lin_v = graph_.producer(attention->inputs(2));
  if (rope_q == nullptr || rope_k == nullptr || lin_v == nullptr || rope_q->type() != graph::ROPE ||
      rope_k->type() != graph::ROPE || lin_v->type() != graph::LINEAR) {
    return Unsupported(*attention, "the decode lowering needs q and k through ROPE and v straight from a LINEAR");
  }
  if (HeadNorm(*rope_q) != nullptr || HeadNorm(*rope_k) != nullptr) {
    // Per-head norms between the projections and RoPE: separate matvecs, then ROPE_KV_APPEND normalises.
    consumed_.insert(rope_q->name());
    consumed_.insert(rope_k->name());
    return std::nullopt;
  }
  const OpDef* lin_q = graph_.producer(rope_q->inputs(0));
  const OpDef* lin_k = graph_.producer(rope_k->inputs(0));
  if (lin_q == nullptr || lin_k == nullptr || lin_q->type() != graph::LINEAR || lin_k->type() != graph::LINEAR) {
    return Unsupported(*attention, "q and k must come from LINEAR ops (or per-head RMS_NORMs of them)");
  }
  if (rope_q->inputs(1) != pos_input_ || rope_k->inputs(1) != pos_input_ || attention->inputs(5) != pos_input_) {
    return Unsupported(*attention, "RoPE and attention must read the position input");
  }
  const bool biased = lin_q->inputs_size() == 3;
  const bool fusable = o_.fusion().qkv_rope_kv_append() && lin_q->inputs(0) == lin_k->inputs(0) &&
                       lin_q->inputs(0) == lin_v->inputs(0) && lin_k->inputs_size() == lin_q->inputs_size() &&
                       lin_v->inputs_size() == lin_q->inputs_size() &&
                       OnlyConsumer(lin_q->outputs(0), *rope_q) && OnlyConsumer(lin_k->outputs(0), *rope_k) &&
                       OnlyConsumer(lin_v->outputs(0), *attention) && OnlyConsumer(rope_q->outputs(0), *attention) &&
                       OnlyConsumer(rope_k->outputs(0), *attention) &&
                       rope_q->rope().SerializeAsString() == rope_k->rope().SerializeAsString() &&
                       rope_q->rope().head_dim() == attention->attention().head_dim();
  // ROPE ops are always lowered with their attention (fused here, or as ROPE_KV_APPEND).
  consumed_.insert(rope_q->name());
  consumed_.insert(rope_k->name());
  if (!fusable) return std::nullopt;

  const graph::AttentionAttrs& at = attention->attention();
  const uint32_t hd = at.head_dim(), kv = at.num_kv_heads(), group_heads = at.num_heads() / at.num_kv_heads();
  MatvecGroup g;
  g.name = absl::StrCat(lin_q->name(), "+", lin_k->name(), "+", lin_v->name());
  g.op = absl::StrCat(lin_q->name(), ",", lin_k->name(), ",", lin_v->name(), ",", rope_q->name(), ",",
                      rope_k->name(), ",", attention->name(), ".append");
  g.weight = PackedWeightFor({lin_q->inputs(1), lin_k->inputs(1), lin_v->inputs(1)}, ROWS_QKV_GROUPED, hd, kv);
  if (biased) {
    g.args.bias = PackedWeightFor({lin_q->inputs(2), lin_k->inputs(2), lin_v->inputs(2)}, ROWS_QKV_GROUPED, hd, kv);
  }
  g.rows = uint64_t{kv} * (group_heads + 2) * hd;
  g.k = static_cast<uint32_t>(graph_.tensor(lin_q->inputs(0)).shape(1));
  g.granule = 2;
  for (uint32_t c = 0; c <= kv; ++c) g.chunks.push_back(uint64_t{c} * (group_heads + 2) * hd);
  SetMatvecInput(lin_q->inputs(0), &g.args, &g.ready);
  g.args.epilogue = isa::kEpilogueRopeKvAppend;
  g.args.out = ArenaTensorFor(rope_q->outputs(0));
  g.args.k_cache = ArenaTensorFor(attention->inputs(3));
  g.args.v_cache = ArenaTensorFor(attention->inputs(4));
  g.args.step_state = step_state_;
  g.args.rope_table = RopeTable(rope_q->rope());
  g.args.heads_per_group = group_heads;
  g.args.num_kv_heads = kv;
  g.args.head_dim = hd;
  g.args.max_seq = static_cast<uint32_t>(graph_.tensor(attention->inputs(3)).shape(1));
  const std::vector<uint32_t> barriers = EmitMatvec(g, o_.barrier_granularity() == PER_CHUNK);
  fused_qkv_[attention->name()] = {g.args.out, barriers};
  consumed_.insert(lin_q->name());
  consumed_.insert(lin_k->name());
  consumed_.insert(lin_v->name());
  return absl::OkStatus();
}

absl::Status Lowering::LowerAttention(const OpDef& op) {
  const graph::AttentionAttrs& at = op.attention();
  if (graph_.tensor(op.inputs(0)).shape(0) != 1) return Unsupported(op, "prefill attention has no lowering yet");
  if (!at.causal()) return Unsupported(op, "only causal attention is lowered");
  const uint32_t hd = at.head_dim(), kv = at.num_kv_heads(), heads = at.num_heads();
  if (hd % 4 != 0 || isa::kAttnThreads % hd != 0) {
    return Unsupported(op, absl::StrCat("head_dim ", hd, ": the attention instructions need a head_dim that divides ",
                                        isa::kAttnThreads, " and is a multiple of 4"));
  }
  if (heads / kv > isa::kAttnMaxGroupHeads) {
    return Unsupported(op, absl::StrCat(heads / kv, " query heads per KV head (", heads, "/", kv,
                                        "); the attention instructions handle at most ", isa::kAttnMaxGroupHeads));
  }
  const uint32_t max_seq = static_cast<uint32_t>(graph_.tensor(op.inputs(3)).shape(1));
  const uint32_t k_cache = ArenaTensorFor(op.inputs(3)), v_cache = ArenaTensorFor(op.inputs(4));
  uint32_t q;
  std::vector<uint32_t> qkv_barriers;  // one per KV group, or one for all
  if (auto it = fused_qkv_.find(op.name()); it != fused_qkv_.end()) {
    q = it->second.q;
    qkv_barriers = it->second.barriers;
  } else {  // unfused: rotate q and k, append k and v, in one instruction
    const OpDef* rope_q = graph_.producer(op.inputs(0));
    const OpDef* rope_k = graph_.producer(op.inputs(1));
    if (rope_q == nullptr || rope_k == nullptr || rope_q->type() != graph::ROPE || rope_k->type() != graph::ROPE ||
        rope_q->rope().head_dim() != static_cast<int>(hd) ||
        rope_q->rope().SerializeAsString() != rope_k->rope().SerializeAsString()) {
      return Unsupported(op, "q and k must come through the same ROPE with the attention's head_dim");
    }
    // Per-head norms before RoPE are applied by the same instruction.
    const OpDef* q_norm = HeadNorm(*rope_q);
    const OpDef* k_norm = HeadNorm(*rope_k);
    if (q_norm != nullptr && k_norm != nullptr && q_norm->norm().eps() != k_norm->norm().eps()) {
      return Unsupported(op, "the q and k head norms must share one eps");
    }
    const std::string q_in = q_norm != nullptr ? q_norm->inputs(0) : rope_q->inputs(0);
    const std::string k_in = k_norm != nullptr ? k_norm->inputs(0) : rope_k->inputs(0);
    const int group = NewGroup(absl::StrCat(op.name(), ".rope_append"));
    std::vector<uint32_t> ready = ReadyBarriers(q_in);
    for (const std::string& t : {k_in, op.inputs(2)}) {
      const std::vector<uint32_t> r = ReadyBarriers(t);
      ready.insert(ready.end(), r.begin(), r.end());
    }
    const std::vector<isa::Wait> waits = WaitsFor(ready);
    const uint32_t barrier = NewBarrier(absl::StrCat(op.name(), ".rope_append"), waits);
    isa::RopeAppendArgs a{};
    a.q_in = ArenaTensorFor(q_in);
    a.k_in = ArenaTensorFor(k_in);
    a.q_norm = q_norm != nullptr ? PackedWeightFor({q_norm->inputs(1)}, ROWS_IDENTITY) : isa::kNoTensor;
    a.k_norm = k_norm != nullptr ? PackedWeightFor({k_norm->inputs(1)}, ROWS_IDENTITY) : isa::kNoTensor;
    a.norm_eps = q_norm != nullptr ? q_norm->norm().eps() : k_norm != nullptr ? k_norm->norm().eps() : 0.0f;
    a.v_in = ArenaTensorFor(op.inputs(2));
    a.q_out = q = ArenaTensorFor(op.inputs(0));
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.step_state = step_state_;
    a.rope_table = RopeTable(rope_q->rope());
    a.num_heads = heads;
    a.num_kv_heads = kv;
    a.head_dim = hd;
    a.max_seq = max_seq;
    std::string names = absl::StrCat(rope_q->name(), ",", rope_k->name(), ",", op.name(), ".append");
    for (const OpDef* norm : {q_norm, k_norm}) {
      if (norm != nullptr) names = absl::StrCat(norm->name(), ",", names);
    }
    Emit(Make(Opcode::ROPE_KV_APPEND, a), barrier, waits, names, group);
    qkv_barriers = {barrier};
  }

  // Each split keeps its group's q, partial outputs and one score per position and head in its
  // activation slot (K and V too, when they fit; see isa::AttnPartialLayout).
  const uint64_t group = heads / kv, fixed = isa::AttnPartialActivationBytes(group, hd, 0) + 16;
  const uint64_t room = o_.smem().activation_bytes() - std::min<uint64_t>(o_.smem().activation_bytes(), fixed);
  const uint64_t fits = room / (4 * group);
  // Short contexts fill fewer splits (options.cc has why the default is 16).
  uint32_t min_positions = o_.attention_min_split_positions();
  min_positions = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>({min_positions, max_seq, fits})));
  uint32_t splits = o_.attention_splits();
  if (splits == 0) {
    const uint32_t kv_bytes = graph_.tensor(op.inputs(3)).dtype() == graph::BF16 ? 2 : 4;
    splits = AutoAttentionSplits(heads, kv, hd, max_seq, min_positions, o_, kv_bytes);
    if (fits > 0) splits = std::max<uint32_t>(splits, static_cast<uint32_t>((max_seq + fits - 1) / fits));
  }
  const uint32_t po = AddTensor(absl::StrCat(op.name(), ".partial_o"), graph::F32, {splits, heads, hd}, ARENA);
  const uint32_t pml = AddTensor(absl::StrCat(op.name(), ".partial_ml"), graph::F32, {splits, heads, 2}, ARENA);
  const float scale = at.scale() > 0 ? at.scale() : 1.0f / std::sqrt(static_cast<float>(hd));
  const bool chunked = o_.barrier_granularity() == PER_CHUNK;

  const uint32_t out = ArenaTensorFor(op.outputs(0));
  // The reduce folded into the last split of each KV head (AttnPartialArgs::out): an arrival counter per KV head.
  const bool fused = !o_.separate_attention_reduce();
  const uint32_t arrivals =
      fused ? AddTensor(absl::StrCat(op.name(), ".arrivals"), graph::I32, {kv}, ARENA) : isa::kNoTensor;
  const int partial_group = NewGroup(absl::StrCat(op.name(), fused ? ".partial_reduce" : ".partial"));
  // All splits signal one barrier: the fused form's readers (the O projection) need every head (a wait per KV head
  // would not fit an instruction), and the reducers' waits are observed in the data when its signallers are exactly
  // the partials' writers (scheduler/data_waits.h).
  const uint32_t partial_barrier = NewBarrier(absl::StrCat(op.name(), ".partial"), WaitsFor(qkv_barriers));
  for (uint32_t g = 0; g < kv; ++g) {
    const std::vector<isa::Wait> waits = WaitsFor({qkv_barriers.size() == kv ? qkv_barriers[g] : qkv_barriers[0]});
    for (uint32_t s = 0; s < splits; ++s) {
      isa::AttnPartialArgs a{q, k_cache, v_cache, step_state_, po, pml, g, s, splits, heads, kv, hd, max_seq, scale};
      a.out = fused ? out : isa::kNoTensor;
      a.arrivals = arrivals;
      a.min_positions = min_positions;
      Emit(Make(Opcode::ATTN_PARTIAL, a), partial_barrier, chunked ? waits : WaitsFor(qkv_barriers),
           op.name(), partial_group);
    }
  }
  if (fused) {
    ready_[op.outputs(0)] = {{partial_barrier}};
    return absl::OkStatus();
  }
  const int reduce_group = NewGroup(absl::StrCat(op.name(), ".reduce"));
  const uint32_t reduce_barrier = NewBarrier(absl::StrCat(op.name(), ".reduce"), WaitsFor({partial_barrier}));
  // A reduce per kAttnThreads output elements by default (a thread each: it loads 32 splits' outputs at once).
  const uint32_t per_reduce = AttnReduceHeads(hd, o_);
  for (uint32_t h = 0; h < heads; h += per_reduce) {
    isa::AttnReduceArgs a{po, pml, out, h, std::min(per_reduce, heads - h), splits, heads, hd};
    Emit(Make(Opcode::ATTN_REDUCE, a), reduce_barrier, WaitsFor({partial_barrier}), op.name(), reduce_group);
  }
  ready_[op.outputs(0)] = {{reduce_barrier}};
  return absl::OkStatus();
}

}  // namespace loom::scheduler::lowering_internal
