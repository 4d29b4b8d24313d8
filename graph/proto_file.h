// Reading and writing protobuf files in binary (.pb) or text format (.pbtxt),
// chosen by extension. Writes are atomic: a failed write leaves no file behind.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace loom {

// True when `path` names a text-format file (.pbtxt / .txtpb / .textproto).
bool IsTextProtoPath(const std::string& path);

// Parses `path` into `message`. Errors name the file and, for text format, the line.
absl::Status ReadProtoFile(const std::string& path, google::protobuf::Message* message);

// Writes `message` to `path` through a temporary file renamed into place.
absl::Status WriteProtoFile(const std::string& path, const google::protobuf::Message& message);

// Writes raw bytes atomically (temporary file + rename); used for every output file.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// Reads a whole file; errors name the file and the reason.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace loom
