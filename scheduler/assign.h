// SM assignment policies: which SM runs each node of a Program, and in what
// order. Every policy produces queues that cannot deadlock: each queue lists
// its nodes in an order consistent with one global execution of the DAG.
//   ROUND_ROBIN   node i of the step -> SM i mod num_sms, in program order
//   LPT           per group, longest node first onto the least-loaded SM so far
//   CRITICAL_PATH list scheduling: the ready node with the longest path to the
//                 end of the step goes to the SM where it can start first
#pragma once

#include <vector>

#include "scheduler/program.h"

namespace loom::scheduler {

// Node indices per SM, in queue order. Uses Node::cost_ns and the cost model's barrier latency.
std::vector<std::vector<int>> AssignToSms(const Program& program, const CompileOptions& options);

}  // namespace loom::scheduler
