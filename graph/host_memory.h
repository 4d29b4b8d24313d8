// Host memory guards: what a step is about to allocate, checked against what the machine has free, so that a
// model too large for the host is refused in a second with both numbers instead of ending in std::bad_alloc or
// the kernel's OOM killer after minutes of work.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace loom::graph {

// MemAvailable of /proc/meminfo in bytes (the kernel's estimate of what can be allocated without swapping);
// nullopt where it cannot be read (then nothing is refused).
std::optional<uint64_t> HostMemoryAvailable();

// OK when `needed` bytes fit `available`; else ResourceExhausted, one line:
//   "<what> needs 12.3 GB of host memory (<detail>), has 4.5 GB free"
absl::Status CheckMemoryFits(uint64_t needed, std::optional<uint64_t> available, const std::string& what,
                             const std::string& detail = "");

// CheckMemoryFits against HostMemoryAvailable().
absl::Status CheckHostMemory(uint64_t needed, const std::string& what, const std::string& detail = "");

}  // namespace loom::graph
