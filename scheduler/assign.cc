#include "scheduler/assign.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

namespace loom::scheduler {
namespace {

std::vector<std::vector<int>> RoundRobin(const Program& p, uint32_t sms) {
  std::vector<std::vector<int>> queues(sms);
  for (size_t i = 0; i < p.nodes.size(); ++i) queues[i % sms].push_back(static_cast<int>(i));
  return queues;
}

std::vector<std::vector<int>> Lpt(const Program& p, uint32_t sms) {
  std::vector<std::vector<int>> queues(sms);
  using Load = std::pair<double, uint32_t>;  // (accumulated cost, sm)
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least;
  for (uint32_t sm = 0; sm < sms; ++sm) least.push({0.0, sm});
  size_t begin = 0;
  while (begin < p.nodes.size()) {  // groups are contiguous runs of nodes
    size_t end = begin;
    while (end < p.nodes.size() && p.nodes[end].group == p.nodes[begin].group) ++end;
    std::vector<int> order;
    for (size_t i = begin; i < end; ++i) order.push_back(static_cast<int>(i));
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p.nodes[a].cost_ns > p.nodes[b].cost_ns; });
    for (int node : order) {
      auto [load, sm] = least.top();
      least.pop();
      queues[sm].push_back(node);
      least.push({load + p.nodes[node].cost_ns, sm});
    }
    begin = end;
  }
  return queues;
}

// When each SM is free, as a min segment tree: the leftmost SM free by a time in O(log sms) (a prefill pass
// places 60k instructions on 132 SMs; a scan per instruction was a third of its lowering time).
class SmFreeTimes {
 public:
  explicit SmFreeTimes(uint32_t sms) : size_(1) {
    while (size_ < sms) size_ *= 2;
    tree_.assign(2 * size_, std::numeric_limits<double>::infinity());
    for (uint32_t i = 0; i < sms; ++i) Set(i, 0.0);
  }
  double Min() const { return tree_[1]; }
  double Value(uint32_t sm) const { return tree_[size_ + sm]; }
  void Set(uint32_t sm, double t) {
    uint32_t i = size_ + sm;
    tree_[i] = t;
    for (i /= 2; i >= 1; i /= 2) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  }
  // The lowest-numbered SM free at or before t (one exists: t >= Min()).
  uint32_t LeftmostAtMost(double t) const {
    uint32_t i = 1;
    while (i < size_) i = tree_[2 * i] <= t ? 2 * i : 2 * i + 1;
    return i - size_;
  }

 private:
  uint32_t size_;
  std::vector<double> tree_;
};

std::vector<std::vector<int>> CriticalPath(const Program& p, uint32_t sms, double latency) {
  const size_t n = p.nodes.size(), nb = p.barriers.size();
  // Bottom level: longest cost path from a node to the end of the step.
  std::vector<std::vector<int>> waiters(nb);
  for (size_t i = 0; i < n; ++i) {
    const isa::Instruction& inst = p.nodes[i].inst;
    for (int w = 0; w < inst.num_waits; ++w) {
      if (!inst.waits[w].previous_step()) waiters[inst.waits[w].barrier()].push_back(static_cast<int>(i));
    }
  }
  std::vector<double> level(n, 0.0), barrier_level(nb, -1.0);
  for (size_t k = n; k-- > 0;) {
    const uint32_t b = p.nodes[k].inst.signal;
    if (barrier_level[b] < 0) {
      barrier_level[b] = 0;
      for (int wtr : waiters[b]) barrier_level[b] = std::max(barrier_level[b], latency + level[wtr]);
    }
    level[k] = p.nodes[k].cost_ns + barrier_level[b];
  }
  // Barrier completion: all signalers placed, at the latest end among them.
  std::vector<int> remaining(nb, 0);
  std::vector<double> done_at(nb, 0.0);
  for (const Node& node : p.nodes) ++remaining[node.inst.signal];
  std::vector<int> blocked(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const isa::Instruction& inst = p.nodes[i].inst;
    for (int w = 0; w < inst.num_waits; ++w) blocked[i] += !inst.waits[w].previous_step();
  }
  using Ready = std::pair<double, int>;  // (bottom level, -node) : highest level, then program order
  std::priority_queue<Ready> ready;
  for (size_t i = 0; i < n; ++i) {
    if (blocked[i] == 0) ready.push({level[i], -static_cast<int>(i)});
  }
  SmFreeTimes free_at(sms);
  std::vector<std::vector<int>> queues(sms);
  while (!ready.empty()) {
    const int node = -ready.top().second;
    ready.pop();
    const isa::Instruction& inst = p.nodes[node].inst;
    double earliest = 0.0;
    for (int w = 0; w < inst.num_waits; ++w) {
      if (!inst.waits[w].previous_step()) earliest = std::max(earliest, done_at[inst.waits[w].barrier()] + latency);
    }
    // The SM where it starts first (the lowest-numbered on a tie): the leftmost SM free by max(earliest, the
    // earliest any SM is free).
    const uint32_t best = free_at.LeftmostAtMost(std::max(earliest, free_at.Min()));
    const double best_start = std::max(free_at.Value(best), earliest);
    const double end = best_start + p.nodes[node].cost_ns;
    free_at.Set(best, end);
    queues[best].push_back(node);
    const uint32_t b = inst.signal;
    done_at[b] = std::max(done_at[b], end);
    if (--remaining[b] == 0) {
      for (int wtr : waiters[b]) {
        if (--blocked[wtr] == 0) ready.push({level[wtr], -wtr});
      }
    }
  }
  return queues;
}

}  // namespace

std::vector<std::vector<int>> AssignToSms(const Program& program, const CompileOptions& options) {
  switch (options.policy()) {
    case ROUND_ROBIN: return RoundRobin(program, options.num_sms());
    case LPT: return Lpt(program, options.num_sms());
    default: return CriticalPath(program, options.num_sms(), options.cost().barrier_latency_ns());
  }
}

}  // namespace loom::scheduler
