// The simulator's predictions obey the cost model's own arithmetic.
#include "scheduler/simulator.h"

#include "scheduler/test_util.h"

namespace loom::scheduler {
namespace {

TEST(Simulator, OneSmRunsEverythingBackToBack) {
  CompileOptions o;
  o.set_num_sms(1);
  const Schedule s = CompileTiny(o);
  absl::StatusOr<SimulationResult> r = Simulate(s);
  ASSERT_TRUE(r.ok()) << r.status();
  double sum = 0;
  for (const Instruction& inst : s.queues(0).instructions()) sum += inst.cost_ns();
  // Prefetching weights can only shorten the step; barriers can add their latency.
  EXPECT_LE(r->steady_step_ns, sum + s.barriers_size() * s.options().cost().barrier_latency_ns());
  EXPECT_GT(r->steady_step_ns, 0.5 * sum);
  EXPECT_NEAR(r->sms[0].tail_ns, 0, 1e-6);
}

TEST(Simulator, MoreSmsAreFasterAndNeverBeatTheBandwidthFloor) {
  double previous = 1e30;
  for (uint32_t sms : {1u, 4u, 32u}) {
    CompileOptions o;
    o.set_num_sms(sms);
    o.mutable_cost()->set_hbm_gbps(100.0 * sms);  // per-SM bandwidth stays 100 GB/s
    const Schedule s = CompileTiny(o);
    absl::StatusOr<SimulationResult> r = Simulate(s);
    ASSERT_TRUE(r.ok());
    EXPECT_LT(r->steady_step_ns, previous);
    EXPECT_LE(r->predicted_gbps(), s.options().cost().hbm_gbps() * 1.0001);
    previous = r->steady_step_ns;
  }
}

}  // namespace
}  // namespace loom::scheduler
