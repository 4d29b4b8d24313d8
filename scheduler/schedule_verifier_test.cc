// The verifier accepts what the compiler makes and rejects each way a schedule
// can be broken, saying which instruction, barrier or tensor and why.
#include "scheduler/schedule_verifier.h"

#include "graph/proto_file.h"
#include "scheduler/test_util.h"

namespace loom::scheduler {
namespace {

void ExpectRejected(const Schedule& s, const std::string& why) {
  absl::Status st = VerifySchedule(s);
  EXPECT_FALSE(st.ok()) << why;
  EXPECT_NE(st.message().find(why), std::string::npos) << "wanted '" << why << "', got: " << st.message();
}

int FindBarrier(const Schedule& s, const std::string& prefix) {
  for (int b = 0; b < s.barriers_size(); ++b) {
    if (s.barriers(b).name().rfind(prefix, 0) == 0) return b;
  }
  return -1;
}

// The folded EMBED and the ARGMAX_REDUCE that stores its row come together: a folded EMBED alone would leave layer 0
// waiting for a row nobody writes, a reduce storing a row no folded EMBED reads would write into another tensor.
TEST(ScheduleVerifier, RejectsAFoldedEmbeddingWithoutItsReduce) {
  const Schedule s = CompileTiny();
  auto edit = [&](const char* opcode, int word, uint32_t value) {
    Schedule bad = s;
    for (auto& q : *bad.mutable_queues()) {
      for (auto& inst : *q.mutable_instructions()) {
        if (inst.opcode() != opcode) continue;
        inst.set_args(word, value);
        if (inst.opcode() == "ARGMAX_REDUCE" && value == 0xffffffffu) inst.set_tag_out(false);  // (no row to tag)
      }
    }
    return bad;
  };
  // ArgmaxReduceArgs: embed_out is word 6, hidden word 7; EmbedArgs: folded is word 9.
  ExpectRejected(edit("ARGMAX_REDUCE", 6, 0xffffffffu), "a folded EMBED (it runs only in a launch's first step)");
  ExpectRejected(edit("EMBED", 9, 0), "which 0 folded EMBEDs of the same table and shape write (needs 1)");
  ExpectRejected(edit("ARGMAX_REDUCE", 7, 128), "which 0 folded EMBEDs of the same table and shape write (needs 1)");
}

TEST(ScheduleVerifier, AcceptsCompiledSchedules) {
  for (uint32_t sms : {1u, 7u, 132u}) {
    CompileOptions o;
    o.set_num_sms(sms);
    EXPECT_TRUE(VerifySchedule(CompileTiny(o)).ok());
  }
}

// Step tags: a wait observed in the data must be on exactly the tagging writers of the input, and those writers and
// every reader must carry their flags.
TEST(ScheduleVerifier, RejectsDataWaitsTheTagsDoNotCover) {
  const Schedule s = CompileTiny();
  Schedule bad = s;
  bool marked = false;
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      if (!marked && inst.opcode() == "ATTN_PARTIAL") {  // its barrier's writers (QKV) do not tag
        inst.mutable_waits(0)->set_in_data(true);
        marked = true;
      }
    }
  }
  ASSERT_TRUE(marked);
  ExpectRejected(bad, "in the data, but the barrier's signallers are not exactly the tagging writers");
  bad = s;
  bool cleared = false;
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      if (!cleared && inst.tag_out() && inst.opcode() == "MATVEC") {
        inst.set_tag_out(false);
        cleared = true;
      }
    }
  }
  ASSERT_TRUE(cleared);
  ExpectRejected(bad, "which the schedule uses step-tagged, without its step-tag flag");
  bad = s;  // readers checking tags no writer stores, with no wait observed in the data: they would never finish
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      inst.set_tag_out(false);
      for (auto& w : *inst.mutable_waits()) w.set_in_data(false);
    }
  }
  ExpectRejected(bad, "which the schedule uses step-tagged, without its step-tag flag");
  bad = s;  // the next step's EMBED row stored a step early (the default), untagged: layer 0 would wait forever
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      if (inst.opcode() == "ARGMAX_REDUCE") inst.set_tag_out(false);
    }
  }
  ExpectRejected(bad, "stores the next step's row of tensor");
  CompileOptions unfolded;
  unfolded.mutable_fusion()->set_next_embedding(false);
  bad = CompileTiny(unfolded);
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      if (inst.opcode() == "ARGMAX_REDUCE") inst.set_tag_out(true);  // without the EMBED folded in it writes nothing
    }                                                                 // tagged
  }
  ExpectRejected(bad, "has step-tag flags 1 where the rules allow 0");
  // Attention's reduce observed in the data (the default): a split that would not tag its partials, or a reducer
  // that would not check them.
  for (const char* opcode : {"ATTN_PARTIAL", "ATTN_REDUCE"}) {
    SCOPED_TRACE(opcode);
    bad = s;
    bool changed = false;
    for (auto& q : *bad.mutable_queues()) {
      for (auto& inst : *q.mutable_instructions()) {
        if (changed || inst.opcode() != opcode) continue;
        if (inst.opcode() == "ATTN_PARTIAL") inst.set_tag_out(false);
        else inst.set_tagged_input(false);
        changed = true;
      }
    }
    ASSERT_TRUE(changed);
    ExpectRejected(bad, "which the schedule uses step-tagged, without its step-tag flag");
  }
}

TEST(ScheduleVerifier, RejectsUnknownOpcodesAndBadArguments) {
  Schedule s = CompileTiny();
  Schedule bad = s;
  bad.mutable_queues(0)->mutable_instructions(0)->set_opcode("TELEPORT");
  ExpectRejected(bad, "unknown opcode 'TELEPORT'");
  bad = s;
  bad.mutable_queues(0)->mutable_instructions(0)->add_args(7);
  ExpectRejected(bad, "argument words");
  bad = s;  // an out-of-range tensor id
  bad.mutable_queues(0)->mutable_instructions(0)->set_args(0, 9999);
  ExpectRejected(bad, "names tensor 9999");
}

TEST(ScheduleVerifier, RejectsBarriersThatNeverFireOrCannotBeMet) {
  Schedule s = CompileTiny();
  Schedule bad = s;
  bad.add_barriers()->set_name("orphan");
  ExpectRejected(bad, absl::StrCat("barrier ", s.barriers_size(), " 'orphan' never fires"));
  bad = s;
  bad.mutable_barriers(1)->set_signals_per_step(bad.barriers(1).signals_per_step() + 1);
  ExpectRejected(bad, "signals per step, instructions give");
  bad = s;
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      if (inst.waits_size() > 0 && !inst.waits(0).previous_step()) {
        inst.mutable_waits(0)->set_count(inst.waits(0).count() + 1);
        ExpectRejected(bad, "can never be met");
        return;
      }
    }
  }
  FAIL() << "no instruction with a wait";
}

TEST(ScheduleVerifier, RejectsArenaOverflowOverlapAndShortTensors) {
  Schedule s = CompileTiny();
  Schedule bad = s;
  bad.set_arena_bytes(bad.arena_bytes() / 2);
  ExpectRejected(bad, "overflows the ARENA region");
  bad = s;
  for (auto& t : *bad.mutable_tensors()) {
    if (t.region() == ARENA && t.offset() > 0) {
      t.set_offset(0);
      break;
    }
  }
  ExpectRejected(bad, "overlap");
  bad = s;  // shrink the MLP activation: the gate/up tiles write past it
  for (auto& t : *bad.mutable_tensors()) {
    if (t.name() == "layers.1.silu_mul") {
      t.set_shape(1, 10);
      t.set_bytes(40);
    }
  }
  ExpectRejected(bad, "tensor 'layers.1.silu_mul' has 10 elements, instruction reaches");
}

TEST(ScheduleVerifier, RejectsSharedMemoryThatDoesNotFit) {
  Schedule bad = CompileTiny();
  bad.mutable_options()->mutable_smem()->set_num_pages(20);
  ExpectRejected(bad, "do not fit an SM");
  bad = CompileTiny();
  bad.mutable_options()->mutable_smem()->set_activation_slots(0);
  ExpectRejected(bad, "in 0 slots");
  bad = CompileTiny();
  bad.mutable_options()->mutable_smem()->set_activation_bytes(512);
  ExpectRejected(bad, "bytes of activation buffer");
  bad = CompileTiny();
  bad.mutable_options()->mutable_smem()->set_matvec_pages_in_flight(bad.options().smem().num_pages() + 1);
  ExpectRejected(bad, "matvec_pages_in_flight");
}

// A MATVEC's 1024-column slots each summed by one consumer warp: pages whose warp shares split them are refused
// (random:llama-3.2-1b's rows are 2048 and 8192 columns; random:tiny's 256 and 512 use 256-column slots).
TEST(ScheduleVerifier, RejectsPagesThatSplitAMatvecSlot) {
  graph::ModelOptions mo;
  mo.max_seq = 64;
  mo.load_weights = false;
  absl::StatusOr<graph::Model> m = graph::LoadModel("random:llama-3.2-1b", mo);
  ASSERT_TRUE(m.ok()) << m.status();
  for (uint32_t page_bytes : {8192u, 12288u, 16384u, 32768u}) {
    CompileOptions o;
    o.set_num_sms(16);
    o.mutable_smem()->set_page_bytes(page_bytes);
    o.mutable_smem()->set_num_pages(4);
    absl::StatusOr<Schedule> s = Compile(m->graph, "random:llama-3.2-1b", o);
    if (page_bytes % 16384 == 0) {
      EXPECT_TRUE(s.ok()) << page_bytes << ": " << s.status();
      continue;
    }
    ASSERT_FALSE(s.ok()) << page_bytes;
    EXPECT_NE(s.status().message().find("(MATVEC of "), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("smem.page_bytes must be a multiple of 16384"), std::string::npos)
        << s.status();
  }
  CompileOptions o;
  o.mutable_smem()->set_page_bytes(8192);
  o.mutable_smem()->set_num_pages(8);
  Schedule tiny = CompileTiny(o);  // 256-column slots: any page of whole warp segments
  EXPECT_TRUE(VerifySchedule(tiny).ok());
  tiny.mutable_options()->mutable_smem()->set_page_bytes(2048);
  ExpectRejected(tiny, "smem.page_bytes must be a multiple of 4096");
}

TEST(ScheduleVerifier, FindsDeadlocksInQueueOrder) {
  CompileOptions o;
  o.set_num_sms(1);
  Schedule bad = CompileTiny(o);
  auto* q = bad.mutable_queues(0)->mutable_instructions();
  // Move the step's last instruction (argmax reduce) to the front of the only queue.
  std::rotate(q->rbegin(), q->rbegin() + 1, q->rend());
  ExpectRejected(bad, "deadlock: SM 0 instruction 0 (ARGMAX_REDUCE");
}

TEST(ScheduleVerifier, RejectsInstructionsOutsideTheStepOrder) {
  Schedule bad = CompileTiny();
  // Drop every wait of some matvec: it no longer depends on the step's first instruction.
  for (auto& q : *bad.mutable_queues()) {
    for (auto& inst : *q.mutable_instructions()) {
      if (inst.opcode() == "MATVEC") {
        inst.clear_waits();
        ExpectRejected(bad, "does not depend on the step's first instruction");
        return;
      }
    }
  }
}

TEST(ScheduleVerifier, RejectsABarrierIdOutOfRange) {
  Schedule bad = CompileTiny();
  bad.mutable_queues(0)->mutable_instructions(0)->set_signal(4000);
  ExpectRejected(bad, "signals barrier 4000");
  const int step = FindBarrier(bad, "step");
  EXPECT_EQ(step, 0);
}

TEST(ScheduleFiles, RoundTripAndCorruptFiles) {
  Schedule s = CompileTiny();
  for (const char* name : {"/s.pb", "/s.pbtxt"}) {
    const std::string path = testing::TempDir() + name;
    ASSERT_TRUE(WriteProtoFile(path, s).ok());
    absl::StatusOr<Schedule> back = LoadSchedule(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->SerializeAsString(), s.SerializeAsString());
  }
  const std::string path = testing::TempDir() + "/hostile.pbtxt";
  ASSERT_TRUE(WriteFileAtomically(path, "format_version: 9 num_sms: 1 queues { instructions { opcode: \"EMBED\" "
                                        "waits { barrier: 99 count: 1 } } }")
                  .ok());
  absl::StatusOr<Schedule> bad = LoadSchedule(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
  const std::string corrupt = testing::TempDir() + "/corrupt.pb";
  ASSERT_TRUE(WriteFileAtomically(corrupt, s.SerializeAsString().substr(0, 100)).ok());
  EXPECT_FALSE(LoadSchedule(corrupt).ok());
}

}  // namespace
}  // namespace loom::scheduler
