// The convolution family's arguments (general graphs, ONNX; and the gated-conv LM's CONV1D), included by
// instruction.h (same rules: 32-bit words, tensor ids, kFields). Host side: ops_conv.cc; device: megakernel/ops/
// conv.cuh and conv_gemm.cuh.
//   CONV_GEMM   a convolution's output tile as an implicit GEMM on the tensor cores (patches gathered into the page)
//   IM2COL      a convolution's rows of input patches as a GEMM's A operand image (the conv is then a GEMM)
//   NHWC_BF16   an f32 tensor (any strides) as bf16 NHWC, channels zero-padded to a multiple of 8 (CONV_GEMM's input)
//   DWCONV      depthwise 2-D convolution of NHWC f32 (one input channel per output channel), direct
//   POOL        max / average windows over NHWC f32
//   CONV1D      depthwise causal convolution over f32 rows, carrying its state across calls (decode and prefill)
#pragma once

#include <math.h>

#include "instructions/elementwise.h"  // EwApply: DWCONV's out_func

namespace loom::isa {

// out = the bf16 swizzled operand image (GemmImageBytes(ImToColRows, ImToColK)) of the patches of an NHWC
// input: image row (b, oy, ox) holds, for (ky, kx, ch) in that order (ch fastest), the input at
// (b, oy * stride_h - pad_top + ky * dilation_h, ox * stride_w - pad_left + kx * dilation_w, c_begin + ch), zero
// outside the input: exactly the rows a CONV2D weight [OC, KH, KW, C / groups] multiplies. Rows [row_begin, +rows)
// (past the last real row: zeros up to the 128-row tile).
struct ImToColArgs {
  uint32_t input;  // f32 [n, h, w, c]
  uint32_t out;    // bf16 image
  uint32_t n;
  uint32_t h;
  uint32_t w;
  uint32_t c;
  uint32_t oh;
  uint32_t ow;
  uint32_t kh;
  uint32_t kw;
  uint32_t stride_h;
  uint32_t stride_w;
  uint32_t pad_top;
  uint32_t pad_left;
  uint32_t dilation_h;
  uint32_t dilation_w;
  uint32_t c_begin;  // the group's first input channel
  uint32_t group_c;  // input channels per group
  uint32_t row_begin;
  uint32_t rows;
  uint32_t relu;  // 1: max(0, input) (a ReLU the producing GEMM split over K left to its readers)
  static constexpr const char* kFields[] = {"input", "out", "n", "h", "w", "c", "oh", "ow", "kh", "kw",
                                            "stride_h", "stride_w", "pad_top", "pad_left", "dilation_h",
                                            "dilation_w", "c_begin", "group_c", "row_begin", "rows", "relu"};
};
LOOM_HD uint32_t ImToColRows(const ImToColArgs& a) { return a.n * a.oh * a.ow; }
LOOM_HD uint32_t ImToColK(const ImToColArgs& a) { return a.kh * a.kw * a.group_c; }

// Two 16-bit fields of one argument word (ConvGemmArgs' packed geometry): hi << 16 | lo.
LOOM_HD uint32_t Pack16(uint32_t hi, uint32_t lo) { return hi << 16 | lo; }
LOOM_HD uint32_t Hi16(uint32_t v) { return v >> 16; }
LOOM_HD uint32_t Lo16(uint32_t v) { return v & 0xffffu; }

// One 128 x 128 output tile of a convolution as an implicit GEMM on the tensor cores: out[r, col] (+)= sum over k
// of patch(r, k) * W[col, k], with the rows and columns of IM2COL's image (row r = (b, oy, ox), column k = (ky, kx,
// ch), ch fastest), but no image in memory: the consumers gather each K slab's patches from the NHWC input into the
// page beside the slab of W the loader streams (f32 input: through f32 stages, rounded to bf16; bf16 input: copied
// straight into the page). K slabs [begin, +count) of the packed `slabs` (count 0: all from begin); epilogues as
// GEMM's kGemmStoreF32, kGemmStoreF32Relu and kGemmPartialF32 (bias, residual), the stores into out (f32) and / or
// out_bf16 (the output rounded to bf16, for the convolutions that read it). Spatial sizes, kernel, strides, padding
// and dilations are packed two to a word (Pack16): each below 2^16.
enum ConvGemmFlags : uint32_t {
  kConvReluInput = 1,  // max(0, input) as it is read (a ReLU a split GEMM left to its readers; f32 input only)
  kConvBf16Input = 2,  // input is bf16 (its group's channels a multiple of 8, 16-byte aligned): no conversion
  // A tall tile: rows [m_tile * kConvTallRows, +kConvTallRows) and n <= kConvTallCols columns, with a bf16 input and
  // the whole K: the consumers gather its A slabs (32 KB) into the activation slot, two buffers, and each warpgroup
  // multiplies its 128 rows as two m64n64 products with the first 64 rows of the W slab. One wave for a 64-channel
  // convolution whose 128 x 128 tiles (half of their columns zero weights) take 1.5.
  kConvTall = 4,
};
struct ConvGemmArgs {
  uint32_t input;     // f32 or bf16 (kConvBf16Input) [batch, h, w, c]
  uint32_t weight;    // bf16 operand image [n, ConvGemmK]
  uint32_t out;       // f32 [ConvGemmRows, n], or kNoTensor (only out_bf16)
  uint32_t bias;      // bf16 [n] or kNoTensor
  uint32_t residual;  // f32 [ConvGemmRows, n] or kNoTensor
  uint32_t epilogue;  // GemmEpilogue: kGemmStoreF32, kGemmStoreF32Relu or kGemmPartialF32
  uint32_t n;         // output channels (of this group)
  uint32_t m_tile;
  uint32_t n_tile;
  uint32_t slabs;     // K slabs: count << 16 | begin (GemmArgs' packing)
  uint32_t out_bf16;  // bf16 [ConvGemmRows, n] or kNoTensor (the store epilogues only)
  uint32_t batch;
  uint32_t c;         // input channels (every group's)
  uint32_t hw;        // h, w
  uint32_t ohw;       // oh, ow
  uint32_t kernel;    // kh, kw
  uint32_t stride;    // stride_h, stride_w
  uint32_t pad;       // pad_top, pad_left
  uint32_t dilation;  // dilation_h, dilation_w
  uint32_t c_begin;   // the group's first input channel
  uint32_t group_c;   // input channels per group
  uint32_t flags;     // ConvGemmFlags
  static constexpr const char* kFields[] = {"input", "weight", "out", "bias", "residual", "epilogue", "n", "m_tile",
                                            "n_tile", "slabs", "out_bf16", "batch", "c", "hw", "ohw", "kernel",
                                            "stride", "pad", "dilation", "c_begin", "group_c", "flags"};
};
inline constexpr uint32_t kConvTallRows = 256, kConvTallCols = 64;
LOOM_HD uint32_t ConvTileRows(const ConvGemmArgs& a) { return (a.flags & kConvTall) ? kConvTallRows : kGemmTileM; }
// The device stages each K slab's patches of an f32 input in its activation slot, two slabs ahead: rows of 64 floats
// padded to kConvStageRowBytes (16 bytes: a warp's reads of 4 rows hit every bank equally). A bf16 input needs no
// stage: its copies go into the page.
inline constexpr uint32_t kConvStages = 2;
inline constexpr uint32_t kConvStageRowBytes = kGemmSlabK * 4 + 16;
// A bf16 input's tile with a residual (added by its store epilogue, not in place) copies the residual's pairs
// into its activation slot with cp.async before its K loop, so the epilogue reads them there: read from global
// memory by the epilogue, the loads of 32 pairs a thread waited for each other (the graph variant's registers).
// Pair p of consumer thread t at (p * kConvThreads + t) * 8 bytes.
inline constexpr uint32_t kConvThreads = 256;
LOOM_HD bool ConvStagesResidual(const ConvGemmArgs& a) {
  return (a.flags & kConvBf16Input) && a.residual != kNoTensor && a.residual != a.out &&
         a.epilogue != kGemmPartialF32 && a.n % 2 == 0;
}
// The store epilogue through the activation slot (ConvStagesOutput: row lengths of whole 16-byte chunks, n % 4 ==
// 0, and n % 8 == 0 with a bf16 output): the tile's finished rows are written to the slot, f32 rows
// kConvOutRowBytes apart (then bf16 rows kConvOutBf16RowBytes apart, in the same place once the f32 ones are read),
// and copied from there to global memory a warp a row (adding into out in place: float4 atomic adds, one per element). The bias (bf16, the
// tile's 128 columns) is copied into the slot at kConvBiasOffset before the K loop, past everything the K loop and
// the staged residual use.
inline constexpr uint32_t kConvOutRowBytes = kGemmTileN * 4 + 16;
inline constexpr uint32_t kConvOutBf16RowBytes = kGemmTileN * 2 + 16;
inline constexpr uint32_t kConvBiasOffset = kConvStages * kGemmTileM * kConvStageRowBytes;
static_assert(kConvBiasOffset >= kGemmTileM * kConvOutRowBytes && kConvBiasOffset >= kGemmTileM * kGemmTileN * 4,
              "the bias lies past the output rows, the f32 stages and the staged residual");
// A tall tile's slot (kConvTall): two A buffers of kConvTallRows x kGemmSlabK bf16 from the first 1 KB boundary (the
// swizzle atom), and afterwards its epilogue's f32 rows (kConvTallCols + 4 floats apart), all below the bias.
static_assert(1023 + 2 * kConvTallRows * kGemmSlabK * 2 <= kConvBiasOffset &&
                  kConvTallRows * (kConvTallCols * 4 + 16) <= kConvBiasOffset,
              "a tall tile's A buffers and output rows fit below the bias");
LOOM_HD bool ConvStagesOutput(const ConvGemmArgs& a) {
  return a.n % 4 == 0 && (a.out_bf16 == kNoTensor || a.n % 8 == 0);
}
LOOM_HD uint32_t ConvGemmActivationBytes(const ConvGemmArgs& a) {
  if (ConvStagesOutput(a)) return kConvBiasOffset + kGemmTileN * 2;
  if (a.flags & kConvBf16Input) return ConvStagesResidual(a) ? kGemmTileM * kGemmTileN * 4 : 0;
  return kConvStages * kGemmTileM * kConvStageRowBytes;
}
// K slabs a bf16 input's tile keeps in flight beyond the one on the tensor cores: the ring must hold this many + 1
// slabs' pages (GpuMachine checks).
inline constexpr uint32_t kConvBf16SlabsAhead = 2;
// Ring pages a CONV_GEMM holds at once: a bf16 input's kConvBf16SlabsAhead + 1 slabs' (a slab takes one page of 32
// KB or more, else two); 0 for an f32 input (it holds two slabs' pages, as GEMM).
LOOM_HD uint32_t ConvGemmRingPages(const ConvGemmArgs& a, uint32_t page_bytes) {
  if (!(a.flags & kConvBf16Input) || (a.flags & kConvTall)) return 0;
  return (kConvBf16SlabsAhead + 1) * (page_bytes >= 2 * kGemmSlabBytes ? 1 : 2);
}
// Whether a group of `group_c` channels from c_begin of `c` may be read as bf16 (whole 16-byte chunks of 8 channels).
LOOM_HD bool ConvBf16Readable(uint32_t c, uint32_t c_begin, uint32_t group_c) {
  return group_c % 8 == 0 && c % 8 == 0 && c_begin % 8 == 0;
}
// The geometry unpacked, shared by the reference and the device.
struct ConvShape {
  uint32_t h, w, oh, ow, kh, kw, stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
};
LOOM_HD ConvShape ConvShapeOf(const ConvGemmArgs& a) {
  return {Hi16(a.hw),     Lo16(a.hw),       Hi16(a.ohw), Lo16(a.ohw), Hi16(a.kernel),   Lo16(a.kernel),
          Hi16(a.stride), Lo16(a.stride),   Hi16(a.pad), Lo16(a.pad), Hi16(a.dilation), Lo16(a.dilation)};
}
LOOM_HD uint32_t ConvGemmRows(const ConvGemmArgs& a) { return a.batch * Hi16(a.ohw) * Lo16(a.ohw); }
LOOM_HD uint32_t ConvGemmK(const ConvGemmArgs& a) { return Hi16(a.kernel) * Lo16(a.kernel) * a.group_c; }
LOOM_HD uint32_t GemmSplitBegin(const ConvGemmArgs& a) { return a.slabs & 0xffffu; }
LOOM_HD uint32_t GemmSplitCount(const ConvGemmArgs& a) { return a.slabs >> 16; }
LOOM_HD GemmSlabRange ConvGemmSlabsOf(const ConvGemmArgs& a) {
  const uint32_t begin = GemmSplitBegin(a), count = GemmSplitCount(a);
  return {begin, count == 0 ? GemmSlabs(ConvGemmK(a)) - begin : count};
}
// Where output row r's window starts: its image's first element (relative to the group's first channel) and the
// input position of its (0, 0) tap, which may lie in the padding.
struct ConvRow {
  uint32_t plane;  // b * h * w * c + c_begin
  int32_t y0, x0;
};
LOOM_HD ConvRow ConvRowOf(const ConvGemmArgs& a, const ConvShape& s, uint32_t r) {
  const uint32_t ox = r % s.ow, oy = r / s.ow % s.oh, b = r / s.ow / s.oh;
  return {b * s.h * s.w * a.c + a.c_begin, static_cast<int32_t>(oy * s.stride_h) - static_cast<int32_t>(s.pad_top),
          static_cast<int32_t>(ox * s.stride_w) - static_cast<int32_t>(s.pad_left)};
}
// Column k's tap: the input offset from the window's (0, 0) tap (dy * w + dx) * c + ch, and (dy, dx).
struct ConvTap {
  int32_t dy, dx;
  uint32_t ch;
};
LOOM_HD ConvTap ConvTapOf(const ConvGemmArgs& a, const ConvShape& s, uint32_t k) {
  const uint32_t tap = k / a.group_c;
  return {static_cast<int32_t>(tap / s.kw * s.dilation_h), static_cast<int32_t>(tap % s.kw * s.dilation_w),
          k % a.group_c};
}
// Where patch(r, k) lies in the input (an element index), for a row below ConvGemmRows and a column below
// ConvGemmK; false in the padding (the patch is zero there).
LOOM_HD bool ConvPatchAt(const ConvGemmArgs& a, const ConvShape& s, const ConvRow& row, const ConvTap& tap,
                         uint32_t* at) {
  const int32_t iy = row.y0 + tap.dy, ix = row.x0 + tap.dx;
  if (iy < 0 || iy >= static_cast<int32_t>(s.h) || ix < 0 || ix >= static_cast<int32_t>(s.w)) return false;
  *at = row.plane + (static_cast<uint32_t>(iy) * s.w + static_cast<uint32_t>(ix)) * a.c + tap.ch;
  return true;
}

enum PoolMode : uint32_t {
  kPoolMax = 0,
  kPoolAvg = 1,            // divided by the window's positions inside the input
  kPoolAvgIncludePad = 2,  // divided by its positions inside the input and its explicit padding
  kNumPoolModes = 3,
};
// out[b, oy, ox, ch] for output elements [begin, +count) (NHWC order) over the window at (oy * stride_h - pad_top
// + ky * dilation_h, ...), as graph/nn_ops' MAX_POOL / AVG_POOL (GLOBAL_AVG_POOL: a window of the whole map).
struct PoolArgs {
  uint32_t input;  // f32 [n, h, w, c]
  uint32_t out;    // f32 [n, oh, ow, c]
  uint32_t n;
  uint32_t h;
  uint32_t w;
  uint32_t c;
  uint32_t oh;
  uint32_t ow;
  uint32_t kh;
  uint32_t kw;
  uint32_t stride_h;
  uint32_t stride_w;
  uint32_t pad_top;
  uint32_t pad_left;
  uint32_t pad_bottom;
  uint32_t pad_right;
  uint32_t dilation_h;
  uint32_t dilation_w;
  uint32_t mode;  // PoolMode
  uint32_t begin;
  uint32_t count;
  uint32_t out_bf16;  // bf16 [n, oh, ow, c] or kNoTensor: the outputs rounded to bf16 too (convolutions read them)
  static constexpr const char* kFields[] = {"input", "out", "n", "h", "w", "c", "oh", "ow", "kh", "kw",
                                            "stride_h", "stride_w", "pad_top", "pad_left", "pad_bottom",
                                            "pad_right", "dilation_h", "dilation_w", "mode", "begin", "count",
                                            "out_bf16"};
};
// Windows of up to kPoolQuadPositions positions over channels that come in fours are pooled four channels a
// thread, each thread's window loads staged in the activation slot (position p of consumer thread t at
// (p * kPoolThreads + t) * 16 bytes): every load in flight at once, none held in registers.
inline constexpr uint32_t kPoolQuadPositions = 9, kPoolThreads = 256;
// Windows of more positions than this are reduced by several threads an output on the device (kPoolParts): the
// lowering gives their instructions fewer outputs.
inline constexpr uint32_t kPoolGatherPositions = 16, kPoolWideOutputs = 32;
LOOM_HD bool PoolQuads(const PoolArgs& a) { return a.c % 4 == 0 && a.kh * a.kw <= kPoolQuadPositions; }
LOOM_HD uint32_t PoolActivationBytes(const PoolArgs& a) {
  return PoolQuads(a) ? kPoolQuadPositions * kPoolThreads * 16 : 0;
}

// The pooled value of output element `i` (NHWC index), shared by the reference and the device. 32-bit index
// arithmetic (Validate keeps every index below 2^32): a 64-bit division costs the GPU a few dozen instructions.
// Output element i's window: its input plane (image b, channel ch; the next pixel a.c floats on) and the input
// position of the window's first tap, which may lie in the padding.
struct PoolWindow {
  const float* plane;
  int32_t y0, x0;
  // Whether input position (iy, ix) lies inside the input, or inside the input and its explicit padding.
  LOOM_HD static bool Inside(const PoolArgs& a, int32_t iy, int32_t ix) {
    return iy >= 0 && iy < static_cast<int32_t>(a.h) && ix >= 0 && ix < static_cast<int32_t>(a.w);
  }
  LOOM_HD static bool InsidePadded(const PoolArgs& a, int32_t iy, int32_t ix) {
    return iy >= -static_cast<int32_t>(a.pad_top) && iy < static_cast<int32_t>(a.h + a.pad_bottom) &&
           ix >= -static_cast<int32_t>(a.pad_left) && ix < static_cast<int32_t>(a.w + a.pad_right);
  }
  LOOM_HD const float* Address(const PoolArgs& a, int32_t iy, int32_t ix) const {
    return plane + (static_cast<uint32_t>(iy) * a.w + static_cast<uint32_t>(ix)) * a.c;
  }
  LOOM_HD float At(const PoolArgs& a, int32_t iy, int32_t ix) const { return *Address(a, iy, ix); }
};
LOOM_HD PoolWindow PoolWindowOf(const PoolArgs& a, const float* x, uint32_t i) {
  const uint32_t ch = i % a.c;
  uint32_t rest = i / a.c;
  const int32_t ox = static_cast<int32_t>(rest % a.ow);
  rest /= a.ow;
  const int32_t oy = static_cast<int32_t>(rest % a.oh);
  const uint32_t b = rest / a.oh;
  return {x + static_cast<uint64_t>(b) * a.h * a.w * a.c + ch,
          oy * static_cast<int32_t>(a.stride_h) - static_cast<int32_t>(a.pad_top),
          ox * static_cast<int32_t>(a.stride_w) - static_cast<int32_t>(a.pad_left)};
}

LOOM_HD float PoolElement(const PoolArgs& a, const float* x, uint32_t i) {
  const PoolWindow win = PoolWindowOf(a, x, i);
  const bool max = a.mode == kPoolMax;
  float acc = max ? -INFINITY : 0.0f;
  int32_t count = 0, padded = 0;
  for (uint32_t ky = 0; ky < a.kh; ++ky) {
    const int32_t iy = win.y0 + static_cast<int32_t>(ky * a.dilation_h);
    for (uint32_t kx = 0; kx < a.kw; ++kx) {
      const int32_t ix = win.x0 + static_cast<int32_t>(kx * a.dilation_w);
      padded += PoolWindow::InsidePadded(a, iy, ix);
      if (!PoolWindow::Inside(a, iy, ix)) continue;
      const float v = win.At(a, iy, ix);
      acc = max ? (v > acc ? v : acc) : acc + v;
      ++count;
    }
  }
  if (!max) acc /= static_cast<float>(a.mode == kPoolAvgIncludePad ? padded : (count > 1 ? count : 1));
  return acc;
}

// A depthwise causal convolution of f32 rows [rows, channels] (row t is the token after row t - 1), channels
// [c_begin, +c_count): out[t, c] = bias[c] + sum_j w[c, j] * window[c, t + j], where the window is the state's
// k - 1 earlier inputs [c, 0..k-2] (oldest first) followed by the rows. Then the state holds the window's last
// k - 1 inputs, so the next call (the next token, or the rest of a prompt) continues the sequence: what
// graph/evaluator's CONV1D computes.
struct Conv1dArgs {
  uint32_t input;   // f32 [rows, channels]
  uint32_t weight;  // f32 [channels, k]
  uint32_t state;   // f32 [channels, k - 1] (read, then updated), or kNoTensor when k == 1
  uint32_t bias;    // f32 [channels] or kNoTensor
  uint32_t out;     // f32 [rows, channels]
  uint32_t rows;
  uint32_t channels;
  uint32_t k;
  uint32_t c_begin;
  uint32_t c_count;
  static constexpr const char* kFields[] = {"input", "weight", "state", "bias", "out",
                                            "rows", "channels", "k", "c_begin", "c_count"};
};
// Window element i (0 <= i < k - 1 + rows) of channel c.
LOOM_HD float Conv1dWindow(const Conv1dArgs& a, const float* in, const float* state, uint32_t c, uint32_t i) {
  return i + 1 < a.k ? state[static_cast<uint64_t>(c) * (a.k - 1) + i]
                     : in[static_cast<uint64_t>(i + 1 - a.k) * a.channels + c];
}

// A depthwise convolution (CONV2D with one input channel per group, groups = c, oc = c * multiplier), directly in
// f32: out[b, oy, ox, o] = bias[o] + sum_{ky, kx} w[o, ky, kx] * in[b, oy * stride_h - pad_top + ky * dilation_h,
// ox * stride_w - pad_left + kx * dilation_w, o / (oc / c)] (zero outside the input), for output elements
// [begin, +count) in NHWC order.
struct DwConvArgs {
  uint32_t input;   // f32 [n, h, w, c]
  uint32_t weight;  // f32 [oc, kh * kw]
  uint32_t bias;    // f32 [oc], or kNoTensor
  uint32_t out;     // f32 [n, oh, ow, oc]
  uint32_t n;
  uint32_t h;
  uint32_t w;
  uint32_t c;
  uint32_t oh;
  uint32_t ow;
  uint32_t oc;
  uint32_t kh;
  uint32_t kw;
  uint32_t stride_h;
  uint32_t stride_w;
  uint32_t pad_top;
  uint32_t pad_left;
  uint32_t dilation_h;
  uint32_t dilation_w;
  // A unary ElementwiseFunc applied to each output as it is stored (kEwCopy, 0: none): the output's one reader when
  // it is a unary element-wise op (MobileNets' ReLU / HardSwish after a depthwise convolution), one pass fewer. (The
  // word held `relu_in`, a ReLU of the input no lowering set: 0 in every schedule written, and kEwCopy is 0.)
  uint32_t out_func;
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"input", "weight", "bias", "out", "n", "h", "w", "c", "oh", "ow", "oc",
                                            "kh", "kw", "stride_h", "stride_w", "pad_top", "pad_left",
                                            "dilation_h", "dilation_w", "out_func", "begin", "count"};
};
// Output element i, shared by the reference and the device (32-bit indices: Validate keeps them below 2^32).
LOOM_HD float DwConvElement(const DwConvArgs& a, const float* in, const float* w, const float* bias, uint32_t i) {
  const uint32_t o = i % a.oc;
  uint32_t rest = i / a.oc;
  const int32_t ox = static_cast<int32_t>(rest % a.ow);
  rest /= a.ow;
  const int32_t oy = static_cast<int32_t>(rest % a.oh);
  const uint32_t b = rest / a.oh;
  const uint32_t ch = o / (a.oc / a.c);
  const float* plane = in + static_cast<uint64_t>(b) * a.h * a.w * a.c + ch;
  const float* taps = w + static_cast<uint64_t>(o) * a.kh * a.kw;
  const int32_t y0 = oy * static_cast<int32_t>(a.stride_h) - static_cast<int32_t>(a.pad_top);
  const int32_t x0 = ox * static_cast<int32_t>(a.stride_w) - static_cast<int32_t>(a.pad_left);
  float acc = bias != nullptr ? bias[o] : 0.0f;
  for (uint32_t ky = 0; ky < a.kh; ++ky) {
    const int32_t iy = y0 + static_cast<int32_t>(ky * a.dilation_h);
    if (iy < 0 || iy >= static_cast<int32_t>(a.h)) continue;
    for (uint32_t kx = 0; kx < a.kw; ++kx) {
      const int32_t ix = x0 + static_cast<int32_t>(kx * a.dilation_w);
      if (ix < 0 || ix >= static_cast<int32_t>(a.w)) continue;
      float v = plane[(static_cast<uint32_t>(iy) * a.w + static_cast<uint32_t>(ix)) * a.c];
      acc += taps[ky * a.kw + kx] * v;
    }
  }
  return a.out_func == kEwCopy ? acc : EwApply(a.out_func, acc, 0.0f);
}

// NHWC_BF16: an f32 tensor read as [n, h, w, c] through any element strides (an NCHW input's transpose folded in)
// into a bf16 NHWC tensor whose channels are padded with zeros to c_pad (a multiple of 8), ReLU'd if relu: what a
// CONV_GEMM gathering bf16 reads (16-byte chunks of 8 channels) when the convolution's channels are not a multiple
// of 8 (a 3-channel image; its weight is packed with the same zero channels). Pixels [begin, +count) of n * h * w.
struct NhwcBf16Args {
  uint32_t input;  // f32: element (b, y, x, ch) at b * stride_n + y * stride_h + x * stride_w + ch * stride_c
  uint32_t out;    // bf16 [n, h, w, c_pad]
  uint32_t n;
  uint32_t h;
  uint32_t w;
  uint32_t c;
  uint32_t c_pad;
  uint32_t stride_n;
  uint32_t stride_h;
  uint32_t stride_w;
  uint32_t stride_c;
  uint32_t relu;  // 0 or 1
  uint32_t begin;
  uint32_t count;
  static constexpr const char* kFields[] = {"input",    "out",      "n",        "h",        "w",
                                            "c",        "c_pad",    "stride_n", "stride_h", "stride_w",
                                            "stride_c", "relu",     "begin",    "count"};
};
// The input element offset of channel 0 of pixel p (32-bit: Validate keeps every offset below 2^32).
LOOM_HD uint32_t NhwcBf16Pixel(const NhwcBf16Args& a, uint32_t p) {
  const uint32_t x = p % a.w, y = p / a.w % a.h, b = p / a.w / a.h;
  return b * a.stride_n + y * a.stride_h + x * a.stride_w;
}
// Channel ch of the pixel at input offset `at`, as the output holds it before rounding (zero past c).
LOOM_HD float NhwcBf16Value(const NhwcBf16Args& a, const float* x, uint32_t at, uint32_t ch) {
  if (ch >= a.c) return 0.0f;
  const float v = x[at + ch * a.stride_c];
  return a.relu != 0 ? (v > 0.0f ? v : 0.0f) : v;
}

}  // namespace loom::isa
