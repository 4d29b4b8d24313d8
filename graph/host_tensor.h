// HostTensor: a tensor's values on the host. Weights keep their bf16 bits (a 1B
// model stays 2.5 GB); activations, state and f32 weights are float32; ids are i32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "graph/dtype.h"
#include "graph/graph.pb.h"

namespace loom::graph {

struct HostTensor {
  DType dtype = DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::vector<float> f32;      // dtype F32; F8E4M3: the scale of each row (shape[0] of them)
  std::vector<uint16_t> bf16;  // dtype BF16; I4: the groups' scales, [N, groups] bf16 bits (float16 bits: half_scales)
  std::vector<int32_t> i32;    // dtype I32; I4: the groups' zero points (0..15), [N, groups]
  // dtype F8E4M3 (a LINEAR weight [N, K]): e4m3 bits; element (n, k) is e4m3(f8[n * K + k]) * f32[n], in f32.
  // dtype I4 (a LINEAR weight [N, K]): two 4-bit values u a byte, element i in byte i / 2 (the low nibble first);
  // element (n, k) is bf16((u - z) * s) with s, z its group's (group g = k / (K / groups)): the library's decompress
  // (with float16 scales rounded to float16 first, as the float16 multiply of AWQ's, GPTQ's and compressed-tensors'
  // dequantization stores it). A product with x multiplies by (u - z) * s unrounded (Int4Product): each group's sum
  // of (u - z) x times s, in f32, as FP8's row scale comes after the row's sum.
  std::vector<uint8_t> f8;
  bool half_scales = false;  // I4: `bf16` holds float16 scales

  static HostTensor Zeros(DType dtype, std::vector<int64_t> shape);
  static HostTensor Zeros(const TensorDef& def);
  static HostTensor FromI32(std::vector<int64_t> shape, std::vector<int32_t> values);
  static HostTensor FromF32(std::vector<int64_t> shape, std::vector<float> values);

  int64_t size() const;
  // Value of element `i` widened to float, whatever the storage.
  float Get(int64_t i) const {
    switch (dtype) {
      case BF16: return Bf16ToFloat(bf16[i]);
      case I32: return static_cast<float>(i32[i]);
      case F8E4M3: return E4m3ToFloat(f8[i]) * f32[i / (static_cast<int64_t>(f8.size()) / shape[0])];
      case I4: return Int4Get(i);
      default: return f32[i];
    }
  }
  const void* data() const;
  size_t bytes() const {
    return dtype == I4 ? static_cast<size_t>(size() + 1) / 2 : static_cast<size_t>(size()) * DTypeSize(dtype);
  }
  // I4: columns per group (K / groups).
  int64_t Int4GroupSize() const { return shape[1] / (static_cast<int64_t>(bf16.size()) / shape[0]); }
  // I4: element i's (u - z) * s, exact in f32 (Get rounds it to bf16).
  float Int4Product(int64_t i) const;
  // I4: scale `g` of [N, groups] as a float (exact: bf16 and float16 both are).
  float Int4Scale(int64_t g) const { return half_scales ? HalfToFloat(bf16[g]) : Bf16ToFloat(bf16[g]); }

 private:
  float Int4Get(int64_t i) const;

};

// Weights of a model by tensor name.
using WeightStore = absl::flat_hash_map<std::string, HostTensor>;

}  // namespace loom::graph
