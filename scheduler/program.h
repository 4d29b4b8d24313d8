// The lowered form of one decode step: tile instructions in a topological
// order, with their waits and signals, plus every table the Schedule carries.
// Lowering produces it; SM assignment turns it into per-SM queues.
#pragma once

#include <string>
#include <vector>

#include "instructions/instruction.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

struct Node {
  isa::Instruction inst{};  // waits and signal filled in
  std::string op;           // graph op(s) it implements
  int group = 0;            // index into Program::groups: the lowered op it belongs to
  double cost_ns = 0;       // filled by the cost model
};

struct Program {
  std::vector<Node> nodes;  // every node's producers come before it
  std::vector<std::string> groups;
  std::vector<Barrier> barriers;
  std::vector<Tensor> tensors;  // offsets assigned by lowering
  std::vector<PackedWeight> packing;
  std::vector<Constant> constants;
  IoBinding io;
  uint32_t max_seq = 0;
  uint32_t vocab_size = 0;
  uint64_t weight_bytes = 0;
  uint64_t arena_bytes = 0;
};

// Producers of each node: the nodes that signal a barrier it waits on in the
// same step with the full count (the dependency edges the schedule guarantees).
std::vector<std::vector<int>> NodePredecessors(const Program& program);

}  // namespace loom::scheduler
