// SUM_SPLITS on the device: the parts of a GEMM split over K added in part order (isa::SumSplitsArgs), so the
// sum is bitwise the same every run whichever split finished first. The rows it adds (the base, then each part)
// are staged through the activation slot in rounds (isa::kSumStageBytes, two buffers): each consumer thread copies
// its share of a round's 16-byte chunks with cp.async, all of them in flight together and the next round's issued
// before this one is added (the SM's L2 bandwidth bounds the sum, not its latency), then adds its chunks' rows in
// order. PACK_ROWS adds its parts the same way (SumStaged).
#pragma once

#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

// max(0, .) as the reference writes it (NaN stays NaN).
__device__ __forceinline__ float SumRelu(float v) { return v < 0.0f ? 0.0f : v; }
__device__ __forceinline__ float4 SumRelu(float4 v) {
  return make_float4(SumRelu(v.x), SumRelu(v.y), SumRelu(v.z), SumRelu(v.w));
}

// out[c] = base[c] (ReLU'd with relu_base) + parts[0][c] + ... + parts[splits - 1][c] (ReLU'd with relu_out) for the
// 16-byte chunks c in [begin, end), parts `stride` chunks apart; base nullptr: from parts[0]. out may be base.
// Every consumer thread takes part; they leave through a consumers' barrier, the sums stored.
__device__ __forceinline__ void SumStaged(const float4* base, const float4* parts, uint32_t stride, uint32_t splits,
                                          float4* out, uint32_t begin, uint32_t end, bool relu_base, bool relu_out,
                                          ConsumerContext& ctx) {
  const uint32_t rows = splits + (base != nullptr ? 1 : 0), round = isa::SumRoundChunks(rows);
  const uint32_t slot = tile::SharedAddress(ctx.act), buffer_bytes = round * rows * 16;
  // Round k's copies into buffer k % 2: row r of a buffer is the base (when there is one), then the parts in order.
  auto issue = [&](uint32_t c0) {
    const uint32_t n = min(round, end - c0), buffer = slot + ((c0 - begin) / round % 2) * buffer_bytes;
    for (uint32_t j = ctx.tid; j < n * rows; j += kConsumerThreads) {
      const uint32_t r = j / n, c = c0 + j % n;
      const float4* src = base == nullptr ? parts + r * stride + c : r == 0 ? base + c : parts + (r - 1) * stride + c;
      CpAsync16Shared(buffer + j * 16, src, 16);
    }
    CpAsyncCommit();
  };
  if (begin < end) issue(begin);
  for (uint32_t c0 = begin; c0 < end; c0 += round) {
    const uint32_t n = min(round, end - c0), buffer = slot + ((c0 - begin) / round % 2) * buffer_bytes;
    if (c0 + round < end) {  // the next round in flight while this one is added
      issue(c0 + round);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    for (uint32_t c = ctx.tid; c < n; c += kConsumerThreads) {
      float4 sum = tile::LoadShared128(buffer + c * 16);
      if (relu_base && base != nullptr) sum = SumRelu(sum);
      for (uint32_t r = 1; r < rows; ++r) {  // in part order
        const float4 v = tile::LoadShared128(buffer + (r * n + c) * 16);
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
      out[c0 + c] = relu_out ? SumRelu(sum) : sum;
    }
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);  // this buffer is read: free for the round after next
  }
}

__device__ __forceinline__ void RunSumSplits(const isa::SumSplitsArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  const float* parts = m.ptr<float>(a.parts);
  const float* base = a.base != isa::kNoTensor ? m.ptr<float>(a.base) : nullptr;
  float* out = m.ptr<float>(a.out);
  const bool relu_base = (a.flags & isa::kSumReluBase) != 0, relu_out = (a.flags & isa::kSumReluOut) != 0;
  if (isa::SumSplitsActivationBytes(a) != 0) {  // whole 16-byte chunks (tensors are 16-aligned)
    SumStaged(reinterpret_cast<const float4*>(base), reinterpret_cast<const float4*>(parts), a.elements / 4,
              a.splits, reinterpret_cast<float4*>(out), a.begin / 4, (a.begin + a.count) / 4, relu_base, relu_out,
              ctx);
    return;
  }
  for (uint32_t i = a.begin + ctx.tid; i < a.begin + a.count; i += kConsumerThreads) {
    float sum = base != nullptr ? isa::SumSplitsBase(a, __ldcg(base + i)) : __ldcg(parts + i);
    for (uint32_t s = base != nullptr ? 0 : 1; s < a.splits; ++s) sum += __ldcg(parts + s * a.elements + i);
    out[i] = relu_out ? SumRelu(sum) : sum;
  }
}

}  // namespace loom::megakernel
