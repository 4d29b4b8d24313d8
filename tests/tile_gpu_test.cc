// The tile layer on the tensor cores: swizzled slab images (as the packing plan
// writes them) read by wgmma through the descriptors of megakernel/tile/, for
// every swizzle width, 64/128/256-column tiles, one and two consumer
// warpgroups and several K; fresh random bf16 data, poisoned outputs, against
// a float32 CPU product.
#include <random>

#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "gtest/gtest.h"
#include "instructions/swizzle.h"
#include "megakernel/gpu_backend.h"
#include "megakernel/tile/tile_selftest.h"
#include "tests/relative_error.h"

namespace loom::megakernel::tile {
namespace {

TEST(TileGpu, WgmmaProductsOfSwizzledSlabs) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << why;
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (isa::Swizzle s : {isa::Swizzle::k128B, isa::Swizzle::k64B, isa::Swizzle::k32B}) {
    for (uint32_t warpgroups : {1u, 2u}) {
      for (uint32_t n : {64u, 128u, 256u}) {
        for (uint32_t k : {64u, 256u}) {
          const uint32_t m = 64 * warpgroups;
          std::vector<uint16_t> a(uint64_t{m} * k), b(uint64_t{n} * k);
          for (uint16_t& v : a) v = graph::FloatToBf16(dist(rng));
          for (uint16_t& v : b) v = graph::FloatToBf16(dist(rng));
          absl::StatusOr<std::vector<float>> c =
              RunTileProduct(isa::PackSwizzled(a.data(), m, k, m, s), isa::PackSwizzled(b.data(), n, k, n, s),
                             warpgroups, n, k, s);
          const std::string what = absl::StrCat(static_cast<int>(s), "B swizzle, M ", m, " N ", n, " K ", k,
                                                " seed ", seed);
          ASSERT_TRUE(c.ok()) << what << ": " << c.status();
          std::vector<float> want(uint64_t{m} * n);
          for (uint32_t i = 0; i < m; ++i) {
            for (uint32_t j = 0; j < n; ++j) {
              float acc = 0.0f;
              for (uint32_t x = 0; x < k; ++x) {
                acc += graph::Bf16ToFloat(a[uint64_t{i} * k + x]) * graph::Bf16ToFloat(b[uint64_t{j} * k + x]);
              }
              want[uint64_t{i} * n + j] = acc;
            }
          }
          EXPECT_LE(RelativeError(*c, want), 1e-5) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::megakernel::tile
