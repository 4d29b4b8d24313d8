#include "runtime/trace.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/proto_file.h"
#include "instructions/isa.h"
#include "nlohmann/json.hpp"

namespace loom::runtime {
namespace {

uint64_t Origin(const TraceInput& in) {
  uint64_t origin = UINT64_MAX;
  for (const TraceEvent& e : *in.events) {
    if (e.start != 0) origin = std::min(origin, e.start);
  }
  return origin == UINT64_MAX ? 0 : origin;
}

}  // namespace

std::vector<std::vector<std::string>> OpNames(const scheduler::Schedule& schedule) {
  std::vector<std::vector<std::string>> names(schedule.queues_size());
  for (int sm = 0; sm < schedule.queues_size(); ++sm) {
    for (const scheduler::Instruction& inst : schedule.queues(sm).instructions()) names[sm].push_back(inst.op());
  }
  return names;
}

absl::Status WriteChromeTrace(const std::string& path, const TraceInput& in) {
  const uint64_t origin = Origin(in);
  const uint64_t total = in.queue_begin->back();
  nlohmann::json events = nlohmann::json::array();
  for (uint32_t sm = 0; sm < in.program->queues.size(); ++sm) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", sm},
                      {"args", {{"name", absl::StrFormat("SM %u", sm)}}}});
  }
  for (uint32_t step = 0; step < in.steps; ++step) {
    for (uint32_t sm = 0; sm < in.program->queues.size(); ++sm) {
      for (uint32_t i = (*in.queue_begin)[sm]; i < (*in.queue_begin)[sm + 1]; ++i) {
        const TraceEvent& e = (*in.events)[step * total + i];
        const isa::Instruction& inst = in.program->queues[sm][i - (*in.queue_begin)[sm]];
        events.push_back({{"name", isa::OpcodeName(inst.op())},
                          {"ph", "X"},
                          {"pid", 0},
                          {"tid", sm},
                          {"ts", (e.start - origin) / 1e3},
                          {"dur", (e.end - e.start) / 1e3},
                          {"args", {{"step", step}, {"index", i - (*in.queue_begin)[sm]},
                                    {"wait_us", (e.ready - e.start) / 1e3},
                                    {"handoff_us", e.handed > e.ready ? (e.handed - e.ready) / 1e3 : 0.0}}}});
        if (in.op_names != nullptr) events.back()["args"]["op"] = (*in.op_names)[sm][i - (*in.queue_begin)[sm]];
        // A streaming opcode's page phase (its prologue before, its epilogue after), from the instruction's start.
        if (e.pages_begin >= e.start && e.pages_end >= e.pages_begin && e.pages_begin != 0) {
          events.back()["args"]["pages_begin_us"] = (e.pages_begin - e.start) / 1e3;
          events.back()["args"]["pages_end_us"] = (e.pages_end - e.start) / 1e3;
        }
      }
    }
  }
  return WriteFileAtomically(path, nlohmann::json({{"traceEvents", events}, {"displayTimeUnit", "ns"}}).dump());
}

std::string TraceSummary(const TraceInput& in) {
  const uint64_t total = in.queue_begin->back();
  const uint32_t sms = static_cast<uint32_t>(in.program->queues.size());
  struct PerOpcode {
    double total_ns = 0, wait_ns = 0;
    int count = 0;
  };
  std::map<std::string, PerOpcode> per_opcode;
  double busy = 0, gaps = 0, largest_gap = 0;
  uint64_t first = UINT64_MAX, last = 0;
  for (uint32_t step = 0; step < in.steps; ++step) {
    for (uint32_t sm = 0; sm < sms; ++sm) {
      uint64_t previous_end = 0;
      for (uint32_t i = (*in.queue_begin)[sm]; i < (*in.queue_begin)[sm + 1]; ++i) {
        const TraceEvent& e = (*in.events)[step * total + i];
        const isa::Instruction& inst = in.program->queues[sm][i - (*in.queue_begin)[sm]];
        PerOpcode& slot = per_opcode[isa::OpcodeName(inst.op())];
        slot.total_ns += static_cast<double>(e.end - e.start);
        slot.wait_ns += static_cast<double>(e.ready - e.start);
        slot.count += 1;
        busy += static_cast<double>(e.end - e.start);
        if (previous_end != 0 && e.start > previous_end) {
          gaps += static_cast<double>(e.start - previous_end);
          largest_gap = std::max(largest_gap, static_cast<double>(e.start - previous_end));
        }
        previous_end = e.end;
        first = std::min(first, e.start);
        last = std::max(last, e.end);
      }
    }
  }
  const double span = last > first ? static_cast<double>(last - first) : 0;
  std::string out = absl::StrFormat("trace: %u steps in %.1f us (%.1f us/step), %.0f GB/s of weights\n", in.steps,
                                    span / 1e3, span / 1e3 / std::max(1u, in.steps),
                                    span > 0 ? in.weight_bytes_per_step * in.steps / span : 0.0);
  absl::StrAppendFormat(&out, "  %-16s %8s %12s %14s %10s\n", "opcode", "count", "SM-us/step", "of it waiting",
                        "us each");
  for (const auto& [name, v] : per_opcode) {
    absl::StrAppendFormat(&out, "  %-16s %8d %12.1f %14.1f %10.2f\n", name, v.count / std::max(1u, in.steps),
                          v.total_ns / 1e3 / std::max(1u, in.steps), v.wait_ns / 1e3 / std::max(1u, in.steps),
                          v.total_ns / 1e3 / v.count);
  }
  absl::StrAppendFormat(&out, "  per SM per step: busy %.1f us, gaps between instructions %.1f us (largest %.1f us)\n",
                        busy / 1e3 / sms / std::max(1u, in.steps), gaps / 1e3 / sms / std::max(1u, in.steps),
                        largest_gap / 1e3);
  if (in.op_names != nullptr) out += StageSummary(in);
  return out;
}

namespace {

// "layers.12.qkv" -> (12, "qkv"); a fused instruction's names of one layer, "layers.3.gate,layers.3.up" ->
// (3, "gate,up"); any other name -> (-1, name).
std::pair<int, std::string> LayerAndStage(const std::string& op) {
  constexpr absl::string_view kPrefix = "layers.";
  int layer = -1;
  std::vector<std::string> stages;
  for (absl::string_view part : absl::StrSplit(op, ',')) {
    if (!absl::StartsWith(part, kPrefix)) return {-1, op};
    const size_t dot = part.find('.', kPrefix.size());
    int l = 0;
    if (dot == absl::string_view::npos || !absl::SimpleAtoi(part.substr(kPrefix.size(), dot - kPrefix.size()), &l) ||
        (layer >= 0 && l != layer)) {
      return {-1, op};
    }
    layer = l;
    stages.emplace_back(part.substr(dot + 1));
  }
  return {layer, absl::StrJoin(stages, ",")};
}

}  // namespace

std::string StageSummary(const TraceInput& in) {
  const uint64_t total = in.queue_begin->back();
  const uint32_t sms = static_cast<uint32_t>(in.program->queues.size());
  struct Stage {
    double busy_ns = 0, wait_ns = 0, handoff_ns = 0, span_ns = 0, spread_ns = 0;
    int count = 0, spans = 0;
  };
  struct Window {
    uint64_t first = UINT64_MAX, last = 0, first_end = UINT64_MAX;
  };
  std::vector<std::string> order;  // stages in the order they first appear
  std::map<std::string, Stage> stages;
  std::map<std::tuple<uint32_t, int, std::string>, Window> stage_windows;  // (step, layer, stage)
  std::map<std::pair<uint32_t, int>, Window> layer_windows;                 // (step, layer)
  for (uint32_t step = 0; step < in.steps; ++step) {
    for (uint32_t sm = 0; sm < sms; ++sm) {
      for (uint32_t i = (*in.queue_begin)[sm]; i < (*in.queue_begin)[sm + 1]; ++i) {
        const TraceEvent& e = (*in.events)[step * total + i];
        const auto [layer, name] = LayerAndStage((*in.op_names)[sm][i - (*in.queue_begin)[sm]]);
        if (!stages.contains(name)) order.push_back(name);
        Stage& st = stages[name];
        const uint64_t ready = std::max(e.ready, e.start);
        st.busy_ns += static_cast<double>(e.end - ready);
        st.wait_ns += static_cast<double>(ready - e.start);
        if (e.handed > ready) st.handoff_ns += static_cast<double>(e.handed - ready);
        ++st.count;
        for (Window* w : {&stage_windows[{step, layer, name}], &layer_windows[{step, layer}]}) {
          w->first = std::min(w->first, e.start);
          w->last = std::max(w->last, e.end);
          w->first_end = std::min(w->first_end, e.end);
        }
      }
    }
  }
  for (const auto& [key, w] : stage_windows) {
    Stage& st = stages[std::get<2>(key)];
    st.span_ns += static_cast<double>(w.last - w.first);
    st.spread_ns += static_cast<double>(w.last - w.first_end);
    ++st.spans;
  }
  const double steps = std::max(1u, in.steps);
  std::string out =
      "  per stage (layers summed; SM-us per step: computing after the waits were met (of it, the hand-off of the\n"
      "  activation slot to the consumers), waiting for them; per layer: span from first start to last end, spread\n"
      "  from first end to last end):\n";
  absl::StrAppendFormat(&out, "  %-22s %8s %12s %10s %12s %10s %10s\n", "stage", "count", "computing", "hand-off",
                        "waiting", "span us", "spread us");
  for (const std::string& name : order) {
    const Stage& st = stages[name];
    const double spans = std::max(1, st.spans);
    absl::StrAppendFormat(&out, "  %-22s %8.0f %12.1f %10.1f %12.1f %10.2f %10.2f\n", name, st.count / steps,
                          st.busy_ns / 1e3 / steps, st.handoff_ns / 1e3 / steps, st.wait_ns / 1e3 / steps,
                          st.span_ns / 1e3 / spans, st.spread_ns / 1e3 / spans);
  }
  double layer_ns = 0;
  int layers = 0;
  for (const auto& [key, w] : layer_windows) {
    if (key.second < 0) continue;
    layer_ns += static_cast<double>(w.last - w.first);
    ++layers;
  }
  if (layers > 0) absl::StrAppendFormat(&out, "  a layer spans %.2f us on average\n", layer_ns / 1e3 / layers);
  return out;
}

}  // namespace loom::runtime
