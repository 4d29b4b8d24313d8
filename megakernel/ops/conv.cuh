// The convolution family on the device (instructions/conv.h; CONV_GEMM in conv_gemm.cuh): IM2COL writes a
// convolution's patches as a GEMM's A operand image, POOL maps output elements over the consumer threads with the
// element functions the host reference uses (PoolElement), NHWC_BF16 copies an f32 tensor into the bf16 NHWC form
// CONV_GEMM gathers (NhwcBf16Value), CONV1D and DWCONV are depthwise convolutions a thread an output.
#pragma once

#include <cuda_bf16.h>

#include "instructions/swizzle.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

// The 8 columns [col, col + 8) of image row r (zeros outside the input, past the rows and past K).
__device__ __forceinline__ uint4 ImToColChunk(const isa::ImToColArgs& a, const float* in, uint32_t r, uint32_t col,
                                              uint32_t rows, uint32_t k, bool vector) {
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (r < rows) {
    const uint32_t ox = r % a.ow, oy = r / a.ow % a.oh, b = r / a.ow / a.oh;
    const int32_t y0 = static_cast<int32_t>(oy * a.stride_h) - static_cast<int32_t>(a.pad_top);
    const int32_t x0 = static_cast<int32_t>(ox * a.stride_w) - static_cast<int32_t>(a.pad_left);
    const float* image = in + static_cast<uint64_t>(b) * a.h * a.w * a.c + a.c_begin;
    if (vector && col < k) {  // 8 consecutive channels of one input pixel
      const uint32_t c = col % a.group_c, kx = col / a.group_c % a.kw, ky = col / a.group_c / a.kw;
      const int32_t iy = y0 + static_cast<int32_t>(ky * a.dilation_h),
                    ix = x0 + static_cast<int32_t>(kx * a.dilation_w);
      if (iy >= 0 && iy < static_cast<int32_t>(a.h) && ix >= 0 && ix < static_cast<int32_t>(a.w)) {
        const float4* p = reinterpret_cast<const float4*>(image + (static_cast<uint32_t>(iy) * a.w + ix) * a.c + c);
        const float4 lo = p[0], hi = p[1];
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      }
    } else {
#pragma unroll
      for (uint32_t e = 0; e < 8; ++e) {
        if (col + e >= k) break;
        const uint32_t c = (col + e) % a.group_c, kx = (col + e) / a.group_c % a.kw, ky = (col + e) / a.group_c / a.kw;
        const int32_t iy = y0 + static_cast<int32_t>(ky * a.dilation_h);
        const int32_t ix = x0 + static_cast<int32_t>(kx * a.dilation_w);
        if (iy >= 0 && iy < static_cast<int32_t>(a.h) && ix >= 0 && ix < static_cast<int32_t>(a.w)) {
          v[e] = image[(static_cast<uint32_t>(iy) * a.w + ix) * a.c + c];
        }
      }
    }
  }
  if (a.relu != 0) {
#pragma unroll
    for (uint32_t e = 0; e < 8; ++e) v[e] = fmaxf(v[e], 0.0f);
  }
  __nv_bfloat162 pairs[4];
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) pairs[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  return *reinterpret_cast<const uint4*>(pairs);
}

// The instruction's (row, 16-byte chunk of 8 columns) pairs spread over all consumer threads, kImToColBatch at a
// time with every load issued before the first store (a store through the image pointer may alias the input as
// far as the compiler knows): the chunks' columns are (ky, kx, ch) with ch fastest, so where the group's channels
// are a multiple of 8 a chunk is 8 consecutive channels of one input pixel (two float4 loads), else it is gathered
// column by column.
constexpr uint32_t kImToColBatch = 4;
__device__ __forceinline__ void RunImToCol(const isa::ImToColArgs& a, ConsumerContext& ctx) {
  const float* in = ctx.machine.ptr<float>(a.input);
  uint8_t* image = ctx.machine.ptr<uint8_t>(a.out);
  const uint32_t rows = isa::ImToColRows(a), k = isa::ImToColK(a);
  const uint32_t chunks = isa::GemmSlabs(k) * isa::kGemmSlabK / 8, total = a.rows * chunks;
  const bool vector = a.group_c % 8 == 0 && a.c % 4 == 0 && a.c_begin % 4 == 0;
  for (uint32_t base = ctx.tid; base < total; base += kConsumerThreads * kImToColBatch) {
    uint4 packed[kImToColBatch];
#pragma unroll
    for (uint32_t j = 0; j < kImToColBatch; ++j) {
      const uint32_t at = base + j * kConsumerThreads;
      if (at < total) packed[j] = ImToColChunk(a, in, a.row_begin + at / chunks, at % chunks * 8, rows, k, vector);
    }
#pragma unroll
    for (uint32_t j = 0; j < kImToColBatch; ++j) {
      const uint32_t at = base + j * kConsumerThreads;
      if (at < total) {
        *reinterpret_cast<uint4*>(
            image + isa::Swizzled128Offset(k, isa::kGemmTileM, a.row_begin + at / chunks, at % chunks * 8)) = packed[j];
      }
    }
  }
}

// Windows of at most kPoolGather positions: the window's loads all issued (an unrolled, guarded gather), then
// reduced in isa::PoolElement's order (the same result); larger windows (a global pool) by RunPoolWide.
constexpr uint32_t kPoolGather = isa::kPoolGatherPositions;
__device__ __forceinline__ float PoolGathered(const isa::PoolArgs& a, const float* x, uint32_t i) {
  const isa::PoolWindow win = isa::PoolWindowOf(a, x, i);
  const bool max = a.mode == isa::kPoolMax;
  float v[kPoolGather];
  uint32_t inside = 0;  // bit t: window position t lies inside the input
  int32_t padded = 0;
  // The window's row and column followed position to position: t / kw and t % kw with kw known only at run time
  // were two integer divisions a position (ResNet-18's max pool at batch 8: 52 -> 44 us an instruction). This
  // code's shape is fragile: the same steps as a struct, or two windows gathered before their stores, measured
  // 87-142 us (docs/history/performance_log.md "Convolutions gathering bf16 activations").
  uint32_t kx = 0;
  int32_t iy = win.y0, ix = win.x0;
  const uint32_t positions = a.kh * a.kw;
#pragma unroll
  for (uint32_t t = 0; t < kPoolGather; ++t) {
    if (t < positions) {
      padded += isa::PoolWindow::InsidePadded(a, iy, ix);
      if (isa::PoolWindow::Inside(a, iy, ix)) {
        v[t] = win.At(a, iy, ix);
        inside |= 1u << t;
      }
      const bool wrap = ++kx == a.kw;
      kx = wrap ? 0 : kx;
      ix = wrap ? win.x0 : ix + static_cast<int32_t>(a.dilation_w);
      iy = wrap ? iy + static_cast<int32_t>(a.dilation_h) : iy;
    }
  }
  float acc = max ? -INFINITY : 0.0f;
#pragma unroll
  for (uint32_t t = 0; t < kPoolGather; ++t) {
    if ((inside >> t) & 1u) acc = max ? (v[t] > acc ? v[t] : acc) : acc + v[t];
  }
  const int32_t count = __popc(inside);
  if (!max) acc /= static_cast<float>(a.mode == isa::kPoolAvgIncludePad ? padded : (count > 1 ? count : 1));
  return acc;
}

// Four channels of output element i's window (isa::PoolQuads): the window's positions copied with cp.async into
// this thread's places in the activation slot (`stage`: position 0's shared address; the next one
// kPoolThreads * 16 bytes on), then reduced from there in PoolElement's order. Held in registers, the window's
// float4s went to local memory one after another (the graph variant's register pressure), each store waiting for
// its load: ResNet-18's max pool took 34-39 us an instruction.
__device__ __forceinline__ float4 PoolStaged(const isa::PoolArgs& a, const float* x, uint32_t i, uint32_t stage) {
  const isa::PoolWindow win = isa::PoolWindowOf(a, x, i);
  uint32_t inside = 0;  // bit t: window position t lies inside the input
  int32_t padded = 0;
  uint32_t kx = 0;
  int32_t iy = win.y0, ix = win.x0;
  const uint32_t positions = a.kh * a.kw;
#pragma unroll
  for (uint32_t t = 0; t < isa::kPoolQuadPositions; ++t) {
    if (t < positions) {
      padded += isa::PoolWindow::InsidePadded(a, iy, ix);
      if (isa::PoolWindow::Inside(a, iy, ix)) {
        CpAsync16Shared(stage + t * isa::kPoolThreads * 16, win.Address(a, iy, ix), 16);
        inside |= 1u << t;
      }
      const bool wrap = ++kx == a.kw;
      kx = wrap ? 0 : kx;
      ix = wrap ? win.x0 : ix + static_cast<int32_t>(a.dilation_w);
      iy = wrap ? iy + static_cast<int32_t>(a.dilation_h) : iy;
    }
  }
  CpAsyncCommit();
  CpAsyncWait<0>();  // (a thread's own copies: visible to it once complete)
  const bool max = a.mode == isa::kPoolMax;
  float4 acc = max ? make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (uint32_t t = 0; t < isa::kPoolQuadPositions; ++t) {
    if ((inside >> t) & 1u) {
      const float4 v = tile::LoadShared128(stage + t * isa::kPoolThreads * 16);
      if (max) {
        acc.x = v.x > acc.x ? v.x : acc.x, acc.y = v.y > acc.y ? v.y : acc.y;
        acc.z = v.z > acc.z ? v.z : acc.z, acc.w = v.w > acc.w ? v.w : acc.w;
      } else {
        acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
      }
    }
  }
  if (!max) {
    const int32_t count = __popc(inside);
    const float d = static_cast<float>(a.mode == isa::kPoolAvgIncludePad ? padded : (count > 1 ? count : 1));
    acc.x /= d, acc.y /= d, acc.z /= d, acc.w /= d;
  }
  return acc;
}

// Windows of more than kPoolGather positions (a global pool): a warp takes 4 outputs, its 8 lanes of each sharing
// the output's positions (lane = part * 4 + output; part p sums positions p, p + 8, ...), the parts combined by
// shuffles. One thread walking a 49-position window waited for its loads one after another: ResNet-18's global pool
// took 14-16 us an instruction. The sum's order differs from PoolElement's (within float rounding).
constexpr uint32_t kPoolParts = 8;
__device__ __forceinline__ void RunPoolWide(const isa::PoolArgs& a, ConsumerContext& ctx, const float* in, float* out,
                                            __nv_bfloat16* image) {
  static_assert(kPoolParts * 4 == 32, "a warp: 4 outputs x kPoolParts parts");
  const bool max = a.mode == isa::kPoolMax;
  const uint32_t end = a.begin + a.count, positions = a.kh * a.kw;
  const uint32_t tasks = (a.count + 3) / 4 * 32;  // whole warps: every lane of a warp takes the same trips
  for (uint32_t task = ctx.tid; task < tasks; task += kConsumerThreads) {
    const uint32_t part = ctx.lane / 4, i = a.begin + task / 32 * 4 + ctx.lane % 4;
    float acc = max ? -INFINITY : 0.0f;
    int32_t count = 0, padded = 0;
    if (i < end) {
      const isa::PoolWindow win = isa::PoolWindowOf(a, in, i);
      for (uint32_t t = part; t < positions; t += kPoolParts) {
        const int32_t iy = win.y0 + static_cast<int32_t>(t / a.kw * a.dilation_h);
        const int32_t ix = win.x0 + static_cast<int32_t>(t % a.kw * a.dilation_w);
        padded += isa::PoolWindow::InsidePadded(a, iy, ix);
        if (!isa::PoolWindow::Inside(a, iy, ix)) continue;
        const float v = win.At(a, iy, ix);
        acc = max ? (v > acc ? v : acc) : acc + v;
        ++count;
      }
    }
#pragma unroll
    for (uint32_t lanes = 4; lanes < 32; lanes *= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, acc, lanes);
      acc = max ? (other > acc ? other : acc) : acc + other;
      count += __shfl_xor_sync(0xffffffffu, count, lanes);
      padded += __shfl_xor_sync(0xffffffffu, padded, lanes);
    }
    if (part == 0 && i < end) {
      if (!max) acc /= static_cast<float>(a.mode == isa::kPoolAvgIncludePad ? padded : (count > 1 ? count : 1));
      out[i] = acc;
      if (image != nullptr) image[i] = __float2bfloat16_rn(acc);
    }
  }
}

// Four channels a thread where isa::PoolQuads (16-byte aligned), the instruction's ragged ends (its elements need
// not start or end on a four) and other shapes one element a thread.
__device__ __forceinline__ void RunPool(const isa::PoolArgs& a, ConsumerContext& ctx) {
  static_assert(isa::kPoolThreads == kConsumerThreads, "a staged place per consumer thread");
  const float* in = ctx.machine.ptr<float>(a.input);
  float* out = ctx.machine.ptr<float>(a.out);
  __nv_bfloat16* image = a.out_bf16 != isa::kNoTensor ? ctx.machine.ptr<__nv_bfloat16>(a.out_bf16) : nullptr;
  if (a.kh * a.kw > kPoolGather) {
    RunPoolWide(a, ctx, in, out, image);
    return;
  }
  const uint32_t end = a.begin + a.count;
  uint32_t quads_begin = end, quads_end = end;  // [quads_begin, quads_end): four channels a thread
  if (isa::PoolQuads(a) &&
      (reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(image)) % 16 ==
          0) {
    quads_begin = std::min((a.begin + 3) / 4 * 4, end);
    quads_end = std::max(end / 4 * 4, quads_begin);
    const uint32_t stage = tile::SharedAddress(ctx.act) + ctx.tid * 16;
    for (uint32_t i = quads_begin + 4 * ctx.tid; i < quads_end; i += 4 * kConsumerThreads) {
      const float4 v = PoolStaged(a, in, i, stage);
      *reinterpret_cast<float4*>(out + i) = v;
      if (image != nullptr) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        *reinterpret_cast<uint2*>(image + i) =
            make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      }
    }
  }
  // The rest one element a thread: [begin, quads_begin) then [quads_end, end).
  const uint32_t head = quads_begin - a.begin, rest = head + (end - quads_end);
  for (uint32_t j = ctx.tid; j < rest; j += kConsumerThreads) {
    const uint32_t i = j < head ? a.begin + j : quads_end + (j - head);
    const float v = PoolGathered(a, in, i);
    out[i] = v;
    if (image != nullptr) image[i] = __float2bfloat16_rn(v);
  }
}

// The instruction's (pixel, 8-channel chunk) pairs over the consumer threads, kNhwcBf16Batch at a time with every
// load issued before the first 16-byte store (through `out` the compiler must assume a store may alias the input).
// From an NCHW input a warp's 32 pixels read each channel's 128 contiguous bytes.
constexpr uint32_t kNhwcBf16Batch = 2;
__device__ __forceinline__ void RunNhwcBf16(const isa::NhwcBf16Args& a, ConsumerContext& ctx) {
  const float* in = ctx.machine.ptr<float>(a.input);
  uint4* out = ctx.machine.ptr<uint4>(a.out);
  const uint32_t chunks = a.c_pad / 8, total = a.count * chunks;
  for (uint32_t base = ctx.tid; base < total; base += kConsumerThreads * kNhwcBf16Batch) {
    float v[kNhwcBf16Batch][8];
#pragma unroll
    for (uint32_t j = 0; j < kNhwcBf16Batch; ++j) {
      const uint32_t at = base + j * kConsumerThreads;
      const uint32_t p = a.begin + (at < total ? at : 0) / chunks, ch = (at < total ? at : 0) % chunks * 8;
      const uint32_t pixel = isa::NhwcBf16Pixel(a, p);
#pragma unroll
      for (uint32_t e = 0; e < 8; ++e) v[j][e] = isa::NhwcBf16Value(a, in, pixel, ch + e);
    }
#pragma unroll
    for (uint32_t j = 0; j < kNhwcBf16Batch; ++j) {
      const uint32_t at = base + j * kConsumerThreads;
      if (at >= total) break;
      __nv_bfloat162 pairs[4];
#pragma unroll
      for (uint32_t e = 0; e < 4; ++e) pairs[e] = __floats2bfloat162_rn(v[j][2 * e], v[j][2 * e + 1]);
      out[static_cast<uint64_t>(a.begin) * chunks + at] = *reinterpret_cast<const uint4*>(pairs);
    }
  }
}

// A thread per output (row, channel), channels fastest (coalesced); every output is written before the first
// state update (a consumer barrier), then a thread per channel shifts its state along (reading ahead of its
// writes).
__device__ __forceinline__ void RunConv1d(const isa::Conv1dArgs& a, ConsumerContext& ctx) {
  const float* in = ctx.machine.ptr<float>(a.input);
  const float* w = ctx.machine.ptr<float>(a.weight);
  float* state = a.state != isa::kNoTensor ? ctx.machine.ptr<float>(a.state) : nullptr;
  const float* bias = a.bias != isa::kNoTensor ? ctx.machine.ptr<float>(a.bias) : nullptr;
  float* out = ctx.machine.ptr<float>(a.out);
  const uint32_t total = a.rows * a.c_count;
  for (uint32_t i = ctx.tid; i < total; i += kConsumerThreads) {
    const uint32_t c = a.c_begin + i % a.c_count, t = i / a.c_count;
    float acc = bias != nullptr ? bias[c] : 0.0f;
    for (uint32_t j = 0; j < a.k; ++j) {
      acc += w[static_cast<uint64_t>(c) * a.k + j] * isa::Conv1dWindow(a, in, state, c, t + j);
    }
    out[static_cast<uint64_t>(t) * a.channels + c] = acc;
  }
  if (state == nullptr) return;
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  for (uint32_t c = a.c_begin + ctx.tid; c < a.c_begin + a.c_count; c += kConsumerThreads) {
    for (uint32_t j = 0; j + 1 < a.k; ++j) {
      state[static_cast<uint64_t>(c) * (a.k - 1) + j] = isa::Conv1dWindow(a, in, state, c, a.rows + j);
    }
  }
}

// A thread per output element (channels fastest: neighbouring threads read neighbouring channels), kDwConvBatch of
// them with every window gathered before the first store.
constexpr uint32_t kDwConvBatch = 4;
__device__ __forceinline__ void RunDwConv(const isa::DwConvArgs& a, ConsumerContext& ctx) {
  const float* in = ctx.machine.ptr<float>(a.input);
  const float* w = ctx.machine.ptr<float>(a.weight);
  const float* bias = a.bias != isa::kNoTensor ? ctx.machine.ptr<float>(a.bias) : nullptr;
  float* out = ctx.machine.ptr<float>(a.out);
  const uint32_t end = a.begin + a.count;
  for (uint32_t i0 = a.begin + ctx.tid; i0 < end; i0 += kConsumerThreads * kDwConvBatch) {
    float v[kDwConvBatch];
#pragma unroll
    for (uint32_t j = 0; j < kDwConvBatch; ++j) {
      const uint32_t i = i0 + j * kConsumerThreads;
      if (i < end) v[j] = isa::DwConvElement(a, in, w, bias, i);
    }
#pragma unroll
    for (uint32_t j = 0; j < kDwConvBatch; ++j) {
      if (i0 + j * kConsumerThreads < end) out[i0 + j * kConsumerThreads] = v[j];
    }
  }
}

}  // namespace loom::megakernel
