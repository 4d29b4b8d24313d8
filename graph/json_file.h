// JSON text as Loom reads it (config.json, model.safetensors.index.json): one object, or one line saying where
// the text stops being JSON (file, line, column, byte) and what nlohmann found there.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace loom::graph {

// `text` parsed as a JSON object. Errors name `path`: where the text is not JSON (NaN, a truncated file) and
// what the parser expected, or which kind of value it holds instead of an object.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const std::string& path);

}  // namespace loom::graph
