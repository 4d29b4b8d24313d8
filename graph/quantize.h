// `loom quantize`: round-to-nearest quantization of a decoder's projections, written as a compressed-tensors
// checkpoint (the format graph/quantization.h reads, and transformers and vLLM load): config.json with its
// `quantization_config`, model.safetensors with the packed projections and every other weight as bf16.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "graph/model.h"

namespace loom::graph {

struct QuantizeOptions {
  // "FP8": e4m3 weights, a bf16 scale per row (absmax / 448), float-quantized. "W4A16": int4, symmetric, a bf16
  // scale per `group_size` columns (absmax / 7.5), pack-quantized. "W8A16": int8, symmetric, a scale per row.
  std::string scheme;
  int group_size = 128;  // W4A16
};

// Writes `model` (a decoder loaded with its weights) quantized into `dir` (created if missing). The LM head, the
// embeddings and the norms stay bf16 (the LM head listed in `ignore`).
absl::Status QuantizeModel(const Model& model, const QuantizeOptions& options, const std::string& dir);
// The same for the model `spec` names (LoadModel's, with `options`), each weight quantized and written as it is read
// or made: the host holds one weight at a time. The file is bit for bit QuantizeModel's of the loaded model. `notes`:
// the loader's.
absl::Status QuantizeCheckpoint(const std::string& spec, const ModelOptions& options, const QuantizeOptions& quantize,
                                const std::string& dir, std::vector<std::string>* notes = nullptr);

}  // namespace loom::graph
