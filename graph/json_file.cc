#include "graph/json_file.h"

#include "absl/strings/str_cat.h"

namespace loom::graph {

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 24: <what>"; the token it
    // quotes has its control characters escaped, so the message stays one line.
    std::string what = e.what();
    if (const size_t end = what.find("] "); what.rfind("[json.exception", 0) == 0 && end != std::string::npos) {
      what = what.substr(end + 2);
    }
    const std::string empty = text.find_first_not_of(" \t\r\n") == std::string_view::npos ? " (the file is empty)" : "";
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON", empty, ": ", what, " (byte ", e.byte, ")"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object but ", j.type_name()));
  }
  return j;
}

}  // namespace loom::graph
