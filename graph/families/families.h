// The Hugging Face model families Loom reads. A family is one file here: how
// its config.json maps onto a DecoderConfig (the fields its transformers
// classes read and their defaults) and back. The table in hf_config.cc names
// each family once.
#pragma once

#include "absl/status/status.h"
#include "graph/decoder.h"
#include "graph/hf_config.h"
#include "nlohmann/json.hpp"

namespace loom::graph {

struct Family {
  const char* model_type;
  const char* architecture;  // the causal-LM class transformers loads
  // Reads the family's config into *c (ReadCommonConfig plus what the family adds).
  absl::Status (*read)(HfConfigReader& r, DecoderConfig* c);
  // Adds the family's own fields to a config.json holding the common ones.
  absl::Status (*write)(const DecoderConfig& c, nlohmann::json* j);
};

extern const Family kLlamaFamily;
extern const Family kMistralFamily;
extern const Family kQwen2Family;
extern const Family kQwen3Family;

// The sliding window of every layer when `sliding_window` (a positive integer or
// null) applies to all of them; null or absent keeps c->sliding_window empty.
absl::Status ReadWindowForAllLayers(HfConfigReader& r, DecoderConfig* c);

}  // namespace loom::graph
