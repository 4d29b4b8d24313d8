// A decoder prefill's end: the last row's final RMSNorm + LM head as MATVEC tiles with argmax partials (as a decode
// step ends), then ARGMAX_REDUCE writing the next token; with PrefillOptions::all_logits every row's logits too.
#include <algorithm>

#include "scheduler/prefill_lowering.h"

namespace loom::scheduler::prefill_internal {

bool DecoderPrefill::OnlyLmHeadReads(const std::string& t) const {
  const std::vector<const OpDef*>& readers = Readers(t);
  if (readers.empty()) return false;
  for (const OpDef* norm : readers) {
    if (norm->type() != graph::RMS_NORM || norm->norm().group_size() != 0) return false;
    for (const OpDef* head : Readers(norm->outputs(0))) {
      const std::vector<const OpDef*>& logits = Readers(head->outputs(0));
      if (head->type() != graph::LINEAR || logits.size() != 1 || logits[0]->type() != graph::ARGMAX) return false;
    }
  }
  return true;
}

absl::Status DecoderPrefill::LowerLmHead(const OpDef& linear, const OpDef& argmax) {
  auto norm = deferred_norms_.find(linear.inputs(0));
  if (norm == deferred_norms_.end()) {
    return Refuse(linear, "the logits' input is not an RMSNorm of the residual stream");
  }
  if (linear.inputs_size() > 2) return Refuse(linear, "an LM head with a bias has no lowering");
  if (head_lowered_) return Refuse(argmax, "a second argmax of logits");
  if (norm->second->inputs(0) != current_) {
    return Refuse(linear, "its norm reads an earlier value of the residual stream");
  }
  if (pending_) FlushParts();  // the last residual projection's parts, added to x for the LM head
  absl::StatusOr<uint32_t> lm_head = Decode(absl::StrCat("packed:", linear.inputs(1)));
  if (!lm_head.ok()) return lm_head.status();
  const uint32_t final_norm = Weight("vec:", {norm->second->inputs(1)}, ROWS_IDENTITY, hidden_, 1, false);
  const float eps = norm->second->norm().eps();
  const StageRef prev = ready_.at(current_);

  const uint32_t vocab = static_cast<uint32_t>(g_.tensor(linear.inputs(1)).shape(0)), num_sms = d_.num_sms;
  // An LM-head tile's slot (isa::MatvecActivationBytes: the input row, then a float per row and slot of the row:
  // hidden 2048 has 2 slots of 1024 columns, hidden 1536 6 of 256). Tiles take at most as many rows as fit the
  // activation ring the widest FLASH_ATTN needs anyway (Llama-3.2-3B's LM head on 8 SMs, a tile an SM, would take a
  // 200 KB slot beside it).
  const uint32_t ring = widest_flash_;
  const uint64_t row_fixed = isa::MatvecActivationBytes(0, hidden_);
  const uint64_t row_bytes = isa::MatvecActivationBytes(1, hidden_) - row_fixed;
  const uint32_t ring_rows =
      static_cast<uint32_t>(std::max<uint64_t>(2, (ring - std::min<uint64_t>(ring, row_fixed)) / row_bytes / 2 * 2));
  const uint32_t tile_rows =
      std::min(ring_rows, std::max<uint32_t>(16, (vocab + num_sms - 1) / num_sms + 1) / 2 * 2);
  const uint32_t tiles = (vocab + tile_rows - 1) / tile_rows;
  const uint32_t partials = b_.Scratch("prefill.partials", graph::F32, {tiles, 2});
  const uint32_t head = b_.Stage(linear.name());
  // One LM-head tile of rows [row_begin, +rows) for one hidden row `input`, with the final norm as its prologue.
  auto lm_head_tile = [&](uint32_t row_begin, uint32_t rows, uint32_t input, uint32_t out) {
    isa::MatvecArgs a{};
    a.weight = *lm_head;
    a.row_begin = row_begin;
    a.rows = std::min(rows, vocab - row_begin);
    a.k = hidden_;
    a.input = input;
    a.prologue = isa::kPrologueRmsNorm;
    a.norm_weight = final_norm;
    a.norm_eps = eps;
    a.epilogue = isa::kEpilogueStore;
    a.out = out;
    a.residual = isa::kNoTensor;
    a.partials = isa::kNoTensor;
    a.bias = isa::kNoTensor;
    return a;
  };
  for (uint32_t t = 0; t < tiles; ++t) {
    isa::MatvecArgs a = lm_head_tile(t * tile_rows, tile_rows, last_row_, d_.io.logits());
    a.epilogue = isa::kEpilogueArgmaxPartial;
    a.partials = partials;
    a.tile_index = t;
    b_.Emit(isa::Opcode::MATVEC, a, head, prev.Of((P_ - 1) / isa::kGemmTileM), linear.name());
  }
  const uint32_t end = b_.Stage(argmax.name());
  isa::Instruction reduce{};  // waits on the last row's logits, and on every row's with all_logits
  reduce.opcode = static_cast<uint8_t>(isa::Opcode::ARGMAX_REDUCE);
  reduce.as<isa::ArgmaxReduceArgs>() = {partials, tiles, pass_state_, d_.io.tokens(), d_.max_seq};
  reduce.num_waits = 1;
  reduce.waits[0] = {head, 0};
  if (o_.all_logits) {
    // Tiles as wide as the activation ring holds; a barrier counts at most kMaxSignalsPerStep signals, so the rows
    // are split over up to three stages the reduce waits on.
    const uint32_t wide_rows = std::min<uint32_t>(vocab, ring_rows);
    const uint32_t wide_tiles = (vocab + wide_rows - 1) / wide_rows;
    const uint32_t rows_per_stage = isa::kMaxSignalsPerStep / wide_tiles;
    if (P_ > 3 * rows_per_stage) {
      return absl::OutOfRangeError(absl::StrCat("prefill: every row's logits for ", P_, " rows: at most ",
                                                3 * rows_per_stage, " rows"));
    }
    b_.Scratch("prefill.logits", graph::F32, {P_, vocab});
    uint32_t rows_stage = 0;
    for (uint32_t r = 0; r < P_; ++r) {
      if (r % rows_per_stage == 0) {
        rows_stage = b_.Stage(absl::StrCat("all_logits.", r / rows_per_stage));
        reduce.waits[reduce.num_waits++] = {rows_stage, 0};
      }
      const uint32_t in = b_.Scratch(absl::StrCat("prefill.row.", r), graph::F32, {hidden_}, "prefill.x",
                                     uint64_t{r} * hidden_ * 4);
      const uint32_t out = b_.Scratch(absl::StrCat("prefill.logits.", r), graph::F32, {vocab}, "prefill.logits",
                                      uint64_t{r} * vocab * 4);
      for (uint32_t t = 0; t < wide_tiles; ++t) {
        b_.Emit(isa::Opcode::MATVEC, lm_head_tile(t * wide_rows, wide_rows, in, out), rows_stage,
                prev.Of(r / isa::kGemmTileM), "all_logits");
      }
    }
  }
  b_.EmitRaw(reduce, end, argmax.name());
  Consume({&argmax});
  head_lowered_ = true;
  return absl::OkStatus();
}

}  // namespace loom::scheduler::prefill_internal
