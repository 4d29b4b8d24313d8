#include "graph/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "graph/proto_file.h"
#include "nlohmann/json.hpp"

namespace loom::graph {
namespace {

// Headers bigger than this are refused (the format's own reference limit).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

}  // namespace

int SafetensorsDTypeSize(const std::string& dtype) {
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "I64") return 8;
  if (dtype == "I8" || dtype == "U8" || dtype == "F8_E4M3") return 1;  // quantized checkpoints (graph/quantization.h)
  return 0;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size,
                                                         const std::string& path) {
  if (prefix.size() < 8 || file_size < 8) return Bad(path, "truncated: shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(prefix[i]);
  if (header_len > kMaxHeaderBytes) return Bad(path, absl::StrCat("header length ", header_len, " is implausible"));
  if (header_len > file_size - 8) {
    return Bad(path, absl::StrCat("truncated: header claims ", header_len, " bytes, file has ", file_size - 8));
  }
  if (prefix.size() < 8 + header_len) return Bad(path, "header not fully read");

  nlohmann::json json = nlohmann::json::parse(prefix.substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return Bad(path, "header is not a JSON object");

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  const uint64_t data_size = file_size - header.data_offset;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, entry] : json.items()) {
    if (name == "__metadata__") continue;
    const std::string where = absl::StrCat("tensor '", name, "'");
    if (!entry.is_object()) return Bad(path, absl::StrCat(where, ": entry is not an object"));
    auto dtype = entry.find("dtype");
    auto shape = entry.find("shape");
    auto offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) return Bad(path, absl::StrCat(where, ": missing dtype"));
    if (shape == entry.end() || !shape->is_array()) return Bad(path, absl::StrCat(where, ": missing shape"));
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned()) {
      return Bad(path, absl::StrCat(where, ": data_offsets must be two unsigned integers"));
    }
    SafetensorsEntry e;
    e.dtype = dtype->get<std::string>();
    const int elem = SafetensorsDTypeSize(e.dtype);
    if (elem == 0) return Bad(path, absl::StrCat(where, ": unsupported dtype ", e.dtype));
    uint64_t count = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) return Bad(path, absl::StrCat(where, ": shape entries must be unsigned integers"));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t{1} << 40) || (dim != 0 && count > (uint64_t{1} << 50) / dim)) {
        return Bad(path, absl::StrCat(where, ": shape too large"));
      }
      count *= dim;
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      return Bad(path, absl::StrCat(where, ": data_offsets [", e.begin, ",", e.end, ") outside the ", data_size,
                                    "-byte data section (truncated or lying header)"));
    }
    if (e.end - e.begin != count * elem) {
      return Bad(path, absl::StrCat(where, ": data_offsets span ", e.end - e.begin, " bytes but ", e.dtype,
                                    " shape needs ", count * elem));
    }
    ranges.emplace_back(e.begin, e.end);
    header.tensors.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return Bad(path, "two tensors' data_offsets overlap");
  }
  return header;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile);
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return Bad(path, "truncated: shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  file->map_ = static_cast<const uint8_t*>(map);
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(
      std::string_view(reinterpret_cast<const char*>(file->map_), file->size_), file->size_, path);
  if (!header.ok()) return header.status();
  file->header_ = *std::move(header);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
}

absl::StatusOr<HostTensor> SafetensorsFile::ReadBf16(const std::string& name) const {
  auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  const SafetensorsEntry& e = it->second;
  if (e.dtype != "BF16" && e.dtype != "F16" && e.dtype != "F32") {
    return Bad(path_, absl::StrCat("tensor '", name, "' has dtype ", e.dtype, "; weights must be BF16, F16 or F32"));
  }
  HostTensor t = HostTensor::Zeros(BF16, e.shape);
  const uint8_t* src = map_ + header_.data_offset + e.begin;
  const int64_t n = t.size();
  if (e.dtype == "BF16") {
    std::memcpy(t.bf16.data(), src, n * 2);
  } else if (e.dtype == "F16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      t.bf16[i] = FloatToBf16(HalfToFloat(h));
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, src + 4 * i, 4);
      t.bf16[i] = FloatToBf16(f);
    }
  }
  return t;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w = SafetensorsWriter::Create(path, tensors);
  if (!w.ok()) return w.status();
  for (const RawTensor& t : tensors) {
    if (absl::Status s = (*w)->Append(t); !s.ok()) return s;
  }
  return (*w)->Finish();
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(const std::string& path,
                                                                             std::vector<RawTensor> layout) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const RawTensor& t : layout) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter);
  w->path_ = path;
  w->temp_ = absl::StrCat(path, ".tmp.", getpid());
  w->layout_ = std::move(layout);
  w->out_ = std::make_unique<std::ofstream>(w->temp_, std::ios::binary | std::ios::trunc);
  if (!*w->out_) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  uint64_t len = json.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  w->out_->write(len_bytes, 8);
  w->out_->write(json.data(), static_cast<std::streamsize>(json.size()));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (out_ != nullptr) {  // not finished: nothing lands
    out_->close();
    std::remove(temp_.c_str());
  }
}

absl::Status SafetensorsWriter::Append(const RawTensor& t) {
  if (out_ == nullptr || next_ >= layout_.size() || layout_[next_].name != t.name ||
      layout_[next_].dtype != t.dtype || layout_[next_].shape != t.shape || layout_[next_].bytes != t.bytes) {
    return absl::InternalError(absl::StrCat(path_, ": tensor '", t.name, "' ", t.dtype, " of ", t.bytes,
                                            " bytes is not the layout's next"));
  }
  ++next_;
  out_->write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
  if (!*out_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (out_ == nullptr || next_ != layout_.size()) {
    return absl::InternalError(absl::StrCat(path_, ": finished after ", next_, " of ", layout_.size(), " tensors"));
  }
  out_->close();
  const bool written = static_cast<bool>(*out_);
  out_.reset();
  if (!written) {
    std::remove(temp_.c_str());
    return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  }
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
    std::remove(temp_.c_str());
    return absl::PermissionDeniedError(absl::StrCat(path_, ": cannot rename into place"));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  std::vector<RawTensor> raw;
  for (const auto& [name, t] : tensors) {
    if (t->dtype != BF16 && t->dtype != I32 && t->dtype != F32) {  // (an FP8 weight's scales are not its bytes)
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is ", DTypeName(t->dtype),
                                                     "; written are bf16, f32 and i32 tensors"));
    }
    const char* dtype = t->dtype == BF16 ? "BF16" : t->dtype == I32 ? "I32" : "F32";
    raw.push_back({name, dtype, t->shape, t->data(), static_cast<uint64_t>(t->bytes())});
  }
  return WriteSafetensors(path, raw);
}

}  // namespace loom::graph
