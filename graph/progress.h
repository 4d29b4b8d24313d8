// Progress of long host work (loading, packing, uploading weights) on stderr:
// a live bar on a terminal, and one summary line with the time when done.
// Small jobs (under kQuietBytes) print nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace loom::graph {

class Progress {
 public:
  static constexpr uint64_t kQuietBytes = uint64_t{256} << 20;

  Progress(std::string label, uint64_t total_bytes);
  ~Progress();  // prints the summary line if Done() was not called
  void Add(uint64_t bytes);
  void Done();
  double seconds() const;

 private:
  void Draw(bool final);
  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  bool tty_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace loom::graph
