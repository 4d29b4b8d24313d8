// Rotary position embedding: the inverse-frequency table (with Llama-3 scaling)
// shared by the graph evaluator, the instruction references and the GPU upload.
#pragma once

#include <vector>

#include "graph/graph.pb.h"

namespace loom::graph {

// head_dim/2 inverse frequencies, as Hugging Face's rope init computes them.
std::vector<float> RopeInvFreq(const RopeAttrs& attrs);

// Rotates one head in place: pairs (j, j + head_dim/2) by angle position*inv_freq[j].
void ApplyRopeToHead(float* head, int head_dim, int position, const float* inv_freq);

}  // namespace loom::graph
