// 4-bit integer weights kept as stored (dtype I4): which checkpoints' weights Loom computes with in int4 (compressed-
// tensors', AWQ's and GPTQ's, bf16 or float16 scales), reading them, and round-to-nearest int4 for random models.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "graph/parallel.h"
#include "graph/quantization_internal.h"

namespace loom::graph {

using quantization_internal::FindParts;
using quantization_internal::IsHubFormat;
using quantization_internal::Parts;
using quantization_internal::ReadHubInt4;

namespace {

// The scheme fields MATVEC_W4 computes with: 4-bit integers, dense int32 packing (compressed-tensors) or AWQ's or
// GPTQ's, a group of a power of two >= 32 columns (its lanes take a group's scale per 16-column step; 32 is the
// smallest group checkpoints use) dividing K, each column's group its index / group_size (no act-order).
bool Int4Scheme(const WeightScheme& s, int64_t cols) {
  const int g = s.group_size;
  return !s.is_float && s.bits == 4 && !s.act_order && g >= 32 && (g & (g - 1)) == 0 && cols % g == 0;
}

}  // namespace

DType KeptDtype(const std::string& weight, int64_t rows, int64_t cols, const WeightScheme& scheme,
                const TensorLookup& lookup) {
  if (KeptQuantized(scheme)) return F8E4M3;
  if (!Int4Scheme(scheme, cols)) return DTYPE_UNSPECIFIED;
  absl::StatusOr<Parts> p = FindParts(weight, rows, cols, scheme, lookup);
  // bf16 or float16 scales (both exact in the 19 bits a meta word keeps: isa::MatvecW4MetaWord); f32 ones widen.
  return p.ok() && (p->scale.entry->dtype == "BF16" || p->scale.entry->dtype == "F16") ? I4 : DTYPE_UNSPECIFIED;
}

absl::StatusOr<HostTensor> ReadInt4Weight(const std::string& weight, int64_t rows, int64_t cols,
                                          const WeightScheme& s, const TensorLookup& lookup) {
  if (KeptDtype(weight, rows, cols, s, lookup) != I4) {
    return absl::InvalidArgumentError(absl::StrCat(weight, ": ", s.Describe(), " is widened, not read as int4"));
  }
  absl::StatusOr<Parts> p = FindParts(weight, rows, cols, s, lookup);
  if (!p.ok()) return p.status();
  const int64_t groups = p->groups;
  HostTensor out;
  out.dtype = I4;
  out.shape = {rows, cols};
  out.half_scales = p->scale.entry->dtype == "F16";
  if (IsHubFormat(s.format)) {
    out.f8.assign(static_cast<size_t>(rows * cols / 2), 0);
    out.bf16.resize(static_cast<size_t>(rows * groups));
    out.i32.resize(static_cast<size_t>(rows * groups));
    ReadHubInt4(*p, rows, cols, s, &out);
    return out;
  }
  out.f8.resize(static_cast<size_t>(rows * cols / 2));
  // Dense packing of 4-bit values in int32 words is two values a byte, the low nibble first: the row's bytes as
  // they are (cols is a multiple of the group, so of 32: whole words).
  const uint8_t* values = p->values.file->Data(*p->values.entry);
  std::memcpy(out.f8.data(), values, out.f8.size());
  out.bf16.resize(static_cast<size_t>(rows * groups));
  std::memcpy(out.bf16.data(), p->scale.file->Data(*p->scale.entry), out.bf16.size() * 2);
  out.i32.assign(static_cast<size_t>(rows * groups), 8);  // symmetric: values stored as q + 8
  if (p->zero_point.entry != nullptr) {
    // [ceil(rows / 8), groups] int32 words, packed down the rows: row r's zero point of group g is nibble r % 8 of
    // word (r / 8, g), stored as z + 8 like the values.
    const uint8_t* zp = p->zero_point.file->Data(*p->zero_point.entry);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        uint32_t word;
        std::memcpy(&word, zp + 4 * ((r / 8) * groups + g), 4);
        out.i32[r * groups + g] = static_cast<int32_t>((word >> (4 * (r % 8))) & 15u);
      }
    }
  }
  return out;
}

HostTensor QuantizeGroupsToInt4(const HostTensor& w, int group_size) {
  const int64_t rows = w.shape[0], cols = w.shape[1], groups = cols / group_size;
  HostTensor out;
  out.dtype = I4;
  out.shape = w.shape;
  out.f8.assign(static_cast<size_t>((rows * cols + 1) / 2), 0);
  out.bf16.resize(static_cast<size_t>(rows * groups));
  out.i32.assign(static_cast<size_t>(rows * groups), 8);
  ParallelFor(rows, [&](int64_t row_begin, int64_t row_end) {  // (whole rows: even columns, whole bytes)
    std::vector<float> v(static_cast<size_t>(group_size));
    for (int64_t r = row_begin; r < row_end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = r * cols + g * group_size;
        float absmax = 0;
        for (int64_t j = 0; j < group_size; ++j) {
          v[j] = w.dtype == BF16 ? Bf16ToFloat(w.bf16[begin + j]) : w.Get(begin + j);
          absmax = std::max(absmax, std::fabs(v[j]));
        }
        const Bf16Bits scale_bits = FloatToBf16(std::isfinite(absmax) ? std::max(absmax / 7.5f, FLT_EPSILON) : NAN);
        out.bf16[r * groups + g] = scale_bits;
        const float scale = Bf16ToFloat(scale_bits);
        for (int64_t j = 0; j < group_size; ++j) {  // group_size is even: pairs fill whole bytes
          const float x = v[j] / scale;
          // (a NaN compares false: 0; +-inf clamp; both only where the scale is NaN, which packing refuses)
          const int32_t q = x >= 7.0f ? 7 : x <= -8.0f ? -8 : x == x ? static_cast<int32_t>(std::nearbyint(x)) : 0;
          out.f8[(begin + j) / 2] |= static_cast<uint8_t>((q + 8) << (4 * ((begin + j) & 1)));
        }
      }
    }
  });
  return out;
}

}  // namespace loom::graph
