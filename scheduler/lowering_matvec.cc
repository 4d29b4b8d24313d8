// Lowering of the matvec family: LINEARs as packed-weight MATVEC tiles (their input staged by the tile's
// prologue, an RMSNorm folded in where it is the only reader), gate/up pairs fused with SILU_MUL into one
// interleaved matvec, the tiles' barriers per chunk of rows.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "scheduler/lowering_internal.h"

namespace loom::scheduler::lowering_internal {

namespace {

// A quantized matvec's tile: MATVEC's fields but its weight-specific ones (FP8's `scales`, int4's `meta` and
// `group_shift`), which the caller sets (a quantized tile has no argmax epilogue, so no `partials`).
template <typename Args>
Args QuantizedTile(const isa::MatvecArgs& a) {
  Args f{};
  f.weight = a.weight, f.row_begin = a.row_begin, f.rows = a.rows, f.k = a.k, f.input = a.input;
  f.prologue = a.prologue, f.norm_weight = a.norm_weight, f.norm_eps = a.norm_eps, f.epilogue = a.epilogue;
  f.out = a.out, f.residual = a.residual, f.k_cache = a.k_cache, f.v_cache = a.v_cache, f.step_state = a.step_state;
  f.rope_table = a.rope_table, f.heads_per_group = a.heads_per_group, f.num_kv_heads = a.num_kv_heads;
  f.head_dim = a.head_dim, f.max_seq = a.max_seq, f.bias = a.bias;
  return f;
}
isa::MatvecFp8Args Fp8Tile(const isa::MatvecArgs& a, uint32_t scales) {
  isa::MatvecFp8Args f = QuantizedTile<isa::MatvecFp8Args>(a);
  f.scales = scales, f.tile_index = a.tile_index;
  return f;
}
isa::MatvecW4Args W4Tile(const isa::MatvecArgs& a, uint32_t meta, uint32_t group_shift) {
  isa::MatvecW4Args f = QuantizedTile<isa::MatvecW4Args>(a);
  f.meta = meta, f.group_shift = group_shift;
  return f;
}

}  // namespace

void Lowering::SetMatvecInput(const std::string& x, isa::MatvecArgs* args, std::vector<uint32_t>* ready) {
  if (auto it = deferred_norms_.find(x); it != deferred_norms_.end()) {
    args->input = ArenaTensorFor(it->second.x);
    args->prologue = isa::kPrologueRmsNorm;
    args->norm_weight = PackedWeightFor({it->second.weight}, ROWS_IDENTITY);
    args->norm_eps = it->second.eps;
    *ready = ReadyBarriers(it->second.x);
  } else {
    args->input = ArenaTensorFor(x);
    args->prologue = isa::kPrologueNone;
    *ready = ReadyBarriers(x);
  }
}

std::vector<uint32_t> Lowering::EmitMatvec(MatvecGroup& g, bool chunk_barriers) {
  if (g.k % 4 != 0 && error_.ok()) {
    error_ = absl::UnimplementedError(absl::StrCat("'", g.op, "': a matvec over ", g.k,
                                                   " columns; the input vector is copied in 16-byte units, so the "
                                                   "column count must be a multiple of 4"));
  }
  // An FP8 weight (PackedWeightFor kept it so): MATVEC_FP8 tiles, the rows' scales beside the weight. An int4 one:
  // MATVEC_W4 tiles of whole 16-row bands, the rows' groups beside it.
  const auto fp8 = fp8_scales_.find(g.weight);
  const bool is_fp8 = fp8 != fp8_scales_.end();
  const auto w4 = w4_meta_.find(g.weight);
  const bool is_w4 = w4 != w4_meta_.end();
  if (is_w4) g.granule = isa::kMatvecW4BandRows;  // (a multiple of the RoPE and SiLU-mul pairs' 2)
  auto activation_bytes = [&](uint64_t rows) {
    return is_fp8  ? isa::MatvecFp8ActivationBytes(static_cast<uint32_t>(rows), g.k)
           : is_w4 ? isa::MatvecW4ActivationBytes(static_cast<uint32_t>(rows), g.k, w4->second.group_shift)
                   : isa::MatvecActivationBytes(static_cast<uint32_t>(rows), g.k);
  };
  if (activation_bytes(g.granule) > o_.smem().activation_bytes() && error_.ok()) {
    error_ = absl::UnimplementedError(absl::StrCat(
        "'", g.op, "': its input of ", g.k, " floats needs ", activation_bytes(g.granule),
        " bytes of activation ring; smem.activation_bytes is ", o_.smem().activation_bytes()));
  }
  if ((is_fp8 || is_w4) && o_.smem().page_bytes() != isa::kDecodePageBytes && error_.ok()) {
    error_ = absl::UnimplementedError(absl::StrCat("'", g.op, "': an ", is_w4 ? "int4" : "FP8", " matvec streams ",
                                                   isa::kDecodePageBytes, "-byte pages only; smem.page_bytes is ",
                                                   o_.smem().page_bytes()));
  }
  for (uint64_t boundary : g.chunks) {
    if (is_w4 && boundary % isa::kMatvecW4BandRows != 0 && error_.ok()) {
      error_ = absl::UnimplementedError(absl::StrCat("'", g.op, "': an int4 matvec's tiles are bands of ",
                                                     isa::kMatvecW4BandRows, " rows; its rows split at row ",
                                                     boundary));
    }
  }
  const int group = NewGroup(g.name);
  const std::vector<isa::Wait> waits = WaitsFor(g.ready);
  if (g.chunks.empty()) g.chunks = {0, g.rows};
  uint64_t rows_per_tile = o_.matvec_rows();
  if (rows_per_tile == 0) {
    const uint64_t tiles = uint64_t{o_.num_sms()} * o_.matvec_tiles_per_sm();
    rows_per_tile = (g.rows + tiles - 1) / tiles;
  }
  rows_per_tile = std::max<uint64_t>(g.granule, (rows_per_tile + g.granule - 1) / g.granule * g.granule);
  // A tile's input vector and partial sums must fit an SM's activation buffer.
  const uint64_t per_row = activation_bytes(1) - activation_bytes(0);
  const uint64_t fit = o_.smem().activation_bytes() > activation_bytes(0)
                           ? (o_.smem().activation_bytes() - activation_bytes(0)) / per_row
                           : 0;
  rows_per_tile = std::min(rows_per_tile, std::max<uint64_t>(g.granule, fit / g.granule * g.granule));

  std::vector<uint32_t> barriers;
  uint32_t tile_index = 0;
  uint32_t shared_barrier = isa::kNoBarrier;
  for (size_t c = 0; c + 1 < g.chunks.size(); ++c) {
    uint32_t barrier;
    if (chunk_barriers) {
      barrier = NewBarrier(absl::StrCat(g.name, ".chunk", c), waits);
    } else {
      if (shared_barrier == isa::kNoBarrier) shared_barrier = NewBarrier(g.name, waits);
      barrier = shared_barrier;
    }
    if (barriers.empty() || barriers.back() != barrier) barriers.push_back(barrier);
    const uint64_t chunk_rows = g.chunks[c + 1] - g.chunks[c];
    const std::vector<uint64_t> bounds =
        SplitEven(g.chunks[c], g.chunks[c + 1], (chunk_rows + rows_per_tile - 1) / rows_per_tile, g.granule);
    for (size_t t = 0; t + 1 < bounds.size(); ++t) {
      isa::MatvecArgs a = g.args;
      a.weight = g.weight;
      a.k = g.k;
      a.row_begin = static_cast<uint32_t>(bounds[t]);
      a.rows = static_cast<uint32_t>(bounds[t + 1] - bounds[t]);
      a.tile_index = tile_index++;
      Emit(is_fp8  ? Make(Opcode::MATVEC_FP8, Fp8Tile(a, fp8->second))
           : is_w4 ? Make(Opcode::MATVEC_W4, W4Tile(a, w4->second.meta, w4->second.group_shift))
                   : Make(Opcode::MATVEC, a),
           barrier, waits, g.op, group);
    }
  }
  return barriers;
}

// gate and up LINEARs of one input, read only by SILU_MUL(gate, up): one interleaved matvec.
std::optional<absl::Status> Lowering::TryGateUp(const OpDef& linear) {
  const std::vector<const OpDef*> consumers = graph_.consumers(linear.outputs(0));
  if (!o_.fusion().silu_mul() || consumers.size() != 1 || consumers[0]->type() != graph::SILU_MUL) {
    return std::nullopt;
  }
  const OpDef& silu = *consumers[0];
  const OpDef* gate = graph_.producer(silu.inputs(0));
  const OpDef* up = graph_.producer(silu.inputs(1));
  if (gate == nullptr || up == nullptr || gate->type() != graph::LINEAR || up->type() != graph::LINEAR ||
      gate->inputs(0) != up->inputs(0) || gate->inputs_size() != up->inputs_size() ||
      !OnlyConsumer(gate->outputs(0), silu) || !OnlyConsumer(up->outputs(0), silu) || gate == up) {
    return std::nullopt;
  }
  MatvecGroup g;
  g.name = absl::StrCat(gate->name(), "+", up->name());
  g.op = absl::StrCat(gate->name(), ",", up->name(), ",", silu.name());
  g.weight = PackedWeightFor({gate->inputs(1), up->inputs(1)}, ROWS_INTERLEAVE_PAIRS);
  if (gate->inputs_size() == 3) g.args.bias = PackedWeightFor({gate->inputs(2), up->inputs(2)}, ROWS_INTERLEAVE_PAIRS);
  g.rows = 2 * static_cast<uint64_t>(graph_.tensor(gate->inputs(1)).shape(0));
  g.k = static_cast<uint32_t>(graph_.tensor(gate->inputs(1)).shape(1));
  g.granule = 2;
  SetMatvecInput(gate->inputs(0), &g.args, &g.ready);
  g.args.epilogue = isa::kEpilogueSiluMul;
  g.args.out = ArenaTensorFor(silu.outputs(0));
  ready_[silu.outputs(0)] = {EmitMatvec(g, false)};
  consumed_.insert(gate->name());
  consumed_.insert(up->name());
  consumed_.insert(silu.name());
  return absl::OkStatus();
}

absl::Status Lowering::LowerLinear(const OpDef& op) {
  if (graph_.tensor(op.inputs(0)).shape(0) != 1) return Unsupported(op, "only batch-1 (decode) LINEARs are lowered");
  const graph::DType weight_dtype = graph_.tensor(op.inputs(1)).dtype();
  if (graph_.tensor(op.inputs(1)).kind() != graph::WEIGHT ||
      (weight_dtype != graph::BF16 && weight_dtype != graph::F8E4M3 && weight_dtype != graph::I4)) {
    return Unsupported(op, "the matvec weight must be a bf16, FP8 or int4 weight");
  }
  if (std::optional<absl::Status> s = TryQkv(op)) return *s;
  if (consumed_.contains(op.name())) return absl::OkStatus();
  if (std::optional<absl::Status> s = TryGateUp(op)) return *s;

  const std::string& out = op.outputs(0);
  MatvecGroup g;
  g.name = op.name();
  g.op = op.name();
  const std::vector<const OpDef*> consumers = graph_.consumers(out);
  const OpDef* argmax = nullptr;
  for (const OpDef* c : consumers) {
    if (c->type() == graph::ARGMAX) argmax = c;
  }
  const bool residual_add = o_.fusion().residual_add() && consumers.size() == 1 &&
                            consumers[0]->type() == graph::ADD && !graph_.tensor(out).is_output();
  const bool argmax_head = !residual_add && o_.fusion().lm_head_argmax() && argmax != nullptr && consumers.size() == 1;
  // The argmax epilogue is MATVEC's alone: a quantized LM head read so is widened to bf16.
  g.weight = PackedWeightFor({op.inputs(1)}, ROWS_IDENTITY, 0, 0, !argmax_head);
  g.rows = static_cast<uint64_t>(graph_.tensor(op.inputs(1)).shape(0));
  g.k = static_cast<uint32_t>(graph_.tensor(op.inputs(1)).shape(1));
  if (op.inputs_size() == 3) g.args.bias = PackedWeightFor({op.inputs(2)}, ROWS_IDENTITY);
  SetMatvecInput(op.inputs(0), &g.args, &g.ready);
  g.args.epilogue = isa::kEpilogueStore;
  std::string result = out;

  if (residual_add) {
    const OpDef& add = *consumers[0];
    const std::string& residual = add.inputs(0) == out ? add.inputs(1) : add.inputs(0);
    g.args.epilogue = isa::kEpilogueResidualAdd;
    g.args.residual = ArenaTensorFor(residual);
    const std::vector<uint32_t> residual_ready = ReadyBarriers(residual);
    g.ready.insert(g.ready.end(), residual_ready.begin(), residual_ready.end());
    g.op = absl::StrCat(op.name(), ",", add.name());
    result = add.outputs(0);
    consumed_.insert(add.name());
  } else if (argmax_head) {
    g.args.epilogue = isa::kEpilogueArgmaxPartial;
    g.op = absl::StrCat(op.name(), ",", argmax->name(), ".partial");
  }
  g.args.out = ArenaTensorFor(result);
  if (g.args.epilogue == isa::kEpilogueArgmaxPartial) {
    // Partials are sized after tiling: emit into a placeholder, then size the tensor.
    const uint32_t first = static_cast<uint32_t>(p_.nodes.size());
    const std::vector<uint32_t> barriers = EmitMatvec(g, false);
    const uint32_t tiles = static_cast<uint32_t>(p_.nodes.size()) - first;
    const uint32_t partials = AddTensor(absl::StrCat(argmax->name(), ".partials"), graph::F32, {tiles, 2}, ARENA);
    for (uint32_t i = first; i < p_.nodes.size(); ++i) p_.nodes[i].inst.as<isa::MatvecArgs>().partials = partials;
    ready_[out] = {barriers};
    p_.io.set_logits(g.args.out);
    consumed_.insert(argmax->name());
    return LowerArgmax(*argmax, partials, tiles, barriers);
  }
  ready_[result] = {EmitMatvec(g, false)};
  return absl::OkStatus();
}

}  // namespace loom::scheduler::lowering_internal
