// libFuzzer: loading (binary or text) and verifying a schedule must reject
// every hostile file with a Status; a schedule that passes must simulate.
#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/text_format.h"
#include "scheduler/schedule_verifier.h"
#include "scheduler/simulator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  loom::scheduler::Schedule schedule;
  bool parsed = schedule.ParseFromString(bytes);
  if (!parsed) {
    google::protobuf::TextFormat::Parser parser;
    parser.AllowPartialMessage(true);
    parsed = parser.ParseFromString(bytes, &schedule);
  }
  if (!parsed) return 0;
  // Bound the work of one input: the verifier walks every instruction twice.
  size_t instructions = 0;
  for (const auto& q : schedule.queues()) instructions += q.instructions_size();
  if (schedule.num_sms() > 4096 || instructions > 100000) return 0;
  if (loom::scheduler::VerifySchedule(schedule).ok()) {
    absl::StatusOr<loom::scheduler::SimulationResult> r = loom::scheduler::Simulate(schedule);
    if (!r.ok()) __builtin_trap();  // verified schedules cannot deadlock
  }
  return 0;
}
