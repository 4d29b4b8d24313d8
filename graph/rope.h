// Rotary position embedding: the rope table (inverse frequencies with Llama-3,
// linear or YaRN scaling, and the cos/sin attention factor) shared by the graph
// evaluator, the instruction references and the GPU upload.
#pragma once

#include <vector>

#include "graph/graph.pb.h"

namespace loom::graph {

// head_dim/2 inverse frequencies, as Hugging Face's rope init functions compute them.
std::vector<float> RopeInvFreq(const RopeAttrs& attrs);

// The factor cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
float RopeAttentionFactor(const RopeAttrs& attrs);

// The rope table an instruction reads: RopeInvFreq, then RopeAttentionFactor
// (head_dim/2 + 1 floats).
std::vector<float> RopeTable(const RopeAttrs& attrs);

// Rotates one head in place: pairs (j, j + head_dim/2) by angle position*table[j],
// cos and sin multiplied by table[head_dim/2].
void ApplyRopeToHead(float* head, int head_dim, int position, const float* table);

}  // namespace loom::graph
