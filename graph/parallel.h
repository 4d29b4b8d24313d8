// Work split over host threads where each index is independent (the result never depends on the split).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace loom::graph {

// Calls fn(begin, end) over [0, n) in contiguous ranges on up to 8 threads (a 70B model's random weights take
// minutes on one; eight keep a shared host usable). Ranges are disjoint: fn may write its indices' outputs.
template <typename Fn>
void ParallelFor(int64_t n, Fn&& fn) {
  const int64_t threads =
      std::clamp<int64_t>(std::min<int64_t>(8, std::thread::hardware_concurrency()), 1, std::max<int64_t>(n, 1));
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < threads; ++w) {
    const int64_t begin = std::min(n, w * chunk), end = std::min(n, (w + 1) * chunk);
    if (begin < end) workers.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  for (std::thread& worker : workers) worker.join();
}

}  // namespace loom::graph
