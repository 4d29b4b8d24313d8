#include "graph/dtype.h"

#include <array>
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

namespace {
float DecodeE4m3(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, mant = b & 7;
  float v;
  if (exp == 15 && mant == 7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant / 8 * 2^-6
  } else {
    v = std::ldexp(1.0f + mant / 8.0f, exp - 7);
  }
  return sign ? -v : v;
}
}  // namespace

float E4m3ToFloat(uint8_t b) {
  static const auto* const kTable = [] {  // the oracle decodes every weight of an FP8 model once a step
    auto* t = new std::array<float, 256>;
    for (int i = 0; i < 256; ++i) (*t)[i] = DecodeE4m3(static_cast<uint8_t>(i));
    return t;
  }();
  return (*kTable)[b];
}

uint8_t FloatToE4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7f;
  const float a = std::fmin(std::fabs(f), kE4m3Max);
  if (a < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // 2^-9 steps; 8 is 2^-6
  int e = 0;
  const float fraction = std::frexp(a, &e);  // a = fraction * 2^e, fraction in [0.5, 1)
  int exponent = e - 1 + 7;
  int mantissa = static_cast<int>(std::nearbyint((2 * fraction - 1) * 8));
  if (mantissa == 8) mantissa = 0, ++exponent;
  return sign | static_cast<uint8_t>(exponent << 3 | mantissa);  // 448 is exponent 15, mantissa 6: the largest
}

int DTypeSize(DType dtype) {
  switch (dtype) {
    case BF16: return 2;
    case F32: return 4;
    case I32: return 4;
    case F8E4M3: return 1;
    default: return 0;
  }
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case BF16: return "bf16";
    case F32: return "f32";
    case I32: return "i32";
    case F8E4M3: return "fp8-e4m3";
    default: return "unspecified";
  }
}

}  // namespace loom::graph
