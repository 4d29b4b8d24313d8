// The prefill pass: the walk over the decode graph's ops, the pass's policies and its frame
// (scheduler/prefill_lowering.h has the rules' map; scheduler/prefill.h the API).
#include "scheduler/prefill.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/dtype.h"
#include "instructions/isa.h"
#include "scheduler/assign.h"
#include "scheduler/compiler.h"
#include "scheduler/graph_lowering.h"
#include "scheduler/options.h"
#include "scheduler/pass_builder.h"
#include "scheduler/prefill_lowering.h"
#include "scheduler/schedule_verifier.h"


namespace loom::scheduler {
namespace prefill_internal {
namespace {

// Rows per PACK_ROWS instruction: small enough that a stage of a short prompt still spreads over many SMs. A norm
// pack of a short prompt is one row per consumer warp (its latency one row's round trip), of a long one two (half
// the instructions, and enough of them to fill the SMs). H100, TTFT ms at P = 128 / 512 / 2048, 8 rows: 2.34 /
// 3.32 / 11.67 and 2.19 / 3.32 / 11.76; 16 rows: 2.21 / 3.40 / 11.60 and 2.23 / 3.38 / 11.62
// (docs/history/performance_log.md "Prefill").
constexpr uint32_t kPackRowsShort = 8, kPackRowsLong = 16;
static_assert(isa::kGemmTileM % kPackRowsShort == 0 && isa::kGemmTileM % kPackRowsLong == 0);

}  // namespace

DecoderPrefill::DecoderPrefill(const graph::Graph& graph, PassBuilder b, DecodeTarget decode, uint32_t rows,
                               const PrefillOptions& options)
    : g_(graph), b_(std::move(b)), d_(std::move(decode)), o_(options), P_(rows) {
  Policies();
  // The frame, every layer's scratch: the widest attention's q and output, the widest MLP's SiLU image.
  x_ = b_.Scratch("prefill.x", graph::F32, {P_, hidden_});
  image_h_ = b_.Scratch("prefill.normed", graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(P_, hidden_) / 2)});
  q_rows_ = b_.Scratch("prefill.q", graph::F32, {P_, widest_q_});
  image_attn_ =
      b_.Scratch("prefill.attention", graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(P_, widest_q_) / 2)});
  image_s_ = b_.Scratch("prefill.mlp", graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(P_, widest_inter_) / 2)});
  last_row_ = b_.Scratch("prefill.last_row", graph::F32, {hidden_}, "prefill.x", uint64_t{P_ - 1} * hidden_ * 4);
  pass_state_ = b_.Scratch("prefill.state", graph::I32, {isa::kStepStateWords});
  // The per-row statistics of a norm deferred to the GEMM after it (isa::GemmArgs::row_norm), one tensor for every
  // norm: a norm's slices of tile m follow, through the stages' chains, every GEMM tile that read the rows of tile
  // m of the previous norm's.
  row_norm_ = b_.Scratch("prefill.row_norm", graph::F32, {P_, isa::kRowNormSlots});
}

// What the graph's shapes decide for the whole pass (before any op is lowered).
void DecoderPrefill::Policies() {
  std::vector<uint32_t> mlp_widths;  // a gate/up GEMM's n per gated MLP
  for (const OpDef& op : g_.def().ops()) {
    if (op.type() == graph::EMBEDDING) {
      vocab_ = static_cast<uint32_t>(g_.tensor(op.inputs(0)).shape(0));
      hidden_ = static_cast<uint32_t>(g_.tensor(op.inputs(0)).shape(1));
    } else if (op.type() == graph::ATTENTION) {
      const graph::AttentionAttrs& a = op.attention();
      widest_q_ = std::max(widest_q_, static_cast<uint32_t>(a.num_heads() * a.head_dim()));
      if (a.head_dim() == 64 || a.head_dim() == 128) {
        widest_flash_ = std::max(widest_flash_, isa::FlashActivationBytes(a.head_dim()));
      }
    } else if (op.type() == graph::SILU_MUL) {
      const OpDef* gate = g_.producer(op.inputs(0));
      if (gate != nullptr && gate->type() == graph::LINEAR) {
        const uint32_t inter = static_cast<uint32_t>(g_.tensor(gate->inputs(1)).shape(0));
        widest_inter_ = std::max(widest_inter_, inter);
        mlp_widths.push_back(2 * inter);
      }
    }
  }
  tiles_m_ = isa::GemmTiles(P_);
  // Every stage but the QKV projection has a barrier per 128-row tile (PrefillOptions.row_tile_barriers): a
  // stage's instructions on rows [128m, +128) wait for the previous stage's on the same rows. FLASH_ATTN's row
  // tile t needs the keys of every tile up to t, so it waits for the whole QKV stage. Write-after-read hazards
  // on the frame's scratch stay ordered through the chains: a layer's norm pack of tile m (writes image_h rows m)
  // follows the previous layer's down-proj of tile m, which followed every gate/up tile reading those rows; the
  // QKV stage (writes q rows) follows every norm pack, so every FLASH_ATTN tile of the layer before; FLASH_ATTN
  // (writes the attention image) follows the whole QKV stage, so every O tile of the layer before; gate/up of
  // tile m (writes the SiLU image rows m) follows its own layer's FLASH_ATTN via O and the pack, and through the
  // QKV stage every down tile of the layer before.
  tiled_ = o_.row_tile_barriers == PrefillOptions::RowTileBarriers::kOn ||
           (o_.row_tile_barriers == PrefillOptions::RowTileBarriers::kAuto && tiles_m_ <= kMaxRowTilesForTileBarriers);
  pack_rows_ = tiles_m_ <= kMaxRowTilesForTileBarriers ? kPackRowsShort : kPackRowsLong;
  static_assert(isa::kGemmTileM == isa::kFlashRows, "instructions stay inside one 128-row tile");
  // Auto pages: 48 KB ones and 128 x 256 GEMM tiles where the pass's widest GEMM has kMinWideTileWaves waves of
  // them (fewer leave SMs idle: wide tiles halve the count), every GEMM that would take them fills them (n a
  // multiple of 256: Qwen2.5-0.5B's hidden 896 measured 3-8% slower wide), and kMinWideTilePages fit beside the
  // widest activation slot (FLASH_ATTN's, or the QKV projection's RoPE stage); FitPassSmem picks 32 or 16 KB
  // otherwise.
  page_bytes_ = o_.page_bytes;
  uint32_t widest_n = hidden_;
  bool fills_wide_tiles = hidden_ % isa::kGemmWideTileN == 0;
  for (uint32_t n : mlp_widths) {
    widest_n = std::max(widest_n, n);
    fills_wide_tiles = fills_wide_tiles && n % isa::kGemmWideTileN == 0;
  }
  const uint64_t widest_tiles = uint64_t{tiles_m_} * isa::GemmColumnTiles(widest_n, true);
  if (page_bytes_ == 0 && fills_wide_tiles && widest_tiles >= uint64_t{kMinWideTileWaves} * d_.num_sms) {
    isa::GemmArgs rope{};
    rope.epilogue = isa::kGemmRopeKvAppend;
    // (with a deferred norm's slots, should a sliced fold come before it)
    SmemConfig smem = d_.smem;
    smem.set_activation_bytes(std::max(isa::GemmActivationBytes(rope) + isa::kGemmRowNormBytes, widest_flash_));
    smem.set_activation_slots(1);
    smem.set_page_bytes(isa::kGemmWideStepBytes);
    smem.set_num_pages(kMinWideTilePages);
    if (SmemTotalBytes(smem) <= kMaxSmemBytes) page_bytes_ = isa::kGemmWideStepBytes;
  }
  // Every GEMM but the QKV projection (its RoPE epilogue takes 128 columns) on 128 x 256 tiles where pages hold them.
  wide_ = page_bytes_ >= isa::kGemmWideStepBytes;
}

absl::StatusOr<uint32_t> DecoderPrefill::Decode(const std::string& name) const {
  absl::StatusOr<uint32_t> found = b_.Find(name);
  if (!found.ok() && d_.check_only) return 0;
  return found;
}

uint32_t DecoderPrefill::Weight(const std::string& prefix, const std::vector<std::string>& sources, RowOrder order,
                                uint64_t rows, uint64_t cols, bool image, uint32_t head_dim, uint32_t kv_heads) {
  const std::string name = absl::StrCat(prefix, absl::StrJoin(sources, "+"));
  if (order == ROWS_QKV_GROUPED) return b_.PackedGrouped(name, sources, rows, cols, image, head_dim, kv_heads);
  return b_.Packed(name, sources, order, rows, cols, image);
}

absl::StatusOr<std::pair<Program, uint32_t>> DecoderPrefill::Lower() {
  for (int index : g_.topological_order()) {
    const OpDef& op = g_.def().ops(index);
    if (consumed_.contains(op.name())) continue;
    absl::Status s;
    switch (op.type()) {
      case graph::EMBEDDING:
        s = LowerEmbedding(op);
        break;
      case graph::RMS_NORM:
        s = LowerNorm(op);
        break;
      case graph::LINEAR:
        s = LowerLinear(op);
        break;
      case graph::ATTENTION:
        s = LowerAttention(op);
        break;
      case graph::ROPE:
        s = Refuse(op, "RoPE of a tensor that is not the q or k projection of one attention");
        break;
      case graph::SILU_MUL:
        s = Refuse(op, "its inputs are not the gate and up projections of one input");
        break;
      case graph::ADD:
        s = Refuse(op, "only a projection's output added to the residual stream has a prefill lowering");
        break;
      case graph::ARGMAX:
        s = Refuse(op, "only the argmax of the LM head's logits has a prefill lowering");
        break;
      default:
        s = Refuse(op, "no prefill lowering (a decoder's pass covers RMSNorm, projections, RoPE, attention, SiLU-mul, "
                       "residual adds and the argmax of the logits)");
    }
    if (!s.ok()) return s;
  }
  if (!head_lowered_) return absl::UnimplementedError("prefill: the graph has no LM head feeding an ARGMAX");
  b_.FinishWaits();
  return std::make_pair(std::move(b_.program()), page_bytes_);
}

}  // namespace prefill_internal

namespace {

bool HasAttention(const graph::Graph& graph) {
  for (const graph::OpDef& op : graph.def().ops()) {
    if (op.type() == graph::ATTENTION) return true;
  }
  return false;
}

prefill_internal::DecodeTarget TargetOf(const Schedule& decode) {
  prefill_internal::DecodeTarget d;
  d.io = decode.io();
  d.max_seq = decode.max_seq();
  d.num_sms = decode.num_sms();
  d.smem = decode.options().smem();
  for (const Constant& c : decode.constants()) d.constants.push_back(&c);
  return d;
}

}  // namespace

absl::Status PrefillSupported(const graph::Graph& graph) {
  if (!HasAttention(graph)) return GeneralPrefillSupported(graph);
  prefill_internal::DecodeTarget check;
  check.check_only = true;
  return prefill_internal::DecoderPrefill(graph, PassBuilder(), check, 1, {}).Lower().status();
}

bool HasPrefillWeights(const Schedule& decode) {
  for (const PackedWeight& p : decode.packing()) {
    if (p.tile_rows() > 0) return true;
  }
  return false;
}

uint64_t PrefillWeightBytes(const Schedule& decode) {
  absl::flat_hash_map<std::string, uint64_t> bytes;
  for (const Tensor& t : decode.tensors()) bytes[t.name()] = t.bytes();
  uint64_t total = 0;
  for (const PackedWeight& p : decode.packing()) {
    if (p.tile_rows() > 0 && bytes.contains(p.tensor())) total += bytes[p.tensor()];
  }
  return total;
}

absl::Status AddPrefillWeights(const graph::Graph& graph, const CompileOptions& options, Program* program) {
  if (!HasAttention(graph)) return AddGeneralPrefillWeights(graph, options, program);
  // Any row count streams the same weights: lower one row and keep what it added to the WEIGHTS region.
  prefill_internal::DecodeTarget d;
  d.io = program->io;
  d.max_seq = program->max_seq;
  d.num_sms = options.num_sms();
  d.smem = options.smem();
  for (const Constant& c : program->constants) d.constants.push_back(&c);
  const size_t decode_tensors = program->tensors.size();
  absl::StatusOr<std::pair<Program, uint32_t>> pass =
      prefill_internal::DecoderPrefill(graph, PassBuilder(*program), d, 1, {}).Lower();
  if (!pass.ok()) return pass.status();
  for (size_t i = decode_tensors; i < pass->first.tensors.size(); ++i) {
    if (pass->first.tensors[i].region() == WEIGHTS) program->tensors.push_back(pass->first.tensors[i]);
  }
  for (const PackedWeight& w : pass->first.packing) program->packing.push_back(w);
  program->weight_bytes = pass->first.weight_bytes;
  return absl::OkStatus();
}

absl::StatusOr<Schedule> LowerPrefill(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                                        const PrefillOptions& prefill_options) {
  Schedule s;
  if (absl::Status st = LowerPrefillInto(graph, decode, rows, prefill_options, &s); !st.ok()) return st;
  return s;
}

absl::Status LowerPrefillInto(const graph::Graph& graph, const Schedule& decode, uint32_t rows,
                              const PrefillOptions& prefill_options, Schedule* out) {
  if (!HasAttention(graph)) {
    if (prefill_options.all_logits) {
      return absl::UnimplementedError("prefill: all_logits needs a decoder with attention");
    }
    absl::StatusOr<Schedule> general = LowerGeneralPrefill(graph, decode, rows, prefill_options.verify);
    if (!general.ok()) return general.status();
    *out = *std::move(general);
    return absl::OkStatus();
  }
  const uint32_t asked = prefill_options.page_bytes;
  if (asked != 0 && asked != isa::kGemmSlabBytes && asked != 2 * isa::kGemmSlabBytes &&
      asked != isa::kGemmWideStepBytes) {
    return absl::InvalidArgumentError(absl::StrCat("prefill: page_bytes ", prefill_options.page_bytes,
                                                   " is not 0 (auto), ", isa::kGemmSlabBytes, ", ",
                                                   2 * isa::kGemmSlabBytes, " or ", isa::kGemmWideStepBytes));
  }
  if (rows == 0 || rows > decode.max_seq()) {
    if (absl::Status s = PrefillSupported(graph); !s.ok()) return s;  // the model's refusal first
    return absl::OutOfRangeError(absl::StrCat("prefill of ", rows, " rows: the KV cache holds ", decode.max_seq()));
  }
  prefill_internal::DecoderPrefill lowering(graph, PassBuilder(decode), TargetOf(decode), rows, prefill_options);
  absl::StatusOr<std::pair<Program, uint32_t>> lowered = lowering.Lower();
  if (!lowered.ok()) return lowered.status();
  auto& [p, page_bytes] = *lowered;
  if (p.weight_bytes != decode.weight_bytes()) {
    return absl::FailedPreconditionError(
        "prefill: the schedule lacks the pass's weights (compiled without the prefill weights: "
        "CompileOptions.prefill, or from another model)");
  }
  // Shared memory: the widest FLASH_ATTN buffers (or LM head tile), pages for the rest.
  CompileOptions options = decode.options();
  FitPassSmem(p, page_bytes, options.mutable_smem());
  // Checked even when the pass is not verified: a block that does not fit fails only at launch.
  if (SmemTotalBytes(options.smem()) > kMaxSmemBytes) {
    return absl::OutOfRangeError(absl::StrCat(
        "prefill of ", rows, " rows: the pass's shared memory (", options.smem().num_pages(), " pages of ",
        options.smem().page_bytes(), " bytes + an activation ring of ", options.smem().activation_bytes(),
        " bytes) exceeds an SM's ", kMaxSmemBytes));
  }
  p.io = decode.io();
  p.max_seq = decode.max_seq();
  p.vocab_size = decode.vocab_size();
  AssembleScheduleInto(p, options, absl::StrCat(decode.model(), " prefill of ", rows, " rows"), out);
  out->mutable_prefill()->set_rows(rows);
  out->mutable_prefill()->set_state(lowering.pass_state());
  if (prefill_options.verify) {
    if (absl::Status st = VerifySchedule(*out); !st.ok()) {
      return absl::InternalError(absl::StrCat("prefill pass failed verification: ", st.message()));
    }
  }
  return absl::OkStatus();
}

bool PrefillInBuckets(const graph::Graph& graph) { return HasAttention(graph); }

uint32_t PrefillBucketRows(uint32_t rows, uint32_t room) {
  const uint32_t tile = isa::kGemmTileM;
  uint64_t bucket = (uint64_t{rows} + tile - 1) / tile * tile;
  if (rows < tile) {  // a power of two from kPrefillMinBucketRows
    bucket = kPrefillMinBucketRows;
    while (bucket < rows) bucket *= 2;
  }
  return static_cast<uint32_t>(std::max<uint64_t>(rows, std::min<uint64_t>(bucket, room)));
}

std::vector<uint32_t> PrefillBuckets(uint32_t max_rows, uint32_t room) {
  std::vector<uint32_t> buckets;
  for (uint32_t rows = 2; rows <= std::min(max_rows, room);) {
    const uint32_t b = PrefillBucketRows(rows, room);
    buckets.push_back(b);
    rows = b + 1;
  }
  return buckets;
}

absl::StatusOr<PrefillLastRow> PrefillLastRowFor(const Schedule& pass, uint32_t rows) {
  const uint32_t lowered = pass.prefill().rows();
  if (rows == 0 || rows > lowered || (rows - 1) / isa::kGemmTileM != (lowered - 1) / isa::kGemmTileM) {
    return absl::InvalidArgumentError(absl::StrCat("a pass of ", lowered, " rows runs prompts of ",
                                                   lowered - (lowered - 1) % isa::kGemmTileM, " to ", lowered,
                                                   " rows, not ", rows));
  }
  int last = -1, x = -1;
  for (int i = 0; i < pass.tensors_size(); ++i) {
    const std::string& name = pass.tensors(i).name();
    if (name == "prefill.last_row") last = i;
    if (name == "prefill.x") x = i;
    if (name == "prefill.logits" && rows != lowered) {
      return absl::InvalidArgumentError("a pass that keeps every row's logits runs its own row count only");
    }
  }
  if (last < 0 || x < 0) return absl::InvalidArgumentError("the pass has no prefill.last_row view of prefill.x");
  const uint64_t row_bytes = pass.tensors(last).bytes();
  return PrefillLastRow{static_cast<uint32_t>(last), pass.tensors(x).offset() + uint64_t{rows - 1} * row_bytes};
}

}  // namespace loom::scheduler
