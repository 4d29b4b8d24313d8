#include "graph/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace loom::graph {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// The value of `key` in the header's dict literal, e.g. 'descr': '<f4' -> '<f4'.
std::string Field(const std::string& header, const std::string& key) {
  const size_t at = header.find(absl::StrCat("'", key, "'"));
  if (at == std::string::npos) return "";
  size_t begin = header.find(':', at);
  if (begin == std::string::npos) return "";
  ++begin;
  while (begin < header.size() && header[begin] == ' ') ++begin;
  const char open = header[begin];
  const size_t end = open == '(' ? header.find(')', begin) + 1 : header.find_first_of(",}", begin);
  return end == std::string::npos || end < begin ? "" : header.substr(begin, end - begin);
}

}  // namespace

absl::StatusOr<HostTensor> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat(path, ": ", why)); };
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0) return bad("not a .npy file");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    return bad(absl::StrCat("npy format version ", major, " is not read"));
  }
  if (bytes.size() < offset + header_len) return bad("truncated header");
  const std::string header = bytes.substr(offset, header_len);
  const std::string descr = Field(header, "descr");
  // float32, or integers (int64 / int32: embedding ids, read as int32).
  const size_t width = descr == "'<f4'" || descr == "'<i4'" ? 4 : descr == "'<i8'" ? 8 : 0;
  if (width == 0) {
    return bad(absl::StrCat("holds ", descr.empty() ? "no dtype" : descr,
                            ", float32 ('<f4') or integers ('<i8', '<i4') needed"));
  }
  if (Field(header, "fortran_order") != "False") return bad("Fortran order is not read (C order needed)");
  std::string shape_text = Field(header, "shape");
  if (shape_text.size() < 2) return bad("no shape");
  shape_text = shape_text.substr(1, shape_text.size() - 2);
  HostTensor t;
  t.dtype = descr == "'<f4'" ? F32 : I32;
  int64_t elements = 1;
  for (absl::string_view d : absl::StrSplit(shape_text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v < 0) return bad(absl::StrCat("bad shape (", shape_text, ")"));
    t.shape.push_back(v);
    elements *= v;
  }
  const size_t data = offset + header_len;
  if (bytes.size() - data != static_cast<size_t>(elements) * width) {
    return bad(absl::StrCat("holds ", bytes.size() - data, " bytes of data for ", elements, " values of ", width,
                            " bytes"));
  }
  if (t.dtype == F32) {
    t.f32.resize(elements);
    std::memcpy(t.f32.data(), bytes.data() + data, elements * 4);
  } else if (width == 4) {
    t.i32.resize(elements);
    std::memcpy(t.i32.data(), bytes.data() + data, elements * 4);
  } else {
    t.i32.resize(elements);
    for (int64_t i = 0; i < elements; ++i) {
      int64_t v;
      std::memcpy(&v, bytes.data() + data + 8 * i, 8);
      if (v < INT32_MIN || v > INT32_MAX) return bad(absl::StrCat("value ", i, " (", v, ") is outside int32"));
      t.i32[i] = static_cast<int32_t>(v);
    }
  }
  return t;
}

absl::Status WriteNpy(const std::string& path, const HostTensor& tensor) {
  if (tensor.dtype != F32) return absl::InvalidArgumentError(absl::StrCat(path, ": only float32 tensors are written"));
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                                    absl::StrJoin(tensor.shape, ", "), tensor.shape.size() == 1 ? ",), }" : "), }");
  // Magic (6) + version (2) + length (2) + header + '\n', padded with spaces to a multiple of 64.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  out.write(len, 2);
  out << header;
  out.write(reinterpret_cast<const char*>(tensor.f32.data()), static_cast<std::streamsize>(tensor.f32.size() * 4));
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace loom::graph
