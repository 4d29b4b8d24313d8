// Trace summaries and the Chrome trace on synthetic timings (no GPU): per opcode, per stage of a layer (the op
// names without their layer), spans, and the op names written into the trace.
#include "runtime/trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace loom::runtime {
namespace {

isa::Instruction Of(isa::Opcode op) {
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(op);
  return inst;
}

// Two SMs, two layers of (qkv MATVEC, attn ATTN_PARTIAL) each, one step: SM s runs layer s's two instructions.
// Layer l's qkv starts at 1000 l ns, waits 100 ns, computes 200; attn starts at 1000 l + 300, waits 50, computes 150.
TEST(Trace, StagesSumLayersAndMeasureSpans) {
  GpuProgram program;
  program.queues = {{Of(isa::Opcode::MATVEC), Of(isa::Opcode::ATTN_PARTIAL)},
                    {Of(isa::Opcode::MATVEC), Of(isa::Opcode::ATTN_PARTIAL)}};
  const std::vector<uint32_t> queue_begin = {0, 2, 4};
  std::vector<TraceEvent> events;
  for (uint64_t l = 0; l < 2; ++l) {
    events.push_back({1000 * l, 1000 * l + 100, 1000 * l + 300, 1000 * l + 150, 1000 * l + 160, 1000 * l + 280});
    events.push_back({1000 * l + 300, 1000 * l + 350, 1000 * l + 500, 0});  // hand-off not recorded
  }
  const std::vector<std::vector<std::string>> ops = {{"layers.0.qkv", "layers.0.attn,layers.0.out"},
                                                     {"layers.1.qkv", "layers.1.attn,layers.1.out"}};
  TraceInput in{&program, &queue_begin, &events, 1, 0, &ops};
  const std::string s = StageSummary(in);
  // qkv: 2 instructions, 400 ns computing (100 of it the hand-off to the consumers), 200 waiting, 300 ns span per
  // layer, one instruction per layer so no spread; attn (a fused instruction's names, each without its layer): 300 /
  // 0 / 100 / 200.
  EXPECT_NE(s.find("qkv                           2          0.4        0.1          0.2       0.30       0.00"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("attn,out                      2          0.3        0.0          0.1       0.20       0.00"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("a layer spans 0.50 us on average"), std::string::npos) << s;
  EXPECT_LT(s.find("qkv"), s.find("attn"));  // in the order they first appear
  const std::string full = TraceSummary(in);
  EXPECT_NE(full.find("MATVEC"), std::string::npos) << full;
  EXPECT_NE(full.find("per stage"), std::string::npos) << full;
  in.op_names = nullptr;
  EXPECT_EQ(TraceSummary(in).find("per stage"), std::string::npos);

  in.op_names = &ops;
  const std::string path = (std::filesystem::temp_directory_path() / "loom_trace_test.json").string();
  ASSERT_TRUE(WriteChromeTrace(path, in).ok());
  std::ifstream f(path);
  std::stringstream json;
  json << f.rdbuf();
  EXPECT_NE(json.str().find("\"op\":\"layers.1.attn,layers.1.out\""), std::string::npos) << json.str();
  EXPECT_NE(json.str().find("\"wait_us\":0.05"), std::string::npos) << json.str();
  // The qkv's page phase, from its start; the attention's (no marks) has none.
  EXPECT_NE(json.str().find("\"pages_begin_us\":0.16,\"pages_end_us\":0.28"), std::string::npos) << json.str();
  EXPECT_EQ(json.str().find("\"pages_begin_us\":0.0,"), std::string::npos) << json.str();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace loom::runtime
