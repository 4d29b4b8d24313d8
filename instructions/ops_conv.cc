// Host side of the convolution family (conv.h): IM2COL, POOL, CONV1D, DWCONV, NHWC_BF16 (CONV_GEMM: ops_gemm.cc).
#include <algorithm>
#include <cmath>

#include "instructions/opcode_host.h"
#include "instructions/swizzle.h"

namespace loom::isa::ref {

void Validate(const ImToColArgs& a, Checker& c) {
  ValidateConvGeometry({a.h, a.w, a.oh, a.ow, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_top, a.pad_left, a.dilation_h,
                        a.dilation_w},
                       a.n, a.c, a.c_begin, a.group_c, a.relu, c);
  const uint64_t m = U(a.n) * a.oh * a.ow, k = U(a.kh) * a.kw * a.group_c;
  c.Require(m < (uint64_t{1} << 31) && k < (uint64_t{1} << 20), "image too large");
  c.Require(a.rows > 0 && U(a.row_begin) + a.rows <= U(GemmTiles(static_cast<uint32_t>(m))) * kGemmTileM,
            absl::StrCat("rows [", a.row_begin, ", +", a.rows, ") outside the ", GemmTiles(static_cast<uint32_t>(m)),
                         " row tiles"));
  c.Tensor("input", a.input, F32, U(a.n) * a.h * a.w * a.c);
  c.Tensor("out", a.out, BF16, GemmImageBytes(static_cast<uint32_t>(m), static_cast<uint32_t>(k)) / 2);
}

void Validate(const PoolArgs& a, Checker& c) {
  c.Require(a.n > 0 && a.h > 0 && a.w > 0 && a.c > 0 && a.oh > 0 && a.ow > 0 && a.kh > 0 && a.kw > 0,
            "every dimension must be positive");
  c.Require(a.stride_h > 0 && a.stride_w > 0 && a.dilation_h > 0 && a.dilation_w > 0,
            "strides and dilations must be positive");
  c.Require(a.mode < kNumPoolModes, absl::StrCat("unknown pool mode ", a.mode));
  const uint64_t out = U(a.n) * a.oh * a.ow * a.c;
  c.Require(a.count > 0 && U(a.begin) + a.count <= out,
            absl::StrCat("elements [", a.begin, ", +", a.count, ") outside the ", out, " outputs"));
  c.Require(U(a.n) * a.h * a.w * a.c < (uint64_t{1} << 32), "input of 2^32 elements or more");
  c.Tensor("input", a.input, F32, U(a.n) * a.h * a.w * a.c);
  c.Tensor("out", a.out, F32, out);
  if (a.out_bf16 != kNoTensor) c.Tensor("out_bf16", a.out_bf16, BF16, out);
}

Footprint Cost(const ImToColArgs& a, uint32_t) {
  const uint64_t elements = U(a.rows) * GemmSlabs(ImToColK(a)) * kGemmSlabK;
  return {0, 6 * elements, 0, elements};
}

Footprint Cost(const PoolArgs& a, uint32_t) {
  const uint64_t window = U(a.kh) * a.kw;
  return {0, 4ull * a.count * (window + 1), PoolActivationBytes(a), a.count * window};
}

void Reference(const ImToColArgs& a, const MachineView& m) {
  const float* in = m.ptr<float>(a.input);
  uint16_t* image = m.ptr<uint16_t>(a.out);
  const uint32_t rows = ImToColRows(a), k = ImToColK(a), width = GemmSlabs(k) * kGemmSlabK;
  for (uint32_t r = a.row_begin; r < a.row_begin + a.rows; ++r) {
    const uint32_t ox = r % a.ow, oy = r / a.ow % a.oh, b = r / a.ow / a.oh;
    for (uint32_t col = 0; col < width; ++col) {
      float v = 0.0f;
      if (r < rows && col < k) {
        const uint32_t ch = col % a.group_c, kx = col / a.group_c % a.kw, ky = col / a.group_c / a.kw;
        const int64_t iy = int64_t{oy} * a.stride_h - a.pad_top + int64_t{ky} * a.dilation_h;
        const int64_t ix = int64_t{ox} * a.stride_w - a.pad_left + int64_t{kx} * a.dilation_w;
        if (iy >= 0 && iy < a.h && ix >= 0 && ix < a.w) {
          v = in[((uint64_t{b} * a.h + iy) * a.w + ix) * a.c + a.c_begin + ch];
          if (a.relu != 0) v = std::max(v, 0.0f);
        }
      }
      image[Swizzled128Offset(k, kGemmTileM, r, col) / 2] = graph::FloatToBf16(v);
    }
  }
}

void Reference(const PoolArgs& a, const MachineView& m) {
  const float* in = m.ptr<float>(a.input);
  float* out = m.ptr<float>(a.out);
  uint16_t* image = a.out_bf16 != kNoTensor ? m.ptr<uint16_t>(a.out_bf16) : nullptr;
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) {
    out[i] = PoolElement(a, in, i);
    if (image != nullptr) image[i] = graph::FloatToBf16(out[i]);
  }
}

void Validate(const Conv1dArgs& a, Checker& c) {
  c.Require(a.rows > 0 && a.channels > 0 && a.k > 0, "rows, channels and k must be positive");
  c.Require(a.c_count > 0 && U(a.c_begin) + a.c_count <= a.channels,
            absl::StrCat("channels [", a.c_begin, ", +", a.c_count, ") outside the ", a.channels));
  c.Require((a.state == kNoTensor) == (a.k == 1), "a state is needed exactly when k > 1");
  c.Require(U(a.rows + a.k) * a.channels < (uint64_t{1} << 32), "input of 2^32 elements or more");
  c.Tensor("input", a.input, F32, U(a.rows) * a.channels);
  c.Tensor("weight", a.weight, F32, U(a.channels) * a.k);
  if (a.state != kNoTensor) c.Tensor("state", a.state, F32, U(a.channels) * (a.k - 1));
  if (a.bias != kNoTensor) c.Tensor("bias", a.bias, F32, a.channels);
  c.Tensor("out", a.out, F32, U(a.rows) * a.channels);
}

Footprint Cost(const Conv1dArgs& a, uint32_t) {
  const uint64_t outputs = U(a.rows) * a.c_count;
  return {0, 8 * outputs + 8ull * a.c_count * a.k, 0, 2 * outputs * a.k};
}

// Every output first (they read the old state), then the state shifted along.
void Reference(const Conv1dArgs& a, const MachineView& m) {
  const float* in = m.ptr<float>(a.input);
  const float* w = m.ptr<float>(a.weight);
  float* state = a.state != kNoTensor ? m.ptr<float>(a.state) : nullptr;
  const float* bias = a.bias != kNoTensor ? m.ptr<float>(a.bias) : nullptr;
  float* out = m.ptr<float>(a.out);
  for (uint32_t c = a.c_begin; c < a.c_begin + a.c_count; ++c) {
    for (uint32_t t = 0; t < a.rows; ++t) {
      float acc = bias != nullptr ? bias[c] : 0.0f;
      for (uint32_t j = 0; j < a.k; ++j) acc += w[U(c) * a.k + j] * Conv1dWindow(a, in, state, c, t + j);
      out[U(t) * a.channels + c] = acc;
    }
  }
  for (uint32_t c = a.c_begin; c < a.c_begin + a.c_count; ++c) {
    for (uint32_t j = 0; j + 1 < a.k; ++j) state[U(c) * (a.k - 1) + j] = Conv1dWindow(a, in, state, c, a.rows + j);
  }
}

void Validate(const DwConvArgs& a, Checker& c) {
  c.Require(a.n > 0 && a.h > 0 && a.w > 0 && a.c > 0 && a.oh > 0 && a.ow > 0 && a.kh > 0 && a.kw > 0,
            "every dimension must be positive");
  c.Require(a.stride_h > 0 && a.stride_w > 0 && a.dilation_h > 0 && a.dilation_w > 0,
            "strides and dilations must be positive");
  c.Require(a.oc > 0 && a.oc % a.c == 0, absl::StrCat("oc ", a.oc, " is not a multiple of c ", a.c));
  c.Require(a.relu_in <= 1, "relu_in must be 0 or 1");
  const uint64_t out = U(a.n) * a.oh * a.ow * a.oc;
  c.Require(a.count > 0 && U(a.begin) + a.count <= out,
            absl::StrCat("elements [", a.begin, ", +", a.count, ") outside the ", out, " outputs"));
  c.Require(out < (uint64_t{1} << 32) && U(a.n) * a.h * a.w * a.c < (uint64_t{1} << 32), "2^32 elements or more");
  c.Tensor("input", a.input, F32, U(a.n) * a.h * a.w * a.c);
  c.Tensor("weight", a.weight, F32, U(a.oc) * a.kh * a.kw);
  if (a.bias != kNoTensor) c.Tensor("bias", a.bias, F32, a.oc);
  c.Tensor("out", a.out, F32, out);
}

Footprint Cost(const DwConvArgs& a, uint32_t) {
  const uint64_t window = U(a.kh) * a.kw;
  return {0, 4ull * a.count * (window + 2), 0, 2ull * a.count * window};
}

void Reference(const DwConvArgs& a, const MachineView& m) {
  const float* in = m.ptr<float>(a.input);
  const float* w = m.ptr<float>(a.weight);
  const float* bias = a.bias != kNoTensor ? m.ptr<float>(a.bias) : nullptr;
  float* out = m.ptr<float>(a.out);
  for (uint32_t i = a.begin; i < a.begin + a.count; ++i) out[i] = DwConvElement(a, in, w, bias, i);
}

void Validate(const NhwcBf16Args& a, Checker& c) {
  c.Require(a.n > 0 && a.h > 0 && a.w > 0 && a.c > 0, "every dimension must be positive");
  c.Require(a.c_pad % 8 == 0 && a.c_pad >= a.c, absl::StrCat("c_pad ", a.c_pad, " is not a multiple of 8 >= c ", a.c));
  c.Require(a.relu <= 1, "relu must be 0 or 1");
  const uint64_t pixels = U(a.n) * a.h * a.w;
  c.Require(a.count > 0 && U(a.begin) + a.count <= pixels,
            absl::StrCat("pixels [", a.begin, ", +", a.count, ") outside the ", pixels));
  const uint64_t end = U(a.n - 1) * a.stride_n + U(a.h - 1) * a.stride_h + U(a.w - 1) * a.stride_w +
                       U(a.c - 1) * a.stride_c + 1;
  c.Require(end < (uint64_t{1} << 32) && pixels * a.c_pad < (uint64_t{1} << 32), "offsets of 2^32 elements or more");
  c.Tensor("input", a.input, F32, end);
  c.Tensor("out", a.out, BF16, pixels * a.c_pad);
}

Footprint Cost(const NhwcBf16Args& a, uint32_t) { return {0, U(a.count) * (4 * a.c + 2 * a.c_pad), 0, 0}; }

void Reference(const NhwcBf16Args& a, const MachineView& m) {
  const float* in = m.ptr<float>(a.input);
  uint16_t* out = m.ptr<uint16_t>(a.out);
  for (uint32_t p = a.begin; p < a.begin + a.count; ++p) {
    const uint32_t at = NhwcBf16Pixel(a, p);
    for (uint32_t ch = 0; ch < a.c_pad; ++ch) out[U(p) * a.c_pad + ch] = graph::FloatToBf16(NhwcBf16Value(a, in, at, ch));
  }
}

}  // namespace loom::isa::ref
