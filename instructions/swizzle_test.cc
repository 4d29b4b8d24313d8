// The swizzled operand image: every element lands exactly once, padding is
// zero, and the layout is the one the PTX ISA gives for each swizzle width.
#include "instructions/swizzle.h"

#include <random>
#include <set>

#include "gtest/gtest.h"

namespace loom::isa {
namespace {

TEST(Swizzle, PackRoundTripsEveryElementWithRaggedEdges) {
  std::mt19937 rng(std::random_device{}());
  for (Swizzle s : {Swizzle::k128B, Swizzle::k64B, Swizzle::k32B}) {
    for (auto [rows, cols, tile_rows] : {std::tuple{64u, 64u, 64u}, {129u, 100u, 64u}, {7u, 33u, 8u}, {200u, 1000u, 128u}}) {
      std::vector<uint16_t> m(uint64_t{rows} * cols);
      for (uint16_t& v : m) v = static_cast<uint16_t>(1 + rng() % 65535);  // never 0: padding is
      const std::vector<uint16_t> image = PackSwizzled(m.data(), rows, cols, tile_rows, s);
      const uint32_t row_elems = static_cast<uint32_t>(s) / 2;
      const uint64_t expect = (rows + tile_rows - 1) / tile_rows * tile_rows * ((cols + row_elems - 1) / row_elems) *
                              row_elems;
      ASSERT_EQ(image.size(), expect);
      uint64_t nonzero = 0;
      for (uint16_t v : image) nonzero += v != 0;
      EXPECT_EQ(nonzero, m.size()) << "elements written twice or padding not zero";
      for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t c = 0; c < cols; ++c) {
          ASSERT_EQ(UnpackSwizzled(image, rows, cols, tile_rows, s, r, c), m[uint64_t{r} * cols + c])
              << static_cast<int>(s) << "B swizzle, element " << r << "," << c;
        }
      }
    }
  }
}

// The 16-byte chunks of an atom's 8 rows are a permutation of the atom (a row's chunks all stay in that row).
TEST(Swizzle, ChunksPermuteInsideTheirRow) {
  for (uint32_t r = 0; r < 8; ++r) {
    std::set<uint32_t> seen;
    for (uint32_t b = 0; b < 128; b += 16) {
      const uint32_t o = SwizzledOffset<Swizzle::k128B>(r, b);
      EXPECT_EQ(o / 128, r);
      EXPECT_EQ(o % 16, 0u);
      seen.insert(o);
    }
    EXPECT_EQ(seen.size(), 8u);
  }
  // The 128-byte pattern: chunk c of row r at chunk c ^ (r % 8).
  EXPECT_EQ(SwizzledOffset<Swizzle::k128B>(5, 3 * 16 + 2), 5 * 128 + (3 ^ 5) * 16 + 2);
  EXPECT_EQ(SwizzledOffset<Swizzle::k128B>(13, 0), 13 * 128 + (0 ^ 5) * 16);
}

}  // namespace
}  // namespace loom::isa
