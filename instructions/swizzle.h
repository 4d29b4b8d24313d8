// The swizzled shared-memory layouts wgmma reads without bank conflicts: part of
// the instruction set, because the host packs tensor-core operands into exactly
// this byte image (one bulk copy fills a page) and the device's tile layer
// (megakernel/tile/) builds its descriptors for it. Compiles under nvcc and g++.
//
// A swizzled operand is K-major: each row holds kRowBytes of K (64, 32 or 16
// bf16), rows are kRowBytes apart, and inside every atom of 8 rows the 16-byte
// chunk c of row r sits at chunk c ^ f(r):
//   128B: f(r) = r % 8          (CuTe Swizzle<3,4,3>; atom 1024 bytes)
//    64B: f(r) = (r / 2) % 4    (Swizzle<2,4,3>;     atom  512 bytes)
//    32B: f(r) = (r / 4) % 2    (Swizzle<1,4,3>;     atom  256 bytes)
// which is one formula on the linear byte offset o = r * kRowBytes + b:
//   o ^ (((o >> 7) & (kRowBytes / 16 - 1)) << 4).
#pragma once

#include <cstdint>
#include <vector>

#include "instructions/instruction.h"  // LOOM_HD

namespace loom::isa {

enum class Swizzle : uint32_t { k32B = 32, k64B = 64, k128B = 128 };

template <Swizzle S>
struct SwizzleTraits {
  static constexpr uint32_t kRowBytes = static_cast<uint32_t>(S);
  static constexpr uint32_t kRowElems = kRowBytes / 2;  // bf16 of K per row
  static constexpr uint32_t kAtomRows = 8;
  static constexpr uint32_t kAtomBytes = kAtomRows * kRowBytes;  // the descriptor's stride byte offset
  // The descriptor's layout field (PTX ISA, wgmma matrix descriptor bits 62-63).
  static constexpr uint64_t kDescriptorMode = S == Swizzle::k128B ? 1 : S == Swizzle::k64B ? 2 : 3;
  static_assert(kRowBytes == 32 || kRowBytes == 64 || kRowBytes == 128);
};

// Byte offset, inside a tile whose base is aligned to its atom, of byte `b` of row `r`.
template <Swizzle S>
LOOM_HD constexpr uint32_t SwizzledOffset(uint32_t r, uint32_t b) {
  constexpr uint32_t kRowBytes = SwizzleTraits<S>::kRowBytes;
  const uint32_t o = r * kRowBytes + b;
  return o ^ (((o >> 7) & (kRowBytes / 16 - 1)) << 4);
}

// The swizzle of every chunk is a permutation inside its atom (so a tile is
// never larger than its rows times kRowBytes).
static_assert(SwizzledOffset<Swizzle::k128B>(0, 16) == 16 && SwizzledOffset<Swizzle::k128B>(1, 0) == 128 + 16 &&
              SwizzledOffset<Swizzle::k128B>(7, 112) == 7 * 128 + 0);
static_assert(SwizzledOffset<Swizzle::k64B>(2, 0) == 2 * 64 + 16 && SwizzledOffset<Swizzle::k64B>(1, 16) == 64 + 16);
static_assert(SwizzledOffset<Swizzle::k32B>(4, 0) == 4 * 32 + 16 && SwizzledOffset<Swizzle::k32B>(3, 16) == 3 * 32 + 16);

// Byte offset of element (r, c) in a PackSwizzled image with 128-byte swizzle (the tensor-core operand layout),
// usable on the device: tiles of `tile_rows` rows, ceil(cols / 64) slabs each.
LOOM_HD uint64_t Swizzled128Offset(uint32_t cols, uint32_t tile_rows, uint32_t r, uint32_t c) {
  constexpr uint32_t kRowElems = SwizzleTraits<Swizzle::k128B>::kRowElems;
  const uint64_t slabs = (cols + kRowElems - 1) / kRowElems;
  return (r / tile_rows * slabs + c / kRowElems) * (uint64_t{tile_rows} * 128) +
         SwizzledOffset<Swizzle::k128B>(r % tile_rows, (c % kRowElems) * 2);
}

// Packs a row-major bf16 matrix [rows, cols] as swizzled K-slabs: for each tile
// of `tile_rows` rows (zero rows past `rows`), its ceil(cols / kRowElems) slabs
// in K order (zero columns past `cols`), each tile_rows * kRowBytes bytes.
// tile_rows must be a multiple of 8 (whole atoms).
std::vector<uint16_t> PackSwizzled(const uint16_t* matrix, uint32_t rows, uint32_t cols, uint32_t tile_rows,
                                   Swizzle swizzle);
// Byte offset in a PackSwizzled image of element (r, c) of the matrix.
uint64_t SwizzledImageOffset(uint32_t cols, uint32_t tile_rows, Swizzle swizzle, uint32_t r, uint32_t c);
// Element (r, c) of the matrix PackSwizzled was given, read back from its image.
uint16_t UnpackSwizzled(const std::vector<uint16_t>& image, uint32_t rows, uint32_t cols, uint32_t tile_rows,
                        Swizzle swizzle, uint32_t r, uint32_t c);

}  // namespace loom::isa
