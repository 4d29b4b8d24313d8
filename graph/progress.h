// Progress of long host work (loading, packing, uploading weights) on stderr:
// a live bar on a terminal, and one summary line with the time when done.
// Small jobs (under kQuietBytes) print nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace loom::graph {

// Where progress goes instead of stderr when set (the Python package draws it with tqdm): the label, bytes done,
// bytes in all, and whether the job is finished; called on the thread doing the work, at most every 100 ms and
// once when done. Small jobs report nothing either way.
using ProgressHook = std::function<void(const std::string& label, uint64_t done, uint64_t total, bool finished)>;
void SetProgressHook(ProgressHook hook);

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
