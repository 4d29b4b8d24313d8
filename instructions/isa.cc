#include "instructions/isa.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "instructions/swizzle.h"

namespace loom::isa {
namespace {

using graph::BF16;
using graph::F32;
using graph::I32;

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

uint64_t U(uint32_t v) { return v; }

void Validate(const EmbedArgs& a, Checker& c) {
  c.Require(a.hidden > 0 && a.vocab > 0, "hidden and vocab must be positive");
  c.Require(a.row_stride >= a.hidden, "row_stride must be at least hidden");
  c.Tensor("table", a.table, BF16, U(a.vocab) * a.row_stride);
  c.Tensor("tokens", a.tokens, I32, 1);
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("out", a.out, F32, a.hidden);
}
void Validate(const RmsNormArgs& a, Checker& c) {
  c.Require(a.n > 0 && a.eps > 0, "n and eps must be positive");
  c.Tensor("input", a.input, F32, a.n);
  c.Tensor("weight", a.weight, BF16, a.n);
  c.Tensor("out", a.out, F32, a.n);
}
void Validate(const MatvecArgs& a, Checker& c) {
  c.Require(a.rows > 0 && a.k > 0, "rows and k must be positive");
  // x arrives by bulk copy (16-byte multiples) and is read as float4.
  c.Require(a.k % 4 == 0, absl::StrCat("k = ", a.k, " must be a multiple of 4"));
  c.Require(U(a.rows) * MatvecRowStride(a.k) < (uint64_t{1} << 32),
            absl::StrCat("a tile of ", a.rows, " x ", a.k, " is too large (32-bit element indices)"));
  c.Require(a.prologue <= kPrologueRmsNorm, absl::StrCat("unknown prologue ", a.prologue));
  c.Require(a.epilogue < kNumEpilogues, absl::StrCat("unknown epilogue ", a.epilogue));
  c.Tensor("weight", a.weight, BF16, (U(a.row_begin) + a.rows) * MatvecRowStride(a.k));
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
      if (a.epilogue == kEpilogueArgmaxPartial) c.Tensor("partials", a.partials, F32, 2 * (U(a.tile_index) + 1));
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
      c.Tensor("k_cache", a.k_cache, F32, kv_rows * a.max_seq);
      c.Tensor("v_cache", a.v_cache, F32, kv_rows * a.max_seq);
      c.Tensor("step_state", a.step_state, I32, kStepStateWords);
      c.Tensor("rope_table", a.rope_table, F32, a.head_dim / 2 + 1);
      break;
    }
  }
}
void Validate(const RopeAppendArgs& a, Checker& c) {
  c.Require(a.head_dim > 0 && a.head_dim % 2 == 0 && a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0,
            "bad head layout");
  const uint64_t q = U(a.num_heads) * a.head_dim, kv = U(a.num_kv_heads) * a.head_dim;
  c.Tensor("q_in", a.q_in, F32, q);
  c.Tensor("k_in", a.k_in, F32, kv);
  c.Tensor("v_in", a.v_in, F32, kv);
  c.Tensor("q_out", a.q_out, F32, q);
  c.Tensor("k_cache", a.k_cache, F32, kv * a.max_seq);
  c.Tensor("v_cache", a.v_cache, F32, kv * a.max_seq);
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("rope_table", a.rope_table, F32, a.head_dim / 2 + 1);
  if (a.q_norm != kNoTensor) c.Tensor("q_norm", a.q_norm, BF16, a.head_dim);
  if (a.k_norm != kNoTensor) c.Tensor("k_norm", a.k_norm, BF16, a.head_dim);
  if (a.q_norm != kNoTensor || a.k_norm != kNoTensor) c.Require(a.norm_eps > 0, "norm_eps must be positive");
}
void Validate(const AttnPartialArgs& a, Checker& c) {
  c.Require(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 && a.kv_head < a.num_kv_heads,
            "bad kv_head / head counts");
  c.Require(a.num_splits > 0 && a.split < a.num_splits, "split outside num_splits");
  c.Require(a.head_dim > 0 && a.scale > 0, "head_dim and scale must be positive");
  // What the device implementation covers (one thread per head dimension slice, accumulators per group head).
  c.Require(a.head_dim % 4 == 0 && kAttnThreads % a.head_dim == 0,
            absl::StrCat("head_dim ", a.head_dim, " must divide ", kAttnThreads, " and be a multiple of 4"));
  c.Require(a.num_kv_heads == 0 || a.num_heads / a.num_kv_heads <= kAttnMaxGroupHeads,
            absl::StrCat(a.num_kv_heads == 0 ? 0 : a.num_heads / a.num_kv_heads,
                         " query heads share a KV head; at most ", kAttnMaxGroupHeads, " can"));
  const uint64_t kv = U(a.num_kv_heads) * a.head_dim;
  c.Tensor("q", a.q, F32, U(a.num_heads) * a.head_dim);
  c.Tensor("k_cache", a.k_cache, F32, kv * a.max_seq);
  c.Tensor("v_cache", a.v_cache, F32, kv * a.max_seq);
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("partial_o", a.partial_o, F32, U(a.num_splits) * a.num_heads * a.head_dim);
  c.Tensor("partial_ml", a.partial_ml, F32, U(a.num_splits) * a.num_heads * 2);
}
void Validate(const AttnReduceArgs& a, Checker& c) {
  c.Require(a.num_splits > 0 && a.head_dim > 0 && a.head_count > 0, "sizes must be positive");
  c.Require(U(a.head_begin) + a.head_count <= a.num_heads, "heads outside num_heads");
  c.Tensor("partial_o", a.partial_o, F32, U(a.num_splits) * a.num_heads * a.head_dim);
  c.Tensor("partial_ml", a.partial_ml, F32, U(a.num_splits) * a.num_heads * 2);
  c.Tensor("out", a.out, F32, U(a.num_heads) * a.head_dim);
}
void Validate(const SiluMulArgs& a, Checker& c) {
  const uint64_t end = U(a.begin) + a.count;
  c.Tensor("gate", a.gate, F32, end);
  c.Tensor("up", a.up, F32, end);
  c.Tensor("out", a.out, F32, end);
}
void Validate(const AddArgs& a, Checker& c) {
  const uint64_t end = U(a.begin) + a.count;
  c.Tensor("a", a.a, F32, end);
  c.Tensor("b", a.b, F32, end);
  c.Tensor("out", a.out, F32, end);
}
void Validate(const ArgmaxPartialArgs& a, Checker& c) {
  c.Require(a.count > 0, "count must be positive");
  c.Tensor("logits", a.logits, F32, U(a.begin) + a.count);
  c.Tensor("partials", a.partials, F32, 2 * (U(a.tile_index) + 1));
}
void Validate(const ArgmaxReduceArgs& a, Checker& c) {
  c.Require(a.num_partials > 0, "num_partials must be positive");
  c.Tensor("partials", a.partials, F32, 2 * U(a.num_partials));
  c.Tensor("step_state", a.step_state, I32, kStepStateWords);
  c.Tensor("tokens", a.tokens, I32, U(a.max_seq) + 1);
}

void Validate(const GemmArgs& a, Checker& c) {
  c.Require(a.m > 0 && a.n > 0 && a.k > 0, "m, n and k must be positive");
  c.Require(a.m_tile < GemmTiles(a.m) && a.n_tile < GemmTiles(a.n),
            absl::StrCat("tile (", a.m_tile, ", ", a.n_tile, ") outside the ", GemmTiles(a.m), " x ", GemmTiles(a.n),
                         " output tiles"));
  c.Tensor("a", a.a, BF16, GemmImageBytes(a.m, a.k) / 2);
  c.Tensor("weight", a.weight, BF16, GemmImageBytes(a.n, a.k) / 2);
  c.Require(a.epilogue < kNumGemmEpilogues, absl::StrCat("unknown epilogue ", a.epilogue));
  if (a.epilogue == kGemmRopeKvAppend) {
    const uint64_t kv_rows = U(a.num_kv_heads) * a.head_dim;
    c.Require(a.head_dim > 0 && a.head_dim % 2 == 0 && a.heads_per_group > 0 && a.num_kv_heads > 0,
              "RoPE layout needs an even head_dim and positive head counts");
    c.Require(a.n == (U(a.heads_per_group) + 2) * kv_rows, "n must be the grouped q|k|v rows");
    c.Require(a.residual == kNoTensor, "no residual with the RoPE epilogue");
    c.Tensor("out", a.out, F32, U(a.m) * a.heads_per_group * kv_rows);
    c.Tensor("k_cache", a.k_cache, F32, kv_rows * a.max_seq);
    c.Tensor("v_cache", a.v_cache, F32, kv_rows * a.max_seq);
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
}

void Validate(const PackRowsArgs& a, Checker& c) {
  c.Require(a.m > 0 && a.k > 0 && a.tiles > 0, "m, k and tiles must be positive");
  c.Require(U(a.tile_begin) + a.tiles <= GemmTiles(a.m),
            absl::StrCat("tiles [", a.tile_begin, ", ", U(a.tile_begin) + a.tiles, ") outside the ", GemmTiles(a.m),
                         " row tiles"));
  c.Tensor("input", a.input, F32, U(a.m) * a.k);
  c.Tensor("out", a.out, BF16, GemmImageBytes(a.m, a.k) / 2);
  if (a.norm_weight != kNoTensor) {
    c.Tensor("norm_weight", a.norm_weight, BF16, a.k);
    c.Require(a.norm_eps > 0, "norm_eps must be positive");
  }
}

// ---- footprints -----------------------------------------------------------

Footprint Cost(const EmbedArgs& a, uint32_t) { return {2ull * a.hidden, 4ull * a.hidden + 16, 0, 0}; }
Footprint Cost(const RmsNormArgs& a, uint32_t) { return {2ull * a.n, 8ull * a.n, 0, 4ull * a.n}; }
Footprint Cost(const MatvecArgs& a, uint32_t) {
  Footprint f;
  f.weight_bytes = 2ull * a.rows * MatvecRowStride(a.k) + (a.bias != kNoTensor ? 2ull * a.rows : 0);
  f.activation_bytes = 4ull * a.k + 8ull * a.rows + (a.prologue == kPrologueRmsNorm ? 2ull * a.k : 0);
  f.smem_bytes = MatvecActivationBytes(a.rows, a.k);
  f.flops = 2ull * a.rows * a.k;
  return f;
}
Footprint Cost(const RopeAppendArgs& a, uint32_t) {
  const uint64_t n = (U(a.num_heads) + 2 * a.num_kv_heads) * a.head_dim;
  return {0, 8 * n, 0, 6 * n};
}
Footprint Cost(const AttnPartialArgs& a, uint32_t context) {
  const uint64_t positions = (U(context) + a.num_splits - 1) / a.num_splits;
  const uint64_t group = a.num_heads / a.num_kv_heads;
  Footprint f;
  f.activation_bytes = 2 * positions * a.head_dim * 4 + group * a.head_dim * 8;
  f.smem_bytes = AttnPartialActivationBytes(static_cast<uint32_t>(group), a.head_dim, static_cast<uint32_t>(positions));
  f.flops = 4 * group * positions * a.head_dim;
  return f;
}
Footprint Cost(const AttnReduceArgs& a, uint32_t) {
  const uint64_t n = U(a.num_splits) * a.head_count * (a.head_dim + 2);
  return {0, 4 * n + 4ull * a.head_count * a.head_dim, 0, 2 * n};
}
Footprint Cost(const SiluMulArgs& a, uint32_t) { return {0, 12ull * a.count, 0, 4ull * a.count}; }
Footprint Cost(const AddArgs& a, uint32_t) { return {0, 12ull * a.count, 0, 1ull * a.count}; }
Footprint Cost(const ArgmaxPartialArgs& a, uint32_t) { return {0, 4ull * a.count + 8, 0, a.count}; }
Footprint Cost(const ArgmaxReduceArgs& a, uint32_t) { return {0, 8ull * a.num_partials + 16, 0, a.num_partials}; }
Footprint Cost(const PackRowsArgs& a, uint32_t) {
  const uint64_t elements = uint64_t{a.tiles} * kGemmTileM * GemmSlabs(a.k) * kGemmSlabK;
  return {0, 6 * elements, 0, 3 * elements};
}
Footprint Cost(const GemmArgs& a, uint32_t) {
  const uint64_t slabs = GemmSlabs(a.k);
  return {slabs * kGemmSlabBytes, slabs * kGemmSlabBytes + 4ull * kGemmTileM * kGemmTileN, 0,
          2ull * kGemmTileM * kGemmTileN * slabs * kGemmSlabK};
}

// ---- float32 references ---------------------------------------------------

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

void Reference(const EmbedArgs& a, const MachineView& m) {
  const int32_t* state = m.ptr<int32_t>(a.step_state);
  int32_t token = m.ptr<int32_t>(a.tokens)[state[kStatePosition]];
  if (token < 0 || static_cast<uint32_t>(token) >= a.vocab) token = 0;  // the host validated the prompt
  const uint16_t* row = m.ptr<uint16_t>(a.table) + static_cast<uint64_t>(token) * a.row_stride;
  float* out = m.ptr<float>(a.out);
  for (uint32_t i = 0; i < a.hidden; ++i) out[i] = graph::Bf16ToFloat(row[i]);
}

// x * rsqrt(mean(x^2) + eps) * w, the same operation order as the graph evaluator.
void RmsNormInto(const float* x, const uint16_t* w, uint32_t n, float eps, float* out) {
  float sum_sq = 0.0f;
  for (uint32_t j = 0; j < n; ++j) sum_sq += x[j] * x[j];
  const float scale = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  for (uint32_t j = 0; j < n; ++j) out[j] = x[j] * scale * graph::Bf16ToFloat(w[j]);
}

void Reference(const RmsNormArgs& a, const MachineView& m) {
  RmsNormInto(m.ptr<float>(a.input), m.ptr<uint16_t>(a.weight), a.n, a.eps, m.ptr<float>(a.out));
}

// Rotates (x, y) by position * table[j], cos and sin scaled by table[half].
void RotatePair(float* x, float* y, uint32_t j, int32_t position, const float* table, uint32_t half) {
  const float angle = static_cast<float>(position) * table[j];
  const float c = std::cos(angle) * table[half], s = std::sin(angle) * table[half];
  const float a = *x, b = *y;
  *x = a * c - b * s;
  *y = b * c + a * s;
}

void Reference(const MatvecArgs& a, const MachineView& m) {
  std::vector<float> x(m.ptr<float>(a.input), m.ptr<float>(a.input) + a.k);
  if (a.prologue == kPrologueRmsNorm) RmsNormInto(x.data(), m.ptr<uint16_t>(a.norm_weight), a.k, a.norm_eps, x.data());
  std::vector<float> y(a.rows);
  const uint64_t stride = MatvecRowStride(a.k);
  const uint16_t* w = m.ptr<uint16_t>(a.weight) + a.row_begin * stride;
  for (uint32_t r = 0; r < a.rows; ++r) {
    float acc = 0.0f;
    for (uint32_t j = 0; j < a.k; ++j) acc += x[j] * graph::Bf16ToFloat(w[r * stride + j]);
    y[r] = acc;
    if (a.bias != kNoTensor) y[r] += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[a.row_begin + r]);
  }
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
      float best = -INFINITY;
      uint32_t best_row = a.row_begin;
      for (uint32_t r = 0; r < a.rows; ++r) {
        out[a.row_begin + r] = y[r];
        if (y[r] > best) best = y[r], best_row = a.row_begin + r;
      }
      m.ptr<float>(a.partials)[2 * a.tile_index] = best;
      m.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_row);
      break;
    }
    case kEpilogueRopeKvAppend: {
      const int32_t pos = m.ptr<int32_t>(a.step_state)[kStatePosition];
      const float* table = m.ptr<float>(a.rope_table);
      const uint32_t half = a.head_dim / 2;
      for (uint32_t r = 0; r < a.rows; r += 2) {
        const QkvRow row = QkvGroupedRow(a.row_begin + r, a.heads_per_group, a.head_dim);
        if (row.kind != kQkvV) RotatePair(&y[r], &y[r + 1], row.dim, pos, table, half);
        float* dst = row.kind == kQkvQ ? out
                     : row.kind == kQkvK ? m.ptr<float>(a.k_cache) + (static_cast<uint64_t>(row.head) * a.max_seq + pos) * a.head_dim
                                         : m.ptr<float>(a.v_cache) + (static_cast<uint64_t>(row.head) * a.max_seq + pos) * a.head_dim;
        const uint32_t base = row.kind == kQkvQ ? row.head * a.head_dim : 0;
        if (row.kind == kQkvV) {  // v rows keep their order: r, r+1 are dims d, d+1
          dst[row.dim] = y[r];
          dst[row.dim + 1] = y[r + 1];
        } else {  // the pair (j, j + half)
          dst[base + row.dim] = y[r];
          dst[base + row.dim + half] = y[r + 1];
        }
      }
      break;
    }
  }
}

void Reference(const RopeAppendArgs& a, const MachineView& m) {
  const int32_t pos = m.ptr<int32_t>(a.step_state)[kStatePosition];
  const float* table = m.ptr<float>(a.rope_table);
  const uint32_t half = a.head_dim / 2;
  // Normalises (optional) then rotates `heads` heads of `in` into `out` (head h at out + h * out_stride).
  auto rotate = [&](const float* in, uint32_t heads, uint32_t norm, float* out, uint64_t out_stride) {
    for (uint32_t h = 0; h < heads; ++h) {
      float* o = out + h * out_stride;
      for (uint32_t d = 0; d < a.head_dim; ++d) o[d] = in[h * a.head_dim + d];
      if (norm != kNoTensor) RmsNormInto(o, m.ptr<uint16_t>(norm), a.head_dim, a.norm_eps, o);
      for (uint32_t j = 0; j < half; ++j) RotatePair(&o[j], &o[j + half], j, pos, table, half);
    }
  };
  rotate(m.ptr<float>(a.q_in), a.num_heads, a.q_norm, m.ptr<float>(a.q_out), a.head_dim);
  const uint64_t cache_row = static_cast<uint64_t>(a.max_seq) * a.head_dim;
  rotate(m.ptr<float>(a.k_in), a.num_kv_heads, a.k_norm, m.ptr<float>(a.k_cache) + pos * uint64_t{a.head_dim}, cache_row);
  for (uint32_t g = 0; g < a.num_kv_heads; ++g) {
    float* v = m.ptr<float>(a.v_cache) + g * cache_row + pos * uint64_t{a.head_dim};
    for (uint32_t d = 0; d < a.head_dim; ++d) v[d] = m.ptr<float>(a.v_in)[g * a.head_dim + d];
  }
}

void Reference(const AttnPartialArgs& a, const MachineView& m) {
  const uint32_t length = static_cast<uint32_t>(m.ptr<int32_t>(a.step_state)[kStatePosition]) + 1;
  uint32_t begin, end;
  SplitRange(length, a.split, a.num_splits, &begin, &end);
  const uint32_t group = a.num_heads / a.num_kv_heads;
  const float* kc = m.ptr<float>(a.k_cache) + static_cast<uint64_t>(a.kv_head) * a.max_seq * a.head_dim;
  const float* vc = m.ptr<float>(a.v_cache) + static_cast<uint64_t>(a.kv_head) * a.max_seq * a.head_dim;
  std::vector<float> scores(end - begin);
  for (uint32_t h = a.kv_head * group; h < (a.kv_head + 1) * group; ++h) {
    const float* q = m.ptr<float>(a.q) + h * a.head_dim;
    float max_score = -INFINITY;
    for (uint32_t p = begin; p < end; ++p) {
      float s = 0.0f;
      for (uint32_t d = 0; d < a.head_dim; ++d) s += q[d] * kc[p * a.head_dim + d];
      scores[p - begin] = s * a.scale;
      max_score = std::max(max_score, scores[p - begin]);
    }
    float* o = m.ptr<float>(a.partial_o) + (static_cast<uint64_t>(a.split) * a.num_heads + h) * a.head_dim;
    for (uint32_t d = 0; d < a.head_dim; ++d) o[d] = 0.0f;
    float l = 0.0f;
    for (uint32_t p = begin; p < end; ++p) {
      const float e = std::exp(scores[p - begin] - max_score);
      l += e;
      for (uint32_t d = 0; d < a.head_dim; ++d) o[d] += e * vc[p * a.head_dim + d];
    }
    float* ml = m.ptr<float>(a.partial_ml) + (static_cast<uint64_t>(a.split) * a.num_heads + h) * 2;
    ml[0] = max_score;
    ml[1] = l;
  }
}

void Reference(const AttnReduceArgs& a, const MachineView& m) {
  const float* po = m.ptr<float>(a.partial_o);
  const float* pml = m.ptr<float>(a.partial_ml);
  float* out = m.ptr<float>(a.out);
  for (uint32_t h = a.head_begin; h < a.head_begin + a.head_count; ++h) {
    float global_max = -INFINITY;
    for (uint32_t s = 0; s < a.num_splits; ++s) global_max = std::max(global_max, pml[(s * a.num_heads + h) * 2]);
    float denom = 0.0f;
    std::vector<float> acc(a.head_dim, 0.0f);
    for (uint32_t s = 0; s < a.num_splits; ++s) {
      const float m_s = pml[(s * a.num_heads + h) * 2];
      if (m_s == -INFINITY) continue;  // empty split
      const float w = std::exp(m_s - global_max);
      denom += w * pml[(s * a.num_heads + h) * 2 + 1];
      for (uint32_t d = 0; d < a.head_dim; ++d) acc[d] += w * po[(static_cast<uint64_t>(s) * a.num_heads + h) * a.head_dim + d];
    }
    for (uint32_t d = 0; d < a.head_dim; ++d) out[h * a.head_dim + d] = denom > 0 ? acc[d] / denom : 0.0f;
  }
}

void Reference(const SiluMulArgs& a, const MachineView& m) {
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    m.ptr<float>(a.out)[i] = Silu(m.ptr<float>(a.gate)[i]) * m.ptr<float>(a.up)[i];
  }
}

void Reference(const AddArgs& a, const MachineView& m) {
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    m.ptr<float>(a.out)[i] = m.ptr<float>(a.a)[i] + m.ptr<float>(a.b)[i];
  }
}

void Reference(const ArgmaxPartialArgs& a, const MachineView& m) {
  const float* logits = m.ptr<float>(a.logits);
  float best = -INFINITY;
  uint32_t best_index = a.begin;
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    if (logits[i] > best) best = logits[i], best_index = i;
  }
  m.ptr<float>(a.partials)[2 * a.tile_index] = best;
  m.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_index);
}

void Reference(const ArgmaxReduceArgs& a, const MachineView& m) {
  const float* partials = m.ptr<float>(a.partials);
  float best = partials[0], best_index = partials[1];
  for (uint32_t t = 1; t < a.num_partials; ++t) {
    const float v = partials[2 * t], index = partials[2 * t + 1];
    if (v > best || (v == best && index < best_index)) best = v, best_index = index;
  }
  int32_t* state = m.ptr<int32_t>(a.step_state);
  const int32_t next = state[kStatePosition] + 1;
  if (next >= static_cast<int32_t>(a.max_seq)) {
    state[kStateOverflow] = 1;
    return;
  }
  if (next >= state[kStatePromptLength]) m.ptr<int32_t>(a.tokens)[next] = static_cast<int32_t>(best_index);
  state[kStatePosition] = next;
}

void Reference(const PackRowsArgs& a, const MachineView& m) {
  const float* in = m.ptr<float>(a.input);
  uint16_t* image = m.ptr<uint16_t>(a.out);
  const uint32_t width = GemmSlabs(a.k) * kGemmSlabK;
  std::vector<float> row(a.k);
  for (uint32_t r = a.tile_begin * kGemmTileM; r < (a.tile_begin + a.tiles) * kGemmTileM; ++r) {
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
  const uint16_t* image_a = m.ptr<uint16_t>(a.a);
  const uint16_t* image_w = m.ptr<uint16_t>(a.weight);
  auto at = [&](const uint16_t* image, uint32_t r, uint32_t c) {
    return graph::Bf16ToFloat(image[SwizzledImageOffset(a.k, kGemmTileM, Swizzle::k128B, r, c) / 2]);
  };
  float* out = m.ptr<float>(a.out);
  uint16_t* image = m.ptr<uint16_t>(a.out);
  std::vector<float> row_values(kGemmTileN);
  for (uint32_t r = a.m_tile * kGemmTileM; r < std::min(a.m, (a.m_tile + 1) * kGemmTileM); ++r) {
    float gate = 0.0f;
    for (uint32_t col = a.n_tile * kGemmTileN; col < std::min(a.n, (a.n_tile + 1) * kGemmTileN); ++col) {
      float acc = 0.0f;
      for (uint32_t x = 0; x < a.k; ++x) acc += at(image_a, r, x) * at(image_w, col, x);
      if (a.bias != kNoTensor) acc += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[col]);
      if (a.epilogue == kGemmRopeKvAppend) {
        row_values[col - a.n_tile * kGemmTileN] = acc;
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
      out[uint64_t{r} * a.n + col] = acc;
    }
    if (a.epilogue == kGemmRopeKvAppend) {  // the tile's columns of this token, pair by pair
      const int32_t pos = m.ptr<int32_t>(a.step_state)[kStatePosition] + static_cast<int32_t>(r);
      const float* table = m.ptr<float>(a.rope_table);
      const uint32_t half = a.head_dim / 2, q_width = a.heads_per_group * a.num_kv_heads * a.head_dim;
      for (uint32_t col = a.n_tile * kGemmTileN; col < std::min(a.n, (a.n_tile + 1) * kGemmTileN); col += 2) {
        float v0 = row_values[col - a.n_tile * kGemmTileN], v1 = row_values[col + 1 - a.n_tile * kGemmTileN];
        const QkvRow q = QkvGroupedRow(col, a.heads_per_group, a.head_dim);
        if (q.kind != kQkvV) RotatePair(&v0, &v1, q.dim, pos, table, half);
        if (q.kind == kQkvQ) {
          out[uint64_t{r} * q_width + q.head * a.head_dim + q.dim] = v0;
          out[uint64_t{r} * q_width + q.head * a.head_dim + q.dim + half] = v1;
        } else if (pos < static_cast<int32_t>(a.max_seq)) {
          float* cache = m.ptr<float>(q.kind == kQkvK ? a.k_cache : a.v_cache) +
                         (uint64_t{q.head} * a.max_seq + pos) * a.head_dim;
          cache[q.dim] = v0;
          cache[q.kind == kQkvK ? q.dim + half : q.dim + 1] = v1;
        }
      }
    }
  }
}

}  // namespace

const char* OpcodeName(Opcode op) {
  switch (op) {
#define LOOM_NAME(name, args) \
  case Opcode::name:          \
    return #name;
    LOOM_OPCODE_LIST(LOOM_NAME)
#undef LOOM_NAME
    default:
      return "UNKNOWN";
  }
}

absl::StatusOr<Opcode> OpcodeFromName(const std::string& name) {
#define LOOM_FROM_NAME(op, args) \
  if (name == #op) return Opcode::op;
  LOOM_OPCODE_LIST(LOOM_FROM_NAME)
#undef LOOM_FROM_NAME
  return absl::InvalidArgumentError(absl::StrCat("unknown opcode '", name, "'"));
}

int ArgCount(Opcode op) {
  switch (op) {
#define LOOM_COUNT(name, args) \
  case Opcode::name:           \
    return static_cast<int>(sizeof(args) / 4);
    LOOM_OPCODE_LIST(LOOM_COUNT)
#undef LOOM_COUNT
    default:
      return 0;
  }
}

const char* const* ArgNames(Opcode op) {
  switch (op) {
#define LOOM_ARG_NAMES(name, args) \
  case Opcode::name:               \
    return args::kFields;
    LOOM_OPCODE_LIST(LOOM_ARG_NAMES)
#undef LOOM_ARG_NAMES
    default:
      return nullptr;
  }
}

absl::Status ValidateInstruction(const Instruction& inst, const std::vector<TensorInfo>& tensors) {
  Checker checker(inst, tensors);
  switch (inst.op()) {
#define LOOM_VALIDATE(name, args)          \
  case Opcode::name:                       \
    Validate(inst.as<args>(), checker);    \
    break;
    LOOM_OPCODE_LIST(LOOM_VALIDATE)
#undef LOOM_VALIDATE
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown opcode ", static_cast<int>(inst.opcode)));
  }
  return checker.status();
}

Footprint InstructionFootprint(const Instruction& inst, uint32_t context) {
  switch (inst.op()) {
#define LOOM_FOOTPRINT(name, args) \
  case Opcode::name:               \
    return Cost(inst.as<args>(), context);
    LOOM_OPCODE_LIST(LOOM_FOOTPRINT)
#undef LOOM_FOOTPRINT
    default:
      return {};
  }
}

void ExecuteReference(const Instruction& inst, const MachineView& machine) {
  switch (inst.op()) {
#define LOOM_REFERENCE(name, args)          \
  case Opcode::name:                        \
    Reference(inst.as<args>(), machine);    \
    break;
    LOOM_OPCODE_LIST(LOOM_REFERENCE)
#undef LOOM_REFERENCE
    default:
      break;
  }
}

}  // namespace loom::isa
