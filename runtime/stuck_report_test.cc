// The watchdog's report of a stuck launch on synthetic counters and retired marks (no GPU): where each SM is, stuck
// inside an instruction or waiting, and a barrier that lost a signal.
#include "runtime/stuck_report.h"

#include <gtest/gtest.h>

#include "instructions/isa.h"

namespace loom::runtime {
namespace {

// An ADD signalling `signal` (or none), waiting for `count` signals a step on `barrier` (or nothing).
isa::Instruction Add(uint32_t signal, uint32_t barrier = isa::kNoBarrier, uint32_t count = 0) {
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(isa::Opcode::ADD);
  inst.signal = signal;
  if (barrier != isa::kNoBarrier) {
    inst.num_waits = 1;
    inst.waits[0] = {barrier, count | (count << 16)};
  }
  return inst;
}
uint64_t Mark(uint32_t launch, uint32_t retired) { return static_cast<uint64_t>(launch) << 32 | retired; }

// SM 0 signals barrier 0 once; SM 1 waits for it, then signals barrier 1.
std::vector<std::vector<isa::Instruction>> Chain() { return {{Add(0)}, {Add(1, 0, 1)}}; }

TEST(StuckReport, NamesTheSmStuckInsideAndTheOneWaitingOnIt) {
  const std::string r = StuckReport({0, 0}, {Mark(7, 0), Mark(7, 0)}, 7, Chain(), 0, 1);
  EXPECT_NE(r.find("stuck inside an instruction whose waits are met: SM 0 queue index 0 opcode ADD"),
            std::string::npos) << r;
  EXPECT_NE(r.find("waiting: SM 1 queue index 0 opcode ADD barrier 0 value 0 target 1"), std::string::npos) << r;
  EXPECT_EQ(r.find("lost"), std::string::npos) << r;
  EXPECT_NE(r.find("0 of 2 SMs done"), std::string::npos) << r;
}

TEST(StuckReport, NamesABarrierShortThoughEverySignallerRetired) {
  // SM 0 retired its instruction, yet barrier 0 reads 0.
  const std::string r = StuckReport({0, 0}, {Mark(7, 1), Mark(7, 0)}, 7, Chain(), 0, 1);
  EXPECT_EQ(r.find("stuck inside"), std::string::npos) << r;
  EXPECT_NE(r.find("barrier 0 is short though all 1 instructions that signal it have retired"), std::string::npos)
      << r;
  EXPECT_NE(r.find("1 of 2 SMs done"), std::string::npos) << r;
}

TEST(StuckReport, AnotherLaunchsMarkCountsAsNothingRetired) {
  const std::string r = StuckReport({0, 0}, {Mark(6, 1), Mark(6, 1)}, 7, Chain(), 0, 1);
  EXPECT_NE(r.find("stuck inside an instruction whose waits are met: SM 0 queue index 0"), std::string::npos) << r;
}

TEST(StuckReport, MultiStepLaunchesNameTheStep) {
  // Steps 4 and 5 (counters carry on from steps 0-3): both SMs retired step 4's instruction; barrier 0 reads 5,
  // step 5's wait needs 6.
  const std::string r = StuckReport({5, 5}, {Mark(3, 1), Mark(3, 1)}, 3, Chain(), 4, 2);
  EXPECT_NE(r.find("stuck inside an instruction whose waits are met: SM 0 queue index 0 opcode ADD (step 5)"),
            std::string::npos) << r;
  EXPECT_NE(r.find("SM 1 queue index 0 opcode ADD (step 5) barrier 0 value 5 target 6"), std::string::npos) << r;
}

TEST(StuckReport, CountsTheSmsPastTheFirstFew) {
  std::vector<std::vector<isa::Instruction>> queues(6, {Add(isa::kNoBarrier, 0, 1)});
  const std::string r = StuckReport({0}, std::vector<uint64_t>(6), 1, queues, 0, 1);
  EXPECT_NE(r.find("SM 2 queue index 0 opcode ADD barrier 0 value 0 target 1 (and 3 more SMs)"), std::string::npos)
      << r;
  EXPECT_EQ(r.find("SM 3 "), std::string::npos) << r;
  // No instruction signals barrier 0: nothing to call lost.
  EXPECT_EQ(r.find("lost"), std::string::npos) << r;
}

}  // namespace
}  // namespace loom::runtime
