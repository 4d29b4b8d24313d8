// MATVEC on the device: y = W[row_begin : row_begin+rows, :] . x (+ bias), W bf16, x f32.
//
// The tile is rows*stride bf16 (stride = isa::MatvecRowStride(k): rows padded
// with zeros to a multiple of 256 columns), row-major, contiguous in the packed
// weight, and arrives page by page through the ring. Below, `k` is the stride. Page layout: elements
// [p*page_elems, (p+1)*page_elems) of the tile. Each warp takes a run of
// 256-element segments of the page; lane l multiplies the 8 weights
// [seg + 8l, seg + 8l + 8) by the matching x. A warp sums its segments while
// they stay inside one partial-sum slot (1024 columns when k allows, else 256),
// then writes slot's sum once: deterministic, no atomics.
//
// Activation slot: x[stride] (x[0:k] bulk-copied by the activation loader, the
// consumers zero the rest) | partial[rows * stride / slot]   (floats)
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

__device__ __forceinline__ float Silu(float x) { return x / (1.0f + expf(-x)); }

// dot of 8 bf16 weights (one 16-byte vector) with 8 floats of x.
__device__ __forceinline__ float Dot8(const uint4& w, const float* x) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float4 xa = *reinterpret_cast<const float4*>(x);
  const float4 xb = *reinterpret_cast<const float4*>(x + 4);
  float2 f0 = __bfloat1622float2(w2[0]), f1 = __bfloat1622float2(w2[1]);
  float2 f2 = __bfloat1622float2(w2[2]), f3 = __bfloat1622float2(w2[3]);
  float acc = f0.x * xa.x;
  acc = fmaf(f0.y, xa.y, acc);
  acc = fmaf(f1.x, xa.z, acc);
  acc = fmaf(f1.y, xa.w, acc);
  acc = fmaf(f2.x, xb.x, acc);
  acc = fmaf(f2.y, xb.y, acc);
  acc = fmaf(f3.x, xb.z, acc);
  acc = fmaf(f3.y, xb.w, acc);
  return acc;
}

// dot of 8 bf16 weights with 8 floats held in registers.
__device__ __forceinline__ float Dot8Reg(const uint4& w, const float (&x)[8], float acc) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(w2[i]);
    acc = fmaf(f.x, x[2 * i], acc);
    acc = fmaf(f.y, x[2 * i + 1], acc);
  }
  return acc;
}

// The x values a lane multiplies in each of its warp's kSegs segments, the same
// in every page when the tile's rows tile the pages exactly.
template <uint32_t kSegs>
__device__ __forceinline__ void LoadXSegments(const float* x, uint32_t k, uint32_t warp_first, uint32_t lane,
                                              float (&xr)[kSegs][8]) {
#pragma unroll
  for (uint32_t s = 0; s < kSegs; ++s) {
    const uint32_t col = ((warp_first + s) * kSegmentElems) % k + lane * 8;
    const float4 lo = *reinterpret_cast<const float4*>(x + col);
    const float4 hi = *reinterpret_cast<const float4*>(x + col + 4);
    xr[s][0] = lo.x, xr[s][1] = lo.y, xr[s][2] = lo.z, xr[s][3] = lo.w;
    xr[s][4] = hi.x, xr[s][5] = hi.y, xr[s][6] = hi.z, xr[s][7] = hi.w;
  }
}

// Streams a tile whose rows tile the pages exactly (page_elems % k == 0): every
// page then starts at column 0, so a warp covers the same columns in every page
// and keeps its x values in registers for the whole tile. kSegs = segments per
// warp per page (page_bytes / 4096).
template <uint32_t kSegs>
__device__ __forceinline__ void StreamTileXInRegisters(const isa::MatvecArgs& a, uint32_t k, ConsumerContext& ctx,
                                                       const float* x, float* partial, uint32_t slot_shift) {
  const uint32_t tile_elems = a.rows * k;
  constexpr uint32_t kPageElems = kSegs * kConsumerWarps * kSegmentElems;
  const uint32_t warp_first = ctx.warp * kSegs;
  float xr[kSegs][8];
  LoadXSegments<kSegs>(x, k, warp_first, ctx.lane, xr);
  // Software-pipelined: the next page's shared-memory loads are in flight while
  // this page's sums go through the warp shuffles.
  uint4 w[kSegs];
  auto load = [&](const uint8_t* page, uint32_t page_start) {
#pragma unroll
    for (uint32_t s = 0; s < kSegs; ++s) {
      if (page_start + (warp_first + s) * kSegmentElems < tile_elems) {
        w[s] = tile::LoadShared128Bits(tile::SharedAddress(page) +
                                       ((warp_first + s) * kSegmentElems + ctx.lane * 8) * 2);
      }
    }
  };
  load(ctx.AcquirePage(), 0);
  for (uint32_t page_start = 0; page_start < tile_elems; page_start += kPageElems) {
    const uint32_t page_end = min(tile_elems, page_start + kPageElems);
    // Independent dot products per segment (short FMA chains), summed per slot below.
    float dot[kSegs];
#pragma unroll
    for (uint32_t s = 0; s < kSegs; ++s) dot[s] = Dot8Reg(w[s], xr[s], 0.0f);
    ctx.ReleasePage();  // its values are in registers
    if (page_start + kPageElems < tile_elems) load(ctx.AcquirePage(), page_start + kPageElems);
    float acc = 0.0f;
#pragma unroll
    for (uint32_t s = 0; s < kSegs; ++s) {
      const uint32_t e0 = page_start + (warp_first + s) * kSegmentElems;
      if (e0 < page_end) {
        acc += dot[s];
        const uint32_t next = e0 + kSegmentElems;
        if (s + 1 == kSegs || next >= page_end || (next >> slot_shift) != (e0 >> slot_shift)) {
          acc = WarpSum(acc);
          if (ctx.lane == 0) partial[e0 >> slot_shift] = acc;
          acc = 0.0f;
        }
      }
    }
  }
}

// Sums each of v[0..7] over the warp with 9 shuffles instead of 8 x 5: every
// level sends away half of the values and keeps the other half. Returns the sum
// of v[MultiWarpSumIndex(lane)].
__device__ __forceinline__ float MultiWarpSum8(float (&v)[8], uint32_t lane) {
  const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0, hi4 = (lane & 4) != 0;
  float v4[4], v2[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float send = hi16 ? v[i] : v[i + 4];
    v4[i] = (hi16 ? v[i + 4] : v[i]) + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float send = hi8 ? v4[i] : v4[i + 2];
    v2[i] = (hi8 ? v4[i + 2] : v4[i]) + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  float r = (hi4 ? v2[1] : v2[0]) + __shfl_xor_sync(0xffffffffu, hi4 ? v2[0] : v2[1], 4);
  r += __shfl_xor_sync(0xffffffffu, r, 2);
  r += __shfl_xor_sync(0xffffffffu, r, 1);
  return r;
}
__device__ __forceinline__ uint32_t MultiWarpSumIndex(uint32_t lane) {
  return ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
}

// StreamTileXInRegisters for the case where a warp's share of a page is
// exactly one partial-sum slot (kSegs * 256 == slot): the warp keeps one
// per-lane sum per page for a batch of 8 pages and reduces the 8 together
// (MultiWarpSum8), so the page loop has no shuffles on its critical path.
template <uint32_t kSegs>
__device__ __forceinline__ void StreamTileBatched(const isa::MatvecArgs& a, uint32_t k, ConsumerContext& ctx,
                                                  const float* x, float* partial, uint32_t slot_shift) {
  constexpr uint32_t kBatch = 8;
  const uint32_t tile_elems = a.rows * k;
  constexpr uint32_t kPageElems = kSegs * kConsumerWarps * kSegmentElems;
  const uint32_t warp_first = ctx.warp * kSegs;
  float xr[kSegs][8];
  LoadXSegments<kSegs>(x, k, warp_first, ctx.lane, xr);
  const uint32_t warp_offset = warp_first * kSegmentElems;  // the warp's slot starts here in every page
  for (uint32_t batch_start = 0; batch_start < tile_elems; batch_start += kBatch * kPageElems) {
    float v[kBatch];
#pragma unroll
    for (uint32_t j = 0; j < kBatch; ++j) {
      const uint32_t page_start = batch_start + j * kPageElems;
      v[j] = 0.0f;
      if (page_start < tile_elems) {  // the same for every consumer: pages stay in ring order
        const uint8_t* page = ctx.AcquirePage();
        if (page_start + warp_offset < tile_elems) {  // a warp's slot is all in the tile or all out
          uint4 w[kSegs];
#pragma unroll
          for (uint32_t s = 0; s < kSegs; ++s) {
            w[s] = tile::LoadShared128Bits(tile::SharedAddress(page) +
                                       ((warp_first + s) * kSegmentElems + ctx.lane * 8) * 2);
          }
          float dot[kSegs];
#pragma unroll
          for (uint32_t s = 0; s < kSegs; ++s) dot[s] = Dot8Reg(w[s], xr[s], 0.0f);
#pragma unroll
          for (uint32_t s = 0; s < kSegs; ++s) v[j] += dot[s];
        }
        ctx.ReleasePage();
      }
    }
    const float sum = MultiWarpSum8(v, ctx.lane);
    const uint32_t e0 = batch_start + MultiWarpSumIndex(ctx.lane) * kPageElems + warp_offset;
    if ((ctx.lane & 3) == 0 && e0 < tile_elems) partial[e0 >> slot_shift] = sum;
  }
}

// Tiles whose rows do not tile the pages (page_elems % k != 0: the down projection of a 5632-wide MLP, every
// matvec of a 3072-wide model, an 8B model's 14336-wide down): a warp's segments fall on other columns in every
// page, so x comes from the slot (ld.shared) per segment. Each lane keeps one sum per partial-sum slot its warp
// covers in a page (kSlots of them) and the warp reduces 8 such sums together (MultiWarpSum8) every 8 / kSlots
// pages. The loop below, which reduced every slot on its own (5 shuffles per 256 columns with slots of 256), took
// pages at ~15 GB/s per SM, slower than an SM's share of HBM (docs/history/performance_log.md).
template <uint32_t kSegs, uint32_t kSlots>
__device__ __forceinline__ void StreamTileXShared(const isa::MatvecArgs& a, uint32_t k, ConsumerContext& ctx,
                                                  const float* x, float* partial, uint32_t slot_shift) {
  static_assert(kSegs % kSlots == 0 && 8 % kSlots == 0, "whole slots per warp, 8 sums per reduction");
  constexpr uint32_t kPages = 8 / kSlots, kSegsPerSlot = kSegs / kSlots;
  constexpr uint32_t kPageElems = kSegs * kConsumerWarps * kSegmentElems;
  const uint32_t tile_elems = a.rows * k;
  const uint32_t warp_offset = ctx.warp * kSegs * kSegmentElems;  // the warp's run of segments in every page
  const uint32_t page_advance = kPageElems % k;                    // its first column moves by this per page
  const uint32_t x_lane = tile::SharedAddress(x) + ctx.lane * 8 * 4;
  uint32_t col = warp_offset % k;
  for (uint32_t batch_start = 0; batch_start < tile_elems; batch_start += kPages * kPageElems) {
    float v[8];
#pragma unroll
    for (uint32_t j = 0; j < kPages; ++j) {
      const uint32_t page_start = batch_start + j * kPageElems;
#pragma unroll
      for (uint32_t t = 0; t < kSlots; ++t) v[j * kSlots + t] = 0.0f;
      if (page_start < tile_elems) {  // the same for every consumer: pages stay in ring order
        const uint32_t page = tile::SharedAddress(ctx.AcquirePage()) + (warp_offset + ctx.lane * 8) * 2;
        uint32_t c = col;
#pragma unroll
        for (uint32_t s = 0; s < kSegs; ++s) {
          if (page_start + warp_offset + s * kSegmentElems < tile_elems) {
            const uint4 w = tile::LoadShared128Bits(page + s * kSegmentElems * 2);
            const float4 xa = tile::LoadShared128(x_lane + c * 4), xb = tile::LoadShared128(x_lane + c * 4 + 16);
            const float xr[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            v[j * kSlots + s / kSegsPerSlot] = Dot8Reg(w, xr, v[j * kSlots + s / kSegsPerSlot]);
          }
          c += kSegmentElems;
          if (c >= k) c -= k;
        }
        ctx.ReleasePage();
      }
      col += page_advance;
      if (col >= k) col -= k;
    }
    const float sum = MultiWarpSum8(v, ctx.lane);
    const uint32_t i = MultiWarpSumIndex(ctx.lane);
    const uint32_t e0 =
        batch_start + (i / kSlots) * kPageElems + warp_offset + (i % kSlots) * kSegsPerSlot * kSegmentElems;
    if ((ctx.lane & 3) == 0 && e0 < tile_elems) partial[e0 >> slot_shift] = sum;
  }
}

// RoPE's rotation of a pair at `position`: cos and sin of position * frequency, scaled by `factor` (the table's entry
// head_dim / 2).
__device__ __forceinline__ void RopeRotation(int32_t position, float frequency, float factor, float* c, float* s) {
  sincosf(static_cast<float>(position) * frequency, s, c);
  *s *= factor;
  *c *= factor;
}
__device__ __forceinline__ void ApplyRotation(float* a, float* b, float c, float s) {
  const float x = *a, y = *b;
  *a = x * c - y * s;
  *b = y * c + x * s;
}

// Rotates (a, b) by position * frequency (RopeRotation).
__device__ __forceinline__ void RotatePairAt(float* a, float* b, int32_t position, float frequency, float factor) {
  float c, s;
  RopeRotation(position, frequency, factor, &c, &s);
  ApplyRotation(a, b, c, s);
}

// Rotates (a, b) by position * table[j]; cos and sin are scaled by `factor` (table[head_dim / 2]).
__device__ __forceinline__ void RotatePairDevice(float* a, float* b, uint32_t j, int32_t position, const float* table,
                                                 float factor) {
  RotatePairAt(a, b, position, table[j], factor);
}

// Reads the input (f32[n], 16-byte aligned) into the slot with cp.async through L2 (other SMs wrote it; the
// activation loader's acquire of their barrier, handed on by the slot's mbarrier, orders it), no registers held.
// One round trip: the activation loader's bulk copy, after the proxy fence it needs, took ~1.4 us from the waits
// being met to the slot (docs/history/performance_log.md). Thread t copies float4 j = t + u * kConsumerThreads, as
// NormalizeMatvecInput reads them, so after its own wait it reads its copies there without a barrier.
// Issued only: MatvecPrologue waits, after issuing its own loads.
__device__ __forceinline__ void IssueMatvecInput(const float* src, float* x, uint32_t n, uint32_t tid) {
  const uint32_t n4 = n / 4;
  for (uint32_t j = tid; j < n4; j += kConsumerThreads) CpAsync<16>(x + 4 * j, src + 4 * j, 16);
  CpAsyncCommit();
  for (uint32_t i = n4 * 4 + tid; i < n; i += kConsumerThreads) x[i] = __ldcg(src + i);  // (cp.async of 4 goes by L1)
}

// A tagged input (ctx.flags & kFlagTaggedInput): after IssueMatvecInput's copies land, each thread checks each float4
// it copied and copies it again until it carries this step's tag. The wait is observed here, in the data, instead of
// by the activation loader on the barrier (instructions/instruction.h "Step tags"): one round trip from the
// producer's store, where its barrier's release, the poll and then this copy took three. With the RMSNorm prologue
// the check is part of the sum of squares' reads; a pass of its own over the slot, for every tagged input, measured
// 0.5% slower (docs/history/performance_log.md).
__device__ __forceinline__ float4 AwaitTaggedFloat4(uint32_t input, const float4* src4, float4* x4, uint32_t j,
                                                    const ConsumerContext& ctx) {
  const uint32_t parity = StepParity(ctx.step);
  float4 v = x4[j];
  for (uint64_t rounds = 0; !Tagged4(*reinterpret_cast<const uint4*>(&v), parity); ++rounds) {
    if (kDeviceDebug && rounds > kDebugSpinLimit) {
      ReportStuck(ctx.error, ctx.sm, ctx.index, static_cast<uint32_t>(isa::Opcode::MATVEC), input,
                  __float_as_uint(v.x), parity, kStuckTaggedRead);
    }
    CpAsync<16>(x4 + j, src4 + j, 16);
    CpAsyncCommit();
    CpAsyncWait<0>();
    v = x4[j];
  }
  return v;
}

// The residual of row r: with kFlagTaggedResidual read again until it carries this step's tag (it is two stages old:
// the first read has it).
__device__ __forceinline__ float TaggedResidual(uint32_t residual, float v, const float* p,
                                               const ConsumerContext& ctx) {
  if ((ctx.flags & isa::kFlagTaggedResidual) == 0) return v;
  for (uint64_t reads = 0; !Tagged(v, StepParity(ctx.step)); ++reads) {
    if (kDeviceDebug && reads > kDebugSpinLimit) {
      ReportStuck(ctx.error, ctx.sm, ctx.index, static_cast<uint32_t>(isa::Opcode::MATVEC), residual,
                  __float_as_uint(v), StepParity(ctx.step), kStuckTaggedRead);
    }
    v = ReloadRelaxed(p);
  }
  return v;
}

// The RMSNorm prologue's weights, 4 bf16 per x float4: the first kNormBatch float4s of each thread are loaded
// beside the input, in the same round trip; the rest (k > 4096) after the sum of squares.
constexpr uint32_t kNormBatch = 4;
__device__ __forceinline__ void LoadNormWeights(const uint2* w4, uint32_t base, uint32_t n4, uint32_t tid,
                                                uint2 (&w)[kNormBatch]) {
#pragma unroll
  for (uint32_t u = 0; u < kNormBatch; ++u) {
    const uint32_t j = base + u * kConsumerThreads + tid;
    if (j < n4) w[u] = __ldg(w4 + j);  // a weight: constant for the kernel's lifetime
  }
}

// Element i of a KV cache set to v: f32, or bf16 rounded to nearest even (isa::KvBytes; the VM's ref::KvStore).
__device__ __forceinline__ void StoreKv(void* cache, bool bf16, uint64_t i, float v) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(cache)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(cache)[i] = v;
  }
}

// What the epilogue reads from global memory for this thread's first row (or row pair), loaded in the prologue's
// round trip: once the tile streams, this SM's in-flight weight pages are ahead of any load on its way in, and a
// load issued in the epilogue waited ~2-4 us for them (docs/history/performance_log.md).
struct MatvecEpilogueInputs {
  float* out;
  float bias0 = 0.0f, bias1 = 0.0f;  // bias of the first row (pair)
  float scale0 = 1.0f, scale1 = 1.0f;  // MATVEC_FP8: the scale of the first row (pair)
  float residual = 0.0f;             // kEpilogueResidualAdd: the first row's residual
  // kEpilogueRopeKvAppend, the first pair: where its two values go (q's output row or the K / V cache row at this
  // step's position; row_bf16: a bf16 cache's), and its rotation (cos and sin already scaled by the table's factor).
  void* row_out = nullptr;
  bool row_bf16 = false;
  float cos = 1.0f, sin = 0.0f;
};

// The thread's first row (or pair, for epilogues on row pairs). Args: isa::MatvecArgs or isa::MatvecFp8Args (the
// prologue and the epilogue are theirs alike).
template <typename Args>
__device__ __forceinline__ uint32_t FirstEpilogueRow(const Args& a, uint32_t tid) {
  return a.epilogue == isa::kEpilogueSiluMul || a.epilogue == isa::kEpilogueRopeKvAppend ? 2 * tid : tid;
}

// Issues the epilogue's loads (see MatvecEpilogueInputs); their values are used after the prologue's wait.
template <typename Args>
__device__ __forceinline__ MatvecEpilogueInputs LoadEpilogueInputs(const Args& a, const ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  MatvecEpilogueInputs in;
  in.out = m.ptr<float>(a.out);
  const uint32_t r = FirstEpilogueRow(a, ctx.tid);
  if (r >= a.rows) return in;
  if (a.bias != isa::kNoTensor) {
    const __nv_bfloat16* bias = m.ptr<__nv_bfloat16>(a.bias) + a.row_begin + r;
    in.bias0 = __bfloat162float(bias[0]);
    if (r + 1 < a.rows) in.bias1 = __bfloat162float(bias[1]);
  }
  if constexpr (std::is_same_v<Args, isa::MatvecFp8Args>) {
    const float* scales = m.ptr<float>(a.scales) + a.row_begin + r;
    in.scale0 = __ldg(scales);  // a weight: constant for the kernel's lifetime
    if (r + 1 < a.rows) in.scale1 = __ldg(scales + 1);
  }
  if (a.epilogue == isa::kEpilogueResidualAdd) in.residual = __ldcg(m.ptr<float>(a.residual) + a.row_begin + r);
  return in;
}

// RoPE's row pair: where its values go and its rotation, worked out beside the input's load (the epilogue issues
// no load for it).
template <typename Args>
__device__ __forceinline__ void LoadRopeInputs(const Args& a, const ConsumerContext& ctx, uint32_t r,
                                               MatvecEpilogueInputs* in) {
  const isa::MachineView& m = ctx.machine;
  const isa::QkvRow row = isa::QkvGroupedRow(a.row_begin + r, a.heads_per_group, a.head_dim);
  const int32_t pos = static_cast<int32_t>(ctx.act_length) - 1;  // read once per step by the activation loader
  if (row.kind == isa::kQkvQ) {
    in->row_out = in->out + row.head * a.head_dim;
    in->row_bf16 = false;
  } else {
    const uint32_t cache = row.kind == isa::kQkvK ? a.k_cache : a.v_cache;
    const uint64_t first = (static_cast<uint64_t>(row.head) * a.max_seq + pos) * a.head_dim;
    in->row_bf16 = m.IsBf16(cache);
    in->row_out = in->row_bf16 ? static_cast<void*>(m.ptr<__nv_bfloat16>(cache) + first)
                               : static_cast<void*>(m.ptr<float>(cache) + first);
  }
  if (row.kind == isa::kQkvV) return;
  const float* table = m.ptr<float>(a.rope_table);
  RopeRotation(pos, table[row.dim], table[a.head_dim / 2], &in->cos, &in->sin);
}

// x (f32[k]) into the slot, its padding zeroed, and with the RMSNorm prologue x <- x * rsqrt(mean(x^2) + eps) *
// norm_weight in place; each thread touches the same float4s in every pass. The epilogue's inputs are loaded in the
// same round trip and returned.
template <typename Args>
__device__ __forceinline__ MatvecEpilogueInputs MatvecPrologue(const Args& a, uint32_t k, ConsumerContext& ctx,
                                                               float* x) {
  const isa::MachineView& m = ctx.machine;
  IssueMatvecInput(m.ptr<float>(a.input), x, a.k, ctx.tid);
  const bool norm = a.prologue == isa::kPrologueRmsNorm;
  const uint32_t n4 = a.k / 4;
  const uint2* w4 = norm ? m.ptr<uint2>(a.norm_weight) : nullptr;
  uint2 w[kNormBatch];
  if (norm) LoadNormWeights(w4, 0, n4, ctx.tid, w);
  MatvecEpilogueInputs epilogue = LoadEpilogueInputs(a, ctx);
  if (a.epilogue == isa::kEpilogueRopeKvAppend && 2 * ctx.tid < a.rows) LoadRopeInputs(a, ctx, 2 * ctx.tid, &epilogue);
  CpAsyncWait<0>();
  const bool tagged = (ctx.flags & isa::kFlagTaggedInput) != 0;
  float4* x4 = reinterpret_cast<float4*>(x);
  const float4* src4 = m.ptr<float4>(a.input);
  if (tagged && !norm) {
    for (uint32_t j = ctx.tid; j < n4; j += kConsumerThreads) AwaitTaggedFloat4(a.input, src4, x4, j, ctx);
  }
  for (uint32_t i = a.k + ctx.tid; i < k; i += kConsumerThreads) x[i] = 0.0f;  // padding: zero weights times zero
  if (!norm) return epilogue;
  float sum_sq = 0.0f;
  for (uint32_t j = ctx.tid; j < n4; j += kConsumerThreads) {
    const float4 v = tagged ? AwaitTaggedFloat4(a.input, src4, x4, j, ctx) : x4[j];
    sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float total = ConsumerSum(sum_sq, ctx.tid, ctx.scratch);
  const float scale = 1.0f / sqrtf(total / static_cast<float>(a.k) + a.norm_eps);
  for (uint32_t base = 0; base < n4; base += kNormBatch * kConsumerThreads) {
    if (base > 0) LoadNormWeights(w4, base, n4, ctx.tid, w);
#pragma unroll
    for (uint32_t u = 0; u < kNormBatch; ++u) {
      const uint32_t j = base + u * kConsumerThreads + ctx.tid;
      if (j < n4) {
        const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[u].x));
        const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[u].y));
        float4 v = x4[j];
        v.x = v.x * scale * w01.x;
        v.y = v.y * scale * w01.y;
        v.z = v.z * scale * w23.x;
        v.w = v.w * scale * w23.y;
        x4[j] = v;
      }
    }
  }
  return epilogue;
}

// The epilogue, after the tile's partial sums are in the slot: each thread sums the slots of its row (or row pair),
// scales it (MATVEC_FP8), adds the bias and finishes it. The first row's inputs were loaded in the prologue; later
// rows (tiles of more rows than threads) load theirs here.
template <typename Args>
__device__ __forceinline__ void FinishMatvec(const Args& a, ConsumerContext& ctx, const MatvecEpilogueInputs& in,
                                             const float* partial, uint32_t slots_per_row) {
  constexpr bool kFp8 = std::is_same_v<Args, isa::MatvecFp8Args>;
  constexpr bool kArgmax = std::is_same_v<Args, isa::MatvecArgs>;  // the quantized matvecs have no argmax epilogue
  const isa::MachineView& m = ctx.machine;
  const uint32_t rows = a.rows;
  const __nv_bfloat16* bias = a.bias != isa::kNoTensor ? m.ptr<__nv_bfloat16>(a.bias) + a.row_begin : nullptr;
  const uint32_t first = FirstEpilogueRow(a, ctx.tid);
  auto slots_sum = [&](uint32_t r) {
    float sum = 0.0f;
    for (uint32_t s = 0; s < slots_per_row; ++s) sum += partial[r * slots_per_row + s];
    return sum;
  };
  auto row_sum = [&](uint32_t r) {
    float sum = slots_sum(r);
    if constexpr (kFp8) {
      sum *= r == first ? in.scale0 : r == first + 1 ? in.scale1 : __ldg(m.ptr<float>(a.scales) + a.row_begin + r);
    }
    if (bias == nullptr) return sum;
    return sum + (r == first ? in.bias0 : r == first + 1 ? in.bias1 : __bfloat162float(bias[r]));
  };
  float* out = in.out;
  const uint32_t tag = OutputTag(ctx.flags, ctx.step);  // stores, residual adds and SiLU-muls may be tagged
  switch (a.epilogue) {
    case isa::kEpilogueStore:
      for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) out[a.row_begin + r] = MaybeTag(row_sum(r), tag);
      break;
    case isa::kEpilogueResidualAdd: {
      for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) {
        const float* p = m.ptr<float>(a.residual) + a.row_begin + r;
        const float residual = TaggedResidual(a.residual, r == first ? in.residual : __ldcg(p), p, ctx);
        out[a.row_begin + r] = MaybeTag(residual + row_sum(r), tag);
      }
      break;
    }
    case isa::kEpilogueSiluMul:
      for (uint32_t r = 2 * ctx.tid; r < rows; r += 2 * kConsumerThreads) {
        out[(a.row_begin + r) / 2] = MaybeTag(Silu(row_sum(r)) * row_sum(r + 1), tag);
      }
      break;
    case isa::kEpilogueRopeKvAppend: {
      const uint32_t half = a.head_dim / 2;
      for (uint32_t r = 2 * ctx.tid; r < rows; r += 2 * kConsumerThreads) {
        const isa::QkvRow row = isa::QkvGroupedRow(a.row_begin + r, a.heads_per_group, a.head_dim);
        MatvecEpilogueInputs pair = in;
        if (r != first) LoadRopeInputs(a, ctx, r, &pair);  // tiles of more than 2 rows per thread
        float v0 = row_sum(r), v1 = row_sum(r + 1);
        if (row.kind != isa::kQkvV) ApplyRotation(&v0, &v1, pair.cos, pair.sin);
        StoreKv(pair.row_out, pair.row_bf16, row.dim, v0);
        StoreKv(pair.row_out, pair.row_bf16, row.kind == isa::kQkvV ? row.dim + 1 : row.dim + half, v1);
      }
      break;
    }
    case isa::kEpilogueArgmaxPartial: {
      if constexpr (!kArgmax) break;  // (refused by validation: the LM head stays bf16)
      float best = -INFINITY;
      uint32_t best_row = a.row_begin;
      for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) {
        const float y = row_sum(r);
        out[a.row_begin + r] = y;
        if (Better(y, a.row_begin + r, best, best_row)) best = y, best_row = a.row_begin + r;
      }
      ConsumerArgmax(&best, &best_row, ctx.tid, ctx.scratch);
      if constexpr (kArgmax) {
        if (ctx.tid == 0) {
          m.ptr<float>(a.partials)[2 * a.tile_index] = best;
          m.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_row);
        }
      }
      break;
    }
  }
}

// kDecodePages: pages are isa::kDecodePageBytes (the decode variant's: isa::KernelVariantOfPages), so only the
// forms of four segments a warp are compiled.
template <bool kDecodePages>
__device__ __forceinline__ void RunMatvec(const isa::MatvecArgs& a, ConsumerContext& ctx) {
  const uint32_t k = isa::MatvecRowStride(a.k), rows = a.rows;  // the padded row from here on
  float* x = ctx.act;
  const uint32_t slot_elems = MatvecSlotElems(k);
  const uint32_t slots_per_row = k / slot_elems;
  float* partial = x + k;

  const MatvecEpilogueInputs in = MatvecPrologue(a, k, ctx, x);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // The input observed in the data: its wait ended here (the trace's "waits met").
  if (ctx.ready != nullptr && ctx.tid == 0 && (ctx.flags & isa::kFlagTaggedInput)) *ctx.ready = GlobalTimer();
  ctx.Mark(0);

  // Stream the tile's pages. 32-bit element indices (the host checks rows * k < 2^32),
  // no division in the loop: a column that advances and wraps, slots by shift.
  const uint32_t tile_elems = rows * k;
  const uint32_t page_elems = ctx.page_bytes / 2;
  const uint32_t segments_per_warp = kDecodePages ? 4 : page_elems / kSegmentElems / kConsumerWarps;
  static_assert(isa::kDecodePageBytes / 2 / kSegmentElems / kConsumerWarps == 4, "four segments a warp");
  const uint32_t slot_shift = slot_elems == kWideSlotElems ? 10 : 8;
  static_assert(kWideSlotElems == 1u << 10 && kSegmentElems == 1u << 8, "slot shifts");
  const bool x_in_registers = page_elems % k == 0;
  if (x_in_registers && segments_per_warp == 4 && slot_elems == 4 * kSegmentElems) {
    StreamTileBatched<4>(a, k, ctx, x, partial, slot_shift);
  } else if (x_in_registers && segments_per_warp == 4) {
    StreamTileXInRegisters<4>(a, k, ctx, x, partial, slot_shift);
  } else if (!kDecodePages && x_in_registers && segments_per_warp == 8) {
    StreamTileXInRegisters<8>(a, k, ctx, x, partial, slot_shift);
  } else if (!kDecodePages && x_in_registers && segments_per_warp == 2) {
    StreamTileXInRegisters<2>(a, k, ctx, x, partial, slot_shift);
  } else if (segments_per_warp == 4 && slot_elems == 4 * kSegmentElems) {
    StreamTileXShared<4, 1>(a, k, ctx, x, partial, slot_shift);
  } else if (kDecodePages || (segments_per_warp == 4 && slot_elems == kSegmentElems)) {
    StreamTileXShared<4, 4>(a, k, ctx, x, partial, slot_shift);
  } else {
  for (uint32_t page_start = 0; page_start < tile_elems; page_start += page_elems) {
    const uint8_t* page = ctx.AcquirePage();
    const uint32_t page_end = min(tile_elems, page_start + page_elems);
    const uint32_t warp_first = ctx.warp * segments_per_warp;
    const uint32_t warp_start = page_start + warp_first * kSegmentElems;
    uint32_t col = warp_start % k;
    float acc = 0.0f;
#pragma unroll 4
    for (uint32_t s = 0; s < segments_per_warp; ++s) {
      const uint32_t e0 = warp_start + s * kSegmentElems;
      if (e0 >= page_end) break;
      const uint4 w =
          tile::LoadShared128Bits(tile::SharedAddress(page) + ((warp_first + s) * kSegmentElems + ctx.lane * 8) * 2);
      acc += Dot8(w, x + col + ctx.lane * 8);
      const uint32_t next = e0 + kSegmentElems;
      if (s + 1 == segments_per_warp || next >= page_end || (next >> slot_shift) != (e0 >> slot_shift)) {
        acc = WarpSum(acc);
        if (ctx.lane == 0) partial[e0 >> slot_shift] = acc;
        acc = 0.0f;
      }
      col += kSegmentElems;
      if (col >= k) col -= k;
    }
    ctx.ReleasePage();
  }
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  ctx.Mark(1);

  FinishMatvec(a, ctx, in, partial, slots_per_row);
}

}  // namespace loom::megakernel
