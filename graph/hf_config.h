// Reading a Hugging Face config.json into a DecoderConfig, so that it cannot be
// silently wrong: every field transformers reads for the model's family is
// either honoured or refused with an error naming the file, the field and its
// value; a missing shape field is an error; a missing optional field takes the
// default of the family's transformers config class (the format's own default).
// Both layouts transformers writes are read: 4.x's top-level `rope_theta` /
// `rope_scaling` and 5.x's `rope_parameters`.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/decoder.h"
#include "nlohmann/json.hpp"

namespace loom::graph {

// Typed, tracked access to one JSON object of a config file. Every read marks
// the key used; Unused() lists what nobody read. Errors are one line:
//   <file>: field '<key>' = <value>: <why>
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& object, std::string path);

  // Present and not null.
  bool Has(const std::string& key) const;
  // Present, maybe null.
  bool Contains(const std::string& key) const;
  // The value (marking it used), or null when absent.
  const nlohmann::json& Get(const std::string& key);
  // A required positive integer.
  absl::Status Int(const std::string& key, int* out);
  // An optional positive integer: absent or null keeps *out (the family default).
  absl::Status OptionalInt(const std::string& key, int* out);
  absl::Status OptionalFloat(const std::string& key, float* out);
  absl::Status OptionalBool(const std::string& key, bool* out);
  absl::Status OptionalString(const std::string& key, std::string* out);
  // The reader of a nested object (absent or null: an empty one).
  HfConfigReader Object(const std::string& key);

  absl::Status Error(const std::string& key, const std::string& why) const;
  absl::Status Error(const std::string& why) const;  // about the file as a whole
  // Keys of this object (and of nested readers) that were never read, with prefixes.
  std::vector<std::string> Unused() const;
  const std::string& path() const { return path_; }

 private:
  struct Shared {
    std::set<std::string> used;  // full keys ("rope_scaling.factor")
    std::vector<std::pair<std::string, const nlohmann::json*>> objects;  // (prefix, object) of every reader
  };
  HfConfigReader(const nlohmann::json& object, std::string path, std::string prefix, std::shared_ptr<Shared> shared);
  std::string Full(const std::string& key) const { return prefix_ + key; }

  const nlohmann::json* object_;
  std::string path_, prefix_;
  std::shared_ptr<Shared> shared_;
};

// What a family's config class defaults to when config.json omits a field.
struct FamilyDefaults {
  int max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  int num_kv_heads = 0;  // 0: num_attention_heads
  int head_dim = 0;      // 0: hidden_size / num_attention_heads
};

// Reads what every supported family shares: shapes, norm eps, activation,
// embeddings tying and the rope section (both layouts, rope types default,
// linear, llama3 and yarn; others refused by name).
absl::Status ReadCommonConfig(HfConfigReader& r, const FamilyDefaults& defaults, DecoderConfig* c);

// Parses config.json text; `path` names the file in errors. `unused` (optional)
// receives the fields transformers does not read for this family either.
absl::StatusOr<DecoderConfig> ParseHfConfig(const std::string& json_text, const std::string& path,
                                            std::vector<std::string>* unused = nullptr);

// The config.json transformers loads as the config's family (for `loom export`).
absl::StatusOr<nlohmann::json> HfConfigToJson(const DecoderConfig& config);

}  // namespace loom::graph
