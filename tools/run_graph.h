// `loom run` on a general graph (an ONNX import, scheduler::CompileGraphPass): inputs from .npy files or random,
// the pass on the CPU VM or the GPU, every output summarised (and written as .npy with --out), --check against
// the op-by-op float32 oracle.
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"
#include "scheduler/schedule.pb.h"

namespace loom::tools {

struct GraphRunFlags {
  std::string backend;  // cpu | gpu
  std::string input;    // "random", or name=file.npy,... (a lone file.npy for a graph of one input)
  std::string out;      // folder for <output>.npy files, or empty
  std::string trace;    // GPU: a Chrome trace JSON of the last run here, and its summary printed
  bool check = false;
  int repeat = 1;
  uint64_t seed = 0;
};

// Returns the process exit code (errors printed as one line).
int RunGraph(const graph::Model& model, const scheduler::Schedule& pass, const GraphRunFlags& flags);

}  // namespace loom::tools
