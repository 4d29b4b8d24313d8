// A debug build of the megakernel (LOOM_DEVICE_DEBUG) must not hang on a wait
// that can never be met: it records (SM, queue index, opcode, barrier, value,
// target), traps, and the host turns the record into an error. The program
// here bypasses the ScheduleVerifier on purpose (it would reject it).
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "tests/stuck_program.h"

namespace loom::megakernel {
namespace {

using namespace ::loom::runtime;  // the runtime the tests drive

TEST(GpuDebug, AStuckWaitIsReportedNotHung) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << why;
  const GpuProgram p = StuckProgram();
  absl::StatusOr<std::unique_ptr<GpuMachine>> m = GpuMachine::Create(p, std::vector<uint8_t>(16));
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->SetWatchdog(0);  // the device's bounded wait reports (the host's watchdog would first, after 2 s)
  absl::StatusOr<float> ms = (*m)->Run(1, false);
  ASSERT_FALSE(ms.ok());
  EXPECT_NE(ms.status().message().find(absl::StrCat("megakernel stuck: ", kStuckWhere)), std::string::npos)
      << ms.status();
}

}  // namespace
}  // namespace loom::megakernel
