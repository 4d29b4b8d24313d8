// The host side of every opcode: validation, footprint (cost model) and float32
// reference, one overload of each per *Args struct, declared here from the opcode
// table and defined next to each other per opcode family (ops_*.cc); isa.cc
// dispatches on the opcode. Internal to instructions/.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "instructions/isa.h"

namespace loom::isa::ref {

using graph::BF16;
using graph::F32;
using graph::I32;

// Element i of a KV cache (isa::KvBytes), and v stored as element i (rounded to nearest even into a bf16 cache,
// as the device's __float2bfloat16_rn).
inline float KvLoad(const MachineView& m, uint32_t cache, uint64_t i) {
  return m.IsBf16(cache) ? graph::Bf16ToFloat(m.ptr<uint16_t>(cache)[i]) : m.ptr<float>(cache)[i];
}
inline void KvStore(const MachineView& m, uint32_t cache, uint64_t i, float v) {
  if (m.IsBf16(cache)) {
    m.ptr<uint16_t>(cache)[i] = graph::FloatToBf16(v);
  } else {
    m.ptr<float>(cache)[i] = v;
  }
}

// Validation helper: collects the first problem with the field that caused it.
class Checker {
 public:
  Checker(const Instruction& inst, const std::vector<TensorInfo>& tensors) : inst_(inst), tensors_(tensors) {}

  // Tensor `id` (argument `field`) must be `dtype` with at least `elements`.
  void Tensor(const char* field, uint32_t id, graph::DType dtype, uint64_t elements) {
    if (!status_.ok()) return;
    if (id >= tensors_.size()) {
      Fail(absl::StrCat(field, " names tensor ", id, ", the table has ", tensors_.size()));
      return;
    }
    const TensorInfo& t = tensors_[id];
    if (t.dtype != dtype) {
      Fail(absl::StrCat(field, " tensor '", t.name, "' is ", graph::DType_Name(t.dtype), ", needs ",
                        graph::DType_Name(dtype)));
    } else if (t.elements < elements) {
      Fail(absl::StrCat(field, " tensor '", t.name, "' has ", t.elements, " elements, instruction reaches ",
                        elements));
    }
  }
  // A layer's KV caches (`elements` each): both f32 or both bf16 (isa::KvBytes).
  void KvCaches(uint32_t k, uint32_t v, uint64_t elements) {
    const graph::DType dtype = KvBf16(k) ? graph::BF16 : graph::F32;
    Tensor("k_cache", k, dtype, elements);
    Tensor("v_cache", v, dtype, elements);
  }
  bool KvBf16(uint32_t k) const { return k < tensors_.size() && tensors_[k].dtype == graph::BF16; }
  void Require(bool ok, const std::string& why) {
    if (status_.ok() && !ok) Fail(why);
  }
  absl::Status status() const { return status_; }

 private:
  void Fail(const std::string& why) {
    status_ = absl::InvalidArgumentError(absl::StrCat(OpcodeName(inst_.op()), ": ", why));
  }
  const Instruction& inst_;
  const std::vector<TensorInfo>& tensors_;
  absl::Status status_;
};

inline uint64_t U(uint32_t v) { return v; }

// A convolution's geometry (IM2COL's and CONV_GEMM's): sizes, strides and dilations positive, the group's channels
// inside the input, relu a flag.
inline void ValidateConvGeometry(const ConvShape& s, uint32_t batch, uint32_t channels, uint32_t c_begin,
                                 uint32_t group_c, uint32_t relu, Checker& c) {
  c.Require(batch > 0 && s.h > 0 && s.w > 0 && channels > 0 && s.oh > 0 && s.ow > 0 && s.kh > 0 && s.kw > 0,
            "every dimension must be positive");
  c.Require(s.stride_h > 0 && s.stride_w > 0 && s.dilation_h > 0 && s.dilation_w > 0,
            "strides and dilations must be positive");
  c.Require(relu <= 1, "relu must be 0 or 1");
  c.Require(group_c > 0 && U(c_begin) + group_c <= channels,
            absl::StrCat("channels [", c_begin, ", +", group_c, ") outside the input's ", channels));
}

inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// x * rsqrt(mean(x^2) + eps) * w, the same operation order as the graph evaluator.
inline void RmsNormInto(const float* x, const uint16_t* w, uint32_t n, float eps, float* out) {
  float sum_sq = 0.0f;
  for (uint32_t j = 0; j < n; ++j) sum_sq += x[j] * x[j];
  const float scale = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  for (uint32_t j = 0; j < n; ++j) out[j] = x[j] * scale * graph::Bf16ToFloat(w[j]);
}

// Rotates (x, y) by position * table[j], cos and sin scaled by table[half].
inline void RotatePair(float* x, float* y, uint32_t j, int32_t position, const float* table, uint32_t half) {
  const float angle = static_cast<float>(position) * table[j];
  const float c = std::cos(angle) * table[half], s = std::sin(angle) * table[half];
  const float a = *x, b = *y;
  *x = a * c - b * s;
  *y = b * c + a * s;
}

#define LOOM_DECLARE_HOST_OPS(name, args)        \
  void Validate(const args& a, Checker& c);      \
  Footprint Cost(const args& a, uint32_t context); \
  void Reference(const args& a, const MachineView& m);
LOOM_OPCODE_LIST(LOOM_DECLARE_HOST_OPS)
#undef LOOM_DECLARE_HOST_OPS

}  // namespace loom::isa::ref
