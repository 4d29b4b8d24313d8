// MATVEC on the device: y = W[row_begin : row_begin+rows, :] . x, W bf16, x f32.
//
// The tile is rows*k bf16, row-major, contiguous in the packed weight, and
// arrives page by page through the ring. Page layout: elements
// [p*page_elems, (p+1)*page_elems) of the tile. Each warp takes a run of
// 256-element segments of the page; lane l multiplies the 8 weights
// [seg + 8l, seg + 8l + 8) by the matching x. A warp sums its segments while
// they stay inside one partial-sum slot (1024 columns when k allows, else 256),
// then writes slot's sum once: deterministic, no atomics.
//
// Activation buffer: x[k] | partial[rows * k / slot] | y[rows]   (floats)
#pragma once

#include <cuda_bf16.h>

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/consumer_context.cuh"

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

__device__ __forceinline__ void RotatePairDevice(float* a, float* b, uint32_t j, int32_t position,
                                                 const float* inv_freq) {
  const float angle = static_cast<float>(position) * inv_freq[j];
  float s, c;
  sincosf(angle, &s, &c);
  const float x = *a, y = *b;
  *a = x * c - y * s;
  *b = y * c + x * s;
}

__device__ __forceinline__ void RunMatvec(const isa::MatvecArgs& a, const ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const uint32_t k = a.k, rows = a.rows;
  float* x = ctx.act;
  const uint32_t slot_elems = MatvecSlotElems(k);
  const uint32_t slots_per_row = k / slot_elems;
  float* partial = x + k;
  float* y = partial + rows * slots_per_row;

  // x (and the RMSNorm prologue), loaded after the instruction's waits.
  const float* input = m.ptr<float>(a.input);
  float sum_sq = 0.0f;
  for (uint32_t j = ctx.tid; j < k; j += kConsumerThreads) {
    const float v = input[j];
    x[j] = v;
    sum_sq += v * v;
  }
  if (a.prologue == isa::kPrologueRmsNorm) {
    const float total = ConsumerSum(sum_sq, ctx.tid, ctx.scratch);
    const float scale = 1.0f / sqrtf(total / static_cast<float>(k) + a.norm_eps);
    const __nv_bfloat16* w = m.ptr<__nv_bfloat16>(a.norm_weight);
    for (uint32_t j = ctx.tid; j < k; j += kConsumerThreads) x[j] = x[j] * scale * __bfloat162float(w[j]);
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);

  // Stream the tile's pages.
  const uint64_t tile_elems = static_cast<uint64_t>(rows) * k;
  const uint32_t page_elems = ctx.page_bytes / 2;
  const uint32_t segments_per_page = page_elems / kSegmentElems;
  const uint32_t segments_per_warp = segments_per_page / kConsumerWarps;
  for (uint64_t page_start = 0; page_start < tile_elems; page_start += page_elems) {
    const uint8_t* page = ctx.AcquirePage();
    const uint64_t page_end = min(tile_elems, page_start + page_elems);
    float acc = 0.0f;
    for (uint32_t s = 0; s < segments_per_warp; ++s) {
      const uint32_t seg = ctx.warp * segments_per_warp + s;
      const uint64_t e0 = page_start + static_cast<uint64_t>(seg) * kSegmentElems;
      if (e0 >= page_end) break;
      const uint32_t col = static_cast<uint32_t>(e0 % k) + ctx.lane * 8;
      const uint4 w = *reinterpret_cast<const uint4*>(page + (static_cast<size_t>(seg) * kSegmentElems + ctx.lane * 8) * 2);
      acc += Dot8(w, x + col);
      const uint64_t next = e0 + kSegmentElems;
      const bool flush = s + 1 == segments_per_warp || next >= page_end || next / slot_elems != e0 / slot_elems;
      if (flush) {
        acc = WarpSum(acc);
        if (ctx.lane == 0) partial[e0 / slot_elems] = acc;
        acc = 0.0f;
      }
    }
    ctx.ReleasePage();
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) {
    float sum = 0.0f;
    for (uint32_t s = 0; s < slots_per_row; ++s) sum += partial[r * slots_per_row + s];
    y[r] = sum;
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);

  // Epilogue.
  float* out = m.ptr<float>(a.out);
  switch (a.epilogue) {
    case isa::kEpilogueStore:
      for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) out[a.row_begin + r] = y[r];
      break;
    case isa::kEpilogueResidualAdd: {
      const float* residual = m.ptr<float>(a.residual);
      for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) out[a.row_begin + r] = residual[a.row_begin + r] + y[r];
      break;
    }
    case isa::kEpilogueSiluMul:
      for (uint32_t r = 2 * ctx.tid; r < rows; r += 2 * kConsumerThreads) out[(a.row_begin + r) / 2] = Silu(y[r]) * y[r + 1];
      break;
    case isa::kEpilogueRopeKvAppend: {
      const int32_t pos = m.ptr<int32_t>(a.step_state)[isa::kStatePosition];
      const float* inv_freq = m.ptr<float>(a.rope_inv_freq);
      const uint32_t half = a.head_dim / 2;
      for (uint32_t r = 2 * ctx.tid; r < rows; r += 2 * kConsumerThreads) {
        const isa::QkvRow row = isa::QkvGroupedRow(a.row_begin + r, a.heads_per_group, a.head_dim);
        float v0 = y[r], v1 = y[r + 1];
        if (row.kind != isa::kQkvV) RotatePairDevice(&v0, &v1, row.dim, pos, inv_freq);
        if (row.kind == isa::kQkvQ) {
          out[row.head * a.head_dim + row.dim] = v0;
          out[row.head * a.head_dim + row.dim + half] = v1;
        } else {
          float* cache = m.ptr<float>(row.kind == isa::kQkvK ? a.k_cache : a.v_cache) +
                         (static_cast<uint64_t>(row.head) * a.max_seq + pos) * a.head_dim;
          cache[row.dim] = v0;
          cache[row.kind == isa::kQkvK ? row.dim + half : row.dim + 1] = v1;
        }
      }
      break;
    }
    case isa::kEpilogueArgmaxPartial: {
      float best = -INFINITY;
      uint32_t best_row = a.row_begin;
      for (uint32_t r = ctx.tid; r < rows; r += kConsumerThreads) {
        out[a.row_begin + r] = y[r];
        if (Better(y[r], a.row_begin + r, best, best_row)) best = y[r], best_row = a.row_begin + r;
      }
      ConsumerArgmax(&best, &best_row, ctx.tid, ctx.scratch);
      if (ctx.tid == 0) {
        m.ptr<float>(a.partials)[2 * a.tile_index] = best;
        m.ptr<float>(a.partials)[2 * a.tile_index + 1] = static_cast<float>(best_row);
      }
      break;
    }
  }
}

}  // namespace loom::megakernel
