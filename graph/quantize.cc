#include "graph/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// The stored parts of one projection [rows, cols] under `module`, in the order they are written (data unset): its
// values (e4m3 bytes, or integers in dense int32 words), its bf16 scales, and for integers its shape.
absl::StatusOr<std::vector<RawTensor>> ProjectionParts(const std::string& module, int64_t rows, int64_t cols,
                                                       const Scheme& s) {
  const int64_t group = s.group_size > 0 ? s.group_size : cols;
  if (cols % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("quantize: '", module, ".weight' has ", cols,
                                                   " columns, not a multiple of --group_size ", group));
  }
  const uint64_t groups = cols / group, words = (cols * s.bits + 31) / 32;
  std::vector<RawTensor> parts;
  if (s.is_float) {
    parts.push_back({module + ".weight", "F8_E4M3", {rows, cols}, nullptr, static_cast<uint64_t>(rows * cols)});
  } else {
    parts.push_back({module + ".weight_packed", "I32", {rows, static_cast<int64_t>(words)}, nullptr, 4 * rows * words});
  }
  parts.push_back({module + ".weight_scale", "BF16", {rows, static_cast<int64_t>(groups)}, nullptr, 2 * rows * groups});
  if (!s.is_float) parts.push_back({module + ".weight_shape", "I64", {2}, nullptr, 16});
  return parts;
}

// One projection [rows, cols]: its parts (ProjectionParts) quantized.
absl::Status QuantizeProjection(const std::string& module, const HostTensor& w, const Scheme& s, Stored* out) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  absl::StatusOr<std::vector<RawTensor>> parts = ProjectionParts(module, rows, cols, s);
  if (!parts.ok()) return parts.status();
  const int64_t group = s.group_size > 0 ? s.group_size : cols, groups = cols / group;
  // Symmetric: scale = absmax / (the largest value's magnitude: 448 for e4m3, (2^bits - 1) / 2 for integers), as
  // compressed-tensors' calculate_qparams, kept at least FLT_EPSILON, stored (and used) as bf16.
  const float top = s.is_float ? kE4m3Max : ((1 << s.bits) - 1) / 2.0f;
  const int32_t q_min = -(1 << (s.bits - 1)), q_max = (1 << (s.bits - 1)) - 1;
  std::string values((*parts)[0].bytes, '\0'), scales((*parts)[1].bytes, '\0');
  const int64_t words = (cols * s.bits + 31) / 32;
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
  const int64_t shape[2] = {rows, cols};
  std::string bytes[3] = {std::move(values), std::move(scales),
                          std::string(reinterpret_cast<const char*>(shape), sizeof(shape))};
  for (size_t i = 0; i < parts->size(); ++i) {
    const RawTensor& part = (*parts)[i];
    out->Add(part.name, part.dtype, part.shape, std::move(bytes[i]));
  }
  return absl::OkStatus();
}

bool IsQuantizedProjection(const std::string& name, const std::vector<int64_t>& shape) {
  return shape.size() == 2 && absl::EndsWith(name, "_proj.weight");
}
std::string ModuleOf(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string(".weight").size());
}

// What model.safetensors holds, in order (data unset): each projection's parts as QuantizeProjection adds them,
// every other weight as bf16. The writer checks each tensor written against it.
// (A group size that does not divide a projection's columns is refused here, before any weight is read.)
absl::StatusOr<std::vector<RawTensor>> OutputLayout(const DecoderConfig& config, const Scheme& s) {
  std::vector<RawTensor> layout;
  for (const auto& [name, shape] : DecoderWeightShapes(config)) {
    if (!IsQuantizedProjection(name, shape)) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      layout.push_back({name, "BF16", shape, nullptr, static_cast<uint64_t>(2 * n)});
      continue;
    }
    absl::StatusOr<std::vector<RawTensor>> parts = ProjectionParts(ModuleOf(name), shape[0], shape[1], s);
    if (!parts.ok()) return parts.status();
    layout.insert(layout.end(), parts->begin(), parts->end());
  }
  return layout;
}

// One weight into the file: a projection quantized, any other as bf16 (widened if it was read otherwise).
absl::Status WriteWeight(const std::string& name, const HostTensor& w, const Scheme& s, SafetensorsWriter& out) {
  if (IsQuantizedProjection(name, w.shape)) {
    Stored stored;
    if (absl::Status st = QuantizeProjection(ModuleOf(name), w, s, &stored); !st.ok()) return st;
    for (const RawTensor& t : stored.tensors) {
      if (absl::Status st = out.Append(t); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (w.dtype == BF16) return out.Append({name, "BF16", w.shape, w.data(), static_cast<uint64_t>(w.bytes())});
  HostTensor widened = HostTensor::Zeros(BF16, w.shape);
  for (int64_t i = 0; i < w.size(); ++i) widened.bf16[i] = FloatToBf16(w.Get(i));
  return out.Append({name, "BF16", w.shape, widened.data(), static_cast<uint64_t>(widened.bytes())});
}

// The folder's config.json and its writer for model.safetensors (the folder created).
absl::StatusOr<std::unique_ptr<SafetensorsWriter>> StartFolder(const DecoderConfig& config, const Scheme& s,
                                                               const std::string& dir, std::string* config_json) {
  absl::StatusOr<nlohmann::json> json = HfConfigToJson(config);
  if (!json.ok()) return json.status();
  (*json)["quantization_config"] = QuantizationConfigJson(s);
  *config_json = json->dump(2) + "\n";
  absl::StatusOr<std::vector<RawTensor>> layout = OutputLayout(config, s);
  if (!layout.ok()) return layout.status();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  uint64_t bytes = 0;
  for (const RawTensor& t : *layout) bytes += t.bytes;
  // Refused before any weight is read where the file cannot fit (a 70B model's int4 folder is 37 GB).
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available < bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat("%s: model.safetensors needs %.1f GB of disk, has %.1f GB free",
                                                        dir, bytes / 1e9, space.available / 1e9));
  }
  return SafetensorsWriter::Create((fs::path(dir) / "model.safetensors").string(), *std::move(layout));
}

uint64_t WeightBytes(const DecoderConfig& config) {
  uint64_t total = 0;
  for (const auto& [name, shape] : DecoderWeightShapes(config)) {
    uint64_t n = 2;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  return total;
}

}  // namespace

absl::Status QuantizeModel(const Model& model, const QuantizeOptions& options, const std::string& dir) {
  absl::StatusOr<Scheme> scheme = SchemeOf(options);
  if (!scheme.ok()) return scheme.status();
  if (model.gated_conv) return absl::UnimplementedError("quantize: decoders of the Llama families only");
  if (model.weights.empty()) return absl::FailedPreconditionError("quantize needs a model loaded with its weights");
  std::string config_json;
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> out = StartFolder(model.config, *scheme, dir, &config_json);
  if (!out.ok()) return out.status();
  Progress progress(absl::StrCat("quantizing to ", options.scheme), WeightBytes(model.config));
  for (const auto& [name, shape] : DecoderWeightShapes(model.config)) {
    const HostTensor& w = model.weights.at(name);
    if (absl::Status s = WriteWeight(name, w, *scheme, **out); !s.ok()) return s;
    progress.Add(static_cast<uint64_t>(2 * w.size()));
  }
  progress.Done();
  if (absl::Status s = (*out)->Finish(); !s.ok()) return s;
  return WriteFileAtomically((fs::path(dir) / "config.json").string(), config_json);
}

absl::Status QuantizeCheckpoint(const std::string& spec, const ModelOptions& options, const QuantizeOptions& quantize,
                                const std::string& dir, std::vector<std::string>* notes) {
  absl::StatusOr<Scheme> scheme = SchemeOf(quantize);
  if (!scheme.ok()) return scheme.status();
  ModelOptions config_only = options;
  config_only.load_weights = false;
  config_only.weight_visitor = nullptr;
  absl::StatusOr<Model> model = LoadModel(spec, config_only);
  if (!model.ok()) return model.status();
  if (model->gated_conv) return absl::UnimplementedError("quantize: decoders of the Llama families only");
  std::string config_json;
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> out = StartFolder(model->config, *scheme, dir, &config_json);
  if (!out.ok()) return out.status();
  // Each weight quantized and written as it is read: the host holds one at a time (a 70B folder's 141 GB of bf16
  // never all at once).
  Progress progress(absl::StrCat("quantizing to ", quantize.scheme), WeightBytes(model->config));
  ModelOptions streamed = options;
  streamed.load_weights = true;
  streamed.weight_visitor = [&](const std::string& name, HostTensor w) {
    progress.Add(static_cast<uint64_t>(2 * w.size()));
    return WriteWeight(name, w, *scheme, **out);
  };
  absl::StatusOr<Model> read = LoadModel(spec, streamed);
  if (!read.ok()) return read.status();
  progress.Done();
  if (notes != nullptr) *notes = read->notes;
  if (absl::Status s = (*out)->Finish(); !s.ok()) return s;
  return WriteFileAtomically((fs::path(dir) / "config.json").string(), config_json);
}

}  // namespace loom::graph
