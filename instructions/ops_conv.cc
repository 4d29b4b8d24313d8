// Host side of the convolution family (conv.h): CONV_GEMM, IM2COL, POOL, CONV1D, DWCONV, NHWC_BF16.
#include <algorithm>
#include <cmath>
#include <vector>

#include "instructions/opcode_host.h"
#include "instructions/swizzle.h"

namespace loom::isa::ref {

void Validate(const ConvGemmArgs& a, Checker& c) {
  const ConvShape s = ConvShapeOf(a);
  c.Require(a.flags <= (kConvReluInput | kConvBf16Input | kConvTall), absl::StrCat("unknown flags ", a.flags));
  const bool bf16 = (a.flags & kConvBf16Input) != 0;
  ValidateConvGeometry(s, a.batch, a.c, a.c_begin, a.group_c, a.flags & kConvReluInput, c);
  c.Require(!bf16 || !(a.flags & kConvReluInput), "a bf16 input is copied as it is: no ReLU as it is read");
  c.Require(!bf16 || ConvBf16Readable(a.c, a.c_begin, a.group_c),
            absl::StrCat("a bf16 input needs c, c_begin and group_c multiples of 8, not ", a.c, ", ", a.c_begin, ", ",
                         a.group_c));
  c.Require(a.n > 0, "n must be positive");
  c.Require(U(s.oh) * s.stride_h + U(s.kh) * s.dilation_h < (uint64_t{1} << 30) &&
                U(s.ow) * s.stride_w + U(s.kw) * s.dilation_w < (uint64_t{1} << 30),
            "window positions of 2^30 or more");
  const uint64_t input = U(a.batch) * s.h * s.w * a.c, m = U(a.batch) * s.oh * s.ow, k = U(s.kh) * s.kw * a.group_c;
  c.Require(input < (uint64_t{1} << 31) && m < (uint64_t{1} << 31) && m * a.n < (uint64_t{1} << 32) &&
                k < (uint64_t{1} << 20),
            "input, rows or output of 2^31 elements or more");
  if (!c.status().ok()) return;
  const uint32_t row_tiles = static_cast<uint32_t>((m + ConvTileRows(a) - 1) / ConvTileRows(a));
  c.Require(a.m_tile < row_tiles && a.n_tile < GemmTiles(a.n),
            absl::StrCat("tile (", a.m_tile, ", ", a.n_tile, ") outside the ", row_tiles, " x ", GemmTiles(a.n),
                         " output tiles"));
  if (a.flags & kConvTall) {
    c.Require(bf16 && a.n <= kConvTallCols && a.slabs == 0 && a.epilogue != kGemmPartialF32 &&
                  ConvStagesOutput(a),
              absl::StrCat("a tall tile needs a bf16 input, n <= ", kConvTallCols,
                           " (a multiple of 4, of 8 with out_bf16), the whole K and a store epilogue; n ", a.n));
  }
  const uint32_t slabs = GemmSlabs(static_cast<uint32_t>(k)), slab_begin = GemmSplitBegin(a),
                 slab_count = GemmSplitCount(a);
  c.Require(U(slab_begin) + (slab_count == 0 ? 1 : slab_count) <= slabs,
            absl::StrCat("K slabs [", slab_begin, ", +", slab_count, ") outside the ", slabs));
  c.Require(a.epilogue == kGemmStoreF32 || a.epilogue == kGemmStoreF32Relu || a.epilogue == kGemmPartialF32,
            absl::StrCat("epilogue ", a.epilogue, ": a convolution stores f32 (whole or a part of a split product)"));
  c.Require(a.epilogue == kGemmPartialF32 || a.slabs == 0, "only the partial epilogue may take part of K");
  if (a.epilogue == kGemmPartialF32) {
    c.Require(a.residual == kNoTensor, "a part of a split product: SUM_SPLITS adds the residual");
    c.Require(a.out_bf16 == kNoTensor && a.out != kNoTensor, "a part of a split product: into out (f32) only");
  }
  c.Require(a.out != kNoTensor || a.out_bf16 != kNoTensor, "no output: out and out_bf16 are both kNoTensor");
  c.Tensor("input", a.input, bf16 ? BF16 : F32, input);
  c.Tensor("weight", a.weight, BF16, GemmImageBytes(a.n, static_cast<uint32_t>(k)) / 2);
  if (a.out != kNoTensor) c.Tensor("out", a.out, F32, m * a.n);
  if (a.out_bf16 != kNoTensor) c.Tensor("out_bf16", a.out_bf16, BF16, m * a.n);
  if (a.bias != kNoTensor) c.Tensor("bias", a.bias, BF16, a.n);
  if (a.residual != kNoTensor) c.Tensor("residual", a.residual, F32, m * a.n);
}

// The patches are gathered from the input per K slab (reading each input element once per tap that covers it).
Footprint Cost(const ConvGemmArgs& a, uint32_t) {
  const uint64_t slabs = ConvGemmSlabsOf(a).count, input = (a.flags & kConvBf16Input) ? 1 : 2;
  const uint64_t stores = (a.out != kNoTensor ? 4 : 0) + (a.out_bf16 != kNoTensor ? 2 : 0);
  const uint64_t rows = ConvTileRows(a), cols = (a.flags & kConvTall) ? kConvTallCols : kGemmTileN;
  return {slabs * kGemmSlabBytes, slabs * input * rows * kGemmSlabK * 2 + stores * rows * cols,
          ConvGemmActivationBytes(a), 2ull * rows * cols * slabs * kGemmSlabK};
}

// The tile's patches rounded to bf16 as the device stores them (a bf16 input as it is), times the bf16 weight
// image, summed in f32.
void Reference(const ConvGemmArgs& a, const MachineView& m) {
  const ConvShape s = ConvShapeOf(a);
  const uint32_t rows = ConvGemmRows(a), k = ConvGemmK(a);
  const GemmSlabRange slabs = ConvGemmSlabsOf(a);
  const uint32_t x_begin = slabs.begin * kGemmSlabK, x_end = std::min(k, (slabs.begin + slabs.count) * kGemmSlabK);
  const uint32_t width = x_end - x_begin, row0 = a.m_tile * ConvTileRows(a), col0 = a.n_tile * kGemmTileN;
  const uint32_t row_end = std::min(rows, row0 + ConvTileRows(a)), col_end = std::min(a.n, col0 + kGemmTileN);
  const bool bf16 = (a.flags & kConvBf16Input) != 0, relu = (a.flags & kConvReluInput) != 0;
  const uint16_t* w = m.ptr<uint16_t>(a.weight);
  std::vector<ConvTap> taps(width);
  for (uint32_t j = 0; j < width; ++j) taps[j] = ConvTapOf(a, s, x_begin + j);
  std::vector<float> weights(uint64_t{col_end - col0} * width), patch(width);
  for (uint32_t col = col0; col < col_end; ++col) {
    for (uint32_t j = 0; j < width; ++j) {
      weights[uint64_t{col - col0} * width + j] =
          graph::Bf16ToFloat(w[SwizzledImageOffset(k, kGemmTileM, Swizzle::k128B, col, x_begin + j) / 2]);
    }
  }
  for (uint32_t r = row0; r < row_end; ++r) {
    const ConvRow row = ConvRowOf(a, s, r);
    for (uint32_t j = 0; j < width; ++j) {
      uint32_t at = 0;
      float v = 0.0f;
      if (ConvPatchAt(a, s, row, taps[j], &at)) {
        v = bf16 ? graph::Bf16ToFloat(m.ptr<uint16_t>(a.input)[at]) : m.ptr<float>(a.input)[at];
      }
      if (relu && v < 0.0f) v = 0.0f;
      patch[j] = graph::Bf16ToFloat(graph::FloatToBf16(v));
    }
    for (uint32_t col = col0; col < col_end; ++col) {
      float acc = 0.0f;
      const float* rw = weights.data() + uint64_t{col - col0} * width;
      for (uint32_t j = 0; j < width; ++j) acc += patch[j] * rw[j];
      if (a.bias != kNoTensor && slabs.begin == 0) acc += graph::Bf16ToFloat(m.ptr<uint16_t>(a.bias)[col]);
      const uint64_t at = uint64_t{r} * a.n + col;
      if (a.residual != kNoTensor) acc += m.ptr<float>(a.residual)[at];
      if (a.epilogue == kGemmStoreF32Relu) acc = std::max(acc, 0.0f);
      if (a.out != kNoTensor) m.ptr<float>(a.out)[at] = acc;
      if (a.out_bf16 != kNoTensor) m.ptr<uint16_t>(a.out_bf16)[at] = graph::FloatToBf16(acc);
    }
  }
}

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
  c.Require(EwValid(a.out_func) && !EwBinary(a.out_func) && a.out_func != kEwZero,
            absl::StrCat("out_func ", a.out_func, " is not a unary function"));
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
