#include "scheduler/prefill.h"

#include "scheduler/graph_lowering.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/dtype.h"
#include "graph/rope.h"
#include "instructions/isa.h"
#include "scheduler/assign.h"
#include "scheduler/compiler.h"
#include "scheduler/cost_model.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/graph_lowering.h"
#include "scheduler/options.h"
#include "scheduler/pass_builder.h"
#include "scheduler/prefill_plan.h"
#include "scheduler/schedule_verifier.h"

namespace loom::scheduler {
namespace {

using prefill_internal::Layer;
using prefill_internal::Plan;
using prefill_internal::ParsePlan;

using graph::OpDef;

// Small enough that a stage of a short prompt still spreads over many SMs. A norm pack of a short prompt is one row
// per consumer warp (its latency one row's round trip), of a long one two (half the instructions, and enough of
// them to fill the SMs). H100, TTFT ms at P = 128 / 512 / 2048, 8 rows: 2.34 / 3.32 / 11.67 and 2.19 / 3.32 /
// 11.76; 16 rows: 2.21 / 3.40 / 11.60 and 2.23 / 3.38 / 11.62 (docs/history/performance_log.md "Prefill").
constexpr uint32_t kEmbedRowsPerInstruction = 4;
constexpr uint32_t kPackRowsShort = 8, kPackRowsLong = 16;
constexpr uint32_t kMaxKSplits = 16;
static_assert(isa::kGemmTileM % kPackRowsShort == 0 && isa::kGemmTileM % kPackRowsLong == 0);

// The columns of a sliced fold's instructions (PrefillOptions::slice_folds), each a slice of one prompt row. Sliced
// only where every row's slices take an SM each, one instruction per SM: a row in as many slices as there
// are SMs per prompt row (at most isa::kRowNormSlots, whole K slabs, each slice of a row one staging round of
// isa::kSumStageBytes: x, the parts, the weights). A second instruction on an SM doubles the stage, the pass's
// critical path. H100, random:llama-3.2-1b, TTFT ms against whole-row folds: P = 16 1.60 / 1.72 (8 slices), 64
// 1.75 / 1.82 (2), but 128 2.03 / 1.99 (2 slices, 2 instructions an SM), 512 3.23 / 3.06 (one row an instruction,
// four an SM), where a whole-row fold has about one row an SM already. nullopt: the whole-row fold.
std::optional<uint32_t> SliceColumns(uint32_t P, uint32_t hidden, uint32_t splits, uint32_t num_sms) {
  constexpr uint32_t kSlab = isa::kGemmSlabK;
  const uint32_t row_bytes_per_column = 4 * (splits + 1), slabs = hidden / kSlab;
  const uint32_t widest = isa::kSumStageBytes / (row_bytes_per_column + 2) / kSlab * kSlab;  // one row
  if (hidden % kSlab != 0 || widest == 0) return std::nullopt;
  const uint32_t fewest = (hidden + widest - 1) / widest;
  const uint32_t slices = std::min({std::max(fewest, num_sms / std::max(P, 1u)), isa::kRowNormSlots, slabs});
  if (slices < fewest || uint64_t{P} * slices > num_sms) return std::nullopt;
  return (slabs + slices - 1) / slices * kSlab;
}

std::string Name(const std::string& prefix, const std::vector<std::string>& sources) {
  return absl::StrCat(prefix, absl::StrJoin(sources, "+"));
}

// The images and vectors of one layer, by name.
struct LayerWeights {
  std::vector<std::string> qkv, qkv_bias, gate_up, gate_up_bias;
};
LayerWeights WeightsOf(const Layer& l) {
  LayerWeights w;
  w.qkv = {l.q.weight, l.k.weight, l.v.weight};
  if (!l.q.bias.empty()) w.qkv_bias = {l.q.bias, l.k.bias, l.v.bias};
  w.gate_up = {l.gate.weight, l.up.weight};
  if (!l.gate.bias.empty()) w.gate_up_bias = {l.gate.bias, l.up.bias};
  return w;
}

}  // namespace

namespace {
bool HasAttention(const graph::Graph& graph) {
  for (const graph::OpDef& op : graph.def().ops()) {
    if (op.type() == graph::ATTENTION) return true;
  }
  return false;
}
}  // namespace

absl::Status PrefillSupported(const graph::Graph& graph) {
  return HasAttention(graph) ? ParsePlan(graph).status() : GeneralPrefillSupported(graph);
}

bool HasPrefillWeights(const Schedule& decode) {
  for (const PackedWeight& p : decode.packing()) {
    if (p.tile_rows() > 0) return true;
  }
  return false;
}

absl::Status AddPrefillWeights(const graph::Graph& graph, const CompileOptions& options, Program* program) {
  if (!HasAttention(graph)) return AddGeneralPrefillWeights(graph, options, program);
  absl::StatusOr<Plan> plan = ParsePlan(graph);
  if (!plan.ok()) return plan.status();
  for (const Layer& l : plan->layers) {
    const LayerWeights w = WeightsOf(l);
    const uint64_t qkv_rows = uint64_t{l.q.n} + l.k.n + l.v.n;
    AddPacked(program, Name("image:", w.qkv), w.qkv, ROWS_QKV_GROUPED, qkv_rows, l.q.k, true, l.head_dim, l.kv_heads);
    if (!w.qkv_bias.empty()) {
      AddPacked(program, Name("bias:", w.qkv_bias), w.qkv_bias, ROWS_QKV_GROUPED, qkv_rows, 1, false, l.head_dim,
                l.kv_heads);
    }
    AddPacked(program, Name("image:", {l.o.weight}), {l.o.weight}, ROWS_IDENTITY, l.o.n, l.o.k, true);
    if (!l.o.bias.empty()) AddPacked(program, Name("bias:", {l.o.bias}), {l.o.bias}, ROWS_IDENTITY, l.o.n, 1, false);
    AddPacked(program, Name("image:", w.gate_up), w.gate_up, ROWS_INTERLEAVE_PAIRS, 2ull * l.gate.n, l.gate.k, true);
    if (!w.gate_up_bias.empty()) {
      AddPacked(program, Name("bias:", w.gate_up_bias), w.gate_up_bias, ROWS_INTERLEAVE_PAIRS, 2ull * l.gate.n, 1,
                false);
    }
    AddPacked(program, Name("image:", {l.down.weight}), {l.down.weight}, ROWS_IDENTITY, l.down.n, l.down.k, true);
    if (!l.down.bias.empty()) {
      AddPacked(program, Name("bias:", {l.down.bias}), {l.down.bias}, ROWS_IDENTITY, l.down.n, 1, false);
    }
    AddPacked(program, Name("vec:", {l.norm1}), {l.norm1}, ROWS_IDENTITY, plan->hidden, 1, false);
    if (!l.q_norm.empty()) {
      AddPacked(program, Name("vec:", {l.q_norm, l.k_norm}), {l.q_norm, l.k_norm}, ROWS_IDENTITY, 2ull * l.head_dim,
                1, false);
    }
    AddPacked(program, Name("vec:", {l.norm2}), {l.norm2}, ROWS_IDENTITY, plan->hidden, 1, false);
  }
  AddPacked(program, Name("vec:", {plan->final_norm}), {plan->final_norm}, ROWS_IDENTITY, plan->hidden, 1, false);
  return absl::OkStatus();
}

namespace {

// The rope table the decode schedule holds for `rope` (a compile-time constant: found by its values).
absl::StatusOr<std::string> RopeTableName(const Schedule& decode, const graph::RopeAttrs& rope) {
  const std::vector<float> table = graph::RopeTable(rope);
  for (const Constant& c : decode.constants()) {
    if (c.values_size() == static_cast<int>(table.size()) && std::equal(table.begin(), table.end(), c.values().begin())) {
      return c.tensor();
    }
  }
  return absl::FailedPreconditionError("prefill: the schedule has no rope table for the graph's RoPE");
}

}  // namespace

absl::StatusOr<Schedule> CompilePrefill(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                                        const PrefillOptions& prefill_options) {
  if (!HasAttention(graph)) {
    if (prefill_options.all_logits) {
      return absl::UnimplementedError("prefill: all_logits needs a decoder with attention");
    }
    return CompileGeneralPrefill(graph, decode, rows, prefill_options.verify);
  }
  const bool all_logits = prefill_options.all_logits;
  const uint32_t asked = prefill_options.page_bytes;
  if (asked != 0 && asked != isa::kGemmSlabBytes && asked != 2 * isa::kGemmSlabBytes &&
      asked != isa::kGemmWideStepBytes) {
    return absl::InvalidArgumentError(absl::StrCat("prefill: page_bytes ", prefill_options.page_bytes,
                                                   " is not 0 (auto), ", isa::kGemmSlabBytes, ", ",
                                                   2 * isa::kGemmSlabBytes, " or ", isa::kGemmWideStepBytes));
  }
  absl::StatusOr<Plan> plan = ParsePlan(graph);
  if (!plan.ok()) return plan.status();
  if (rows == 0 || rows > decode.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat("prefill of ", rows, " rows: the KV cache holds ", decode.max_seq()));
  }
  PassBuilder b(decode);
  const uint32_t P = rows, hidden = plan->hidden, tiles_m = isa::GemmTiles(P);
  // Auto pages: 48 KB ones and 128 x 256 GEMM tiles where the pass's widest GEMM has kMinWideTileWaves waves of
  // them (fewer leave SMs idle: wide tiles halve the count), every GEMM that would take them fills them (n a
  // multiple of 256: Qwen2.5-0.5B's hidden 896 measured 3-8% slower wide), and kMinWideTilePages fit beside the
  // widest activation slot (FLASH_ATTN's, or the QKV projection's RoPE stage); FitPassSmem picks 32 or 16 KB
  // otherwise.
  uint32_t page_bytes = prefill_options.page_bytes;
  uint32_t widest_n = hidden;
  bool fills_wide_tiles = hidden % isa::kGemmWideTileN == 0;
  for (const Layer& l : plan->layers) {
    widest_n = std::max(widest_n, 2 * l.gate.n);
    fills_wide_tiles = fills_wide_tiles && (2 * l.gate.n) % isa::kGemmWideTileN == 0;
  }
  const uint64_t widest_tiles = uint64_t{tiles_m} * isa::GemmColumnTiles(widest_n, true);
  if (page_bytes == 0 && fills_wide_tiles && widest_tiles >= uint64_t{kMinWideTileWaves} * decode.num_sms()) {
    isa::GemmArgs rope{};
    rope.epilogue = isa::kGemmRopeKvAppend;
    // (with a deferred norm's slots, should a sliced fold come before it)
    uint32_t activation = isa::GemmActivationBytes(rope) + isa::kGemmRowNormBytes;
    for (const Layer& l : plan->layers) activation = std::max(activation, isa::FlashActivationBytes(l.head_dim));
    SmemConfig smem = decode.options().smem();
    smem.set_activation_bytes(activation);
    smem.set_activation_slots(1);
    smem.set_page_bytes(isa::kGemmWideStepBytes);
    smem.set_num_pages(kMinWideTilePages);
    if (SmemTotalBytes(smem) <= kMaxSmemBytes) page_bytes = isa::kGemmWideStepBytes;
  }
  // Every GEMM but the QKV projection (its RoPE epilogue takes 128 columns) on 128 x 256 tiles where pages hold them.
  const bool wide_gemm_tiles = page_bytes >= isa::kGemmWideStepBytes;
#define LOOM_FIND(var, name)                              \
  uint32_t var;                                           \
  {                                                       \
    absl::StatusOr<uint32_t> found = b.Find(name);        \
    if (!found.ok()) return found.status();               \
    var = *found;                                         \
  }
  const uint32_t tokens = decode.io().tokens(), state = decode.io().step_state();
  LOOM_FIND(table, absl::StrCat("packed:", plan->table));
  LOOM_FIND(lm_head, absl::StrCat("packed:", plan->lm_head));
  LOOM_FIND(final_norm, Name("vec:", {plan->final_norm}));
  uint32_t widest_q = 0, widest_inter = 0;
  for (const Layer& l : plan->layers) widest_q = std::max(widest_q, l.heads * l.head_dim);
  for (const Layer& l : plan->layers) widest_inter = std::max(widest_inter, l.gate.n);
  const uint32_t x = b.Scratch("prefill.x", graph::F32, {P, hidden});
  const uint32_t image_h = b.Scratch("prefill.normed", graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(P, hidden) / 2)});
  const uint32_t q_rows = b.Scratch("prefill.q", graph::F32, {P, widest_q});
  const uint32_t image_attn =
      b.Scratch("prefill.attention", graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(P, widest_q) / 2)});
  const uint32_t image_s =
      b.Scratch("prefill.mlp", graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(P, widest_inter) / 2)});
  const uint32_t last_row = b.Scratch("prefill.last_row", graph::F32, {hidden}, "prefill.x", uint64_t{P - 1} * hidden * 4);
  const uint32_t pass_state = b.Scratch("prefill.state", graph::I32, {isa::kStepStateWords});

  // Embedding, in chunks of rows.
  // Every stage but the QKV projection has a barrier per 128-row tile (PrefillOptions.row_tile_barriers): a
  // stage's instructions on rows [128m, +128) wait for the previous stage's on the same rows. FLASH_ATTN's row
  // tile t needs the keys of every tile up to t, so it waits for the whole QKV stage. Write-after-read hazards
  // on the shared scratch stay ordered through the chains: a layer's norm pack of tile m (writes image_h rows m)
  // follows the previous layer's down-proj of tile m, which followed every gate/up tile reading those rows; the
  // QKV stage (writes q rows) follows every norm pack, so every FLASH_ATTN tile of the layer before; FLASH_ATTN
  // (writes the attention image) follows the whole QKV stage, so every O tile of the layer before; gate/up of
  // tile m (writes the SiLU image rows m) follows its own layer's FLASH_ATTN via O and the pack, and through the
  // QKV stage every down tile of the layer before.
  const bool tiled = prefill_options.row_tile_barriers == PrefillOptions::RowTileBarriers::kOn ||
                     (prefill_options.row_tile_barriers == PrefillOptions::RowTileBarriers::kAuto &&
                      tiles_m <= kMaxRowTilesForTileBarriers);
  const uint32_t pack_rows = tiles_m <= kMaxRowTilesForTileBarriers ? kPackRowsShort : kPackRowsLong;
  static_assert(isa::kGemmTileM % kEmbedRowsPerInstruction == 0 && isa::kGemmTileM == isa::kFlashRows,
                "instructions stay inside one 128-row tile");
  StageRef prev = b.Stages("embed", tiles_m, tiled);
  for (uint32_t r = 0; r < P; r += kEmbedRowsPerInstruction) {
    isa::EmbedArgs e{table, tokens, state, x, hidden, plan->vocab, isa::MatvecRowStride(hidden), r,
                     std::min(kEmbedRowsPerInstruction, P - r)};
    b.Emit(isa::Opcode::EMBED, e, prev.Of(r / isa::kGemmTileM), std::nullopt, "embed");
  }
  // x's parts of a GEMM split over K not added yet: the next PACK_ROWS adds them as it reads x (below).
  std::optional<SplitParts> pending;
  // The per-row statistics of a norm deferred to the GEMM after it (isa::GemmArgs::row_norm), one tensor for both
  // norms of a layer: a norm's slices of tile m follow, through the chains above, every GEMM tile that read the
  // rows of tile m of the previous norm's.
  const uint32_t row_norm = b.Scratch("prefill.row_norm", graph::F32, {P, isa::kRowNormSlots});
  // The norm the next GEMM applies: row_norm after a sliced fold, else kNoTensor (the image is normed).
  uint32_t deferred = isa::kNoTensor;
  auto pack = [&](const std::string& name, uint32_t norm, float eps, StageRef after) {
    const StageRef stage = b.Stages(name, tiles_m, tiled);
    const std::optional<uint32_t> slice =
        pending && prefill_options.slice_folds
            ? SliceColumns(P, hidden, static_cast<uint32_t>(pending->parts.size()), decode.num_sms())
            : std::nullopt;
    deferred = slice ? row_norm : isa::kNoTensor;
    // Adding parts, a prompt row reads (splits + 1) rows: fewer rows an instruction (PrefillOptions.fold_rows).
    uint32_t fold = pack_rows;
    if (pending) {
      const uint64_t row_bytes = uint64_t{hidden} * 4 * (pending->parts.size() + 1);
      fold = prefill_options.fold_rows != 0
                 ? prefill_options.fold_rows
                 : static_cast<uint32_t>(std::clamp<uint64_t>(kFoldBytesPerInstruction / row_bytes, 1, pack_rows));
    }
    // A sliced fold packs the prompt rows alone: the image's rows past P reach only accumulator rows no epilogue
    // stores (as the SiLU image's, which its GEMM never writes), and the GEMMs copy A only up to round8(P).
    const uint32_t rows_packed = slice ? P : tiles_m * isa::kGemmTileM;
    for (uint32_t r = 0; r < rows_packed;) {
      // Prompt rows by `fold` (or by slices), the padding after them by the usual count, neither across a row tile.
      const uint32_t tile_end = (r / isa::kGemmTileM + 1) * isa::kGemmTileM;
      if (slice) {  // a prompt row a slice
        for (uint32_t c = 0; c < hidden; c += *slice) {
          isa::PackRowsArgs a{x, image_h, P, hidden, r, 1, norm, eps};
          a.parts = pending->all, a.splits = static_cast<uint32_t>(pending->parts.size());
          a.row_norm = row_norm, a.col_begin = c, a.cols = *slice;
          b.Emit(isa::Opcode::PACK_ROWS, a, stage.Of(r / isa::kGemmTileM), after.Of(r / isa::kGemmTileM), name);
        }
        ++r;
        continue;
      }
      const uint32_t rows = std::min(tile_end - r, pending && r < P ? std::min(fold, P - r) : pack_rows);
      isa::PackRowsArgs a{x, image_h, P, hidden, r, rows, norm, eps};
      if (pending && r < P) a.parts = pending->all, a.splits = static_cast<uint32_t>(pending->parts.size());
      b.Emit(isa::Opcode::PACK_ROWS, a, stage.Of(r / isa::kGemmTileM), after.Of(r / isa::kGemmTileM), name);
      r += rows;
    }
    pending.reset();
    return stage;
  };
  // Every output tile of one GEMM, m-tiles inside n-tiles: concurrent SMs share W tiles in L2. A residual GEMM
  // (x += A·Wᵀ in place) with fewer tiles than SMs is split over K as well (a short prompt's O- and down-proj
  // would otherwise run on a few SMs through all of K): each split stores its part, and the next PACK_ROWS adds
  // the parts to x in part order as it reads x for the next norm (after the last layer, a SUM_SPLITS stage), so the
  // sum is the same every run (float atomics into x were not: logits moved by up to 0.05 and greedy tokens changed
  // from run to run), and costs no stage of its own. Returns the stage the next one waits for.
  auto gemm = [&](const std::string& name, isa::GemmArgs g, StageRef after, bool tiled_stage) {
    const StageRef stage = b.Stages(name, tiles_m, tiled_stage);
    g.wide = wide_gemm_tiles && g.epilogue != isa::kGemmRopeKvAppend ? 1 : 0;
    const uint32_t tiles = isa::GemmTiles(g.m) * isa::GemmColumnTiles(g.n, g.wide), slabs = isa::GemmSlabs(g.k);
    auto emit = [&](const isa::GemmArgs& tile, uint32_t m) {
      b.Emit(isa::Opcode::GEMM, tile, stage.Of(m), after.Of(m), name);
    };
    // As many ways as keep every instruction in one wave (rounding up left some SMs two tiles' worth).
    if (g.residual != x || g.out != x || 2 * tiles > decode.num_sms() || slabs < 2) {
      ForEachGemmTile(g, 1, emit);
      return stage;
    }
    const uint32_t splits = std::min({slabs, decode.num_sms() / tiles,
                                      prefill_options.max_splits != 0 ? prefill_options.max_splits : kMaxKSplits});
    if (splits < 2) {
      ForEachGemmTile(g, 1, emit);
      return stage;
    }
    pending = AddSplitParts(b, absl::StrCat("prefill.parts.", g.k), uint64_t{g.m} * g.n, splits);
    g.epilogue = isa::kGemmPartialF32;
    g.residual = isa::kNoTensor;
    ForEachGemmTile(g, splits, emit, pending->parts);
    return stage;
  };
  auto bias_of = [&](const std::vector<std::string>& sources) -> absl::StatusOr<uint32_t> {
    if (sources.empty() || sources[0].empty()) return isa::kNoTensor;
    return b.Find(Name("bias:", sources));
  };
  for (size_t li = 0; li < plan->layers.size(); ++li) {
    const Layer& l = plan->layers[li];
    const LayerWeights w = WeightsOf(l);
    const std::string n = absl::StrCat("layers.", li, ".");
    LOOM_FIND(norm1, Name("vec:", {l.norm1}));
    LOOM_FIND(norm2, Name("vec:", {l.norm2}));
    LOOM_FIND(w_qkv, Name("image:", w.qkv));
    LOOM_FIND(w_o, Name("image:", {l.o.weight}));
    LOOM_FIND(w_gu, Name("image:", w.gate_up));
    LOOM_FIND(w_down, Name("image:", {l.down.weight}));
    LOOM_FIND(k_cache, l.k_cache);
    LOOM_FIND(v_cache, l.v_cache);
    absl::StatusOr<std::string> rope_name = RopeTableName(decode, l.rope);
    if (!rope_name.ok()) return rope_name.status();
    LOOM_FIND(rope, *rope_name);
    absl::StatusOr<uint32_t> b_qkv = bias_of(w.qkv_bias), b_o = bias_of({l.o.bias}), b_gu = bias_of(w.gate_up_bias),
                             b_down = bias_of({l.down.bias});
    for (const auto* s : {&b_qkv, &b_o, &b_gu, &b_down}) {
      if (!s->ok()) return s->status();
    }
    const uint32_t q_width = l.heads * l.head_dim;

    StageRef stage = pack(n + "attn_norm", norm1, l.eps1, prev);
    isa::GemmArgs qkv{};
    qkv.a = image_h;
    qkv.weight = w_qkv;
    qkv.out = q_rows;
    qkv.m = P;
    qkv.n = l.q.n + l.k.n + l.v.n;
    qkv.k = hidden;
    qkv.bias = *b_qkv;
    qkv.residual = isa::kNoTensor;
    qkv.epilogue = isa::kGemmRopeKvAppend;
    qkv.k_cache = k_cache;
    qkv.v_cache = v_cache;
    qkv.step_state = state;
    qkv.rope_table = rope;
    qkv.qk_norm = isa::kNoTensor;
    if (!l.q_norm.empty()) {
      LOOM_FIND(qk_norm, Name("vec:", {l.q_norm, l.k_norm}));
      qkv.qk_norm = qk_norm;
      qkv.norm_eps = l.qk_eps;
    }
    qkv.num_kv_heads = l.kv_heads;
    qkv.head_dim = l.head_dim;
    qkv.max_seq = decode.max_seq();
    qkv.row_norm = deferred;
    stage = gemm(n + "qkv", qkv, stage, false);

    const StageRef flash = b.Stages(n + "attn", tiles_m, tiled);
    for (uint32_t t = 0; t * isa::kFlashRows < P; ++t) {
      for (uint32_t h = 0; h < l.heads; ++h) {
        isa::FlashAttnArgs f{q_rows, k_cache, v_cache, state, image_attn, P, t, h, l.heads, l.kv_heads, l.head_dim,
                             decode.max_seq(), l.scale};
        b.Emit(isa::Opcode::FLASH_ATTN, f, flash.Of(t), stage.Of(t), n + "attn");
      }
    }
    isa::GemmArgs o{};
    o.a = image_attn;
    o.weight = w_o;
    o.out = x;
    o.residual = x;  // in place: each element is read, then written, by the same thread
    o.m = P;
    o.n = hidden;
    o.k = q_width;
    o.bias = *b_o;
    o.epilogue = isa::kGemmStoreF32;
    stage = gemm(n + "o", o, flash, tiled);

    stage = pack(n + "mlp_norm", norm2, l.eps2, stage);
    isa::GemmArgs gu{};
    gu.a = image_h;
    gu.weight = w_gu;
    gu.out = image_s;
    gu.residual = isa::kNoTensor;
    gu.m = P;
    gu.n = 2 * l.gate.n;
    gu.k = hidden;
    gu.bias = *b_gu;
    gu.epilogue = isa::kGemmSiluMulToImage;
    gu.row_norm = deferred;
    stage = gemm(n + "gate_up", gu, stage, tiled);
    isa::GemmArgs down{};
    down.a = image_s;
    down.weight = w_down;
    down.out = x;
    down.residual = x;
    down.m = P;
    down.n = hidden;
    down.k = l.gate.n;
    down.bias = *b_down;
    down.epilogue = isa::kGemmStoreF32;
    // The last layer's down-projection signals one barrier: the LM head (one row) waits on it, and through it the
    // step's end depends on every instruction.
    prev = gemm(n + "down", down, stage, tiled && li + 1 < plan->layers.size());
  }
  if (pending) {  // the last down-projection's parts, added to x for the LM head
    const StageRef sum = b.Stages("down/sum", tiles_m, false);
    const uint64_t elements = uint64_t{P} * hidden;
    EmitSumSplits(b, *pending, x, x, elements, 0, elements, SumChunk(elements, decode.num_sms()), 0, sum.Of(0),
                  prev.Of(0), "down/sum");
    prev = sum;
    pending.reset();
  }

  // The last row: final norm + LM head with argmax partials (as a decode step), then the reduce.
  const uint32_t vocab = plan->vocab, num_sms = decode.num_sms();
  // An LM-head tile's slot (isa::MatvecActivationBytes: the input row, then a float per row and slot of the row:
  // hidden 2048 has 2 slots of 1024 columns, hidden 1536 6 of 256). Tiles take at most as many rows as fit the
  // activation ring the widest FLASH_ATTN needs anyway (Llama-3.2-3B's LM head on 8 SMs, a tile an SM, would take a
  // 200 KB slot beside it).
  uint32_t ring = 0;
  for (const Layer& l : plan->layers) ring = std::max(ring, isa::FlashActivationBytes(l.head_dim));
  const uint64_t row_fixed = isa::MatvecActivationBytes(0, hidden);
  const uint64_t row_bytes = isa::MatvecActivationBytes(1, hidden) - row_fixed;
  const uint32_t ring_rows =
      static_cast<uint32_t>(std::max<uint64_t>(2, (ring - std::min<uint64_t>(ring, row_fixed)) / row_bytes / 2 * 2));
  const uint32_t tile_rows =
      std::min(ring_rows, std::max<uint32_t>(16, (vocab + num_sms - 1) / num_sms + 1) / 2 * 2);
  const uint32_t tiles = (vocab + tile_rows - 1) / tile_rows;
  const uint32_t partials = b.Scratch("prefill.partials", graph::F32, {tiles, 2});
  const uint32_t head = b.Stage("logits");
  // One LM-head tile of rows [row_begin, +rows) for one hidden row `input`, with the final norm as its prologue.
  auto lm_head_tile = [&](uint32_t row_begin, uint32_t rows, uint32_t input, uint32_t out) {
    isa::MatvecArgs a{};
    a.weight = lm_head;
    a.row_begin = row_begin;
    a.rows = std::min(rows, vocab - row_begin);
    a.k = hidden;
    a.input = input;
    a.prologue = isa::kPrologueRmsNorm;
    a.norm_weight = final_norm;
    a.norm_eps = plan->final_eps;
    a.epilogue = isa::kEpilogueStore;
    a.out = out;
    a.residual = isa::kNoTensor;
    a.partials = isa::kNoTensor;
    a.bias = isa::kNoTensor;
    return a;
  };
  for (uint32_t t = 0; t < tiles; ++t) {
    isa::MatvecArgs a = lm_head_tile(t * tile_rows, tile_rows, last_row, decode.io().logits());
    a.epilogue = isa::kEpilogueArgmaxPartial;
    a.partials = partials;
    a.tile_index = t;
    b.Emit(isa::Opcode::MATVEC, a, head, prev.Of((P - 1) / isa::kGemmTileM), "logits");
  }
  const uint32_t end = b.Stage("next_token");
  isa::Instruction reduce{};  // waits on the last row's logits, and on every row's with all_logits
  reduce.opcode = static_cast<uint8_t>(isa::Opcode::ARGMAX_REDUCE);
  reduce.as<isa::ArgmaxReduceArgs>() = {partials, tiles, pass_state, tokens, decode.max_seq()};
  reduce.num_waits = 1;
  reduce.waits[0] = {head, 0};
  if (all_logits) {
    // Tiles as wide as the activation ring holds; a barrier counts at most kMaxSignalsPerStep signals, so the rows
    // are split over up to three stages the reduce waits on.
    const uint32_t wide_rows = std::min<uint32_t>(vocab, ring_rows);
    const uint32_t wide_tiles = (vocab + wide_rows - 1) / wide_rows;
    const uint32_t rows_per_stage = isa::kMaxSignalsPerStep / wide_tiles;
    if (P > 3 * rows_per_stage) {
      return absl::OutOfRangeError(absl::StrCat("prefill: every row's logits for ", P, " rows: at most ",
                                                3 * rows_per_stage, " rows"));
    }
    const uint32_t logits = b.Scratch("prefill.logits", graph::F32, {P, vocab});
    uint32_t rows_stage = 0;
    for (uint32_t r = 0; r < P; ++r) {
      if (r % rows_per_stage == 0) {
        rows_stage = b.Stage(absl::StrCat("all_logits.", r / rows_per_stage));
        reduce.waits[reduce.num_waits++] = {rows_stage, 0};
      }
      const uint32_t in = b.Scratch(absl::StrCat("prefill.row.", r), graph::F32, {hidden}, "prefill.x",
                                    uint64_t{r} * hidden * 4);
      const uint32_t out = b.Scratch(absl::StrCat("prefill.logits.", r), graph::F32, {vocab}, "prefill.logits",
                                     uint64_t{r} * vocab * 4);
      for (uint32_t t = 0; t < wide_tiles; ++t) {
        b.Emit(isa::Opcode::MATVEC, lm_head_tile(t * wide_rows, wide_rows, in, out), rows_stage,
               prev.Of(r / isa::kGemmTileM), "all_logits");
      }
    }
  }
  b.EmitRaw(reduce, end, "next_token");
#undef LOOM_FIND

  b.FinishWaits();
  Program& p = b.program();
  // Shared memory: the widest FLASH_ATTN buffers (or LM head tile), pages for the rest.
  // Auto (short prompts): 32 KB pages where at least kMinWidePages of them fit beside the activation ring (fewer
  // starve the GEMM: gemm_bench 4096³ 435 TFLOP/s with 3, 537 with 4), else 16 KB.
  CompileOptions options = decode.options();
  FitPassSmem(p, page_bytes, options.mutable_smem());
  // Checked even when the pass is not verified: a block that does not fit fails only at launch.
  if (SmemTotalBytes(options.smem()) > kMaxSmemBytes) {
    return absl::OutOfRangeError(absl::StrCat(
        "prefill of ", P, " rows: the pass's shared memory (", options.smem().num_pages(), " pages of ",
        options.smem().page_bytes(), " bytes + an activation ring of ", options.smem().activation_bytes(),
        " bytes) exceeds an SM's ", kMaxSmemBytes));
  }
  p.io = decode.io();
  p.max_seq = decode.max_seq();
  p.vocab_size = decode.vocab_size();
  Schedule s = AssembleSchedule(p, options, absl::StrCat(decode.model(), " prefill of ", P, " rows"));
  s.mutable_prefill()->set_rows(P);
  s.mutable_prefill()->set_state(pass_state);
  if (prefill_options.verify) {
    if (absl::Status st = VerifySchedule(s); !st.ok()) {
      return absl::InternalError(absl::StrCat("prefill pass failed verification: ", st.message()));
    }
  }
  return s;
}

}  // namespace loom::scheduler
