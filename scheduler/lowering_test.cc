// Lowering: what a decode graph becomes, with and without each fusion, and
// clear refusals for what has no lowering yet.
#include "scheduler/lowering.h"

#include <algorithm>
#include <map>

#include "graph/graph_builder.h"
#include "instructions/isa.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/lowering_internal.h"
#include "scheduler/options.h"
#include "scheduler/schedule_verifier.h"
#include "scheduler/test_util.h"

namespace loom::scheduler {
namespace {

std::map<std::string, int> OpcodeCounts(const Schedule& s) {
  std::map<std::string, int> counts;
  for (const SmQueue& q : s.queues()) {
    for (const Instruction& inst : q.instructions()) ++counts[inst.opcode()];
  }
  return counts;
}

// The split count from the cost model (attention_splits 0): a split's and the reduce's costs weighed at the context
// the schedule is for (docs/history/performance_log.md).
TEST(Lowering, AutoAttentionSplitsWeighsTheSplitAgainstTheReduce) {
  using lowering_internal::AutoAttentionSplits;
  CompileOptions requested;
  requested.set_num_sms(132);
  const CompileOptions o = ResolveOptions(requested);
  // TinyLlama (32 heads, 4 KV heads of 64): 21 splits at context 1024 (max_seq 2048), not the 33 SMs a KV head has;
  // at half a 4200-position cache (2100) 32, where fewer splits' rows would no longer fit the slot.
  EXPECT_EQ(AutoAttentionSplits(32, 4, 64, 2048, 16, o), 21u);
  EXPECT_EQ(AutoAttentionSplits(32, 4, 64, 4200, 16, o), 32u);
  // Llama-3.2-1B / 3B / 8B: 16 SMs a KV head, fewer than the cost model's best.
  EXPECT_EQ(AutoAttentionSplits(32, 8, 64, 2048, 16, o), 16u);
  EXPECT_EQ(AutoAttentionSplits(24, 8, 128, 2048, 16, o), 16u);
  // A longer context wants more splits; a short cache caps them at one per 64 positions.
  EXPECT_GT(AutoAttentionSplits(32, 4, 64, 8192, 16, o), AutoAttentionSplits(32, 4, 64, 2048, 16, o));
  EXPECT_EQ(AutoAttentionSplits(32, 4, 64, 256, 16, o), 4u);
  // A smaller slot: the least costly count whose split's rows (at context 1024) fit it.
  CompileOptions small = o;
  small.mutable_smem()->set_activation_bytes(32768);
  const uint32_t splits = AutoAttentionSplits(32, 4, 64, 2048, 16, small);
  EXPECT_GT(splits, 21u);
  EXPECT_LE(isa::AttnPartialLayout(8, 64, (1024 + splits - 1) / splits, true, 4).bytes, 32768u);
  EXPECT_GT(isa::AttnPartialLayout(8, 64, (1024 + splits - 2) / (splits - 1), true, 4).bytes, 32768u);
  // A bf16 cache's rows take half the room: fewer splits fit the same slot.
  const uint32_t bf16_splits = AutoAttentionSplits(32, 4, 64, 2048, 16, small, 2);
  EXPECT_LT(bf16_splits, splits);
  EXPECT_LE(isa::AttnPartialLayout(8, 64, (1024 + bf16_splits - 1) / bf16_splits, true, 2).bytes, 32768u);
  // The reduce is priced at a consumer thread per output element whatever attention_reduce_heads is (priced at its
  // two heads of 64 the rule picked 32 for TinyLlama, 2.3% slower at 1024 than 21).
  for (uint32_t per : {1u, 2u, 4u}) {
    CompileOptions r = o;
    r.set_attention_reduce_heads(per);
    EXPECT_EQ(AutoAttentionSplits(32, 4, 64, 2048, 16, r), 21u) << per;
  }
}

TEST(Lowering, FusedTinyDecodeStepHasTheExpectedInstructions) {
  CompileOptions o;
  o.set_num_sms(8);
  o.set_attention_splits(2);
  o.set_separate_attention_reduce(false);
  const Schedule s = CompileTiny(o);
  const std::map<std::string, int> c = OpcodeCounts(s);
  EXPECT_EQ(c.at("EMBED"), 1);
  EXPECT_EQ(c.at("ARGMAX_REDUCE"), 1);
  EXPECT_EQ(c.at("ATTN_PARTIAL"), 2 * 2 * 2);  // layers x kv heads x splits
  EXPECT_EQ(c.count("ATTN_REDUCE"), 0u);          // folded into the last split of each KV head
  EXPECT_EQ(c.count("RMS_NORM"), 0u);  // all fused into matvecs
  EXPECT_EQ(c.count("ADD"), 0u);
  EXPECT_EQ(c.count("SILU_MUL"), 0u);
  // Every matvec weight byte is streamed exactly once per step, plus one embedding row;
  // the norm weights ride along with the activations.
  absl::StatusOr<graph::DecoderConfig> tiny = graph::DecoderPreset("tiny");
  const uint64_t norm_bytes = 2 * (2 * 2 * 256 + 256);
  EXPECT_EQ(s.weight_bytes_per_step(), static_cast<uint64_t>(tiny->DecodeWeightBytes()) - norm_bytes);
}

// The next step's EMBED folded into ARGMAX_REDUCE (isa::ArgmaxReduceArgs): the reduce stores the EMBED's row with
// the EMBED's table and shape, tagged as the EMBED tags it; `unfuse embed` leaves both as they were.
TEST(Lowering, ArgmaxReduceStoresTheNextStepsEmbedding) {
  for (bool fold : {true, false}) {
    SCOPED_TRACE(fold ? "folded" : "unfolded");
    CompileOptions o;
    if (!fold) o.mutable_fusion()->set_next_embedding(false);
    const Schedule s = CompileTiny(o);
    const Instruction* embed = nullptr;
    const Instruction* reduce = nullptr;
    for (const auto& q : s.queues()) {
      for (const Instruction& inst : q.instructions()) {
        if (inst.opcode() == "EMBED") embed = &inst;
        if (inst.opcode() == "ARGMAX_REDUCE") reduce = &inst;
      }
    }
    ASSERT_NE(embed, nullptr);
    ASSERT_NE(reduce, nullptr);
    absl::StatusOr<isa::Instruction> e = DecodeInstruction(*embed, s);
    absl::StatusOr<isa::Instruction> r = DecodeInstruction(*reduce, s);
    ASSERT_TRUE(e.ok() && r.ok());
    const isa::EmbedArgs& ea = e->as<isa::EmbedArgs>();
    const isa::ArgmaxReduceArgs& ra = r->as<isa::ArgmaxReduceArgs>();
    EXPECT_EQ(ea.folded, fold ? 1u : 0u);
    EXPECT_TRUE(embed->tag_out());  // layer 0 observes the row in the data either way
    EXPECT_EQ(reduce->tag_out(), fold);
    if (fold) {
      EXPECT_EQ(ra.embed_out, ea.out);
      EXPECT_EQ(ra.embed_table, ea.table);
      EXPECT_EQ(ra.hidden, ea.hidden);
      EXPECT_EQ(ra.vocab, ea.vocab);
      EXPECT_EQ(ra.row_stride, ea.row_stride);
    } else {
      EXPECT_EQ(ra.embed_out, isa::kNoTensor);
    }
    EXPECT_TRUE(VerifySchedule(s).ok());
  }
}

// attention_reduce_heads: the separate reduce's output split into reduces of that many heads (default 2; the last one
// ragged), every head merged exactly once.
TEST(Lowering, AttentionReduceHeadsSetsTheReducesPerLayer) {
  for (uint32_t per : {0u, 1u, 3u}) {
    CompileOptions o;
    o.set_num_sms(8);
    o.set_attention_splits(2);
    o.set_attention_reduce_heads(per);
    const Schedule s = CompileTiny(o);
    std::vector<int> merged(2 * 4, 0);  // layers x heads of random:tiny
    int reduces = 0;
    for (const SmQueue& q : s.queues()) {
      for (const Instruction& inst : q.instructions()) {
        if (inst.opcode() != "ATTN_REDUCE") continue;
        ++reduces;
        const isa::AttnReduceArgs a = DecodeInstruction(inst, s)->as<isa::AttnReduceArgs>();
        const int layer = inst.op().find("layers.1.") == 0 ? 1 : 0;
        EXPECT_LE(a.head_count, per == 0 ? 2u : per) << per;
        for (uint32_t h = a.head_begin; h < a.head_begin + a.head_count; ++h) ++merged[layer * 4 + h];
      }
    }
    EXPECT_EQ(reduces, per == 0 ? 4 : per == 1 ? 8 : 4) << per;  // per layer: 2 heads of 64 (the default), 1, 3
    EXPECT_EQ(merged, std::vector<int>(8, 1)) << per;
  }
}

// Step tags (instructions/instruction.h): every MATVEC reading a whole activation that tagging writers alone produce
// observes its wait in the data, and every ATTN_REDUCE its wait on the splits' partials; attention's splits
// (reading q and the KV cache) still poll their barrier.
TEST(Lowering, DecodeWaitsOnWholeActivationsAreObservedInTheData) {
  CompileOptions o;
  o.set_num_sms(8);
  const Schedule s = CompileTiny(o);
  int observed = 0, tagging = 0;
  for (const SmQueue& q : s.queues()) {
    for (const Instruction& inst : q.instructions()) {
      for (const Wait& w : inst.waits()) {
        if (!w.in_data()) continue;
        ++observed;
        EXPECT_TRUE(inst.opcode() == "MATVEC" || inst.opcode() == "ATTN_REDUCE") << inst.opcode();
        EXPECT_TRUE(inst.tagged_input());
      }
      if (inst.opcode() == "ATTN_PARTIAL") {
        for (const Wait& w : inst.waits()) EXPECT_FALSE(w.in_data()) << "attention reads q and the KV cache";
        EXPECT_TRUE(inst.tag_out()) << "its partials are the reduce's input";
      }
      if (inst.opcode() == "ATTN_REDUCE") {
        EXPECT_TRUE(inst.waits_size() == 1 && inst.waits(0).in_data());
        EXPECT_TRUE(inst.tag_out()) << "it writes the O projection's input";
      }
      tagging += inst.tag_out();
    }
  }
  // Per layer: QKV (the residual stream), O (attention's output), gate/up, down; then the LM head.
  EXPECT_GT(observed, 0);
  EXPECT_GT(tagging, 0);
  o.set_data_waits(false);
  const Schedule polled = CompileTiny(o);
  for (const SmQueue& q : polled.queues()) {
    for (const Instruction& inst : q.instructions()) {
      EXPECT_FALSE(inst.tag_out() || inst.tagged_input() || inst.tagged_residual());
      for (const Wait& w : inst.waits()) EXPECT_FALSE(w.in_data());
    }
  }
}

// Unfused ops name the activations too: whatever they read or write stays untagged, its waits polled.
TEST(Lowering, UnfusedActivationsAreNotTagged) {
  CompileOptions o;
  o.set_num_sms(8);
  o.mutable_fusion()->set_residual_add(false);
  o.mutable_fusion()->set_silu_mul(false);
  const Schedule s = CompileTiny(o);
  for (const SmQueue& q : s.queues()) {
    for (const Instruction& inst : q.instructions()) {
      if (inst.opcode() == "ADD" || inst.opcode() == "SILU_MUL") {
        EXPECT_FALSE(inst.tag_out());
        for (const Wait& w : inst.waits()) EXPECT_FALSE(w.in_data());
      }
    }
  }
}

TEST(Lowering, SeparateAttentionReduceEmitsAReducePerTwoHeads) {
  CompileOptions o;
  o.set_num_sms(8);
  o.set_attention_splits(2);
  const std::map<std::string, int> c = OpcodeCounts(CompileTiny(o));  // (the default with data waits)
  EXPECT_EQ(c.at("ATTN_PARTIAL"), 2 * 2 * 2);
  EXPECT_EQ(c.at("ATTN_REDUCE"), 4);  // layers x (4 heads of 64: two reduces of two)
  o.set_separate_attention_reduce(false);
  EXPECT_EQ(OpcodeCounts(CompileTiny(o)).count("ATTN_REDUCE"), 0u);
  o.clear_separate_attention_reduce();
  o.set_data_waits(false);  // polled, the fused reduce's counter is the shorter way
  EXPECT_EQ(OpcodeCounts(CompileTiny(o)).count("ATTN_REDUCE"), 0u);
}

// The decode variant compiles only the forms the default decode lowering emits (isa::KernelVariantOf): the fused
// reduce's ATTN_PARTIAL makes its program run in the tensor variant.
TEST(Lowering, DefaultDecodeRunsInTheDecodeVariant) {
  const auto variant = [](const CompileOptions& o) {
    absl::StatusOr<DecodedSchedule> d = DecodeSchedule(CompileTiny(o));
    EXPECT_TRUE(d.ok()) << d.status();
    isa::KernelVariant v = isa::kDecodeKernel;
    for (const auto& q : d->queues) {
      for (const isa::Instruction& inst : q) v = std::max(v, isa::KernelVariantOf(inst));
    }
    return v;
  };
  CompileOptions o;
  o.set_num_sms(8);
  EXPECT_EQ(variant(o), isa::kDecodeKernel);
  o.set_attention_splits(3);
  EXPECT_EQ(variant(o), isa::kDecodeKernel);
  o.set_separate_attention_reduce(false);
  EXPECT_EQ(variant(o), isa::kTensorKernel);
}

TEST(Lowering, EachFusionOffUsesTheUnfusedOpcodes) {
  CompileOptions o;
  o.set_num_sms(4);
  *o.mutable_fusion() = AllFusionsOff();
  const std::map<std::string, int> c = OpcodeCounts(CompileTiny(o));
  EXPECT_EQ(c.at("RMS_NORM"), 2 * 2 + 1);
  EXPECT_EQ(c.at("ROPE_KV_APPEND"), 2);
  EXPECT_EQ(c.at("ADD"), 2 * 2);
  EXPECT_EQ(c.at("SILU_MUL"), 2);
  EXPECT_GT(c.at("ARGMAX_PARTIAL"), 0);
}

TEST(Lowering, TilesBalanceAcrossSmsAndRespectKvGroups) {
  CompileOptions o;
  o.set_num_sms(132);
  const Schedule s = CompileTiny(o);
  for (const SmQueue& q : s.queues()) {
    for (const Instruction& inst : q.instructions()) {
      if (inst.opcode() != "MATVEC") continue;
      isa::Instruction decoded{};
      for (int i = 0; i < inst.args_size(); ++i) decoded.args[i] = inst.args(i);
      const isa::MatvecArgs& a = decoded.as<isa::MatvecArgs>();
      if (a.epilogue == isa::kEpilogueRopeKvAppend) {
        const uint32_t group_rows = (a.heads_per_group + 2) * a.head_dim;
        EXPECT_EQ(a.row_begin / group_rows, (a.row_begin + a.rows - 1) / group_rows) << "tile crosses a KV group";
      }
    }
  }
}

TEST(Lowering, RefusesOpsWithoutADecodeLowering) {
  graph::GraphBuilder b("conv_net");
  b.Input("img", {1, 8, 8, 4}, graph::F32);
  b.Weight("w", {4, 3, 3, 4});
  graph::Conv2dAttrs a;
  a.set_stride_h(1);
  a.set_stride_w(1);
  b.Conv2d("y", "img", "w", "", a);
  absl::StatusOr<graph::Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok());
  absl::StatusOr<Program> p = LowerDecodeGraph(*g, ResolveOptions({}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("op 'y' (CONV2D): has no lowering to instructions yet"), std::string::npos)
      << p.status();
}

// What the device cannot run is refused when compiling, naming the op and the reason.
TEST(Lowering, RefusesShapesTheKernelCannotRun) {
  absl::StatusOr<graph::DecoderConfig> c = graph::DecoderPreset("tiny");
  ASSERT_TRUE(c.ok());
  c->num_heads = 16;  // 16 query heads share each of 1 KV head
  c->num_kv_heads = 1;
  c->head_dim = 16;
  absl::StatusOr<graph::Graph> g = graph::BuildDecoderGraph(*c, 64);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<Program> p = LowerDecodeGraph(*g, ResolveOptions({}));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "op 'layers.0.attn' (ATTENTION): 16 query heads per KV head (16/1); the attention "
                                  "instructions handle at most 8");
  c = graph::DecoderPreset("tiny");
  c->head_dim = 96;  // does not divide 256
  c->num_heads = 2;
  c->num_kv_heads = 1;
  g = graph::BuildDecoderGraph(*c, 64);
  ASSERT_TRUE(g.ok());
  p = LowerDecodeGraph(*g, ResolveOptions({}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("head_dim 96"), std::string::npos) << p.status();
  c = graph::DecoderPreset("tiny");
  c->hidden_size = 258;  // the input vector moves in 16-byte units
  g = graph::BuildDecoderGraph(*c, 64);
  ASSERT_TRUE(g.ok());
  p = LowerDecodeGraph(*g, ResolveOptions({}));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("a matvec over 258 columns"), std::string::npos) << p.status();
}

// Real checkpoint widths that are not multiples of 256 compile to padded rows.
TEST(Lowering, OddWidthsCompileToPaddedRows) {
  for (int hidden : {576, 896, 960}) {
    absl::StatusOr<graph::DecoderConfig> c = graph::DecoderPreset("tiny");
    c->hidden_size = hidden;
    c->num_heads = hidden / 64;  // 9, 14, 15
    c->num_kv_heads = c->num_heads % 3 == 0 ? 3 : c->num_heads / 7 * 7 == c->num_heads ? 2 : 5;
    c->intermediate_size = 1536;
    absl::StatusOr<graph::Graph> g = graph::BuildDecoderGraph(*c, 64);
    ASSERT_TRUE(g.ok());
    absl::StatusOr<Schedule> s = Compile(*g, "odd", CompileOptions());
    ASSERT_TRUE(s.ok()) << hidden << ": " << s.status();
    for (const PackedWeight& p : s->packing()) {
      if (p.tile_rows() > 0) continue;  // a prefill GEMM's operand image: zero padding inside its slabs
      if (p.cols() > 1) EXPECT_EQ(p.row_stride() % 256, 0u) << p.tensor();
      if (p.cols() == static_cast<uint64_t>(hidden)) EXPECT_EQ(p.row_stride(), (hidden + 255) / 256 * 256u);
    }
  }
}

// An 8B model's 14336-wide down-proj input does not fit the default activation ring: the compiler grows the
// ring (taking a page away) unless the user fixed the shared-memory layout, which is then refused by name.
TEST(Lowering, WideInputsGetALargerActivationRing) {
  absl::StatusOr<graph::DecoderConfig> c = graph::DecoderPreset("tiny");
  c->hidden_size = 4096;
  c->num_heads = 32;
  c->num_kv_heads = 8;
  c->head_dim = 128;
  c->intermediate_size = 14336;
  c->num_layers = 1;
  absl::StatusOr<graph::Graph> g = graph::BuildDecoderGraph(*c, 256);
  ASSERT_TRUE(g.ok());
  absl::StatusOr<Schedule> s = Compile(*g, "8b-ish", CompileOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(s->options().smem().activation_bytes(), 14336u * 4);
  EXPECT_LE(SmemTotalBytes(s->options().smem()), kMaxSmemBytes);
  EXPECT_LT(s->options().smem().num_pages(), 11u);
  CompileOptions fixed;
  fixed.mutable_smem()->set_activation_bytes(47104);
  s = Compile(*g, "8b-ish", fixed);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'layers.0.down,layers.0.mlp_residual': its input of 14336 floats needs"),
            std::string::npos)
      << s.status();
}

TEST(Options, BadOptionsAreRejectedByName) {
  CompileOptions o = ResolveOptions({});
  o.mutable_smem()->set_num_pages(40);
  absl::Status s = ValidateOptions(o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shared memory"), std::string::npos);
  o = ResolveOptions({});
  o.mutable_smem()->set_page_bytes(1000);
  EXPECT_FALSE(ValidateOptions(o).ok());
  o = ResolveOptions({});
  o.mutable_smem()->set_activation_slots(5);
  s = ValidateOptions(o);
  EXPECT_NE(s.message().find("activation_slots"), std::string::npos) << s;
  // 1 KB more activation ring no longer fits beside 11 pages.
  o = ResolveOptions({});
  o.mutable_smem()->set_activation_bytes(o.smem().activation_bytes() + 1024);
  s = ValidateOptions(o);
  EXPECT_NE(s.message().find("activation ring"), std::string::npos) << s;
  o = ResolveOptions({});
  o.mutable_smem()->set_matvec_pages_in_flight(o.smem().num_pages() + 1);
  s = ValidateOptions(o);
  EXPECT_NE(s.message().find("smem.matvec_pages_in_flight 12 is more than the 11 pages"), std::string::npos) << s;
}

// MATVEC pages in flight cover the HBM latency at an SM's share of the bandwidth: 1000 ns x 3100 / 132 GB/s =
// 23.5 KB, two 16 KB pages; more with bigger shares or a longer latency, never more than the ring.
TEST(Options, PagesInFlightCoverTheLatency) {
  EXPECT_EQ(ResolveOptions({}).smem().matvec_pages_in_flight(), 2u);
  CompileOptions o;
  o.mutable_cost()->set_sm_gbps(50);
  EXPECT_EQ(ResolveOptions(o).smem().matvec_pages_in_flight(), 4u);
  o.mutable_cost()->set_hbm_latency_ns(1e6);
  EXPECT_EQ(ResolveOptions(o).smem().matvec_pages_in_flight(), 11u);
  o = CompileOptions();
  o.mutable_smem()->set_page_bytes(32768);
  EXPECT_EQ(ResolveOptions(o).smem().matvec_pages_in_flight(), 1u);
  o.mutable_smem()->set_matvec_pages_in_flight(3);
  EXPECT_EQ(ResolveOptions(o).smem().matvec_pages_in_flight(), 3u);
}

TEST(Options, AttentionSplitsCoverSixteenPositionsUnlessAsked) {
  EXPECT_EQ(ResolveOptions({}).attention_min_split_positions(), 16u);
  CompileOptions o;
  o.set_attention_min_split_positions(1);
  EXPECT_EQ(ResolveOptions(o).attention_min_split_positions(), 1u);
}

}  // namespace
}  // namespace loom::scheduler
