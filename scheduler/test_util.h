// Shared by scheduler tests: a compiled random:tiny schedule.
#pragma once

#include "graph/model.h"
#include "gtest/gtest.h"
#include "scheduler/compiler.h"

namespace loom::scheduler {

inline Schedule CompileTiny(CompileOptions options = {}) {
  graph::ModelOptions mo;
  mo.max_seq = 64;
  mo.load_weights = false;
  absl::StatusOr<graph::Model> m = graph::LoadModel("random:tiny", mo);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<Schedule> s = Compile(m->graph, "random:tiny", options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule();
}

}  // namespace loom::scheduler
