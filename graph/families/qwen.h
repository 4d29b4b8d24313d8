// What Qwen2 and Qwen3 share: sliding windows per layer type.
#pragma once

#include "graph/families/families.h"

namespace loom::graph {

// use_sliding_window / sliding_window / max_window_layers / layer_types, as
// transformers' Qwen2 and Qwen3 configs resolve them: a layer of type
// "sliding_attention" attends to sliding_window positions when
// use_sliding_window is true; layer_types defaults to sliding for layers from
// max_window_layers on.
absl::Status ReadQwenWindows(HfConfigReader& r, DecoderConfig* c);
void WriteQwenWindows(const DecoderConfig& c, nlohmann::json* j);

}  // namespace loom::graph
