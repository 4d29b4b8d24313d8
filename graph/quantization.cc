#include "graph/quantization.h"

#include "graph/parallel.h"
#include "graph/quantization_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/dtype.h"

namespace loom::graph {
namespace quantization_internal {

absl::Status Refuse(const std::string& path, const std::string& field, const nlohmann::json& value,
                    const std::string& why) {
  std::string shown = value.dump();
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": field 'quantization_config.", field, "' = ", shown, ": ", why));
}

// Keys of `object` outside `known`: the first one, refused (a field Loom does not know may change the math).
absl::Status OnlyKnownKeys(const nlohmann::json& object, const std::set<std::string>& known, const std::string& path,
                           const std::string& prefix) {
  for (const auto& [key, value] : object.items()) {
    if (!known.contains(key)) return Refuse(path, prefix + key, value, "not understood by Loom's reader");
  }
  return absl::OkStatus();
}

bool IsNull(const nlohmann::json& object, const std::string& key) {
  return !object.contains(key) || object[key].is_null();
}

// Empty: null, {} or [].
bool IsEmpty(const nlohmann::json& object, const std::string& key) {
  return IsNull(object, key) || ((object[key].is_object() || object[key].is_array()) && object[key].empty());
}

std::string ContainsPattern(const std::string& part) {
  std::string escaped;
  for (char ch : part) {
    if (std::strchr(".^$|()[]{}*+?\\", ch) != nullptr) escaped += '\\';
    escaped += ch;
  }
  return "re:.*" + escaped;
}

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace quantization_internal

using namespace quantization_internal;

namespace {

absl::StatusOr<WeightScheme> ParseWeights(const nlohmann::json& w, const std::string& format, const std::string& path,
                                          const std::string& prefix) {
  if (!w.is_object()) return Refuse(path, prefix, w, "must be an object");
  if (absl::Status s = OnlyKnownKeys(w,
                                     {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure",
                                      "dynamic", "actorder", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"},
                                     path, prefix + ".");
      !s.ok()) {
    return s;
  }
  WeightScheme s;
  s.format = format;
  const std::string type = w.value("type", std::string("int"));
  if (type != "int" && type != "float") return Refuse(path, prefix + ".type", w["type"], "must be \"int\" or \"float\"");
  s.is_float = type == "float";
  if (!w.contains("num_bits") || !w["num_bits"].is_number_integer()) {
    return Refuse(path, prefix + ".num_bits", w.value("num_bits", nlohmann::json()), "must be an integer");
  }
  s.bits = w["num_bits"].get<int>();
  if (s.is_float ? s.bits != 8 : (s.bits < 1 || s.bits > 8)) {
    return Refuse(path, prefix + ".num_bits", w["num_bits"],
                  s.is_float ? "float weights are read as FP8 (e4m3) only" : "integer weights of 1 to 8 bits only");
  }
  if (s.is_float != (format == "float-quantized")) {
    return Refuse(path, prefix + ".type", w["type"],
                  absl::StrCat("does not match the format '", format, "' (int: pack-quantized, float: float-quantized)"));
  }
  s.symmetric = w.value("symmetric", true);
  if (s.is_float && !s.symmetric) return Refuse(path, prefix + ".symmetric", w["symmetric"], "FP8 with zero points");
  const std::string strategy = w.value("strategy", std::string("tensor"));
  if (strategy == "group") {
    if (!w.contains("group_size") || !w["group_size"].is_number_integer() || w["group_size"].get<int>() <= 0) {
      return Refuse(path, prefix + ".group_size", w.value("group_size", nlohmann::json()),
                    "the group strategy needs a positive group_size");
    }
    s.group_size = w["group_size"].get<int>();
  } else if (strategy == "channel") {
    s.group_size = 0;
  } else if (strategy == "tensor") {
    s.group_size = -1;
  } else {
    return Refuse(path, prefix + ".strategy", w["strategy"],
                  "Loom reads weight scales per group, channel or tensor (not block, token or tensor_group)");
  }
  if (!IsNull(w, "block_structure")) return Refuse(path, prefix + ".block_structure", w["block_structure"], "block scales are not read");
  if (w.contains("dynamic") && !(w["dynamic"].is_boolean() && !w["dynamic"].get<bool>())) {
    return Refuse(path, prefix + ".dynamic", w["dynamic"], "weights with scales computed at run time are not read");
  }
  // act-order "group" stores a permutation of the columns into groups (g_idx); "weight" and "static" only ordered
  // the calibration, the stored format is the plain one.
  if (!IsNull(w, "actorder") && w["actorder"] != "weight" && w["actorder"] != "static") {
    return Refuse(path, prefix + ".actorder", w["actorder"], "activation-ordered groups (g_idx) are not read");
  }
  return s;
}

bool Matches(const std::string& pattern, const std::string& module) {
  if (pattern == "Linear") return true;  // every projection Loom reads is an nn.Linear
  if (absl::StartsWith(pattern, "re:")) {
    // Python's re.match: anchored at the start only.
    return std::regex_search(module, std::regex(pattern.substr(3)), std::regex_constants::match_continuous);
  }
  return pattern == module;
}

}  // namespace

std::string WeightScheme::Describe() const {
  const std::string values = is_float ? "FP8 (e4m3)" : absl::StrCat("int", bits);
  const std::string scales = group_size > 0    ? absl::StrCat("group ", group_size)
                             : group_size == 0 ? std::string("a scale per row")
                                               : std::string("one scale");
  return absl::StrCat(values, " weights, ", scales, act_order ? " in activation order" : "",
                      symmetric ? "" : ", with zero points", " (", format, ")");
}

absl::StatusOr<std::optional<WeightScheme>> QuantizationConfig::SchemeOf(const std::string& module) const {
  for (const std::string& pattern : ignore) {
    if (Matches(pattern, module)) return std::nullopt;
  }
  std::optional<WeightScheme> found;
  for (const Group& g : groups) {
    for (const std::string& t : g.targets) {
      if (!Matches(t, module)) continue;
      if (found) {
        return absl::InvalidArgumentError(
            absl::StrCat("quantization_config: two config_groups target '", module, "'"));
      }
      found = g.scheme;
      break;
    }
  }
  return found;
}

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& q, const std::string& path) {
  if (!q.is_object()) return Refuse(path, "", q, "must be an object");
  const std::string method = q.value("quant_method", std::string());
  if (method == "awq") return ParseAwqConfig(q, path);
  if (method == "gptq") return ParseGptqConfig(q, path);
  if (method != "compressed-tensors") {
    return Refuse(path, "quant_method", q.value("quant_method", nlohmann::json()),
                  "Loom reads compressed-tensors, AWQ and GPTQ checkpoints");
  }
  if (absl::Status s = OnlyKnownKeys(q,
                                     {"quant_method", "format", "config_groups", "ignore", "quantization_status",
                                      "kv_cache_scheme", "sparsity_config", "transform_config", "version",
                                      "global_compression_ratio", "moe_sparsity_config"},
                                     path, "");
      !s.ok()) {
    return s;
  }
  if (q.value("quantization_status", std::string("compressed")) != "compressed") {
    return Refuse(path, "quantization_status", q["quantization_status"], "only compressed checkpoints are read");
  }
  for (const char* key : {"kv_cache_scheme", "sparsity_config", "transform_config", "moe_sparsity_config"}) {
    if (!IsEmpty(q, key)) {
      return Refuse(path, key, q[key], "changes the math and is not implemented (a quantized KV cache, sparsity, transforms)");
    }
  }
  const std::string top_format = q.value("format", std::string());
  QuantizationConfig config;
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty()) {
    return Refuse(path, "config_groups", q.value("config_groups", nlohmann::json()), "must name at least one group");
  }
  for (const auto& [name, group] : q["config_groups"].items()) {
    const std::string prefix = absl::StrCat("config_groups.", name);
    if (!group.is_object()) return Refuse(path, prefix, group, "must be an object");
    if (absl::Status s = OnlyKnownKeys(group, {"targets", "weights", "input_activations", "output_activations", "format"},
                                       path, prefix + ".");
        !s.ok()) {
      return s;
    }
    for (const char* key : {"input_activations", "output_activations"}) {
      if (!IsNull(group, key)) {
        return Refuse(path, absl::StrCat(prefix, ".", key), group[key],
                      "activation quantization changes the math and is not implemented (weight-only schemes: W4A16, "
                      "W8A16, FP8 weights)");
      }
    }
    const std::string format = group.value("format", nlohmann::json()).is_string() ? group["format"].get<std::string>()
                                                                                   : top_format;
    if (format != "pack-quantized" && format != "float-quantized") {
      return Refuse(path, group.contains("format") && group["format"].is_string() ? prefix + ".format" : "format",
                    format, "Loom reads pack-quantized and float-quantized weights");
    }
    if (IsNull(group, "weights")) return Refuse(path, prefix + ".weights", nullptr, "a group without weights");
    absl::StatusOr<WeightScheme> scheme = ParseWeights(group["weights"], format, path, prefix + ".weights");
    if (!scheme.ok()) return scheme.status();
    QuantizationConfig::Group g{{}, *scheme};
    if (!group.contains("targets") || !group["targets"].is_array() || group["targets"].empty()) {
      return Refuse(path, prefix + ".targets", group.value("targets", nlohmann::json()), "must list targets");
    }
    for (const nlohmann::json& t : group["targets"]) {
      if (!t.is_string()) return Refuse(path, prefix + ".targets", group["targets"], "must be strings");
      const std::string target = t.get<std::string>();
      if (target != "Linear" && !absl::StartsWith(target, "re:") && absl::StrContains(target, "Linear")) {
        return Refuse(path, prefix + ".targets", t, "a module class other than Linear");
      }
      g.targets.push_back(target);
    }
    config.groups.push_back(std::move(g));
  }
  if (q.contains("ignore") && !q["ignore"].is_null()) {
    if (!q["ignore"].is_array()) return Refuse(path, "ignore", q["ignore"], "must be a list");
    for (const nlohmann::json& t : q["ignore"]) {
      if (!t.is_string()) return Refuse(path, "ignore", q["ignore"], "must be strings");
      config.ignore.push_back(t.get<std::string>());
    }
  }
  for (const auto& patterns : {config.ignore}) {
    for (const std::string& p : patterns) {
      if (!absl::StartsWith(p, "re:")) continue;
      try {
        std::regex r(p.substr(3));
      } catch (const std::regex_error&) {
        return Refuse(path, "ignore", p, "not a regular expression");
      }
    }
  }
  return config;
}

absl::StatusOr<Parts> quantization_internal::FindParts(const std::string& weight, int64_t rows, int64_t cols,
                                                      const WeightScheme& s, const TensorLookup& lookup) {
  const std::string module = weight.substr(0, weight.size() - std::string(".weight").size());
  auto need = [&](const std::string& suffix) -> absl::StatusOr<StoredTensor> {
    std::optional<StoredTensor> t = lookup(module + "." + suffix);
    if (!t) {
      return absl::NotFoundError(absl::StrCat("quantized weight '", weight, "' (", s.Describe(), "): tensor '",
                                              module, ".", suffix, "' is missing"));
    }
    return *t;
  };
  auto bad = [&](const StoredTensor& t, const std::string& name, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(t.file->path(), ": tensor '", module, ".", name, "' ",
                                                   t.entry->dtype, " ", Shape(t.entry->shape), ": ", why));
  };
  Parts p;
  if (IsHubFormat(s.format)) return FindHubParts(weight, rows, cols, s, need, bad);
  if (s.group_size > 0 && cols % s.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("quantized weight '", weight, "': group_size ", s.group_size,
                                                   " does not divide its ", cols, " columns"));
  }
  p.groups = s.group_size > 0 ? cols / s.group_size : 1;
  const std::string values_name = s.is_float ? "weight" : "weight_packed";
  absl::StatusOr<StoredTensor> values = need(values_name);
  if (!values.ok()) return values.status();
  p.values = *values;
  const int64_t words = (cols * s.bits + 31) / 32;
  if (s.is_float) {
    if (p.values.entry->dtype != "F8_E4M3" || p.values.entry->shape != std::vector<int64_t>{rows, cols}) {
      return bad(p.values, values_name, absl::StrCat("need F8_E4M3 ", Shape({rows, cols})));
    }
  } else if (p.values.entry->dtype != "I32" || p.values.entry->shape != std::vector<int64_t>{rows, words}) {
    return bad(p.values, values_name, absl::StrCat("need I32 ", Shape({rows, words}), " (", cols, " values of ",
                                                   s.bits, " bits a row)"));
  }
  absl::StatusOr<StoredTensor> scale = need("weight_scale");
  if (!scale.ok()) return scale.status();
  p.scale = *scale;
  const std::string& sd = p.scale.entry->dtype;
  if (sd != "BF16" && sd != "F16" && sd != "F32") return bad(p.scale, "weight_scale", "scales must be BF16, F16 or F32");
  int64_t scales = 1;
  for (int64_t d : p.scale.entry->shape) scales *= d;
  const bool scale_ok = s.group_size < 0 ? scales == 1 : p.scale.entry->shape == std::vector<int64_t>{rows, p.groups};
  if (!scale_ok) {
    return bad(p.scale, "weight_scale",
               s.group_size < 0 ? std::string("need one scale") : absl::StrCat("need ", Shape({rows, p.groups})));
  }
  if (!s.is_float) {
    if (std::optional<StoredTensor> shape = lookup(module + ".weight_shape")) {
      p.shape = *shape;
      const std::string& dt = p.shape.entry->dtype;
      bool ok = (dt == "I64" || dt == "I32") && p.shape.entry->shape == std::vector<int64_t>{2};
      if (ok) {
        const uint8_t* d = p.shape.file->Data(*p.shape.entry);
        int64_t r = 0, c = 0;
        if (dt == "I64") {
          std::memcpy(&r, d, 8), std::memcpy(&c, d + 8, 8);
        } else {
          int32_t r32, c32;
          std::memcpy(&r32, d, 4), std::memcpy(&c32, d + 4, 4);
          r = r32, c = c32;
        }
        ok = r == rows && c == cols;
      }
      if (!ok) return bad(p.shape, "weight_shape", absl::StrCat("must hold ", Shape({rows, cols})));
    }
  }
  if (!s.symmetric) {
    absl::StatusOr<StoredTensor> zp = need("weight_zero_point");
    if (!zp.ok()) return zp.status();
    p.zero_point = *zp;
    // Packed along the rows (compressed-tensors packs zero points with packed_dim 0) for group and channel
    // strategies; one unpacked value for the tensor strategy.
    const std::vector<int64_t> want =
        s.group_size < 0 ? std::vector<int64_t>{1} : std::vector<int64_t>{(rows * s.bits + 31) / 32, p.groups};
    int64_t count = 1;
    for (int64_t d : p.zero_point.entry->shape) count *= d;
    const bool ok = p.zero_point.entry->dtype == "I32" &&
                    (s.group_size < 0 ? count == 1 : p.zero_point.entry->shape == want);
    if (!ok) return bad(p.zero_point, "weight_zero_point", absl::StrCat("need I32 ", Shape(want)));
  } else if (std::optional<StoredTensor> zp = lookup(module + ".weight_zero_point")) {
    return bad(*zp, "weight_zero_point", "a zero point for a symmetric scheme");
  }
  return p;
}

namespace {

// Bits [bit, bit + bits) of a little-endian run of int32 words, as an unsigned value.
uint32_t Field(const uint8_t* words, uint64_t bit, int bits) {
  uint64_t v = 0;
  const uint64_t byte = bit / 8;
  const int span = static_cast<int>((bit % 8 + bits + 7) / 8);  // at most 2 bytes for bits <= 8
  for (int i = 0; i < span; ++i) v |= static_cast<uint64_t>(words[byte + i]) << (8 * i);
  return static_cast<uint32_t>((v >> (bit % 8)) & ((1u << bits) - 1));
}

}  // namespace

absl::StatusOr<uint64_t> CheckQuantizedWeight(const std::string& weight, int64_t rows, int64_t cols,
                                              const WeightScheme& scheme, const TensorLookup& lookup) {
  absl::StatusOr<Parts> p = FindParts(weight, rows, cols, scheme, lookup);
  if (!p.ok()) return p.status();
  uint64_t bytes = 0;
  for (const StoredTensor* t : {&p->values, &p->scale, &p->zero_point, &p->shape}) {
    if (t->entry != nullptr) bytes += t->entry->end - t->entry->begin;
  }
  return bytes;
}

absl::StatusOr<HostTensor> ReadQuantizedWeight(const std::string& weight, int64_t rows, int64_t cols,
                                               const WeightScheme& s, const TensorLookup& lookup) {
  absl::StatusOr<Parts> p = FindParts(weight, rows, cols, s, lookup);
  if (!p.ok()) return p.status();
  const uint8_t* values = p->values.file->Data(*p->values.entry);
  // Every scale as a float, read once (a weight of a billion values has a few million of them).
  const std::string& scale_dtype = p->scale.entry->dtype;
  const uint8_t* stored = p->scale.file->Data(*p->scale.entry);
  std::vector<float> scales((p->scale.entry->end - p->scale.entry->begin) / (scale_dtype == "F32" ? 4 : 2));
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scale_dtype == "F32") {
      std::memcpy(&scales[i], stored + 4 * i, 4);
      continue;
    }
    uint16_t b;
    std::memcpy(&b, stored + 2 * i, 2);
    scales[i] = scale_dtype == "F16" ? HalfToFloat(b) : Bf16ToFloat(b);
  }
  // The library multiplies in the scale's dtype: one rounding for bf16 (the product of two bf16 values is exact in
  // f32); float16 rounds to float16 first (the product of a float16 and an int of at most 9 bits is exact in f32),
  // then to bf16 as Loom stores it.
  const bool half = scale_dtype == "F16";
  HostTensor out = HostTensor::Zeros(BF16, {rows, cols});
  if (IsHubFormat(s.format)) {
    ReadHubWeight(*p, rows, cols, s, scales, half, &out);
    return out;
  }
  const int64_t words = (cols * s.bits + 31) / 32;
  const int32_t offset = 1 << (s.bits - 1);  // stored unsigned: value + 2^(bits-1)
  const uint8_t* zp = p->zero_point.entry != nullptr ? p->zero_point.file->Data(*p->zero_point.entry) : nullptr;
  const int64_t zp_words = (rows * s.bits + 31) / 32, groups = s.group_size < 0 ? 1 : p->groups;
  const int64_t group = s.group_size > 0 ? s.group_size : cols;
  std::vector<float> row_scale(groups);
  std::vector<int32_t> row_zero(groups, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      row_scale[g] = scales[s.group_size < 0 ? 0 : r * p->groups + g];
      if (zp == nullptr) continue;
      if (s.group_size < 0) {
        std::memcpy(&row_zero[g], zp, 4);
        continue;
      }
      // Column g of [zp_words, groups] words, bit r * bits down the column.
      const uint64_t bit = uint64_t(r) * s.bits;
      uint32_t w0, w1 = 0;
      std::memcpy(&w0, zp + 4 * ((bit / 32) * p->groups + g), 4);
      if (bit / 32 + 1 < static_cast<uint64_t>(zp_words)) std::memcpy(&w1, zp + 4 * ((bit / 32 + 1) * p->groups + g), 4);
      const uint64_t pair = (uint64_t{w1} << 32) | w0;
      row_zero[g] = static_cast<int32_t>((pair >> (bit % 32)) & ((1u << s.bits) - 1)) - offset;
    }
    const uint8_t* row = s.is_float ? values + r * cols : values + 4 * r * words;
    uint16_t* dst = out.bf16.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = c / group;
      float v;
      if (s.is_float) {
        v = E4m3ToFloat(row[c]);
      } else {  // 4 and 8 bits sit whole in bytes (low nibble first); others across them
        const uint32_t u = s.bits == 8   ? row[c]
                           : s.bits == 4 ? (row[c / 2] >> (4 * (c & 1))) & 15u
                                         : Field(row, uint64_t(c) * s.bits, s.bits);
        v = static_cast<float>(static_cast<int32_t>(u) - offset - row_zero[g]);  // exact: |q - z| < 2^8
      }
      const float w = v * row_scale[g];
      dst[c] = FloatToBf16(half ? RoundToHalf(w) : w);
    }
  }
  return out;
}

absl::StatusOr<HostTensor> ReadFp8Weight(const std::string& weight, int64_t rows, int64_t cols, const WeightScheme& s,
                                         const TensorLookup& lookup) {
  if (!KeptQuantized(s)) {
    return absl::InvalidArgumentError(absl::StrCat(weight, ": ", s.Describe(), " is widened, not read as FP8"));
  }
  absl::StatusOr<Parts> p = FindParts(weight, rows, cols, s, lookup);
  if (!p.ok()) return p.status();
  HostTensor out = HostTensor::Zeros(F8E4M3, {rows, cols});
  const uint8_t* values = p->values.file->Data(*p->values.entry);
  std::memcpy(out.f8.data(), values, out.f8.size());
  const std::string& scale_dtype = p->scale.entry->dtype;
  const uint8_t* stored = p->scale.file->Data(*p->scale.entry);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = s.group_size < 0 ? 0 : r;  // a tensor's one scale, or the row's
    if (scale_dtype == "F32") {
      std::memcpy(&out.f32[r], stored + 4 * i, 4);
      continue;
    }
    uint16_t b;
    std::memcpy(&b, stored + 2 * i, 2);
    out.f32[r] = scale_dtype == "F16" ? HalfToFloat(b) : Bf16ToFloat(b);
  }
  return out;
}

HostTensor QuantizeRowsToFp8(const HostTensor& w) {
  const int64_t rows = w.shape[0], cols = w.size() / std::max<int64_t>(rows, 1);
  HostTensor out = HostTensor::Zeros(F8E4M3, w.shape);
  ParallelFor(rows, [&](int64_t row_begin, int64_t row_end) {
    std::vector<float> row(cols);
    for (int64_t r = row_begin; r < row_end; ++r) {
      float absmax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        row[c] = w.dtype == BF16 ? Bf16ToFloat(w.bf16[r * cols + c]) : w.Get(r * cols + c);
        absmax = std::max(absmax, std::fabs(row[c]));
      }
      // The least power of two with absmax / scale <= 448 (2^-126 for an all-zero row).
      int e = 0;
      std::frexp(absmax / kE4m3Max, &e);  // absmax / 448 = f * 2^e, f in [0.5, 1)
      float scale = absmax > 0 ? std::ldexp(1.0f, e) : std::ldexp(1.0f, -126);
      if (absmax > 0 && absmax / (scale / 2) <= kE4m3Max) scale /= 2;  // an exact power of two
      if (!std::isfinite(absmax)) scale = NAN;  // a non-finite weight stays one (packing refuses it by name)
      out.f32[r] = scale;
      const float inverse = 1.0f / scale;  // exact: a power of two
      for (int64_t c = 0; c < cols; ++c) out.f8[r * cols + c] = FloatToE4m3(row[c] * inverse);
    }
  });
  return out;
}

}  // namespace loom::graph
