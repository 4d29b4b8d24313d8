#include "graph/dtype.h"

#include <array>
#include <cmath>
#include <cstring>

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

// `f` rounded to the nearest float16 value (ties to even), as a float: what a float16 multiply stores.
float RoundToHalf(float f) {
  const float a = std::fabs(f);
  if (!(a < 65520.0f)) return std::isnan(f) ? f : std::copysign(INFINITY, f);  // 65520 rounds up past the largest
  if (a < 6.103515625e-05f) return std::copysign(std::nearbyint(a * 16777216.0f) / 16777216.0f, f);  // 2^-24 steps
  uint32_t x;
  std::memcpy(&x, &a, 4);
  x += 0x0FFFu + ((x >> 13) & 1u);  // keep 10 mantissa bits, to nearest even (a carry moves the exponent up)
  x &= ~0x1FFFu;
  float r;
  std::memcpy(&r, &x, 4);
  return std::copysign(r, f);
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
  // On the float's bits (a model's worth of weights is quantized at load: frexp and nearbyint took ~1 s a billion).
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;       // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;      // 448 and above (infinity too): the largest, 448
  if (a < 0x3c800000u) {                         // below 2^-6: subnormal steps of 2^-9, ties to even
    float v;
    const float scaled = (std::memcpy(&v, &a, 4), v) * 512.0f;  // exact: a power of two
    return sign | static_cast<uint8_t>(std::nearbyint(scaled));  // 8 is 2^-6, the least normal: the same bits
  }
  // Normal: the top 3 of 23 mantissa bits, rounded to nearest even (a carry moves into the exponent), rebiased.
  const uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - ((127u - 7u) << 3));
}

int DTypeSize(DType dtype) {
  switch (dtype) {
    case BF16: return 2;
    case F32: return 4;
    case I32: return 4;
    case F8E4M3: return 1;
    case I4: return 1;  // two values a byte: schedule tensors of packed int4 weights are shaped in bytes
    default: return 0;
  }
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case BF16: return "bf16";
    case F32: return "f32";
    case I32: return "i32";
    case F8E4M3: return "fp8-e4m3";
    case I4: return "int4";
    default: return "unspecified";
  }
}

}  // namespace loom::graph
