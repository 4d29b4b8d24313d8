// Resize in linear mode against ONNX's own expected outputs: the backend data's linear cases (half_pixel up and
// down, align_corners up and down, pytorch_half_pixel to sizes), whose scales / sizes the data feeds as graph inputs,
// given here as initializers from their data files; on the oracle and lowered on the CPU VM (and the GPU where there
// is one). Skips, saying why, without Debian's libonnx-testdata (LOOM_ONNX_TESTDATA names another copy).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"
#include "tests/onnx_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using namespace onnx_test;  // NOLINT: the tests' helpers

std::string Bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(OnnxImport, LinearResizeMatchesTheBackendData) {
  const std::string data = std::getenv("LOOM_ONNX_TESTDATA") != nullptr ? std::getenv("LOOM_ONNX_TESTDATA")
                                                                        : "/usr/share/libonnx-testdata/data";
  if (!fs::is_directory(data)) GTEST_SKIP() << data << " is missing (apt-get install libonnx-testdata)";
  for (const std::string name :
       {"test_resize_upsample_scales_linear", "test_resize_upsample_scales_linear_align_corners",
        "test_resize_downsample_scales_linear", "test_resize_downsample_scales_linear_align_corners",
        "test_resize_downsample_sizes_linear_pytorch_half_pixel"}) {
    const fs::path dir = fs::path(data) / "node" / name;
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    onnx::ModelProto proto;
    ASSERT_TRUE(proto.ParseFromString(Bytes(dir / "model.onnx"))) << name;
    // Inputs past X (roi, scales, sizes) become initializers of their data set's values.
    onnx::GraphProto* g = proto.mutable_graph();
    for (int k = g->input_size() - 1; k >= 1; --k) {
      onnx::TensorProto t;
      ASSERT_TRUE(t.ParseFromString(Bytes(dir / "test_data_set_0" / ("input_" + std::to_string(k) + ".pb")))) << name;
      t.set_name(g->input(k).name());
      *g->add_initializer() = t;
      g->mutable_input()->DeleteSubrange(k, 1);
    }
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), name + ".onnx");
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    absl::StatusOr<graph::HostTensor> x = graph::ReadOnnxTensor((dir / "test_data_set_0" / "input_0.pb").string());
    absl::StatusOr<graph::HostTensor> want = graph::ReadOnnxTensor((dir / "test_data_set_0" / "output_0.pb").string());
    ASSERT_TRUE(x.ok() && want.ok()) << name;
    const std::vector<float> y = Evaluate(*m, *x, 0);
    ASSERT_EQ(static_cast<int64_t>(y.size()), want->size()) << name;
    for (int64_t i = 0; i < want->size(); ++i) {
      EXPECT_NEAR(y[i], want->Get(i), 1e-5 + 1e-4 * std::fabs(want->Get(i))) << name << " at " << i;
    }
    for (const std::vector<float>& lowered : RunLowered(*m, *x, name + ".onnx")) {
      ASSERT_EQ(lowered.size(), y.size()) << name;
      // The GPU multiplies in bf16 (the interpolation matrices are MATMUL operands): within 1e-2 of the range.
      for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(lowered[i], y[i], 1e-2 * (1 + std::fabs(y[i]))) << name;
    }
  }
}

}  // namespace
}  // namespace loom
