#include "graph/host_tensor.h"

namespace loom::graph {

int64_t HostTensor::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostTensor HostTensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const int64_t n = t.size();
  switch (dtype) {
    case BF16: t.bf16.assign(n, 0); break;
    case graph::I32: t.i32.assign(n, 0); break;
    case F8E4M3:
      t.f8.assign(n, 0);
      t.f32.assign(t.shape.empty() ? 0 : t.shape[0], 1.0f);
      break;
    case I4:  // one group a row (zero points 8, scales 0): callers size the groups
      t.f8.assign((n + 1) / 2, 0x88);
      t.bf16.assign(t.shape.empty() ? 0 : t.shape[0], 0);
      t.i32.assign(t.shape.empty() ? 0 : t.shape[0], 8);
      break;
    default: t.f32.assign(n, 0.0f); break;
  }
  return t;
}

HostTensor HostTensor::Zeros(const TensorDef& def) {
  return Zeros(def.dtype(), std::vector<int64_t>(def.shape().begin(), def.shape().end()));
}

HostTensor HostTensor::FromI32(std::vector<int64_t> shape, std::vector<int32_t> values) {
  HostTensor t;
  t.dtype = graph::I32;
  t.shape = std::move(shape);
  t.i32 = std::move(values);
  return t;
}

HostTensor HostTensor::FromF32(std::vector<int64_t> shape, std::vector<float> values) {
  HostTensor t;
  t.dtype = graph::F32;
  t.shape = std::move(shape);
  t.f32 = std::move(values);
  return t;
}

const void* HostTensor::data() const {
  switch (dtype) {
    case BF16: return bf16.data();
    case I32: return i32.data();
    case F8E4M3: return f8.data();
    case I4: return f8.data();
    default: return f32.data();
  }
}

float HostTensor::Int4Product(int64_t i) const {
  const int64_t cols = shape[1], groups = static_cast<int64_t>(bf16.size()) / shape[0];
  const int64_t g = i / cols * groups + i % cols / (cols / groups);
  const int32_t u = (f8[i / 2] >> (4 * (i & 1))) & 15;
  // (u - z) is exact (5 bits), and its product with a bf16 or float16 scale (8 or 11 significant bits) is exact in f32.
  return static_cast<float>(u - i32[g]) * Int4Scale(g);
}

float HostTensor::Int4Get(int64_t i) const {
  const float product = Int4Product(i);
  return Bf16ToFloat(FloatToBf16(half_scales ? RoundToHalf(product) : product));
}

}  // namespace loom::graph
