// The element-wise and row-wise family's arguments (general graphs, ONNX), included by instruction.h (same rules:
// 32-bit words, tensor ids, kFields). Host side: ops_elementwise.cc; device: megakernel/ops/elementwise.cuh.
//   ELEMENTWISE a unary or binary map over up to 4 strided dimensions (broadcasts, copies, transposes)
//   SOFTMAX     softmax along one axis of f32 rows
//   NORM_ROWS   LayerNorm or RMSNorm of f32 rows with f32 scale (and shift)
#pragma once

#include <math.h>

namespace loom::isa {

inline constexpr uint32_t kElementwiseDims = 4;
enum ElementwiseFunc : uint32_t {
  kEwCopy = 0,  // unary: out = f(a)
  kEwRelu = 1,
  kEwSigmoid = 2,
  kEwGelu = 3,      // erf form
  kEwGeluTanh = 4,  // tanh approximation
  kEwErf = 5,
  kEwTanh = 6,
  kEwExp = 7,
  kEwZero = 8,  // out = 0 (a is read for its shape only)
  kEwSqrt = 9,
  kEwLog = 10,
  kEwHardSigmoid = 11,  // max(0, min(1, fma(x, 1/6, 1/2))), a NaN kept (graph HARD_SIGMOID)
  kEwHardSwish = 12,    // x times that
  kEwRelu6 = 13,        // min(max(x, 0), 6), -0 and a NaN kept (graph RELU6)
  kEwLastUnary = 13,
  kEwFirstBinary = 16,  // binary: out = f(a, b)
  kEwAdd = 16,
  kEwSub = 17,
  kEwMul = 18,
  kEwDiv = 19,
  kEwSiluMul = 20,  // silu(a) * b (a gate and its value)
  kEwMax = 21,      // a NaN in either operand is the result, as numpy.maximum's
  kEwMin = 22,
  kEwGreater = 23,  // the comparisons: 1 where a OP b holds, else 0 (0 with a NaN operand)
  kEwLess = 24,
  kEwEqual = 25,
  kEwGreaterEqual = 26,
  kEwLessEqual = 27,
  kEwKeep = 28,  // a where b is not 0, else 0
  kEwEnd = 29,
};
LOOM_HD bool EwValid(uint32_t f) { return f <= kEwLastUnary || (f >= kEwFirstBinary && f < kEwEnd); }
LOOM_HD bool EwBinary(uint32_t f) { return f >= kEwFirstBinary; }
// f(x[, y]) in the graph oracle's operation order (graph/nn_ops).
LOOM_HD float EwApply(uint32_t f, float x, float y) {
  switch (f) {
    case kEwRelu: return x > 0.0f ? x : 0.0f;
    case kEwSigmoid: return 1.0f / (1.0f + expf(-x));
    case kEwGelu: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case kEwGeluTanh: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case kEwErf: return erff(x);
    case kEwTanh: return tanhf(x);
    case kEwExp: return expf(x);
    case kEwZero: return 0.0f;
    case kEwSqrt: return sqrtf(x);
    case kEwLog: return logf(x);
    case kEwHardSigmoid:
    case kEwHardSwish: {
      float h = fmaf(x, 1.0f / 6.0f, 0.5f);  // fmaf on both sides: the VM and the GPU round it once, the same
      h = h > 1.0f ? 1.0f : h;
      h = h < 0.0f ? 0.0f : h;
      return f == kEwHardSwish ? x * h : h;
    }
    case kEwRelu6: {
      const float h = x < 0.0f ? 0.0f : x;
      return h > 6.0f ? 6.0f : h;
    }
    case kEwAdd: return x + y;
    case kEwSub: return x - y;
    case kEwMul: return x * y;
    case kEwDiv: return x / y;
    case kEwSiluMul: return x / (1.0f + expf(-x)) * y;
    case kEwMax: return x < y || y != y ? y : x;
    case kEwMin: return x > y || y != y ? y : x;
    case kEwGreater: return x > y ? 1.0f : 0.0f;
    case kEwLess: return x < y ? 1.0f : 0.0f;
    case kEwEqual: return x == y ? 1.0f : 0.0f;
    case kEwGreaterEqual: return x >= y ? 1.0f : 0.0f;
    case kEwLessEqual: return x <= y ? 1.0f : 0.0f;
    case kEwKeep: return y != 0.0f ? x : 0.0f;
    default: return x;
  }
}
// For the elements i in [begin, +count) of the index space [size0, size1, size2, size3] (size3 fastest; i =
// (d0, d1, d2, d3)): out[Σ d_k o_stride_k] = f(a[Σ d_k a_stride_k], b[Σ d_k b_stride_k]). A stride of 0
// broadcasts, permuted strides transpose, out strides other than the contiguous ones write a slice (a CONCAT's
// input into its part of the output, through a view of it).
struct ElementwiseArgs {
  uint32_t func;  // ElementwiseFunc
  uint32_t a;     // f32
  uint32_t b;     // f32, or kNoTensor (unary)
  uint32_t out;   // f32
  uint32_t begin;
  uint32_t count;
  uint32_t size[kElementwiseDims];
  uint32_t a_stride[kElementwiseDims];
  uint32_t b_stride[kElementwiseDims];
  uint32_t o_stride[kElementwiseDims];
  static constexpr const char* kFields[] = {
      "func",      "a",         "b",         "out",       "begin",     "count",     "size0",     "size1",
      "size2",     "size3",     "a_stride0", "a_stride1", "a_stride2", "a_stride3", "b_stride0", "b_stride1",
      "b_stride2", "b_stride3", "o_stride0", "o_stride1", "o_stride2", "o_stride3"};
};
// Element offsets of index i in a, b and out (32-bit: Validate keeps every offset below 2^32).
LOOM_HD void EwOffsets(const ElementwiseArgs& e, uint32_t i, uint32_t* a, uint32_t* b, uint32_t* o) {
  uint32_t oa = 0, ob = 0, oo = 0;
  for (int d = kElementwiseDims - 1; d >= 0; --d) {
    if (e.size[d] == 1) continue;
    const uint32_t coord = i % e.size[d];
    i /= e.size[d];
    oa += coord * e.a_stride[d];
    ob += coord * e.b_stride[d];
    oo += coord * e.o_stride[d];
  }
  *a = oa;
  *b = ob;
  *o = oo;
}
// Whether a, b and out are all walked at the index itself (no broadcast, transpose or slice): the fast path.
LOOM_HD bool EwContiguous(const ElementwiseArgs& e) {
  uint32_t stride = 1;
  for (int d = kElementwiseDims - 1; d >= 0; --d) {
    if (e.size[d] != 1 && (e.a_stride[d] != stride || e.o_stride[d] != stride ||
                           (e.b != kNoTensor && e.b_stride[d] != stride))) {
      return false;
    }
    stride *= e.size[d];
  }
  return true;
}

// Softmax along the middle axis of an input viewed as [outer, len, inner] (contiguous), for the rows
// (o, i) = divmod(r, inner) with r in [begin, +count): out = exp(x - max) / sum, as graph/nn_ops' SOFTMAX.
struct SoftmaxArgs {
  uint32_t input;  // f32 [outer * len * inner]
  uint32_t out;    // f32, the same shape
  uint32_t outer;
  uint32_t len;
  uint32_t inner;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"input", "out", "outer", "len", "inner", "begin", "count"};
};

enum NormMode : uint32_t {
  kNormLayer = 0,  // (x - mean) * rsqrt(mean((x - mean)^2) + eps) * scale + shift
  kNormRms = 1,    // x * rsqrt(mean(x^2) + eps) * scale
  kNumNormModes = 2,
};
// Rows [begin, +count) of an f32 input [rows, len] normalised, as graph/evaluator's LAYER_NORM / RMS_NORM (a
// per-head RMSNorm: rows of head_dim).
struct NormRowsArgs {
  uint32_t input;  // f32 [rows, len]
  uint32_t out;    // f32 [rows, len] (may be the input)
  uint32_t scale;  // f32 [len]
  uint32_t shift;  // f32 [len], or kNoTensor (kNormRms: always)
  uint32_t rows;
  uint32_t len;
  uint32_t mode;  // NormMode
  float eps;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"input", "out", "scale", "shift", "rows", "len",
                                            "mode", "eps", "begin", "count"};
};
template <>
inline constexpr uint32_t kFloatWords<NormRowsArgs> = FloatWord(offsetof(NormRowsArgs, eps));

}  // namespace loom::isa
