// libFuzzer: the safetensors header parser must reject anything malformed with
// a Status, never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "graph/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The file size may lie in either direction relative to what was read.
  (void)loom::graph::ParseSafetensorsHeader(bytes, size, "fuzz.safetensors");
  if (size > 0) (void)loom::graph::ParseSafetensorsHeader(bytes, size + data[0], "fuzz.safetensors");
  return 0;
}
