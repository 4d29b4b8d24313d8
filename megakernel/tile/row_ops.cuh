// Row-wise operations on the rows of an Accumulator<N>, as attention's online
// softmax needs them: max, sum, exp2 of a scaled difference, scaling by a row
// vector, and conversion to the bf16 A-operand fragment of a following wgmma.
//
// A thread holds two rows of the 64 x N tile, Row(t, 0) and Row(t, 0) + 8
// (registers with (i / 2) % 2 = 0 and 1); the 4 lanes of a quad (lanes 4q ..
// 4q + 3) share those rows, so a row reduction is per-thread partials then two
// xor shuffles inside the quad.
#pragma once

#include <cuda_bf16.h>

#include "megakernel/tile/wgmma.cuh"

namespace loom::megakernel::tile {

// A value per row of the thread's two rows: v[0] for Row(t, 0), v[1] for Row(t, 0) + 8.
struct RowPair {
  float v[2];
};

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <uint32_t N>
__device__ __forceinline__ RowPair RowMax(const Accumulator<N>& a) {
  RowPair m{{-INFINITY, -INFINITY}};
#pragma unroll
  for (uint32_t i = 0; i < Accumulator<N>::kRegs; ++i) m.v[(i / 2) % 2] = fmaxf(m.v[(i / 2) % 2], a.d[i]);
  return {{QuadMax(m.v[0]), QuadMax(m.v[1])}};
}

template <uint32_t N>
__device__ __forceinline__ RowPair RowSum(const Accumulator<N>& a) {
  RowPair s{{0.0f, 0.0f}};
#pragma unroll
  for (uint32_t i = 0; i < Accumulator<N>::kRegs; ++i) s.v[(i / 2) % 2] += a.d[i];
  return {{QuadSum(s.v[0]), QuadSum(s.v[1])}};
}

// 2^x on the MUFU unit alone (ex2.approx.ftz: results below 2^-126 flush to zero, which no softmax weight
// notices); exp2f adds a denormal-range test and two multiplies around it.
__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// d = exp2((d - sub[row]) * scale), as one FFMA and one MUFU: softmax numerators with the log2(e) / sqrt(d) scale
// folded in.
template <uint32_t N>
__device__ __forceinline__ void Exp2Rows(Accumulator<N>& a, const RowPair& sub, float scale) {
  const float bias[2] = {-sub.v[0] * scale, -sub.v[1] * scale};
#pragma unroll
  for (uint32_t i = 0; i < Accumulator<N>::kRegs; ++i) a.d[i] = Exp2Approx(fmaf(a.d[i], scale, bias[(i / 2) % 2]));
}

// d *= s[row]
template <uint32_t N>
__device__ __forceinline__ void ScaleRows(Accumulator<N>& a, const RowPair& s) {
#pragma unroll
  for (uint32_t i = 0; i < Accumulator<N>::kRegs; ++i) a.d[i] *= s.v[(i / 2) % 2];
}

// The bf16 A-operand fragment of columns [16j, 16j + 16) of the tile, for MmaAsyncRegA: the fragment's
// registers hold (row, col) pairs in the same order as the accumulator's registers 8j .. 8j + 7, so the
// conversion is a pairwise pack (lower column in the low half).
template <uint32_t N>
__device__ __forceinline__ void ToOperandA(const Accumulator<N>& a, uint32_t j, uint32_t (&frag)[4]) {
#pragma unroll
  for (uint32_t q = 0; q < 4; ++q) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(a.d[8 * j + 2 * q], a.d[8 * j + 2 * q + 1]);
    frag[q] = *reinterpret_cast<const uint32_t*>(&pair);
  }
}

}  // namespace loom::megakernel::tile
