#include "graph/progress.h"

#include <unistd.h>

#include <cstdio>

namespace loom::graph {
namespace {

ProgressHook& Hook() {
  static ProgressHook hook;
  return hook;
}

}  // namespace

void SetProgressHook(ProgressHook hook) { Hook() = std::move(hook); }

Progress::Progress(std::string label, uint64_t total_bytes)
    : label_(std::move(label)), total_(total_bytes), tty_(isatty(STDERR_FILENO) != 0) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { Done(); }

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (total_ < kQuietBytes || (!tty_ && !Hook())) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(Hook() ? 100 : 200)) return;
  last_draw_ = now;
  if (Hook()) Hook()(label_, done_, total_, false);
  else Draw(false);
}

void Progress::Done() {
  if (finished_) return;
  finished_ = true;
  if (total_ < kQuietBytes) return;
  if (Hook()) Hook()(label_, done_, total_, true);
  else Draw(true);
}

void Progress::Draw(bool final) {
  constexpr int kWidth = 30;
  const double fraction = total_ == 0 ? 1.0 : static_cast<double>(done_) / static_cast<double>(total_);
  const int filled = static_cast<int>(fraction * kWidth + 0.5);
  const double gb = static_cast<double>(done_) / 1e9, total_gb = static_cast<double>(total_) / 1e9;
  if (final) {
    std::fprintf(stderr, "%s%s: %.2f GB in %.1f s (%.2f GB/s)\n", tty_ ? "\r\033[K" : "", label_.c_str(), gb,
                 seconds(), seconds() > 0 ? gb / seconds() : 0.0);
  } else {
    std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %.2f / %.2f GB", label_.c_str(), filled,
                 "##############################", kWidth - filled, "", 100 * fraction, gb, total_gb);
  }
  std::fflush(stderr);
}

}  // namespace loom::graph
