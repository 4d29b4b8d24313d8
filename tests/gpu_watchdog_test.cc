// A release build of the megakernel must not hang its host on a wait that can never be met: the watchdog sees the
// barrier counters stop moving and fails the launch, naming the SM, queue index, opcode and wait. Not a gtest: the
// stuck kernel runs until the process ends, and nothing may wait for it on the way out (std::_Exit). The program
// is tests/stuck_program.h's. Exit 0: passed (or no GPU, said why); 1: failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "tests/stuck_program.h"

namespace loom::megakernel {
namespace {

using namespace ::loom::runtime;  // the runtime the tests drive

int Check() {
  std::string why;
  if (!GpuAvailable(&why)) {
    std::printf("gpu_watchdog_test: skipped: %s\n", why.c_str());
    return 0;
  }
  const GpuProgram p = StuckProgram();
  absl::StatusOr<std::unique_ptr<GpuMachine>> m = GpuMachine::Create(p, std::vector<uint8_t>(16));
  if (!m.ok()) {
    std::printf("gpu_watchdog_test: FAILED: %s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  (*m)->SetWatchdog(0.5);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<float> ms = (*m)->Run(1, false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string message = ms.ok() ? "" : std::string(ms.status().message());
  const bool named = message.find(kStuckWhere) != std::string::npos;
  const bool ok = !ms.ok() && named && GpuHung() && seconds < 5.0;
  std::printf("gpu_watchdog_test: %s after %.2f s: %s\n", ok ? "passed" : "FAILED", seconds,
              ms.ok() ? "the launch returned" : message.c_str());
  if (ok) {  // and nothing runs after it
    absl::StatusOr<float> again = (*m)->Run(1, false);
    if (again.ok()) {
      std::printf("gpu_watchdog_test: FAILED: a launch after the stuck one ran\n");
      return 1;
    }
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace loom::megakernel

int main() {
  const int rc = loom::megakernel::Check();
  std::fflush(stdout);
  std::_Exit(rc);
}
