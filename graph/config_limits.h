// The largest value of each shape field of a model configuration Loom accepts (config.json of every family).
// Far above every published checkpoint (Llama 3.1 405B: 126 layers, hidden 16384, intermediate 53248, 128 heads;
// vocabularies up to ~262k; Llama 4 Scout: 10M positions), so no real model meets them, while a value past them (a
// typo, "1e9") is refused by field at once: the graph and the weight tables grow with these fields, and a billion
// layers exhausts the host long before any weight is read.
#pragma once

namespace loom::graph {

constexpr int kMaxLayers = 1024;
constexpr int kMaxWidth = 1 << 16;         // hidden_size
constexpr int kMaxIntermediate = 1 << 19;  // intermediate_size
constexpr int kMaxVocab = 1 << 22;
constexpr int kMaxHeads = 1024;  // query or KV heads
constexpr int kMaxHeadDim = 1024;
constexpr int kMaxPositions = 1 << 26;  // max_position_embeddings
constexpr int kMaxConvKernel = 1024;    // a gated-conv LM's conv_kernel

}  // namespace loom::graph
