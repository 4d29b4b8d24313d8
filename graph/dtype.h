// Element types of Loom tensors and the bf16 <-> float32 conversions every
// host component uses (round-to-nearest-even, as the GPU's cvt.rn.bf16.f32).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.pb.h"

namespace loom::graph {

using Bf16Bits = uint16_t;

inline float Bf16ToFloat(Bf16Bits b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline Bf16Bits FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<Bf16Bits>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<Bf16Bits>(u >> 16);
}

// FP8 e4m3 ("fn": no infinities, 0x7f / 0xff are NaN) <-> float. FloatToE4m3 rounds to nearest, ties to even,
// saturating at +-448 (what a quantizer clamps to anyway).
float E4m3ToFloat(uint8_t b);
uint8_t FloatToE4m3(float f);
inline constexpr float kE4m3Max = 448.0f;

// IEEE half -> float (safetensors "F16" weights are converted to bf16 on load).
float HalfToFloat(uint16_t h);
// `f` rounded to the nearest float16 value (ties to even), as a float: what a float16 multiply stores (infinity past
// the largest float16).
float RoundToHalf(float f);

// Bytes per element of a dtype (I4: per byte of packed values); 0 for DTYPE_UNSPECIFIED.
int DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

}  // namespace loom::graph
