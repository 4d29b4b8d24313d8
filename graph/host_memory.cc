#include "graph/host_memory.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"

namespace loom::graph {

std::optional<uint64_t> HostMemoryAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key, unit;
    uint64_t kib = 0;
    if (fields >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB") return kib * 1024;
  }
  return std::nullopt;
}

absl::Status CheckMemoryFits(uint64_t needed, std::optional<uint64_t> available, const std::string& what,
                             const std::string& detail) {
  if (!available || needed <= *available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat("%s needs %.1f GB of host memory%s, has %.1f GB free", what,
                                                      needed / 1e9, detail.empty() ? "" : " (" + detail + ")",
                                                      *available / 1e9));
}

absl::Status CheckHostMemory(uint64_t needed, const std::string& what, const std::string& detail) {
  return CheckMemoryFits(needed, HostMemoryAvailable(), what, detail);
}

}  // namespace loom::graph
