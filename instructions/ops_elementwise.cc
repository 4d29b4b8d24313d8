// Host side of the element-wise family (elementwise.h): ELEMENTWISE, SOFTMAX, NORM_ROWS.
#include <algorithm>
#include <cmath>

#include "instructions/opcode_host.h"
#include "instructions/swizzle.h"

namespace loom::isa::ref {

void Validate(const ElementwiseArgs& a, Checker& c) {
  c.Require(EwValid(a.func), absl::StrCat("unknown function ", a.func));
  c.Require(EwBinary(a.func) == (a.b != kNoTensor), "b is needed exactly by the binary functions");
  uint64_t total = 1, a_end = 1, b_end = 1, o_end = 1;
  for (uint32_t d = 0; d < kElementwiseDims; ++d) {
    c.Require(a.size[d] > 0, "sizes must be positive");
    if (a.size[d] == 0) return;
    total *= a.size[d];
    a_end += U(a.size[d] - 1) * a.a_stride[d];
    b_end += U(a.size[d] - 1) * a.b_stride[d];
    o_end += U(a.size[d] - 1) * a.o_stride[d];
  }
  c.Require(a.count > 0 && U(a.begin) + a.count <= total,
            absl::StrCat("elements [", a.begin, ", +", a.count, ") outside the ", total, " outputs"));
  c.Require(total < (uint64_t{1} << 32) && a_end < (uint64_t{1} << 32) && b_end < (uint64_t{1} << 32) &&
                o_end < (uint64_t{1} << 32),
            "offsets of 2^32 elements or more");
  c.Tensor("a", a.a, F32, a_end);
  if (a.b != kNoTensor) c.Tensor("b", a.b, F32, b_end);
  c.Tensor("out", a.out, F32, total);
}

void Validate(const SoftmaxArgs& a, Checker& c) {
  c.Require(a.outer > 0 && a.len > 0 && a.inner > 0, "outer, len and inner must be positive");
  const uint64_t rows = U(a.outer) * a.inner;
  c.Require(a.count > 0 && U(a.begin) + a.count <= rows,
            absl::StrCat("rows [", a.begin, ", +", a.count, ") outside the ", rows, " rows"));
  c.Tensor("input", a.input, F32, rows * a.len);
  c.Tensor("out", a.out, F32, rows * a.len);
}

Footprint Cost(const SoftmaxArgs& a, uint32_t) { return {0, 12ull * a.count * a.len, 0, 4ull * a.count * a.len}; }

Footprint Cost(const ElementwiseArgs& a, uint32_t) {
  return {0, (EwBinary(a.func) ? 12ull : 8ull) * a.count, 0, 4ull * a.count};
}

void Reference(const ElementwiseArgs& a, const MachineView& m) {
  const float* x = m.ptr<float>(a.a);
  const float* y = a.b != kNoTensor ? m.ptr<float>(a.b) : nullptr;
  float* out = m.ptr<float>(a.out);
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    uint32_t oa, ob, oo;
    EwOffsets(a, i, &oa, &ob, &oo);
    out[oo] = EwApply(a.func, x[oa], y != nullptr ? y[ob] : 0.0f);
  }
}

void Reference(const SoftmaxArgs& a, const MachineView& m) {
  const float* x = m.ptr<float>(a.input);
  float* y = m.ptr<float>(a.out);
  for (uint64_t r = a.begin; r < U(a.begin) + a.count; ++r) {
    const uint64_t base = r / a.inner * a.len * a.inner + r % a.inner;
    float mx = -INFINITY, sum = 0.0f;
    for (uint64_t i = 0; i < a.len; ++i) mx = std::max(mx, x[base + i * a.inner]);
    for (uint64_t i = 0; i < a.len; ++i) sum += (y[base + i * a.inner] = std::exp(x[base + i * a.inner] - mx));
    for (uint64_t i = 0; i < a.len; ++i) y[base + i * a.inner] /= sum;
  }
}

void Validate(const NormRowsArgs& a, Checker& c) {
  c.Require(a.rows > 0 && a.len > 0, "rows and len must be positive");
  c.Require(a.mode < kNumNormModes, absl::StrCat("unknown norm mode ", a.mode));
  c.Require(a.mode == kNormLayer || a.shift == kNoTensor, "RMSNorm has no shift");
  c.Require(a.eps >= 0.0f, "eps must not be negative");
  c.Require(a.count > 0 && U(a.begin) + a.count <= a.rows,
            absl::StrCat("rows [", a.begin, ", +", a.count, ") outside the ", a.rows, " rows"));
  c.Require(U(a.rows) * a.len < (uint64_t{1} << 32), "input of 2^32 elements or more");
  c.Tensor("input", a.input, F32, U(a.rows) * a.len);
  c.Tensor("out", a.out, F32, U(a.rows) * a.len);
  c.Tensor("scale", a.scale, F32, a.len);
  if (a.shift != kNoTensor) c.Tensor("shift", a.shift, F32, a.len);
}

Footprint Cost(const NormRowsArgs& a, uint32_t) {
  return {0, 16ull * a.count * a.len, 0, 8ull * a.count * a.len};
}

void Reference(const NormRowsArgs& a, const MachineView& m) {
  const float* x = m.ptr<float>(a.input);
  float* y = m.ptr<float>(a.out);
  const float* w = m.ptr<float>(a.scale);
  const float* b = a.shift != kNoTensor ? m.ptr<float>(a.shift) : nullptr;
  for (uint64_t r = a.begin; r < U(a.begin) + a.count; ++r) {
    const float* row = x + r * a.len;
    float mean = 0.0f;
    if (a.mode == kNormLayer) {
      for (uint32_t j = 0; j < a.len; ++j) mean += row[j];
      mean /= static_cast<float>(a.len);
    }
    float sum_sq = 0.0f;
    for (uint32_t j = 0; j < a.len; ++j) sum_sq += (row[j] - mean) * (row[j] - mean);
    const float scale = 1.0f / std::sqrt(sum_sq / static_cast<float>(a.len) + a.eps);
    for (uint32_t j = 0; j < a.len; ++j) {
      y[r * a.len + j] = (row[j] - mean) * scale * w[j] + (b != nullptr ? b[j] : 0.0f);
    }
  }
}

}  // namespace loom::isa::ref
