// The watchdog's report of a stuck launch (runtime/stuck_report.h).
#include "runtime/stuck_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "instructions/isa.h"

namespace loom::runtime {

// Each SM's retired mark (this launch's, else none retired) gives the instruction it
// is on: stuck inside it if the counters meet its waits, else waiting on the first they do not. When no SM is stuck
// inside, a barrier the waiting SMs wait on whose signalling instructions have all retired lost a signal.
std::string StuckReport(const std::vector<uint32_t>& counters, const std::vector<uint64_t>& retired, uint32_t launch,
                        const std::vector<std::vector<isa::Instruction>>& queues, uint32_t first_step, uint32_t steps) {
  constexpr int kNamed = 3;  // SMs named per kind; the rest counted
  std::vector<uint64_t> done(queues.size());  // instructions each SM retired this launch
  for (size_t sm = 0; sm < queues.size(); ++sm) {
    done[sm] = sm < retired.size() && (retired[sm] >> 32) == launch ? static_cast<uint32_t>(retired[sm]) : 0;
  }
  std::string inside, waiting;
  int num_inside = 0, num_waiting = 0, num_done = 0;
  std::vector<uint32_t> short_barriers;
  for (size_t sm = 0; sm < queues.size(); ++sm) {
    const uint64_t length = queues[sm].size();
    if (done[sm] >= length * steps) {
      ++num_done;
      continue;
    }
    const uint32_t step = first_step + static_cast<uint32_t>(done[sm] / length);
    const uint32_t index = static_cast<uint32_t>(done[sm] % length);
    const isa::Instruction& inst = queues[sm][index];
    const std::string at = absl::StrCat("SM ", sm, " queue index ", index, " opcode ", isa::OpcodeName(inst.op()),
                                        steps > 1 ? absl::StrCat(" (step ", step, ")") : "");
    int unmet = -1;
    for (int k = 0; k < inst.num_waits && unmet < 0; ++k) {
      const isa::Wait& w = inst.waits[k];
      if (w.barrier() < counters.size() && !isa::Reached(counters[w.barrier()], w.target(step))) unmet = k;
    }
    if (unmet < 0) {
      if (num_inside++ < kNamed) absl::StrAppend(&inside, inside.empty() ? "" : "; ", at);
      continue;
    }
    const isa::Wait& w = inst.waits[unmet];
    if (num_waiting++ < kNamed) {
      absl::StrAppend(&waiting, waiting.empty() ? "" : "; ", at, " barrier ", w.barrier(), " value ",
                      counters[w.barrier()], " target ", w.target(step));
    }
    if (short_barriers.size() < 16 &&
        std::find(short_barriers.begin(), short_barriers.end(), w.barrier()) == short_barriers.end()) {
      short_barriers.push_back(w.barrier());
    }
  }
  std::string report;
  if (num_inside > 0) {
    absl::StrAppend(&report, "stuck inside an instruction whose waits are met: ", inside,
                    num_inside > kNamed ? absl::StrCat(" (and ", num_inside - kNamed, " more SMs)") : "", "; ");
  }
  if (num_waiting > 0) {
    absl::StrAppend(&report, "waiting: ", waiting,
                    num_waiting > kNamed ? absl::StrCat(" (and ", num_waiting - kNamed, " more SMs)") : "", "; ");
  }
  if (num_inside == 0) {
    for (uint32_t barrier : short_barriers) {
      uint64_t signallers = 0, retired_signallers = 0;
      for (size_t sm = 0; sm < queues.size(); ++sm) {
        for (uint64_t n = 0; n < queues[sm].size() * steps; ++n) {
          if (queues[sm][n % queues[sm].size()].signal != barrier) continue;
          ++signallers;
          retired_signallers += n < done[sm];
        }
      }
      if (signallers > 0 && retired_signallers == signallers) {
        absl::StrAppend(&report, "barrier ", barrier, " is short though all ", signallers,
                        " instructions that signal it have retired (a lost signal); ");
        break;
      }
    }
  }
  absl::StrAppend(&report, num_done, " of ", queues.size(), " SMs done");
  return report;
}

}  // namespace loom::runtime
