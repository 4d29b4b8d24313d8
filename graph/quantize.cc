#include "graph/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "graph/hf_config.h"
#include "graph/json_file.h"
#include "graph/progress.h"
#include "graph/proto_file.h"
#include "graph/safetensors.h"

namespace loom::graph {
namespace {

namespace fs = std::filesystem;

struct Scheme {
  bool is_float;
  int bits;
  int group_size;  // 0: a scale per row
  const char* format;
};

absl::StatusOr<Scheme> SchemeOf(const QuantizeOptions& o) {
  if (o.scheme == "FP8") return Scheme{true, 8, 0, "float-quantized"};
  if (o.scheme == "W8A16") return Scheme{false, 8, 0, "pack-quantized"};
  if (o.scheme == "W4A16") {
    if (o.group_size <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--group_size ", o.group_size, " must be positive"));
    }
    return Scheme{false, 4, o.group_size, "pack-quantized"};
  }
  return absl::InvalidArgumentError(absl::StrCat("--scheme=", o.scheme, ": one of FP8, W4A16, W8A16"));
}

// What ModelCompressor.update_config writes for a weight-only scheme on every Linear but the LM head.
nlohmann::json QuantizationConfigJson(const Scheme& s) {
  nlohmann::json weights = {{"dynamic", false},
                            {"num_bits", s.bits},
                            {"strategy", s.group_size > 0 ? "group" : "channel"},
                            {"symmetric", true},
                            {"type", s.is_float ? "float" : "int"},
                            {"group_size", nullptr}};
  if (s.group_size > 0) weights["group_size"] = s.group_size;
  return {{"config_groups",
           {{"group_0",
             {{"format", nullptr},
              {"input_activations", nullptr},
              {"output_activations", nullptr},
              {"targets", {"Linear"}},
              {"weights", weights}}}}},
          {"format", s.format},
          {"global_compression_ratio", nullptr},
          {"ignore", {"lm_head"}},
          {"kv_cache_scheme", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"},
          {"sparsity_config", nlohmann::json::object()},
          {"transform_config", nlohmann::json::object()}};
}

// Stored bytes of the tensors written, kept alive until the file is.
struct Stored {
  std::deque<std::string> buffers;
  std::vector<RawTensor> tensors;
  void Add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::string bytes) {
    buffers.push_back(std::move(bytes));
    tensors.push_back({name, dtype, std::move(shape), buffers.back().data(), buffers.back().size()});
  }
};

// One projection [rows, cols]: its quantized values, bf16 scales (and shape) under `module`.
absl::Status QuantizeProjection(const std::string& module, const HostTensor& w, const Scheme& s, Stored* out) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  const int64_t group = s.group_size > 0 ? s.group_size : cols;
  if (cols % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("quantize: '", module, ".weight' has ", cols,
                                                   " columns, not a multiple of --group_size ", group));
  }
  const int64_t groups = cols / group;
  // Symmetric: scale = absmax / (the largest value's magnitude: 448 for e4m3, (2^bits - 1) / 2 for integers), as
  // compressed-tensors' calculate_qparams, kept at least FLT_EPSILON, stored (and used) as bf16.
  const float top = s.is_float ? kE4m3Max : ((1 << s.bits) - 1) / 2.0f;
  const int32_t q_min = -(1 << (s.bits - 1)), q_max = (1 << (s.bits - 1)) - 1;
  std::string scales(static_cast<size_t>(rows * groups) * 2, '\0');
  const int64_t words = (cols * s.bits + 31) / 32;
  std::string values(static_cast<size_t>(s.is_float ? rows * cols : rows * words * 4), '\0');
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float absmax = 0;
      for (int64_t c = g * group; c < (g + 1) * group; ++c) absmax = std::max(absmax, std::fabs(w.Get(r * cols + c)));
      const Bf16Bits scale_bits = FloatToBf16(std::max(absmax / top, FLT_EPSILON));
      std::memcpy(&scales[2 * (r * groups + g)], &scale_bits, 2);
      const float scale = Bf16ToFloat(scale_bits);
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        const float x = w.Get(r * cols + c) / scale;
        if (s.is_float) {
          values[r * cols + c] = static_cast<char>(FloatToE4m3(std::clamp(x, -kE4m3Max, kE4m3Max)));
          continue;
        }
        const int32_t q = std::clamp(static_cast<int32_t>(std::nearbyint(x)), q_min, q_max);
        // Dense packing: value c at bit c * bits of the row's words, stored as q + 2^(bits-1).
        const uint64_t u = static_cast<uint64_t>(q - q_min), bit = uint64_t(c) * s.bits;
        uint8_t* row = reinterpret_cast<uint8_t*>(&values[4 * r * words]);
        for (int b = 0; b < s.bits; ++b) {
          if ((u >> b) & 1) row[(bit + b) / 8] |= static_cast<uint8_t>(1u << ((bit + b) % 8));
        }
      }
    }
  }
  if (s.is_float) {
    out->Add(module + ".weight", "F8_E4M3", {rows, cols}, std::move(values));
  } else {
    out->Add(module + ".weight_packed", "I32", {rows, words}, std::move(values));
  }
  out->Add(module + ".weight_scale", "BF16", {rows, groups}, std::move(scales));
  if (!s.is_float) {
    const int64_t shape[2] = {rows, cols};
    out->Add(module + ".weight_shape", "I64", {2}, std::string(reinterpret_cast<const char*>(shape), sizeof(shape)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status QuantizeModel(const Model& model, const QuantizeOptions& options, const std::string& dir) {
  absl::StatusOr<Scheme> scheme = SchemeOf(options);
  if (!scheme.ok()) return scheme.status();
  if (model.gated_conv) return absl::UnimplementedError("quantize: decoders of the Llama families only");
  if (model.weights.empty()) return absl::FailedPreconditionError("quantize needs a model loaded with its weights");
  absl::StatusOr<nlohmann::json> config = HfConfigToJson(model.config);
  if (!config.ok()) return config.status();
  (*config)["quantization_config"] = QuantizationConfigJson(*scheme);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  Stored stored;
  uint64_t total = 0;
  for (const auto& [name, shape] : DecoderWeightShapes(model.config)) total += model.weights.at(name).bytes();
  Progress progress(absl::StrCat("quantizing to ", options.scheme), total);
  for (const auto& [name, shape] : DecoderWeightShapes(model.config)) {
    const HostTensor& w = model.weights.at(name);
    progress.Add(w.bytes());
    if (shape.size() == 2 && absl::EndsWith(name, "_proj.weight")) {
      if (absl::Status s = QuantizeProjection(name.substr(0, name.size() - 7), w, *scheme, &stored); !s.ok()) return s;
      continue;
    }
    stored.tensors.push_back({name, "BF16", w.shape, w.data(), static_cast<uint64_t>(w.bytes())});
  }
  progress.Done();
  if (absl::Status s = WriteSafetensors((fs::path(dir) / "model.safetensors").string(), stored.tensors); !s.ok()) {
    return s;
  }
  return WriteFileAtomically((fs::path(dir) / "config.json").string(), config->dump(2) + "\n");
}

}  // namespace loom::graph
