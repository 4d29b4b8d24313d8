// The WEIGHTS region packed a window at a time (PackWeightsInWindows) is the region PackWeights builds, byte for
// byte, in windows that cover it once, in offset order, each within the window size unless one tensor is larger.
#include "scheduler/packing.h"

#include <algorithm>
#include <cstring>

#include "graph/model.h"
#include "gtest/gtest.h"
#include "scheduler/compiler.h"

namespace loom::scheduler {
namespace {

TEST(Packing, WindowsConcatenateToTheRegion) {
  for (const char* scheme : {"", "W4A16"}) {
    graph::ModelOptions mo;
    mo.max_seq = 64;
    mo.scheme = scheme;
    absl::StatusOr<graph::Model> m = graph::LoadModel("random:tiny", mo);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<Schedule> s = Compile(m->graph, m->spec, CompileOptions());
    ASSERT_TRUE(s.ok()) << s.status();
    absl::StatusOr<std::vector<uint8_t>> region = PackWeights(*s, m->weights);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_EQ(region->size(), s->weight_bytes());
    uint64_t largest = 0;
    for (const Tensor& t : s->tensors()) largest = t.region() == WEIGHTS ? std::max(largest, t.bytes()) : largest;
    for (uint64_t window : {uint64_t{1}, uint64_t{4096}, largest, region->size() / 3, region->size()}) {
      std::vector<uint8_t> joined;
      int windows = 0;
      absl::Status st = PackWeightsInWindows(*s, m->weights, window,
                                             [&](uint64_t offset, const uint8_t* data, uint64_t bytes) {
                                               EXPECT_EQ(offset, joined.size()) << "windows in offset order, no gap";
                                               joined.insert(joined.end(), data, data + bytes);
                                               ++windows;
                                               return absl::OkStatus();
                                             });
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_TRUE(joined == *region) << scheme << ", windows of " << window << " bytes";
      if (window == region->size()) EXPECT_EQ(windows, 1);
      if (window < region->size() / 2) EXPECT_GT(windows, 2) << window;
    }
    // A sink's error stops the packing and is returned.
    absl::Status st = PackWeightsInWindows(*s, m->weights, 4096, [](uint64_t, const uint8_t*, uint64_t) {
      return absl::ResourceExhaustedError("device full");
    });
    EXPECT_EQ(st.message(), "device full");
  }
}

}  // namespace
}  // namespace loom::scheduler
