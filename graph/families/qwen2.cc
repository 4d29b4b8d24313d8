// Qwen2 and Qwen2.5 (model_type "qwen2", Qwen2ForCausalLM): biases on q, k and
// v (always), none on o or the MLP; sliding windows per layer type.
#include "graph/families/qwen.h"

#include "absl/strings/str_cat.h"

namespace loom::graph {

absl::Status ReadQwenWindows(HfConfigReader& r, DecoderConfig* c) {
  bool use_sliding = false;
  int window = 4096, max_window_layers = 28;
  if (absl::Status s = r.OptionalBool("use_sliding_window", &use_sliding); !s.ok()) return s;
  if (r.Contains("sliding_window") && !r.Has("sliding_window")) window = 0;
  if (absl::Status s = r.OptionalInt("sliding_window", &window); !s.ok()) return s;
  if (absl::Status s = r.OptionalInt("max_window_layers", &max_window_layers); !s.ok()) return s;
  if (!use_sliding) window = 0;
  c->sliding_window.assign(c->num_layers, 0);
  if (!r.Has("layer_types")) {
    r.Get("layer_types");
    for (int l = max_window_layers; l < c->num_layers; ++l) c->sliding_window[l] = window;
    return absl::OkStatus();
  }
  const nlohmann::json& types = r.Get("layer_types");
  if (!types.is_array() || types.size() != static_cast<size_t>(c->num_layers)) {
    return r.Error("layer_types", absl::StrCat("must list one type per layer (", c->num_layers, ")"));
  }
  for (int l = 0; l < c->num_layers; ++l) {
    const nlohmann::json& t = types[l];
    if (t == "sliding_attention") {
      c->sliding_window[l] = window;
    } else if (t != "full_attention") {
      return r.Error("layer_types", absl::StrCat("layer ", l, " has type ", t.dump(),
                                                 "; Loom runs full_attention and sliding_attention layers"));
    }
  }
  return absl::OkStatus();
}

void WriteQwenWindows(const DecoderConfig& c, nlohmann::json* j) {
  (*j)["use_sliding_window"] = false;
  (*j)["sliding_window"] = nullptr;
  (*j)["max_window_layers"] = c.num_layers;
}

namespace {

absl::Status Read(HfConfigReader& r, DecoderConfig* c) {
  FamilyDefaults defaults;
  defaults.max_position_embeddings = 32768;
  defaults.num_kv_heads = 32;
  if (absl::Status s = ReadCommonConfig(r, defaults, c); !s.ok()) return s;
  c->qkv_bias = true;
  return ReadQwenWindows(r, c);
}

absl::Status Write(const DecoderConfig& c, nlohmann::json* j) {
  if (!c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm) {
    return absl::InvalidArgumentError("a qwen2 config has q/k/v biases only and no q/k norms");
  }
  WriteQwenWindows(c, j);
  return absl::OkStatus();
}

}  // namespace

const Family kQwen2Family = {"qwen2", "Qwen2ForCausalLM", Read, Write};

}  // namespace loom::graph
