// What graph/quantization.cc (compressed-tensors, the dispatch) and graph/quantization_hub.cc (AutoAWQ's and
// GPTQ's formats) share. Internal to graph/.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/quantization.h"
#include "nlohmann/json.hpp"

namespace loom::graph::quantization_internal {

// `<path>: field 'quantization_config.<field>' = <value>: <why>`.
absl::Status Refuse(const std::string& path, const std::string& field, const nlohmann::json& value,
                    const std::string& why);
// The first key of `object` outside `known`, refused (a field Loom does not know may change the math).
absl::Status OnlyKnownKeys(const nlohmann::json& object, const std::set<std::string>& known, const std::string& path,
                           const std::string& prefix);
bool IsNull(const nlohmann::json& object, const std::string& key);
// An `ignore` pattern matching module names that contain `part`.
std::string ContainsPattern(const std::string& part);
std::string Shape(const std::vector<int64_t>& s);

// The stored tensors of one quantized weight.
struct Parts {
  StoredTensor values, scale, zero_point, shape, g_idx;
  int64_t groups = 0;  // scales per row (1 for channel and tensor)
};
// The stored tensors of the quantized weight `weight` under scheme `s`, checked (names, dtypes, shapes): refusals
// name the file, tensor and field (quantization.cc).
absl::StatusOr<Parts> FindParts(const std::string& weight, int64_t rows, int64_t cols, const WeightScheme& s,
                                const TensorLookup& lookup);
using NeedFn = std::function<absl::StatusOr<StoredTensor>(const std::string& suffix)>;
using BadFn = std::function<absl::Status(const StoredTensor& t, const std::string& suffix, const std::string& why)>;

// quantization_hub.cc: `quant_method` "awq" and "gptq", and their WeightScheme formats ("awq-gemm", "gptq",
// "gptq-v2").
absl::StatusOr<QuantizationConfig> ParseAwqConfig(const nlohmann::json& q, const std::string& path);
absl::StatusOr<QuantizationConfig> ParseGptqConfig(const nlohmann::json& q, const std::string& path);
bool IsHubFormat(const std::string& format);
absl::StatusOr<Parts> FindHubParts(const std::string& weight, int64_t rows, int64_t cols, const WeightScheme& s,
                                   const NeedFn& need, const BadFn& bad);
// The weight, (q - z) * scale rounded in the scale's dtype (float16 where `half`), then to bf16; `scales` are the
// stored [groups, rows] as floats.
void ReadHubWeight(const Parts& p, int64_t rows, int64_t cols, const WeightScheme& s, const std::vector<float>& scales,
                   bool half, HostTensor* out);
// The 4-bit weight as stored, into an I4 HostTensor sized [rows, cols] with `p.groups` groups a row (zeroed values):
// each value's nibble, each group's zero point and 16-bit scale (a group's columns by index: no act-order).
void ReadHubInt4(const Parts& p, int64_t rows, int64_t cols, const WeightScheme& s, HostTensor* out);

}  // namespace loom::graph::quantization_internal
