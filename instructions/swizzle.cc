#include "instructions/swizzle.h"

namespace loom::isa {
namespace {

uint32_t RowBytes(Swizzle s) { return static_cast<uint32_t>(s); }

}  // namespace

uint64_t SwizzledImageOffset(uint32_t cols, uint32_t tile_rows, Swizzle s, uint32_t r, uint32_t c) {
  const uint32_t row_elems = RowBytes(s) / 2;
  const uint64_t slabs = (cols + row_elems - 1) / row_elems;
  const uint64_t slab_bytes = uint64_t{tile_rows} * RowBytes(s);
  const uint64_t tile = r / tile_rows, slab = c / row_elems;
  const uint32_t rr = r % tile_rows, b = (c % row_elems) * 2;
  uint32_t in_slab = 0;
  switch (s) {
    case Swizzle::k128B: in_slab = SwizzledOffset<Swizzle::k128B>(rr, b); break;
    case Swizzle::k64B: in_slab = SwizzledOffset<Swizzle::k64B>(rr, b); break;
    case Swizzle::k32B: in_slab = SwizzledOffset<Swizzle::k32B>(rr, b); break;
  }
  return (tile * slabs + slab) * slab_bytes + in_slab;
}

std::vector<uint16_t> PackSwizzled(const uint16_t* matrix, uint32_t rows, uint32_t cols, uint32_t tile_rows,
                                   Swizzle swizzle) {
  const uint32_t row_elems = RowBytes(swizzle) / 2;
  const uint64_t tiles = (rows + tile_rows - 1) / tile_rows, slabs = (cols + row_elems - 1) / row_elems;
  std::vector<uint16_t> image(tiles * slabs * tile_rows * row_elems, 0);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t c = 0; c < cols; ++c) {
      image[SwizzledImageOffset(cols, tile_rows, swizzle, r, c) / 2] = matrix[uint64_t{r} * cols + c];
    }
  }
  return image;
}

uint16_t UnpackSwizzled(const std::vector<uint16_t>& image, uint32_t rows, uint32_t cols, uint32_t tile_rows,
                        Swizzle swizzle, uint32_t r, uint32_t c) {
  (void)rows;
  return image[SwizzledImageOffset(cols, tile_rows, swizzle, r, c) / 2];
}

}  // namespace loom::isa
