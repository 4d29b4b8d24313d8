#include "graph/families/gated_conv.h"

#include <cmath>
#include <cstdint>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/config_limits.h"
#include "graph/decoder.h"
#include "graph/graph_builder.h"
#include "graph/json_file.h"
#include "nlohmann/json.hpp"

namespace loom::graph {

absl::Status GatedConvConfig::Validate() const {
  auto bad = [](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("gated-conv: ", why)); };
  if (hidden <= 0 || layers <= 0 || intermediate <= 0 || vocab <= 0) {
    return bad("hidden, layers, intermediate and vocab must be positive");
  }
  if (kernel < 1 || kernel > 64) return bad(absl::StrCat("kernel ", kernel, " outside [1, 64]"));
  if (!(eps > 0)) return bad("eps must be positive");
  return absl::OkStatus();
}

bool IsGatedConvPreset(const std::string& name) { return absl::StartsWith(name, "gated-conv"); }

absl::StatusOr<GatedConvConfig> GatedConvPreset(const std::string& name) {
  GatedConvConfig c;
  if (name == "gated-conv-tiny") {
    c.hidden = 64, c.layers = 2, c.intermediate = 128, c.kernel = 4, c.vocab = 1000;
  } else if (name == "gated-conv-small") {
    c.hidden = 512, c.layers = 8, c.intermediate = 1536, c.kernel = 4, c.vocab = 32000;
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown gated-conv preset '", name, "' (gated-conv-tiny, gated-conv-small)"));
  }
  return c;
}

std::string GatedConvConfigJson(const GatedConvConfig& c) {
  nlohmann::json j = {{"model_type", kGatedConvModelType},
                      {"hidden_size", c.hidden},
                      {"num_hidden_layers", c.layers},
                      {"intermediate_size", c.intermediate},
                      {"conv_kernel", c.kernel},
                      {"vocab_size", c.vocab},
                      {"rms_norm_eps", std::stod(absl::StrCat(c.eps))},
                      {"tie_word_embeddings", c.tie_embeddings}};
  return j.dump(2) + "\n";
}

absl::StatusOr<std::optional<GatedConvConfig>> ParseGatedConvConfig(const std::string& text, const std::string& path) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonObject(text, path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.contains("model_type") || j["model_type"] != kGatedConvModelType) return std::nullopt;
  GatedConvConfig c;
  // Each shape field is an integer up to its limit (config_limits.h): an implausible one is refused by name
  // before a graph of that size is built.
  auto get_int = [&](const char* key, int* out, int limit) -> absl::Status {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": '", key, "' must be an integer"));
    }
    const int64_t v = j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t{INT64_MAX}
                          ? INT64_MAX
                          : j[key].get<int64_t>();
    if (v > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", key, "' = ", v, ": implausible: more than ", limit, ", beyond any published model"));
    }
    *out = static_cast<int>(v);
    return absl::OkStatus();
  };
  for (auto [key, out, limit] : std::vector<std::tuple<const char*, int*, int>>{
           {"hidden_size", &c.hidden, kMaxWidth},
           {"num_hidden_layers", &c.layers, kMaxLayers},
           {"intermediate_size", &c.intermediate, kMaxIntermediate},
           {"conv_kernel", &c.kernel, kMaxConvKernel},
           {"vocab_size", &c.vocab, kMaxVocab}}) {
    if (absl::Status s = get_int(key, out, limit); !s.ok()) return s;
  }
  if (!j.contains("rms_norm_eps") || !j["rms_norm_eps"].is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": 'rms_norm_eps' must be a number"));
  }
  c.eps = j["rms_norm_eps"].get<float>();
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": 'tie_word_embeddings' must be true or false"));
    }
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (absl::Status s = c.Validate(); !s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  return c;
}

absl::StatusOr<Graph> BuildGatedConvGraph(const GatedConvConfig& c, int max_seq) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (max_seq <= 0) return absl::InvalidArgumentError("gated-conv: max_seq must be positive");
  const int64_t d = c.hidden, f = c.intermediate, k = c.kernel;
  GraphBuilder b("gated-conv");
  b.Input("token", {1}, I32);
  b.Weight("embed", {c.vocab, d});
  std::string x = b.Embedding("x0", "embed", "token");
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    auto w = [&](const std::string& name, std::vector<int64_t> shape) {
      return b.Weight(p + name + ".weight", std::move(shape));
    };
    const std::string n1 = b.RmsNorm(p + "n1", x, w("norm1", {d}), c.eps);
    const std::string u = b.Linear(p + "u", n1, w("in_u", {d, d}));
    const std::string g = b.Linear(p + "g", n1, w("in_g", {d, d}));
    const std::string state = k > 1 ? b.State(p + "conv_state", {d, k - 1}) : "";
    const std::string conv = b.Conv1d(p + "conv", u, w("conv", {d, k}), state, b.Weight(p + "conv.bias", {d}));
    const std::string gated = b.SiluMul(p + "gated", g, conv);
    x = b.Add(p + "x1", b.Linear(p + "o", gated, w("out", {d, d})), x);
    const std::string n2 = b.RmsNorm(p + "n2", x, w("norm2", {d}), c.eps);
    const std::string act =
        b.SiluMul(p + "act", b.Linear(p + "gate", n2, w("gate", {f, d})), b.Linear(p + "up", n2, w("up", {f, d})));
    x = b.Add(p + "x2", b.Linear(p + "down", act, w("down", {d, f})), x);
  }
  const std::string normed = b.RmsNorm("final", x, b.Weight("final_norm", {d}), c.eps);
  const std::string head = c.tie_embeddings ? "embed" : b.Weight("lm_head", {c.vocab, d});
  b.MarkOutput(b.Linear("logits", normed, head));
  b.MarkOutput(b.Argmax("next_token", "logits"));
  absl::StatusOr<Graph> graph = std::move(b).Build();
  if (!graph.ok()) return graph.status();
  GraphDef def = graph->def();
  def.set_max_seq(max_seq);
  return Graph::Create(std::move(def));
}

WeightStore RandomGatedConvWeights(const Graph& graph, uint64_t seed) {
  WeightStore weights;
  for (const TensorDef* t : graph.TensorsOfKind(WEIGHT)) {
    const std::string& name = t->name();
    const std::vector<int64_t> shape(t->shape().begin(), t->shape().end());
    // Norms near 1; the conv taps wide enough that the sequence matters; the rest scaled to their fan-in.
    const bool norm = absl::StrContains(name, "norm");
    const float width = norm                                  ? 0.1f
                        : absl::EndsWith(name, "conv.weight") ? 0.5f
                        : absl::EndsWith(name, "conv.bias")   ? 0.1f
                        : name == "embed"                     ? 1.0f
                                                              : std::sqrt(3.0f / static_cast<float>(shape.back()));
    weights.emplace(name, RandomBf16Weight(name, shape, seed, norm ? 1.0f : 0.0f, width));
  }
  return weights;
}

}  // namespace loom::graph
