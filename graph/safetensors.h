// The safetensors file format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then the raw tensor bytes.
// The parser trusts nothing: every offset, size and dtype is checked against the
// file, and every error names the file and the tensor.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"

namespace loom::graph {

struct SafetensorsEntry {
  std::string dtype;  // "BF16", "F16", "F32", "I32", "I64", "I8", "U8", "F8_E4M3"
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets inside the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  uint64_t data_offset = 0;  // where the data section starts in the file
};

// Bytes per element of a safetensors dtype string; 0 when Loom cannot read it.
int SafetensorsDTypeSize(const std::string& dtype);

// Parses and checks the header of a file of `file_size` bytes whose first bytes
// are `prefix` (at least the 8-byte length and the JSON header must be present).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size,
                                                         const std::string& path);

// A safetensors file mapped read-only into memory.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  // The tensor converted to bf16 (BF16 copied, F16/F32 rounded to nearest even).
  absl::StatusOr<HostTensor> ReadBf16(const std::string& name) const;
  // The stored bytes of one of its tensors (entry.end - entry.begin of them, checked against the file).
  const uint8_t* Data(const SafetensorsEntry& entry) const { return map_ + header_.data_offset + entry.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
};

// A tensor of any safetensors dtype as stored bytes (quantized checkpoints: I32 words, F8_E4M3, I64), not owned.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors);

// A safetensors file written tensor by tensor: the header from `layout` (names, dtypes, shapes, byte counts; data
// unused) first, then each tensor's bytes as Append gives them, which must follow the layout's order, names and
// sizes; Finish renames the file into place (atomically, as WriteSafetensors). A writer dropped before Finish
// removes its temporary file.
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(const std::string& path,
                                                                   std::vector<RawTensor> layout);
  ~SafetensorsWriter();
  absl::Status Append(const RawTensor& t);
  absl::Status Finish();

 private:
  SafetensorsWriter() = default;
  std::string path_, temp_;
  std::vector<RawTensor> layout_;
  size_t next_ = 0;
  std::unique_ptr<std::ofstream> out_;
};

// Writes tensors (bf16, f32 or i32) as a safetensors file, atomically.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const HostTensor*>>& tensors);

}  // namespace loom::graph
