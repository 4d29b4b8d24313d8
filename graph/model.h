// Loading a model by spec: "random:<preset>" or "random:<config.json>" (that
// architecture with deterministic random weights; "random:gated-conv-*": the
// gated depthwise-conv LM of graph/families/gated_conv.h), a
// Hugging Face folder (config.json + model.safetensors or a sharded index) of a
// family in graph/families/ (or model_type "loom-gated-conv"), or an ONNX file
// (*.onnx, graph/onnx_import.h). Exporting writes a random model as such a folder.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "graph/decoder.h"
#include "graph/families/gated_conv.h"

namespace loom::graph {

struct ModelOptions {
  int max_seq = 0;           // KV-cache capacity; 0: min(max_position_embeddings, 4096), or `request` if larger
  // Tokens a run will hold (prompt + generated): with max_seq 0, the KV cache grows to hold them, up to
  // max_position_embeddings (a decoder's; 0: no request).
  int request = 0;
  bool load_weights = true;  // false: config and graph only (compiling needs no weights)
  uint64_t seed = 0x10057u;  // for random: models
  // Packed images of the weights the caller will build to run the model (1: a decode schedule, 2: with its
  // prefill pass's), counted with the KV cache in the host-memory check made before any weight is loaded; 0
  // checks the weights alone (PackWeights checks its own region before allocating it).
  int packed_copies = 0;
  // Random decoders: "FP8" quantizes every projection (not the LM head) to e4m3 with a scale per row
  // (QuantizeRowsToFp8), "W4A16" to symmetric int4 with a bf16 scale per group_size columns
  // (QuantizeGroupsToInt4), as a checkpoint of that scheme would hold; "" keeps them bf16.
  std::string scheme;
  int group_size = 128;
  // Decoders' KV cache: F32 (the default) or BF16 (half its memory and of the bytes decode attention reads a position;
  // K and V rounded to nearest even as they are appended). Other models refuse BF16.
  DType kv_dtype = F32;
  // Checkpoints: widen every quantized weight to bf16 as it is read, even those Loom computes with as stored (FP8
  // with a scale per row or tensor).
  bool widen_quantized = false;
  // When set (with load_weights), each weight is handed to it as it is read or made, in DecoderWeightShapes' order,
  // and none is kept in Model::weights: a caller that writes each one out (a streamed `loom quantize`) holds one at a
  // time, and the host-memory check counts the largest instead of them all.
  std::function<absl::Status(const std::string& name, HostTensor weight)> weight_visitor;
};

struct Model {
  std::string spec;
  DecoderConfig config;
  // What the caller should tell the user: config fields transformers does not
  // read for this family (ignored), weights rounded to bf16.
  std::vector<std::string> notes;
  Graph graph;
  WeightStore weights;  // empty unless ModelOptions::load_weights
  std::optional<GatedConvConfig> gated_conv;  // family "gated-conv" (config then holds its sizes for messages)
};

// "f32" or "bf16" (a --kv_dtype flag's, loom.load's kv_dtype) as ModelOptions::kv_dtype; anything else refused by
// name.
absl::StatusOr<DType> ParseKvDtype(const std::string& name);

// Refuses, before building a graph or reading a weight, a config with an implausible field (config_limits.h), a
// folder whose files lack a weight the config names, and weights (plus options.packed_copies) the host's free
// memory cannot hold (ResourceExhausted: "needs X GB of host memory, has Y GB free").
absl::StatusOr<Model> LoadModel(const std::string& spec, const ModelOptions& options = {});

// Writes config.json and model.safetensors into `dir` (created if missing), a
// folder transformers loads as the config's family. FP8 weights are written as float32, each value times its row's
// scale, int4 weights as bf16 (exact): the weights Loom computes with, unrounded.
absl::Status ExportModel(const Model& model, const std::string& dir);

}  // namespace loom::graph
