// Host side of the tensor-core opcodes: GEMM (every epilogue), PACK_ROWS and SUM_SPLITS, over swizzled operand
// images (CONV_GEMM, a convolution's implicit GEMM: ops_conv.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "instructions/swizzle.h"
#include "instructions/opcode_host.h"

namespace loom::isa::ref {

void Validate(const GemmArgs& a, Checker& c) {
  c.Require(a.m > 0 && a.n > 0 && a.k > 0, "m, n and k must be positive");
  c.Require(a.wide <= 1, absl::StrCat("wide must be 0 or 1, not ", a.wide));
  c.Require(GemmMTile(a) < GemmTiles(a.m) && GemmNTile(a) < GemmColumnTiles(a.n, a.wide),
            absl::StrCat("tile (", GemmMTile(a), ", ", GemmNTile(a), ") outside the ", GemmTiles(a.m), " x ",
                         GemmColumnTiles(a.n, a.wide), " output tiles", a.wide ? " of 256 columns" : ""));
  c.Tensor("a", a.a, BF16, GemmImageBytes(a.m, a.k) / 2);
  c.Tensor("weight", a.weight, BF16, GemmImageBytes(a.n, a.k) / 2);
  c.Require(a.epilogue < kNumGemmEpilogues, absl::StrCat("unknown epilogue ", a.epilogue));
  const uint32_t slab_begin = GemmSplitBegin(a), slab_count = GemmSplitCount(a);
  c.Require(U(slab_begin) + (slab_count == 0 ? 1 : slab_count) <= GemmSlabs(a.k),
            absl::StrCat("K slabs [", slab_begin, ", +", slab_count, ") outside the ", GemmSlabs(a.k)));
  c.Require(a.epilogue == kGemmPartialF32 || a.slabs == 0, "only the partial epilogue may take part of K");
  c.Require(a.slabs == 0 || GemmSlabs(a.k) <= 0xffffu,  // (the range's two 16-bit halves)
            absl::StrCat("k ", a.k, ": a split of more than 65535 K slabs"));
  c.Require(!a.wide || a.epilogue != kGemmRopeKvAppend, "the RoPE epilogue takes 128-column tiles only");
  if (a.epilogue == kGemmPartialF32) c.Require(a.residual == kNoTensor, "a part of a split product: SUM_SPLITS adds the residual");
  if (a.epilogue == kGemmRopeKvAppend) {
    const uint64_t kv_rows = U(a.num_kv_heads) * a.head_dim;
    const uint32_t group = GemmHeadsPerGroup(a);
    c.Require(a.head_dim > 0 && a.head_dim % 2 == 0 && a.num_kv_heads > 0 && group > 0,
              "RoPE layout needs an even head_dim and positive head counts");
    c.Require(a.n == (U(group) + 2) * kv_rows, "n must be the grouped q|k|v rows");
    c.Require(a.residual == kNoTensor, "no residual with the RoPE epilogue");
    c.Tensor("out", a.out, F32, U(a.m) * group * kv_rows);
    if (a.qk_norm != kNoTensor) {
      c.Require(a.head_dim >= 64 && kGemmTileN % a.head_dim == 0,
                absl::StrCat("per-head norms need whole heads in a 128-column tile; head_dim ", a.head_dim));
      c.Require(a.norm_eps > 0, "norm_eps must be positive");
      c.Tensor("qk_norm", a.qk_norm, BF16, 2ull * a.head_dim);
    }
    c.KvCaches(a.k_cache, a.v_cache, kv_rows * a.max_seq);
    c.Tensor("step_state", a.step_state, I32, kStepStateWords);
    c.Tensor("rope_table", a.rope_table, F32, a.head_dim / 2 + 1);
  } else if (a.epilogue == kGemmSiluMulToImage) {
    // The image's K padding must be zero for the GEMM that reads it; with n / 2 a multiple of the slab there is
    // none (every real intermediate size is a multiple of 64).
    c.Require(a.n % (2 * kGemmSlabK) == 0 && a.residual == kNoTensor,
              absl::StrCat("SiLU-mul pairs need n a multiple of ", 2 * kGemmSlabK, " and no residual"));
    c.Tensor("out", a.out, BF16, GemmImageBytes(a.m, a.n / 2) / 2);
  } else {
    c.Tensor("out", a.out, F32, U(a.m) * a.n);
  }
  if (a.bias != kNoTensor) c.Tensor("bias", a.bias, BF16, a.n);
  if (a.residual != kNoTensor) c.Tensor("residual", a.residual, F32, U(a.m) * a.n);
  if (a.row_norm != kNoTensor) c.Tensor("row_norm", a.row_norm, F32, U(a.m) * kRowNormSlots);
}

void Validate(const PackRowsArgs& a, Checker& c) {
  c.Require(a.m > 0 && a.k > 0 && a.rows > 0, "m, k and rows must be positive");
  c.Require(U(a.row_begin) + a.rows <= U(GemmTiles(a.m)) * kGemmTileM,
            absl::StrCat("rows [", a.row_begin, ", ", U(a.row_begin) + a.rows, ") outside the ", GemmTiles(a.m),
                         " row tiles"));
  c.Tensor("input", a.input, F32, U(a.m) * a.k);
  c.Tensor("out", a.out, BF16, GemmImageBytes(a.m, a.k) / 2);
  c.Require(a.splits == 0 || (a.splits >= 2 && a.splits <= kMaxSumSplits),
            absl::StrCat("splits ", a.splits, ": 0, or a split product's 2 to ", kMaxSumSplits, " parts"));
  if (a.splits != 0) {
    c.Require(a.parts != a.input && a.parts != a.out, "the parts are a tensor of their own");
    c.Require(U(a.splits) * a.m * a.k < (uint64_t{1} << 32), "parts of 2^32 elements or more (the device's offsets)");
    c.Tensor("parts", a.parts, F32, U(a.splits) * a.m * a.k);
  }
  if (a.norm_weight != kNoTensor) {
    c.Tensor("norm_weight", a.norm_weight, BF16, a.k);
    c.Require(a.norm_eps > 0, "norm_eps must be positive");
  }
  if (a.row_norm == kNoTensor) {
    c.Require(a.col_begin == 0 && a.cols == 0, "column slices are for a deferred norm (row_norm) only");
    return;
  }
  // A deferred norm's slice: whole 16-byte chunks of x and 8-byte groups of the image (a slab's columns), rows of
  // the input only (the image's padding rows are packed whole), one staging round.
  c.Tensor("row_norm", a.row_norm, F32, U(a.m) * kRowNormSlots);
  c.Require(a.norm_weight != kNoTensor, "a deferred norm (row_norm) needs its norm_weight");
  c.Require(a.k % kGemmSlabK == 0 && a.cols > 0 && a.cols % kGemmSlabK == 0 && a.col_begin % a.cols == 0 &&
                a.col_begin < a.k,
            absl::StrCat("slice [", a.col_begin, ", +", a.cols, ") of k ", a.k, ": k and the slice width must be ",
                         "multiples of ", kGemmSlabK, ", the slice one of the row's"));
  c.Require(PackRowsSlices(a) <= kRowNormSlots,
            absl::StrCat(PackRowsSlices(a), " column slices of k ", a.k, ": at most ", kRowNormSlots));
  c.Require(U(a.row_begin) + a.rows <= a.m, absl::StrCat("a slice's rows [", a.row_begin, ", +", a.rows,
                                                          ") must be rows of the input (m ", a.m, ")"));
  c.Require(U(a.rows) * (PackRowsColumns(a) / 4) * (a.splits + 1) * 16 + 2ull * PackRowsColumns(a) <= kSumStageBytes,
            absl::StrCat(a.rows, " rows x ", PackRowsColumns(a), " columns and ", a.splits,
                         " parts: more than one staging round of ", kSumStageBytes, " bytes"));
}

Footprint Cost(const PackRowsArgs& a, uint32_t) {
  // A slice (row_norm): its columns only; whole rows: the image's padded width.
  const uint32_t columns = a.row_norm != kNoTensor ? PackRowsColumns(a) : GemmSlabs(a.k) * kGemmSlabK;
  const uint64_t elements = uint64_t{a.rows} * columns;
  return {0, 6 * elements + (a.splits != 0 ? 4 * (a.splits + 2) * elements : 0), 0, (3 + a.splits) * elements};
}

Footprint Cost(const GemmArgs& a, uint32_t) {
  const uint64_t slabs = GemmSlabsOf(a).count, columns = GemmTileColumns(a);
  return {slabs * kGemmSlabBytes * columns / kGemmTileN, slabs * kGemmSlabBytes + 4ull * kGemmTileM * columns,
          GemmActivationBytes(a), 2ull * kGemmTileM * columns * slabs * kGemmSlabK};
}

void Validate(const SumSplitsArgs& a, Checker& c) {
  c.Require(a.elements > 0 && a.count > 0, "elements and count must be positive");
  c.Require(a.splits >= 2 && a.splits <= kMaxSumSplits,
            absl::StrCat("splits ", a.splits, ": a split product has 2 to ", kMaxSumSplits, " parts"));
  c.Require(U(a.begin) + a.count <= a.elements,
            absl::StrCat("elements [", a.begin, ", +", a.count, ") outside the ", a.elements));
  c.Require(a.flags <= (kSumReluBase | kSumReluOut), absl::StrCat("unknown flags ", a.flags));
  c.Require(a.base != kNoTensor || !(a.flags & kSumReluBase), "kSumReluBase without a base");
  c.Require(a.parts != a.out && a.parts != a.base, "the parts are a tensor of their own");
  c.Require(U(a.splits) * a.elements < (uint64_t{1} << 32), "parts of 2^32 elements or more (the device's offsets)");
  c.Tensor("parts", a.parts, F32, U(a.splits) * a.elements);
  c.Tensor("out", a.out, F32, a.elements);
  if (a.base != kNoTensor) c.Tensor("base", a.base, F32, a.elements);
}

Footprint Cost(const SumSplitsArgs& a, uint32_t) {
  const uint64_t reads = U(a.splits) + (a.base != kNoTensor ? 1 : 0);
  return {0, 4 * U(a.count) * (reads + 1), 0, U(a.count) * a.splits};
}

void Reference(const SumSplitsArgs& a, const MachineView& m) {
  const float* parts = m.ptr<float>(a.parts);
  const float* base = a.base != kNoTensor ? m.ptr<float>(a.base) : nullptr;
  float* out = m.ptr<float>(a.out);
  for (uint64_t i = a.begin; i < U(a.begin) + a.count; ++i) {
    float sum = base != nullptr ? SumSplitsBase(a, base[i]) : parts[i];
    for (uint32_t s = base != nullptr ? 0 : 1; s < a.splits; ++s) sum += parts[s * U(a.elements) + i];
    out[i] = (a.flags & kSumReluOut) && sum < 0.0f ? 0.0f : sum;
  }
}

// A deferred norm's slice: parts added, x * w rounded to bf16 unscaled, the slice's slot of each row.
void ReferenceSlice(const PackRowsArgs& a, const MachineView& m) {
  float* x = m.ptr<float>(a.input);
  const float* parts = m.ptr<float>(a.parts);
  const uint16_t* w = m.ptr<uint16_t>(a.norm_weight);
  uint16_t* image = m.ptr<uint16_t>(a.out);
  float* slots = m.ptr<float>(a.row_norm);
  const uint32_t slices = PackRowsSlices(a), end = a.col_begin + PackRowsColumns(a);
  for (uint32_t r = a.row_begin; r < a.row_begin + a.rows; ++r) {
    float sum_sq = 0.0f;
    for (uint32_t c = a.col_begin; c < end; ++c) {
      const uint64_t i = uint64_t{r} * a.k + c;
      float v = x[i];
      for (uint32_t s = 0; s < a.splits; ++s) v += parts[s * U(a.m) * a.k + i];
      x[i] = v;
      sum_sq += v * v;
      image[Swizzled128Offset(a.k, kGemmTileM, r, c) / 2] = graph::FloatToBf16(v * graph::Bf16ToFloat(w[c]));
    }
    float* row = slots + uint64_t{r} * kRowNormSlots;
    row[a.col_begin / a.cols] = sum_sq / static_cast<float>(a.k) + a.norm_eps / static_cast<float>(slices);
    if (a.col_begin == 0) std::fill(row + slices, row + kRowNormSlots, 0.0f);
  }
}

void Reference(const PackRowsArgs& a, const MachineView& m) {
  if (a.row_norm != kNoTensor) {
    ReferenceSlice(a, m);
    return;
  }
  if (a.splits != 0) {  // the parts added in part order first, into the input
    float* x = m.ptr<float>(a.input);
    const float* parts = m.ptr<float>(a.parts);
    for (uint64_t i = U(a.row_begin) * a.k; i < std::min<uint64_t>(a.m, U(a.row_begin) + a.rows) * a.k; ++i) {
      float sum = x[i];
      for (uint32_t s = 0; s < a.splits; ++s) sum += parts[s * U(a.m) * a.k + i];
      x[i] = sum;
    }
  }
  const float* in = m.ptr<float>(a.input);
  uint16_t* image = m.ptr<uint16_t>(a.out);
  const uint32_t width = GemmSlabs(a.k) * kGemmSlabK;
  std::vector<float> row(a.k);
  for (uint32_t r = a.row_begin; r < a.row_begin + a.rows; ++r) {
    if (r < a.m) {
      std::copy(in + uint64_t{r} * a.k, in + uint64_t{r} * a.k + a.k, row.begin());
      if (a.norm_weight != kNoTensor) RmsNormInto(row.data(), m.ptr<uint16_t>(a.norm_weight), a.k, a.norm_eps, row.data());
    }
    for (uint32_t c = 0; c < width; ++c) {
      image[Swizzled128Offset(a.k, kGemmTileM, r, c) / 2] = r < a.m && c < a.k ? graph::FloatToBf16(row[c]) : 0;
    }
  }
}

void Reference(const GemmArgs& a, const MachineView& m) {
  // The tile's rows of A and W over its K range, read out of the swizzled images once (floats, row-major).
  const GemmSlabRange slabs = GemmSlabsOf(a);
  const uint32_t x_begin = slabs.begin * kGemmSlabK, x_end = std::min(a.k, (slabs.begin + slabs.count) * kGemmSlabK);
  const uint32_t width = x_end - x_begin;
  auto unswizzle = [&](const uint16_t* image, uint32_t row0, uint32_t rows) {
    std::vector<float> values(uint64_t{rows} * width);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t x = x_begin; x < x_end; ++x) {
        values[uint64_t{r} * width + (x - x_begin)] =
            graph::Bf16ToFloat(image[SwizzledImageOffset(a.k, kGemmTileM, Swizzle::k128B, row0 + r, x) / 2]);
      }
    }
    return values;
  };
  const uint32_t m_tile = GemmMTile(a), n_tile = GemmNTile(a);
  const uint32_t columns = GemmTileColumns(a), row0 = m_tile * kGemmTileM, col0 = n_tile * columns;
  const uint32_t col_end = std::min(a.n, col0 + columns);
  const std::vector<float> tile_a = unswizzle(m.ptr<uint16_t>(a.a), row0, std::min(a.m, row0 + kGemmTileM) - row0);
  const std::vector<float> tile_w = unswizzle(m.ptr<uint16_t>(a.weight), col0, col_end - col0);
  float* out = m.ptr<float>(a.out);
  uint16_t* image = m.ptr<uint16_t>(a.out);
  std::vector<float> row_values(kGemmTileN);
  for (uint32_t r = m_tile * kGemmTileM; r < std::min(a.m, (m_tile + 1) * kGemmTileM); ++r) {
    float gate = 0.0f;
    const float scale = a.row_norm != kNoTensor ? RowNormScale(m.ptr<float>(a.row_norm) + uint64_t{r} * kRowNormSlots) : 1.0f;
    for (uint32_t col = col0; col < col_end; ++col) {
      float acc = 0.0f;
      const float* ra = tile_a.data() + uint64_t{r - row0} * width;
      const float* rw = tile_w.data() + uint64_t{col - col0} * width;
      for (uint32_t x = 0; x < width; ++x) acc += ra[x] * rw[x];
      if (a.row_norm != kNoTensor) acc *= scale;
      if (a.bias != kNoTensor && slabs.begin == 0) acc += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[col]);
      if (a.epilogue == kGemmRopeKvAppend) {
        row_values[col - n_tile * kGemmTileN] = acc;
        continue;
      }
      if (a.epilogue == kGemmSiluMulToImage) {
        if (col % 2 == 0) {
          gate = acc;
        } else {
          image[Swizzled128Offset(a.n / 2, kGemmTileM, r, col / 2) / 2] = graph::FloatToBf16(Silu(gate) * acc);
        }
        continue;
      }
      if (a.residual != kNoTensor) acc += m.ptr<float>(a.residual)[uint64_t{r} * a.n + col];
      if (a.epilogue == kGemmStoreF32Relu) acc = std::max(acc, 0.0f);
      out[uint64_t{r} * a.n + col] = acc;
    }
    if (a.epilogue == kGemmRopeKvAppend) {  // the tile's columns of this token, pair by pair
      const int32_t pos = m.ptr<int32_t>(a.step_state)[kStatePosition] + static_cast<int32_t>(r);
      const float* table = m.ptr<float>(a.rope_table);
      const uint32_t group = GemmHeadsPerGroup(a);
      const uint32_t half = a.head_dim / 2, q_width = group * a.num_kv_heads * a.head_dim;
      if (a.qk_norm != kNoTensor) {  // each q and k head of the tile RMS-normed over its head_dim first
        const uint16_t* w = m.ptr<uint16_t>(a.qk_norm);
        for (uint32_t h0 = n_tile * kGemmTileN; h0 < std::min(a.n, (n_tile + 1) * kGemmTileN); h0 += a.head_dim) {
          const QkvRow head = QkvGroupedRow(h0, group, a.head_dim);
          if (head.kind == kQkvV) continue;
          float sum_sq = 0.0f;
          for (uint32_t c = h0; c < h0 + a.head_dim; ++c) sum_sq += row_values[c - n_tile * kGemmTileN] * row_values[c - n_tile * kGemmTileN];
          const float scale = 1.0f / std::sqrt(sum_sq / static_cast<float>(a.head_dim) + a.norm_eps);
          for (uint32_t c = h0; c < h0 + a.head_dim; ++c) {
            const QkvRow q = QkvGroupedRow(c, group, a.head_dim);
            row_values[c - n_tile * kGemmTileN] *=
                scale * graph::Bf16ToFloat(w[(head.kind == kQkvK ? a.head_dim : 0) + q.dim]);
          }
        }
      }
      for (uint32_t col = n_tile * kGemmTileN; col < std::min(a.n, (n_tile + 1) * kGemmTileN); col += 2) {
        float v0 = row_values[col - n_tile * kGemmTileN], v1 = row_values[col + 1 - n_tile * kGemmTileN];
        const QkvRow q = QkvGroupedRow(col, group, a.head_dim);
        if (q.kind != kQkvV) RotatePair(&v0, &v1, q.dim, pos, table, half);
        if (q.kind == kQkvQ) {
          out[uint64_t{r} * q_width + q.head * a.head_dim + q.dim] = v0;
          out[uint64_t{r} * q_width + q.head * a.head_dim + q.dim + half] = v1;
        } else if (pos < static_cast<int32_t>(a.max_seq)) {
          const uint32_t cache = q.kind == kQkvK ? a.k_cache : a.v_cache;
          const uint64_t dst = (uint64_t{q.head} * a.max_seq + pos) * a.head_dim + q.dim;
          KvStore(m, cache, dst, v0);
          KvStore(m, cache, q.kind == kQkvK ? dst + half : dst + 1, v1);
        }
      }
    }
  }
}

}  // namespace loom::isa::ref
