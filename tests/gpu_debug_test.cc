// A debug build of the megakernel (LOOM_DEVICE_DEBUG) must not hang on a wait
// that can never be met: it records (SM, queue index, opcode, barrier, value,
// target), traps, and the host turns the record into an error. The program
// here bypasses the ScheduleVerifier on purpose (it would reject it).
#include "gtest/gtest.h"
#include "megakernel/gpu_backend.h"
#include "megakernel/gpu_machine.h"

namespace loom::megakernel {
namespace {

TEST(GpuDebug, AStuckWaitIsReportedNotHung) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << why;
  GpuProgram p;
  p.tensors = {{0, 1024, isa::kArenaRegion, 2 /* F32 */}};
  p.arena_bytes = 1024;
  p.num_barriers = 2;
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(isa::Opcode::ADD);
  inst.as<isa::AddArgs>() = {0, 0, 0, 0, 16};
  inst.signal = 1;
  inst.num_waits = 1;
  inst.waits[0] = {0, 1u | (1u << 16)};  // barrier 0: one signal per step, which nothing sends
  p.queues = {{}, {inst}};               // on SM 1, after an empty SM 0
  absl::StatusOr<std::unique_ptr<GpuMachine>> m = GpuMachine::Create(p, std::vector<uint8_t>(16));
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<float> ms = (*m)->Run(1, false);
  ASSERT_FALSE(ms.ok());
  EXPECT_NE(ms.status().message().find("megakernel stuck: SM 1 queue index 0 opcode ADD barrier 0 value 0 target 1"),
            std::string::npos)
      << ms.status();
}

}  // namespace
}  // namespace loom::megakernel
