// Decode waits observed in the data (instructions/instruction.h "Step tags").
//
// A tensor T is tagged when every instruction that names T is one of
//   - a writer that can tag what it stores: MATVEC with the store, residual-add or SiLU-mul epilogue (out = T),
//     ATTN_PARTIAL's fused merge (out = T), ATTN_REDUCE (out = T) or EMBED (out = T); an ATTN_PARTIAL without the
//     fused merge (its heads of T = partial_o or partial_ml);
//   - a MATVEC reading all of T as its input, or reading T as its epilogue's residual; an ATTN_REDUCE reading its
//     heads of T as partial_o or partial_ml;
// and the writers store every element of T exactly once per step (ATTN_PARTIAL's merge: one split of each KV head
// does, at run time). Then a MATVEC's or ATTN_REDUCE's full-count wait on a barrier whose signallers are exactly T's
// writers is observed in the data: the reader reads T until every value it needs carries the step's tag, and every
// reader of T validates the tags it reads, so no read of T relies on a chain of acquires that an observed wait would
// break. An ARGMAX_REDUCE storing the next step's EMBED row into T (its embed_out) is neither: it tags that row with
// the next step's tag where T is tagged (the step's last instruction, after every reader of T in the step).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "instructions/instruction.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

// Elements of each tensor of a table (a Program's or a Schedule's), by id.
template <typename Tensors>
std::vector<uint64_t> TensorElements(const Tensors& tensors) {
  std::vector<uint64_t> elements;
  for (const Tensor& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape()) n *= static_cast<uint64_t>(d);
    elements.push_back(n);
  }
  return elements;
}

// Sets the in_data waits and the tag flags of one decode step's instructions (any order); clears any set before.
// tensor_elements[id]: elements of tensor id. Returns how many waits are observed in the data.
int MarkDataWaits(const std::vector<isa::Instruction*>& step, const std::vector<uint64_t>& tensor_elements);

// Refuses marks MarkDataWaits would not set (a wait in the data on a barrier other instructions also signal, a
// writer that cannot tag, a reader that would not check the tags) or an observed tensor whose writers or readers
// lack their flags. Errors name the instruction by where[i].
absl::Status CheckDataWaits(const std::vector<const isa::Instruction*>& step,
                            const std::vector<uint64_t>& tensor_elements,
                            const std::vector<std::string>& where);

}  // namespace loom::scheduler
