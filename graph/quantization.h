// Weights a checkpoint stores quantized: config.json's `quantization_config` as compressed-tensors writes it
// (`quant_method: "compressed-tensors"`, what llmcompressor publishes), and the reading of each quantized
// projection back to the bf16 weight the library's own `decompress` gives (bit for bit: the integer or e4m3 value,
// minus the zero point, times the scale, rounded once in the scale's dtype).
//
// Read: weight-only schemes, `pack-quantized` integers of 1-8 bits (dense int32 packing; strategy group, channel or
// tensor; symmetric or with packed zero points) and `float-quantized` FP8 e4m3 (channel or tensor). Every field that
// changes the math is honoured or refused by name: activation quantization (`input_activations`), a quantized KV
// cache, sparsity, transforms, block strategies, compressed-tensors' act-order groups, dynamic weight scales. FP8
// weights with a scale per row or tensor (MATVEC_FP8) and 4-bit weights in groups (MATVEC_W4; also AWQ's and GPTQ's,
// quantization_hub.cc) are kept as stored (KeptDtype); every other scheme is widened to bf16 as it is read, and the
// caller says so.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "graph/safetensors.h"
#include "nlohmann/json.hpp"

namespace loom::graph {

// How one projection's weight is stored.
struct WeightScheme {
  std::string format;      // "pack-quantized" (integers in int32 words) or "float-quantized" (e4m3 bytes)
  bool is_float = false;   // e4m3 values, else signed integers
  int bits = 0;            // 1-8 (integers), 8 (e4m3)
  bool symmetric = true;   // false: a zero point per scale
  int group_size = 0;      // columns per scale; 0: one scale per row ("channel"); -1: one for the tensor
  bool act_order = false;  // GPTQ's desc_act: each column's group is g_idx[column], not column / group_size
  std::string Describe() const;  // e.g. "int4 weights, group 128, with zero points (pack-quantized)"
};

struct QuantizationConfig {
  struct Group {
    std::vector<std::string> targets;  // "Linear", module names, or "re:<regex>" (matched from the start)
    WeightScheme scheme;
  };
  std::vector<Group> groups;
  std::vector<std::string> ignore;  // modules kept unquantized, same patterns
  // The scheme of a linear module (a projection's weight name without ".weight"), nullopt where it is stored
  // unquantized; an error when two groups claim it.
  absl::StatusOr<std::optional<WeightScheme>> SchemeOf(const std::string& module) const;
};

// config.json's `quantization_config` (`path` names the file in errors: `field 'quantization_config.<key>' ...`).
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& q, const std::string& path);

// A stored tensor (the file that holds it and its header entry), found by name across a folder's files.
struct StoredTensor {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};
using TensorLookup = std::function<std::optional<StoredTensor>(const std::string& name)>;

// Checks the stored tensors of the quantized weight `weight` ("<module>.weight", `rows` x `cols` in the model)
// under `scheme`: names, dtypes and shapes, each refusal naming the file, tensor and field. Returns the bytes a
// read takes.
absl::StatusOr<uint64_t> CheckQuantizedWeight(const std::string& weight, int64_t rows, int64_t cols,
                                              const WeightScheme& scheme, const TensorLookup& lookup);
// Whether Loom computes with the scheme's weights as stored (not widened): FP8 e4m3 with a scale per row or per
// tensor (MATVEC_FP8).
inline bool KeptQuantized(const WeightScheme& s) { return s.is_float && s.bits == 8 && s.group_size <= 0; }
// The weight as stored, for a scheme KeptQuantized: an F8E4M3 HostTensor (e4m3 values, each row's scale in f32:
// a tensor scale repeated; bf16 and f16 scales are exact in f32).
absl::StatusOr<HostTensor> ReadFp8Weight(const std::string& weight, int64_t rows, int64_t cols,
                                         const WeightScheme& scheme, const TensorLookup& lookup);
// Round-to-nearest FP8 of a 2-D weight, a scale per row: the power of two at least absmax / 448 (so every q * scale
// is exact in bf16 as well: the same weight widened, for the prefill's tensor cores, loses nothing). A row holding
// a NaN or an infinity gets a NaN scale, so the weight is refused where every weight is checked (packing).
HostTensor QuantizeRowsToFp8(const HostTensor& w);

// The dtype Loom computes with a stored quantized weight in: F8E4M3 (KeptQuantized), I4 (4-bit integers packed by
// compressed-tensors, AWQ (GEMM) or GPTQ, with bf16 or float16 scales per group of a power of two >= 32 columns
// that divides K, no act-order: MATVEC_W4), or DTYPE_UNSPECIFIED where it is widened to bf16 as it is read. Reads
// only the header.
DType KeptDtype(const std::string& weight, int64_t rows, int64_t cols, const WeightScheme& scheme,
                const TensorLookup& lookup);
// The weight as stored, for a scheme KeptDtype keeps as I4: an I4 HostTensor (each value's nibble, its group's
// bf16 or float16 scale and zero point: 8 for a symmetric scheme), repacked into rows from AWQ's and GPTQ's
// packings.
absl::StatusOr<HostTensor> ReadInt4Weight(const std::string& weight, int64_t rows, int64_t cols,
                                          const WeightScheme& scheme, const TensorLookup& lookup);
// Round-to-nearest symmetric int4 of a 2-D weight, a bf16 scale per `group_size` columns: what `loom quantize
// --scheme=W4A16` writes (scale = absmax / 7.5 rounded to bf16, q = round(w / scale) clamped to [-8, 7], stored as
// q + 8 with zero point 8). A group holding a NaN or an infinity gets a NaN scale (packing refuses the weight).
HostTensor QuantizeGroupsToInt4(const HostTensor& w, int group_size);

// The weight widened to bf16 (CheckQuantizedWeight first).
absl::StatusOr<HostTensor> ReadQuantizedWeight(const std::string& weight, int64_t rows, int64_t cols,
                                               const WeightScheme& scheme, const TensorLookup& lookup);

}  // namespace loom::graph
