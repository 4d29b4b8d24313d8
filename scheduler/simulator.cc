#include "scheduler/simulator.h"

#include <algorithm>

#include "scheduler/cost_model.h"
#include "scheduler/decoded_schedule.h"

namespace loom::scheduler {

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule) {
  absl::StatusOr<DecodedSchedule> decoded = DecodeSchedule(schedule);
  if (!decoded.ok()) return decoded.status();
  const DecodedSchedule& d = *decoded;
  constexpr uint32_t kSteps = 3;  // a cold step, then two to measure the steady state
  const uint32_t sms = schedule.num_sms();
  const size_t barriers = d.signals_per_step.size();
  const double latency = schedule.options().cost().barrier_latency_ns();

  // Per (step, barrier): signals seen and the latest signal time.
  std::vector<std::vector<uint32_t>> count(kSteps, std::vector<uint32_t>(barriers, 0));
  std::vector<std::vector<double>> latest(kSteps, std::vector<double>(barriers, 0.0));
  std::vector<size_t> next(sms, 0);
  std::vector<double> free_at(sms, 0.0), load_free(sms, 0.0), last_start(sms, 0.0);
  std::vector<std::vector<SmTimes>> times(kSteps, std::vector<SmTimes>(sms));
  std::vector<std::vector<double>> sm_end(kSteps, std::vector<double>(sms, 0.0));
  std::vector<double> step_end(kSteps, 0.0);

  size_t remaining = 0;
  for (const auto& q : d.queues) remaining += q.size() * kSteps;
  while (remaining > 0) {
    bool progress = false;
    for (uint32_t sm = 0; sm < sms; ++sm) {
      const auto& q = d.queues[sm];
      while (!q.empty() && next[sm] < q.size() * kSteps) {
        const uint32_t step = static_cast<uint32_t>(next[sm] / q.size());
        const isa::Instruction& inst = q[next[sm] % q.size()];
        double ready = 0.0;
        bool met = true;
        for (int w = 0; w < inst.num_waits && met; ++w) {
          const isa::Wait& wait = inst.waits[w];
          if (wait.previous_step() && step == 0) continue;
          const uint32_t s = wait.previous_step() ? step - 1 : step;
          met = count[s][wait.barrier()] >= wait.count();
          ready = std::max(ready, latest[s][wait.barrier()] + latency);
        }
        if (!met) break;
        const InstructionCost cost = CostOf(inst, schedule.options().cost());
        const double load_start = std::max(load_free[sm], last_start[sm]);
        const double load_end = load_start + cost.weight_ns;
        load_free[sm] = load_end;
        const double start = std::max(free_at[sm], ready);
        const double end = std::max(start + cost.compute_ns, load_end);
        times[step][sm].wait_ns += start - free_at[sm];
        times[step][sm].busy_ns += end - start;
        last_start[sm] = start;
        free_at[sm] = end;
        sm_end[step][sm] = end;
        if (inst.signal != isa::kNoBarrier) {
          ++count[step][inst.signal];
          latest[step][inst.signal] = std::max(latest[step][inst.signal], end);
        }
        step_end[step] = std::max(step_end[step], end);
        ++next[sm];
        --remaining;
        progress = true;
      }
    }
    if (!progress) return absl::FailedPreconditionError("simulation: the schedule deadlocks");
  }
  SimulationResult r;
  r.first_step_ns = step_end[0];
  r.steady_step_ns = step_end[2] - step_end[1];
  r.sms = times[2];
  for (uint32_t sm = 0; sm < sms; ++sm) {
    // The steady step's window starts where step 1 ended; idle before an SM's
    // first instruction of step 2 counts as waiting, after its last as tail.
    r.sms[sm].tail_ns = step_end[2] - (d.queues[sm].empty() ? step_end[1] : sm_end[2][sm]);
    if (d.queues[sm].empty()) r.sms[sm].wait_ns = 0;
  }
  r.weight_bytes_per_step = static_cast<double>(schedule.weight_bytes_per_step());
  return r;
}

}  // namespace loom::scheduler
