#include "graph/proto_file.h"
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace loom {
namespace {

// Keeps the first text-format error with its position.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

}  // namespace

bool IsTextProtoPath(const std::string& path) {
  return absl::EndsWith(path, ".pbtxt") || absl::EndsWith(path, ".txtpb") ||
         absl::EndsWith(path, ".textproto");
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return buffer.str();
}

absl::Status ReadProtoFile(const std::string& path, google::protobuf::Message* message) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  if (IsTextProtoPath(path)) {
    google::protobuf::TextFormat::Parser parser;
    FirstErrorCollector errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(*bytes, message)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a valid ", message->GetTypeName(), " text proto: ", errors.error()));
    }
  } else if (!message->ParseFromString(*bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a valid binary ", message->GetTypeName(), " (corrupt or truncated)"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(temp.c_str());
      return absl::DataLossError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot rename into place: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status WriteProtoFile(const std::string& path, const google::protobuf::Message& message) {
  std::string bytes;
  if (IsTextProtoPath(path)) {
    if (!google::protobuf::TextFormat::PrintToString(message, &bytes)) {
      return absl::InternalError(absl::StrCat(path, ": cannot print ", message.GetTypeName()));
    }
  } else if (!message.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat(path, ": cannot serialize ", message.GetTypeName()));
  }
  return WriteFileAtomically(path, bytes);
}

}  // namespace loom
