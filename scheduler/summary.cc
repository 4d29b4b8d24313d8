#include "scheduler/summary.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "instructions/isa.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/simulator.h"

namespace loom::scheduler {

namespace {

std::string ArgString(const isa::Instruction& inst) {
  std::string out;
  const char* const* names = isa::ArgNames(inst.op());
  const uint32_t floats = isa::FloatWords(inst.op());
  for (int i = 0; i < isa::ArgCount(inst.op()); ++i) {
    absl::StrAppend(&out, i ? " " : "", names[i], "=");
    if (floats >> i & 1u) {
      float v;
      std::memcpy(&v, &inst.args[i], 4);
      absl::StrAppend(&out, v);
    } else {
      absl::StrAppend(&out, inst.args[i]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ScheduleSummary(const Schedule& schedule, const std::string& name, bool instructions) {
  const Schedule* s = &schedule;
  std::string out;
  absl::StatusOr<DecodedSchedule> d = DecodeSchedule(*s);
  if (!d.ok()) return d.status();
  absl::StatusOr<SimulationResult> sim = Simulate(*s);
  if (!sim.ok()) return sim.status();
  absl::StrAppendFormat(&out, "schedule %s\n  model %s, %u SMs, policy %s, barriers %s, max_seq %u\n", name.c_str(),
                        s->model().c_str(), s->num_sms(), SmPolicy_Name(s->options().policy()).c_str(),
                        BarrierGranularity_Name(s->options().barrier_granularity()).c_str(), s->max_seq());
  absl::StrAppendFormat(&out, "  weights %.1f MB (streamed per step %.1f MB), arena %.1f MB, %d tensors, %d barriers\n",
                        s->weight_bytes() / 1e6, s->weight_bytes_per_step() / 1e6, s->arena_bytes() / 1e6,
                        s->tensors_size(), s->barriers_size());
  const SmemConfig& smem = s->options().smem();
  absl::StrAppendFormat(&out,
                        "  shared memory per SM: %u pages of %u KB (%u in flight), %u KB activation ring in %u "
                        "slot%s\n",
                        smem.num_pages(), smem.page_bytes() / 1024, smem.matvec_pages_in_flight(),
                        smem.activation_bytes() / 1024, smem.activation_slots(),
                        smem.activation_slots() == 1 ? "" : "s");
  if (s->has_graph()) {  // a general graph's pass: one run per evaluation ("step" below means that run)
    auto list = [&](const google::protobuf::RepeatedPtrField<IoTensor>& io) {
      std::vector<std::string> items;
      for (const IoTensor& t : io) {
        items.push_back(absl::StrCat(t.name(), " [", absl::StrJoin(s->tensors(t.tensor()).shape(), ", "), "]"));
      }
      return absl::StrJoin(items, ", ");
    };
    absl::StrAppendFormat(&out, "  graph pass, run once per evaluation: inputs %s; outputs %s\n",
                          list(s->graph().inputs()), list(s->graph().outputs()));
  }
  struct PerOpcode {
    int count = 0;
    double weight_mb = 0, cost_us = 0;
  };
  std::map<std::string, PerOpcode> per_opcode;
  std::vector<int> counts;
  std::vector<double> loads;
  int total = 0;
  for (uint32_t sm = 0; sm < s->num_sms(); ++sm) {
    double load = 0;
    for (size_t i = 0; i < d->queues[sm].size(); ++i) {
      const isa::Instruction& inst = d->queues[sm][i];
      PerOpcode& p = per_opcode[isa::OpcodeName(inst.op())];
      ++p.count;
      p.weight_mb += isa::InstructionFootprint(inst, s->options().cost().context_length()).weight_bytes / 1e6;
      p.cost_us += d->cost_ns[sm][i] / 1e3;
      load += d->cost_ns[sm][i];
    }
    counts.push_back(static_cast<int>(d->queues[sm].size()));
    loads.push_back(load / 1e3);
    total += static_cast<int>(d->queues[sm].size());
  }
  absl::StrAppendFormat(&out, "\n  instructions per step: %d\n  %-16s %7s %12s %14s\n", total, "opcode", "count",
                        "weights MB", "predicted us");
  for (const auto& [name, p] : per_opcode) {
    absl::StrAppendFormat(&out, "  %-16s %7d %12.2f %14.1f\n", name.c_str(), p.count, p.weight_mb, p.cost_us);
  }
  std::sort(counts.begin(), counts.end());
  std::sort(loads.begin(), loads.end());
  absl::StrAppendFormat(
      &out,
      "\n  per-SM load: instructions min %d / median %d / max %d; predicted busy us min %.1f / median %.1f / "
      "max %.1f\n",
      counts.front(), counts[counts.size() / 2], counts.back(), loads.front(), loads[loads.size() / 2], loads.back());
  double busy = 0, wait = 0, tail = 0;
  for (const SmTimes& t : sim->sms) busy += t.busy_ns, wait += t.wait_ns, tail += t.tail_ns;
  const double n = static_cast<double>(sim->sms.size());
  absl::StrAppendFormat(&out, "\n  simulated (cost model: %.0f GB/s HBM, %.0f ns barrier latency, context %u):\n",
                        s->options().cost().hbm_gbps(), s->options().cost().barrier_latency_ns(),
                        s->options().cost().context_length());
  absl::StrAppendFormat(&out, "    first step %.1f us, steady step %.1f us (%.0f GB/s of weights)\n",
                        sim->first_step_ns / 1e3, sim->steady_step_ns / 1e3, sim->predicted_gbps());
  absl::StrAppendFormat(
      &out, "    per SM, mean over the steady step: busy %.1f us, waiting on barriers %.1f us, tail %.1f us\n",
      busy / n / 1e3, wait / n / 1e3, tail / n / 1e3);
  if (instructions) {
    for (uint32_t sm = 0; sm < s->num_sms(); ++sm) {
      absl::StrAppendFormat(&out, "\n  SM %u:\n", sm);
      for (size_t i = 0; i < d->queues[sm].size(); ++i) {
        const isa::Instruction& inst = d->queues[sm][i];
        std::string waits;
        for (int w = 0; w < inst.num_waits; ++w) {
          absl::StrAppend(&waits, w ? "," : "", inst.waits[w].barrier(), inst.waits[w].previous_step() ? "@prev" : "",
                          ":", inst.waits[w].count(), inst.waits[w].in_data() ? " in data" : "");
        }
        // Step tags (instructions/instruction.h): what the instruction tags or checks.
        std::string tags;
        if (inst.flags & isa::kFlagTagOut) tags += " tags-out";
        if (inst.flags & isa::kFlagTaggedInput) tags += " checks-input";
        if (inst.flags & isa::kFlagTaggedResidual) tags += " checks-residual";
        absl::StrAppendFormat(&out, "    %4zu %-15s wait[%s] signal %u%s  %s  op=%s\n", i, isa::OpcodeName(inst.op()),
                              waits.c_str(), inst.signal, tags.c_str(), ArgString(inst).c_str(),
                              s->queues(sm).instructions(i).op().c_str());
      }
    }
  }
  return out;
}

}  // namespace loom::scheduler
