#include "graph/dtype.h"

#include <cmath>

namespace loom::graph {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

int DTypeSize(DType dtype) {
  switch (dtype) {
    case BF16: return 2;
    case F32: return 4;
    case I32: return 4;
    default: return 0;
  }
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case BF16: return "bf16";
    case F32: return "f32";
    case I32: return "i32";
    default: return "unspecified";
  }
}

}  // namespace loom::graph
