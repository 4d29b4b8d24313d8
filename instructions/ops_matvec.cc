// Host side of MATVEC, MATVEC_FP8 and MATVEC_W4: validation, footprint, float32 reference (every prologue and
// epilogue).
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>
#include "instructions/opcode_host.h"

namespace loom::isa::ref {
namespace {

// What MATVEC and MATVEC_FP8 share: everything but the weight (its dtype and row stride) and the argmax epilogue.
template <typename Args>
void ValidateMatvec(const Args& a, graph::DType weight_dtype, uint32_t stride, Checker& c) {
  c.Require(a.rows > 0 && a.k > 0, "rows and k must be positive");
  // x arrives by bulk copy (16-byte multiples) and is read as float4.
  c.Require(a.k % 4 == 0, absl::StrCat("k = ", a.k, " must be a multiple of 4"));
  c.Require(U(a.rows) * stride < (uint64_t{1} << 32),
            absl::StrCat("a tile of ", a.rows, " x ", a.k, " is too large (32-bit element indices)"));
  c.Require(a.prologue <= kPrologueRmsNorm, absl::StrCat("unknown prologue ", a.prologue));
  c.Require(a.epilogue < kNumEpilogues, absl::StrCat("unknown epilogue ", a.epilogue));
  c.Tensor("weight", a.weight, weight_dtype, (U(a.row_begin) + a.rows) * stride);
  c.Tensor("input", a.input, F32, a.k);
  if (a.bias != kNoTensor) c.Tensor("bias", a.bias, BF16, U(a.row_begin) + a.rows);
  if (a.prologue == kPrologueRmsNorm) {
    c.Tensor("norm_weight", a.norm_weight, BF16, a.k);
    c.Require(a.norm_eps > 0, "norm_eps must be positive");
  }
  const uint64_t end = U(a.row_begin) + a.rows;
  switch (a.epilogue) {
    case kEpilogueStore:
    case kEpilogueArgmaxPartial:
      c.Tensor("out", a.out, F32, end);
      if constexpr (std::is_same_v<Args, MatvecArgs>) {
        if (a.epilogue == kEpilogueArgmaxPartial) c.Tensor("partials", a.partials, F32, 2 * (U(a.tile_index) + 1));
      } else {
        c.Require(a.epilogue != kEpilogueArgmaxPartial, "a quantized matvec has no argmax epilogue");
      }
      break;
    case kEpilogueResidualAdd:
      c.Tensor("out", a.out, F32, end);
      c.Tensor("residual", a.residual, F32, end);
      break;
    case kEpilogueSiluMul:
      c.Require(a.row_begin % 2 == 0 && a.rows % 2 == 0, "SiLU-mul tiles must hold whole (gate, up) pairs");
      c.Tensor("out", a.out, F32, end / 2);
      break;
    case kEpilogueRopeKvAppend: {
      const uint64_t kv_rows = U(a.num_kv_heads) * a.head_dim;
      c.Require(a.head_dim > 0 && a.head_dim % 2 == 0 && a.heads_per_group > 0 && a.num_kv_heads > 0,
                "RoPE layout needs an even head_dim and positive head counts");
      c.Require(a.row_begin % 2 == 0 && a.rows % 2 == 0, "RoPE tiles must hold whole rotation pairs");
      c.Require(end <= (U(a.heads_per_group) + 2) * kv_rows, "tile runs past the q|k|v rows");
      c.Tensor("out", a.out, F32, U(a.heads_per_group) * kv_rows);
      c.KvCaches(a.k_cache, a.v_cache, kv_rows * a.max_seq);
      c.Tensor("step_state", a.step_state, I32, kStepStateWords);
      c.Tensor("rope_table", a.rope_table, F32, a.head_dim / 2 + 1);
      break;
    }
  }
}

// The input of a tile: x, or RMSNorm(x) * norm_weight with the prologue.
template <typename Args>
std::vector<float> MatvecInput(const Args& a, const MachineView& m) {
  std::vector<float> x(m.ptr<float>(a.input), m.ptr<float>(a.input) + a.k);
  if (a.prologue == kPrologueRmsNorm) RmsNormInto(x.data(), m.ptr<uint16_t>(a.norm_weight), a.k, a.norm_eps, x.data());
  return x;
}

// The epilogue of every tile, on its rows' sums y (bias added).
template <typename Args>
void MatvecEpilogue(const Args& a, const MachineView& m, std::vector<float>& y) {
  float* out = m.ptr<float>(a.out);
  switch (a.epilogue) {
    case kEpilogueStore:
      for (uint32_t r = 0; r < a.rows; ++r) out[a.row_begin + r] = y[r];
      break;
    case kEpilogueResidualAdd: {
      const float* residual = m.ptr<float>(a.residual);
      for (uint32_t r = 0; r < a.rows; ++r) out[a.row_begin + r] = residual[a.row_begin + r] + y[r];
      break;
    }
    case kEpilogueSiluMul:
      for (uint32_t r = 0; r < a.rows; r += 2) out[(a.row_begin + r) / 2] = Silu(y[r]) * y[r + 1];
      break;
    case kEpilogueArgmaxPartial: {
      if constexpr (!std::is_same_v<Args, MatvecArgs>) break;  // (refused by validation)
      float best = -INFINITY;
      uint32_t best_row = a.row_begin;
      for (uint32_t r = 0; r < a.rows; ++r) {
        out[a.row_begin + r] = y[r];
        if (y[r] > best) best = y[r], best_row = a.row_begin + r;
      }
      if constexpr (std::is_same_v<Args, MatvecArgs>) {
        m.ptr<float>(a.partials)[2 * a.tile_index] = best;
        m.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_row);
      }
      break;
    }
    case kEpilogueRopeKvAppend: {
      const int32_t pos = m.ptr<int32_t>(a.step_state)[kStatePosition];
      const float* table = m.ptr<float>(a.rope_table);
      const uint32_t half = a.head_dim / 2;
      for (uint32_t r = 0; r < a.rows; r += 2) {
        const QkvRow row = QkvGroupedRow(a.row_begin + r, a.heads_per_group, a.head_dim);
        if (row.kind != kQkvV) RotatePair(&y[r], &y[r + 1], row.dim, pos, table, half);
        if (row.kind == kQkvQ) {  // the pair (j, j + half)
          out[row.head * a.head_dim + row.dim] = y[r];
          out[row.head * a.head_dim + row.dim + half] = y[r + 1];
          continue;
        }
        const uint32_t cache = row.kind == kQkvK ? a.k_cache : a.v_cache;
        const uint64_t dst = (static_cast<uint64_t>(row.head) * a.max_seq + pos) * a.head_dim + row.dim;
        KvStore(m, cache, dst, y[r]);  // v rows keep their order (r, r+1 are dims d, d+1); k's pair is (j, j + half)
        KvStore(m, cache, row.kind == kQkvV ? dst + 1 : dst + half, y[r + 1]);
      }
      break;
    }
  }
}

}  // namespace

void Validate(const MatvecArgs& a, Checker& c) {
  ValidateMatvec(a, BF16, MatvecRowStride(a.k), c);
}

void Validate(const MatvecFp8Args& a, Checker& c) {
  ValidateMatvec(a, graph::F8E4M3, MatvecFp8RowStride(a.k), c);
  c.Tensor("scales", a.scales, F32, U(a.row_begin) + a.rows);
}

void Validate(const MatvecW4Args& a, Checker& c) {
  ValidateMatvec(a, graph::I4, MatvecW4RowStride(a.k) / 2, c);
  c.Require(a.row_begin % kMatvecW4BandRows == 0 && a.rows % kMatvecW4BandRows == 0,
            absl::StrCat("an int4 tile is whole bands of ", kMatvecW4BandRows, " rows (row_begin ", a.row_begin,
                         ", rows ", a.rows, ")"));
  c.Require(a.group_shift >= 5 && a.group_shift < 31,
            absl::StrCat("group_shift ", a.group_shift, ": groups are a power of two of at least 32 columns"));
  if (a.group_shift >= 5 && a.group_shift < 31) {
    c.Tensor("meta", a.meta, I32, (U(a.row_begin) + a.rows) * MatvecW4Groups(a.k, a.group_shift));
  }
  const uint32_t stride = MatvecW4RowStride(a.k);
  c.Require(MatvecW4Pieces(stride) == 1 || a.prologue == kPrologueNone,
            absl::StrCat("k ", a.k, " is multiplied in pieces of ", MatvecW4PieceColumns(stride),
                         " columns, which take no prologue (an RMSNorm needs the whole row first)"));
}

Footprint Cost(const MatvecArgs& a, uint32_t) {
  Footprint f;
  f.weight_bytes = 2ull * a.rows * MatvecRowStride(a.k) + (a.bias != kNoTensor ? 2ull * a.rows : 0);
  f.activation_bytes = 4ull * a.k + 8ull * a.rows + (a.prologue == kPrologueRmsNorm ? 2ull * a.k : 0);
  f.smem_bytes = MatvecActivationBytes(a.rows, a.k);
  f.flops = 2ull * a.rows * a.k;
  return f;
}

Footprint Cost(const MatvecFp8Args& a, uint32_t) {
  Footprint f;
  f.weight_bytes = 1ull * a.rows * MatvecFp8RowStride(a.k) + 4ull * a.rows + (a.bias != kNoTensor ? 2ull * a.rows : 0);
  f.activation_bytes = 4ull * a.k + 8ull * a.rows + (a.prologue == kPrologueRmsNorm ? 2ull * a.k : 0);
  f.smem_bytes = MatvecFp8ActivationBytes(a.rows, a.k);
  f.flops = 2ull * a.rows * a.k;
  return f;
}

Footprint Cost(const MatvecW4Args& a, uint32_t) {
  Footprint f;
  const uint32_t groups = a.group_shift < 31 ? MatvecW4Groups(a.k, a.group_shift) : 0;
  f.weight_bytes = uint64_t{a.rows} * MatvecW4RowStride(a.k) / 2 + 4ull * a.rows * groups +
                   (a.bias != kNoTensor ? 2ull * a.rows : 0);
  f.activation_bytes = 4ull * a.k + 8ull * a.rows + (a.prologue == kPrologueRmsNorm ? 2ull * a.k : 0);
  f.smem_bytes = a.group_shift < 31 ? MatvecW4ActivationBytes(a.rows, a.k, a.group_shift) : 0;
  f.flops = 2ull * a.rows * a.k;
  return f;
}

void Reference(const MatvecArgs& a, const MachineView& m) {
  const std::vector<float> x = MatvecInput(a, m);
  std::vector<float> y(a.rows);
  const uint64_t stride = MatvecRowStride(a.k);
  const uint16_t* w = m.ptr<uint16_t>(a.weight) + a.row_begin * stride;
  for (uint32_t r = 0; r < a.rows; ++r) {
    float acc = 0.0f;
    for (uint32_t j = 0; j < a.k; ++j) acc += x[j] * graph::Bf16ToFloat(w[r * stride + j]);
    y[r] = acc;
    if (a.bias != kNoTensor) y[r] += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[a.row_begin + r]);
  }
  MatvecEpilogue(a, m, y);
}

// The row's sum of e4m3 values times x, then times the row's scale (in f32): the graph evaluator's order.
void Reference(const MatvecFp8Args& a, const MachineView& m) {
  const std::vector<float> x = MatvecInput(a, m);
  std::vector<float> y(a.rows);
  const uint64_t stride = MatvecFp8RowStride(a.k);
  const uint8_t* w = m.ptr<uint8_t>(a.weight) + a.row_begin * stride;
  const float* scales = m.ptr<float>(a.scales) + a.row_begin;
  for (uint32_t r = 0; r < a.rows; ++r) {
    float acc = 0.0f;
    for (uint32_t j = 0; j < a.k; ++j) {
      acc += x[j] * graph::E4m3ToFloat(w[r * stride + j / kMatvecFp8RowAlign * kMatvecFp8RowAlign +
                                          MatvecFp8Position(j % kMatvecFp8RowAlign)]);
    }
    y[r] = acc * scales[r];
    if (a.bias != kNoTensor) y[r] += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[a.row_begin + r]);
  }
  MatvecEpilogue(a, m, y);
}

// Each group's sum of (u - z) x in column order, times its scale, added in group order, in f32 (the graph's value).
void Reference(const MatvecW4Args& a, const MachineView& m) {
  const std::vector<float> x = MatvecInput(a, m);
  std::vector<float> y(a.rows);
  const uint64_t stride = MatvecW4RowStride(a.k), chunks = stride / kMatvecW4ChunkColumns;
  const uint32_t groups = MatvecW4Groups(a.k, a.group_shift);
  const uint8_t* w = m.ptr<uint8_t>(a.weight);
  const uint32_t* meta = m.ptr<uint32_t>(a.meta);
  for (uint32_t r = 0; r < a.rows; ++r) {
    const uint64_t row = a.row_begin + r, band = row / kMatvecW4BandRows;
    float acc = 0.0f, sum = 0.0f, scale = 0.0f, zero = 0.0f;
    for (uint32_t j = 0; j < a.k; ++j) {
      if (j % (1u << a.group_shift) == 0) {
        const uint32_t word = meta[(band * groups + (j >> a.group_shift)) * kMatvecW4BandRows + row % kMatvecW4BandRows];
        scale = std::bit_cast<float>(MatvecW4MetaScaleBits(word));
        zero = static_cast<float>(MatvecW4MetaZero(word));
      }
      const W4Nibble at = MatvecW4Byte(row % kMatvecW4BandRows, j % kMatvecW4ChunkColumns);
      const uint8_t byte = w[(band * chunks + j / kMatvecW4ChunkColumns) * kMatvecW4ChunkBytes + at.byte];
      sum += x[j] * (static_cast<float>((byte >> (4 * at.high)) & 15) - zero);
      if (j + 1 == a.k || (j + 1) % (1u << a.group_shift) == 0) {
        acc += sum * scale;
        sum = 0.0f;
      }
    }
    y[r] = acc;
    if (a.bias != kNoTensor) y[r] += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[a.row_begin + r]);
  }
  MatvecEpilogue(a, m, y);
}

}  // namespace loom::isa::ref
