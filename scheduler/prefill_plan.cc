#include "scheduler/prefill_plan.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "instructions/instruction.h"

namespace loom::scheduler::prefill_internal {
namespace {

using graph::OpDef;

absl::Status Refuse(const OpDef& op, const std::string& why) {
  return absl::UnimplementedError(
      absl::StrCat("prefill: op '", op.name(), "' (", graph::OpType_Name(op.type()), "): ", why));
}

std::vector<const OpDef*> ConsumersOfType(const graph::Graph& g, const std::string& t, graph::OpType type) {
  std::vector<const OpDef*> out;
  for (const OpDef* op : g.consumers(t)) {
    if (op->type() == type) out.push_back(op);
  }
  return out;
}

Linear LinearOf(const graph::Graph& g, const OpDef& op) {
  Linear l;
  l.weight = op.inputs(1);
  if (op.inputs_size() > 2) l.bias = op.inputs(2);
  l.n = static_cast<uint32_t>(g.tensor(l.weight).shape(0));
  l.k = static_cast<uint32_t>(g.tensor(l.weight).shape(1));
  return l;
}

// Through a per-head RMSNorm (group_size > 0) producing `t`, if any: its input, with its weight and eps.
std::string ThroughHeadNorm(const graph::Graph& g, const std::string& t, std::string* weight, float* eps) {
  const OpDef* p = g.producer(t);
  if (p == nullptr || p->type() != graph::RMS_NORM || p->norm().group_size() == 0) return t;
  *weight = p->inputs(1);
  *eps = p->norm().eps();
  return p->inputs(0);
}

// The LINEAR producing `t` from `input`, or an error naming what is there instead.
absl::StatusOr<const OpDef*> LinearFrom(const graph::Graph& g, const std::string& t, const std::string& input,
                                        const OpDef& user) {
  const OpDef* p = g.producer(t);
  if (p == nullptr || p->type() != graph::LINEAR || p->inputs(0) != input) {
    return Refuse(user, absl::StrCat("input '", t, "' is not a projection of the layer's normed input"));
  }
  return p;
}

}  // namespace

absl::StatusOr<Plan> ParsePlan(const graph::Graph& g) {
  Plan plan;
  const OpDef* embed = nullptr;
  for (const OpDef& op : g.def().ops()) {
    if (op.type() == graph::EMBEDDING) embed = &op;
  }
  if (embed == nullptr) return absl::UnimplementedError("prefill: the graph has no EMBEDDING");
  plan.table = embed->inputs(0);
  plan.vocab = static_cast<uint32_t>(g.tensor(plan.table).shape(0));
  plan.hidden = static_cast<uint32_t>(g.tensor(plan.table).shape(1));
  std::string x = embed->outputs(0);
  while (true) {
    std::vector<const OpDef*> norms = ConsumersOfType(g, x, graph::RMS_NORM);
    if (norms.size() != 1 || norms[0]->norm().group_size() != 0) {
      return absl::UnimplementedError(absl::StrCat("prefill: the residual stream '", x,
                                                   "' does not feed exactly one RMSNorm of whole rows"));
    }
    const OpDef& norm = *norms[0];
    const std::string h = norm.outputs(0);
    std::vector<const OpDef*> linears = ConsumersOfType(g, h, graph::LINEAR);
    if (linears.size() == 1) {  // the final norm and the LM head
      const OpDef& head = *linears[0];
      if (ConsumersOfType(g, head.outputs(0), graph::ARGMAX).size() != 1) {
        return Refuse(head, "the last projection must feed the ARGMAX of a decode step");
      }
      if (head.inputs_size() > 2) return Refuse(head, "an LM head with a bias has no lowering");
      plan.final_norm = norm.inputs(1);
      plan.final_eps = norm.norm().eps();
      plan.lm_head = head.inputs(1);
      return plan;
    }
    Layer l;
    l.norm1 = norm.inputs(1);
    l.eps1 = norm.norm().eps();
    // The attention these projections feed (through RoPE for q and k).
    const OpDef* attn = nullptr;
    for (const OpDef* lin : linears) {
      for (const OpDef* c : g.consumers(lin->outputs(0))) {
        if (c->type() == graph::RMS_NORM && c->norm().group_size() > 0) {  // a per-head norm, then RoPE
          for (const OpDef* r : ConsumersOfType(g, c->outputs(0), graph::ROPE)) c = r;
        }
        if (c->type() == graph::ATTENTION) attn = c;
        if (c->type() == graph::ROPE) {
          for (const OpDef* a : ConsumersOfType(g, c->outputs(0), graph::ATTENTION)) attn = a;
        }
      }
    }
    if (attn == nullptr || linears.size() != 3) {
      return Refuse(norm, "its output does not feed the q, k and v projections of one attention");
    }
    const graph::AttentionAttrs& at = attn->attention();
    if (!at.causal()) return Refuse(*attn, "only causal attention has a prefill lowering");
    l.heads = at.num_heads();
    l.kv_heads = at.num_kv_heads();
    l.head_dim = at.head_dim();
    l.scale = at.scale() > 0 ? at.scale() : 1.0f / std::sqrt(static_cast<float>(at.head_dim()));
    const OpDef* rope_q = g.producer(attn->inputs(0));
    const OpDef* rope_k = g.producer(attn->inputs(1));
    if (rope_q == nullptr || rope_k == nullptr || rope_q->type() != graph::ROPE || rope_k->type() != graph::ROPE ||
        rope_q->rope().SerializeAsString() != rope_k->rope().SerializeAsString()) {
      return Refuse(*attn, "q and k must come from RoPE ops with the same attributes");
    }
    l.rope = rope_q->rope();
    float q_eps = 0, k_eps = 0;
    const std::string q_in = ThroughHeadNorm(g, rope_q->inputs(0), &l.q_norm, &q_eps);
    const std::string k_in = ThroughHeadNorm(g, rope_k->inputs(0), &l.k_norm, &k_eps);
    if (l.q_norm.empty() != l.k_norm.empty() || q_eps != k_eps) {
      return Refuse(*attn, "q and k must both have per-head norms with the same eps, or neither");
    }
    l.qk_eps = q_eps;
    if (!l.q_norm.empty()) {
      for (const std::string& w : {l.q_norm, l.k_norm}) {
        if (graph::NumElements(g.tensor(w)) != at.head_dim()) {
          return Refuse(*attn, absl::StrCat("per-head norm weight '", w, "' is not [head_dim]"));
        }
      }
    }
    absl::StatusOr<const OpDef*> q = LinearFrom(g, q_in, h, *rope_q);
    if (!q.ok()) return q.status();
    absl::StatusOr<const OpDef*> k = LinearFrom(g, k_in, h, *rope_k);
    if (!k.ok()) return k.status();
    absl::StatusOr<const OpDef*> v = LinearFrom(g, attn->inputs(2), h, *attn);
    if (!v.ok()) return v.status();
    l.q = LinearOf(g, **q);
    l.k = LinearOf(g, **k);
    l.v = LinearOf(g, **v);
    if (l.q.bias.empty() != l.k.bias.empty() || l.q.bias.empty() != l.v.bias.empty()) {
      return Refuse(**q, "q, k and v must all have biases or none");
    }
    l.k_cache = attn->inputs(3);
    l.v_cache = attn->inputs(4);
    // o-proj + residual
    std::vector<const OpDef*> o = ConsumersOfType(g, attn->outputs(0), graph::LINEAR);
    if (o.size() != 1) return Refuse(*attn, "its output must feed one projection");
    l.o = LinearOf(g, *o[0]);
    std::vector<const OpDef*> add1 = ConsumersOfType(g, o[0]->outputs(0), graph::ADD);
    if (add1.size() != 1 || (add1[0]->inputs(0) != x && add1[0]->inputs(1) != x)) {
      return Refuse(*o[0], "its output must be added to the layer's residual stream");
    }
    const std::string x1 = add1[0]->outputs(0);
    // MLP: norm -> gate, up -> SiLU-mul -> down + residual
    std::vector<const OpDef*> norms2 = ConsumersOfType(g, x1, graph::RMS_NORM);
    if (norms2.size() != 1) return Refuse(*add1[0], "its output must feed one RMSNorm");
    l.norm2 = norms2[0]->inputs(1);
    l.eps2 = norms2[0]->norm().eps();
    const std::string h2 = norms2[0]->outputs(0);
    std::vector<const OpDef*> mlp = ConsumersOfType(g, h2, graph::LINEAR);
    const OpDef* silu = mlp.empty() ? nullptr : [&]() -> const OpDef* {
      std::vector<const OpDef*> s = ConsumersOfType(g, mlp[0]->outputs(0), graph::SILU_MUL);
      return s.size() == 1 ? s[0] : nullptr;
    }();
    if (mlp.size() != 2 || silu == nullptr) return Refuse(*norms2[0], "its output must feed gate and up projections");
    absl::StatusOr<const OpDef*> gate = LinearFrom(g, silu->inputs(0), h2, *silu);
    if (!gate.ok()) return gate.status();
    absl::StatusOr<const OpDef*> up = LinearFrom(g, silu->inputs(1), h2, *silu);
    if (!up.ok()) return up.status();
    l.gate = LinearOf(g, **gate);
    l.up = LinearOf(g, **up);
    if (l.gate.bias.empty() != l.up.bias.empty()) return Refuse(*silu, "gate and up must both have biases or neither");
    std::vector<const OpDef*> down = ConsumersOfType(g, silu->outputs(0), graph::LINEAR);
    if (down.size() != 1) return Refuse(*silu, "its output must feed one projection");
    l.down = LinearOf(g, *down[0]);
    std::vector<const OpDef*> add2 = ConsumersOfType(g, down[0]->outputs(0), graph::ADD);
    if (add2.size() != 1 || (add2[0]->inputs(0) != x1 && add2[0]->inputs(1) != x1)) {
      return Refuse(*down[0], "its output must be added to the residual stream");
    }
    // What the tensor-core opcodes cover.
    if (l.head_dim != 64 && l.head_dim != 128) {
      return Refuse(*attn, absl::StrCat("head_dim ", l.head_dim, ": the flash-attention tiles cover 64 and 128"));
    }
    if (l.gate.n % isa::kGemmSlabK != 0) {
      return Refuse(*silu, absl::StrCat("intermediate size ", l.gate.n, " is not a multiple of ", isa::kGemmSlabK,
                                        " (the SiLU-mul epilogue writes whole operand slabs)"));
    }
    plan.layers.push_back(std::move(l));
    x = add2[0]->outputs(0);
  }
}

}  // namespace loom::scheduler::prefill_internal
