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
#include "runtime/gpu_backend.h"
#include "megakernel/tile/tile_selftest.h"
#include "tests/relative_error.h"

namespace loom::megakernel::tile {
namespace {

using namespace ::loom::runtime;  // the runtime the tests drive

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

// One query tile of causal flash attention: key tiles streamed with an online softmax in registers (S = Q·Kᵀ
// on wgmma, causal mask, running max and sum, output rescaled, P as bf16 A fragments, O += P·V on wgmma), at
// several context lengths and query positions (tiles crossing the diagonal, tiles past it skipped). The
// reference rounds P to bf16 as the device does before P·V, with the row sums of the unrounded P.
TEST(TileGpu, CausalFlashAttentionQueryTile) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << why;
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  constexpr uint32_t kD = 64;
  struct Case { uint32_t keys, q0; float spread; };
  for (const Case& c : {Case{64, 0, 0.5f}, Case{64, 0, 4.0f}, Case{192, 128, 2.0f}, Case{512, 448, 2.0f},
                        Case{512, 200, 4.0f}, Case{512, 37, 1.0f}}) {
    std::vector<uint16_t> q(64 * kD), k(c.keys * kD), v(c.keys * kD), vt(kD * c.keys);
    for (uint16_t& x : q) x = graph::FloatToBf16(dist(rng) * c.spread);
    for (uint16_t& x : k) x = graph::FloatToBf16(dist(rng));
    for (uint16_t& x : v) x = graph::FloatToBf16(dist(rng));
    for (uint32_t key = 0; key < c.keys; ++key) {
      for (uint32_t d = 0; d < kD; ++d) vt[d * c.keys + key] = v[key * kD + d];
    }
    const float scale = 0.125f;
    absl::StatusOr<std::vector<float>> o = RunAttentionTile(
        isa::PackSwizzled(q.data(), 64, kD, 64, isa::Swizzle::k128B),
        isa::PackSwizzled(k.data(), c.keys, kD, 64, isa::Swizzle::k128B),
        isa::PackSwizzled(vt.data(), kD, c.keys, 64, isa::Swizzle::k128B), c.keys, c.q0, scale);
    ASSERT_TRUE(o.ok()) << o.status();
    std::vector<float> want(64 * kD);
    for (uint32_t i = 0; i < 64; ++i) {
      const uint32_t visible = c.q0 + i + 1;
      std::vector<float> s(visible);
      float max = -INFINITY;
      for (uint32_t j = 0; j < visible; ++j) {
        float acc = 0.0f;
        for (uint32_t d = 0; d < kD; ++d) acc += graph::Bf16ToFloat(q[i * kD + d]) * graph::Bf16ToFloat(k[j * kD + d]);
        s[j] = acc;
        max = std::max(max, acc);
      }
      float sum = 0.0f;
      for (float& x : s) sum += (x = std::exp2((x - max) * scale * 1.4426950408889634f));
      for (uint32_t d = 0; d < kD; ++d) {
        float acc = 0.0f;
        for (uint32_t j = 0; j < visible; ++j) {
          acc += graph::Bf16ToFloat(graph::FloatToBf16(s[j])) * graph::Bf16ToFloat(v[j * kD + d]);
        }
        want[i * kD + d] = acc / sum;
      }
    }
    EXPECT_LE(RelativeError(*o, want), 2e-3) << "keys " << c.keys << " q0 " << c.q0 << " seed " << seed;
  }
}

}  // namespace
}  // namespace loom::megakernel::tile
