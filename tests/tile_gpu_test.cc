// The tile layer on the tensor cores: swizzled slab images (as the packing plan
// writes them) read by wgmma through the descriptors of megakernel/tile/, for
// every swizzle width, 64/128/256-column tiles, one and two consumer
// warpgroups and several K; and one attention query tile (softmax on the
// accumulator rows, P·V with A from registers). Fresh random bf16 data,
// poisoned outputs, against float32 CPU references.
#include <algorithm>
#include <cmath>
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

// One query tile of attention: S = Q·Kᵀ on wgmma, softmax on the accumulator rows, P as bf16 A fragments in
// registers, O = P·V on wgmma. The reference rounds P to bf16 as the device does before P·V (the row sums are
// of the unrounded P, as on the device).
TEST(TileGpu, AttentionTileSoftmaxAndRegisterOperand) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << why;
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  constexpr uint32_t kN = 64;
  for (float spread : {0.5f, 4.0f}) {  // near-uniform and peaked softmax rows
    std::vector<uint16_t> q(kN * kN), k(kN * kN), v(kN * kN), vt(kN * kN);
    for (uint16_t& x : q) x = graph::FloatToBf16(dist(rng) * spread);
    for (uint16_t& x : k) x = graph::FloatToBf16(dist(rng));
    for (uint16_t& x : v) x = graph::FloatToBf16(dist(rng));
    for (uint32_t key = 0; key < kN; ++key) {
      for (uint32_t d = 0; d < kN; ++d) vt[d * kN + key] = v[key * kN + d];
    }
    const float scale = 0.125f;
    absl::StatusOr<std::vector<float>> o = RunAttentionTile(
        isa::PackSwizzled(q.data(), kN, kN, kN, isa::Swizzle::k128B),
        isa::PackSwizzled(k.data(), kN, kN, kN, isa::Swizzle::k128B),
        isa::PackSwizzled(vt.data(), kN, kN, kN, isa::Swizzle::k128B), scale);
    ASSERT_TRUE(o.ok()) << o.status();
    std::vector<float> want(kN * kN);
    for (uint32_t i = 0; i < kN; ++i) {
      std::vector<float> s(kN);
      float max = -INFINITY;
      for (uint32_t j = 0; j < kN; ++j) {
        float acc = 0.0f;
        for (uint32_t d = 0; d < kN; ++d) acc += graph::Bf16ToFloat(q[i * kN + d]) * graph::Bf16ToFloat(k[j * kN + d]);
        s[j] = acc;
        max = std::max(max, acc);
      }
      float sum = 0.0f;
      for (float& x : s) sum += (x = std::exp2((x - max) * scale * 1.4426950408889634f));
      for (uint32_t d = 0; d < kN; ++d) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < kN; ++j) {
          acc += graph::Bf16ToFloat(graph::FloatToBf16(s[j])) * graph::Bf16ToFloat(v[j * kN + d]);
        }
        want[i * kN + d] = acc / sum;
      }
    }
    EXPECT_LE(RelativeError(*o, want), 1e-4) << "spread " << spread << " seed " << seed;
  }
}

}  // namespace
}  // namespace loom::megakernel::tile
