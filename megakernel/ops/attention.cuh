// Split-KV decode attention on the device (ATTN_PARTIAL, with the reduce fused into the last split of a KV head;
// the merge and ATTN_REDUCE: ops/attention_merge.cuh).
//
// ATTN_PARTIAL's activation slot is isa::AttnPartialLayout: the activation
// loader reads the context length after the waits and bulk-copies q and, when
// they fit the slot, the split's K and V rows; otherwise the consumers read
// K and V from the caches.
#pragma once

#include <cuda_bf16.h>

#include "megakernel/block_reduce.cuh"
#include "megakernel/ops/attention_merge.cuh"
#include "megakernel/ops/consumer_context.cuh"
#include "megakernel/tile/smem_tile.cuh"

namespace loom::megakernel {

// K and V values as the cache holds them (isa::KvBytes): f32, or bf16 (half the bytes a position).
__device__ __forceinline__ float KvValue(const float* p, uint32_t i) { return p[i]; }
__device__ __forceinline__ float KvValue(const __nv_bfloat16* p, uint32_t i) { return __bfloat162float(p[i]); }

// Where float4 j of the group's q rows goes in the slot: in order beside f32 K rows; beside bf16 ones each head's
// even float4s first, then its odd ones, so that the two a lane's 8-value K chunk c needs sit at c and hd / 8 + c:
// 8 lanes on 8 consecutive chunks then read 128 contiguous bytes a load (one wavefront), where float4s 2c and 2c + 1
// (32 bytes apart) took two.
template <typename KvT>
__device__ __forceinline__ uint32_t QSlotIndex(uint32_t j, uint32_t hd4) {
  if constexpr (sizeof(KvT) == 4) {
    return j;
  } else {
    const uint32_t i = j % hd4;
    return j - i + (i % 2) * (hd4 / 2) + i / 2;
  }
}

// q (float4s of it, as QSlotIndex lays them out) times the K values of 16-byte chunk c of a row of `chunks`, into
// two sums: a chunk is 4 f32 or 8 bf16 values.
__device__ __forceinline__ void DotChunk(const float* k, const float4* qrow, uint32_t c, uint32_t, float& acc0,
                                         float& acc1) {
  const float4 kv = reinterpret_cast<const float4*>(k)[c], qv = qrow[c];
  acc0 += qv.x * kv.x + qv.y * kv.y;
  acc1 += qv.z * kv.z + qv.w * kv.w;
}
__device__ __forceinline__ void DotChunk(const __nv_bfloat16* k, const float4* qrow, uint32_t c, uint32_t chunks,
                                         float& acc0, float& acc1) {
  const uint4 w = reinterpret_cast<const uint4*>(k)[c];
  const float4 q0 = qrow[c], q1 = qrow[chunks + c];
  // A word's low half is the earlier dimension; a bf16's bits are the high half of its f32.
  acc0 += q0.x * __uint_as_float(w.x << 16) + q0.y * __uint_as_float(w.x & 0xffff0000u);
  acc1 += q0.z * __uint_as_float(w.y << 16) + q0.w * __uint_as_float(w.y & 0xffff0000u);
  acc0 += q1.x * __uint_as_float(w.z << 16) + q1.y * __uint_as_float(w.z & 0xffff0000u);
  acc1 += q1.z * __uint_as_float(w.w << 16) + q1.w * __uint_as_float(w.w & 0xffff0000u);
}

// Scores of `n` positions for the group's heads: a thread per (head, position), the positions of a head on
// consecutive lanes. A warp's lanes read K rows hd values apart, which all start in the same bank: each lane walks
// its row's 16-byte chunks from its own offset (c + p) % chunks, so 8 consecutive lanes hit 8 different bank
// groups (a 16-byte load then takes the 4 wavefronts it must, not 32), and the q row alike.
template <typename KvT>
__device__ __forceinline__ void AttnScores(const float* q, const KvT* kc, float* scores, uint32_t group, uint32_t n,
                                           uint32_t hd, float scale, uint32_t tid) {
  const uint32_t hd4 = hd / 4, chunks = hd * sizeof(KvT) / 16;
  const float4* q4 = reinterpret_cast<const float4*>(q);
  for (uint32_t i = tid; i < group * n; i += kConsumerThreads) {
    const uint32_t h = i / n, p = i - h * n;
    const KvT* krow = kc + p * hd;
    const float4* qrow = q4 + h * hd4;
    float acc0 = 0.0f, acc1 = 0.0f;
    uint32_t c = p % chunks;
#pragma unroll 4
    for (uint32_t k = 0; k < chunks; ++k) {
      DotChunk(krow, qrow, c, chunks, acc0, acc1);
      c = c + 1 == chunks ? 0 : c + 1;
    }
    scores[h * n + p] = (acc0 + acc1) * scale;
  }
}

// A warp per head (warp h < group): the maximum of its `n` scores, `bound` at least, and the scores replaced by
// exp(score - maximum); returns the sum of those.
__device__ __forceinline__ float AttnExpScores(float* scores, uint32_t h, uint32_t n, float bound, uint32_t lane,
                                               float* max_out) {
  float mx = bound;
  for (uint32_t p = lane; p < n; p += 32) mx = fmaxf(mx, scores[h * n + p]);
  for (int offset = 16; offset > 0; offset >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
  float l = 0.0f;
  for (uint32_t p = lane; p < n; p += 32) {
    const float e = expf(scores[h * n + p] - mx);
    scores[h * n + p] = e;
    l += e;
  }
  *max_out = mx;
  return WarpSum(l);
}

// A thread's output accumulators: one per head of the group, for its (position group, dim).
struct AttnAcc {
  float h[kMaxGroupHeads];
};
// acc.h[h] + the sum over the `n` positions of scores[h][p] * V[p][d] for this thread's (position group pg, dim d):
// a thread per (position group, dim), every head of the group (each V element read once).
template <typename KvT>
__device__ __forceinline__ AttnAcc AttnAccumulate(AttnAcc acc, const KvT* vc, const float* scores, uint32_t group,
                                                  uint32_t n, uint32_t hd, uint32_t groups, uint32_t pg, uint32_t d) {
  for (uint32_t p = pg; p < n; p += 4 * groups) {
    float v[4];
#pragma unroll
    for (uint32_t u = 0; u < 4; ++u) {
      if (p + u * groups < n) v[u] = KvValue(vc, (p + u * groups) * hd + d);
    }
#pragma unroll
    for (uint32_t u = 0; u < 4; ++u) {
      if (p + u * groups >= n) break;
#pragma unroll
      for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
        if (h < group) acc.h[h] += scores[h * n + p + u * groups] * v[u];
      }
    }
  }
  return acc;
}

// The split's K / V rows are in its slot (every consumer is past the barrier after their copies): consumer thread 0
// counts it in the block's split count, just after the scratch floats (shared_layout.cuh's Carve). The decode loader
// issues no page of the instructions after the split until then (an empty split: the activation loader counts it).
__device__ __forceinline__ void CountSplitRows(const ConsumerContext& ctx) {
  // Atomic, as the loader's polls are (a plain store against volatile polls is a race to racecheck).
  uint32_t* count = reinterpret_cast<uint32_t*>(ctx.scratch + kSplitCountAfterScratch);
  if (ctx.tid == 0) atomicAdd(count, 1u);
}

// A split whose rows do not fit the slot (kActivationChunked): `chunk` positions at a time through the K and V
// buffers of isa::AttnChunkLayout, the copies of chunks c + 1 .. c + kAttnChunkBuffers - 1 in flight while chunk c
// is computed; each head's running maximum and sum (warp h) rescale the accumulators (alpha) as a chunk raises the
// maximum. The rows earlier steps wrote of the first chunk are copied before the waits when the slot came early.
// Leaves the position groups' outputs in the slot's `red` (returned) and warp h's maximum and sum in head_max /
// head_sum.
template <typename KvT>
__device__ __forceinline__ float* AttnPartialChunks(const isa::AttnPartialArgs& a, ConsumerContext& ctx,
                                                    uint32_t begin, uint32_t n, float* head_max, float* head_sum) {
  const isa::MachineView& m = ctx.machine;
  const uint32_t group = a.num_heads / a.num_kv_heads, hd = a.head_dim, hd4 = hd / 4;
  const uint32_t row16 = hd * sizeof(KvT) / 16;  // a K / V row's 16-byte pieces
  const uint32_t chunk = ctx.act_flags >> kActivationChunkShift, chunks = (n + chunk - 1) / chunk;
  const isa::AttnChunkSlot layout = isa::AttnChunkLayout(group, hd, chunk, sizeof(KvT));
  uint8_t* slot = reinterpret_cast<uint8_t*>(ctx.act);
  float* q = reinterpret_cast<float*>(slot + layout.q);
  float* scores = reinterpret_cast<float*>(slot + layout.scores);
  float* alpha = reinterpret_cast<float*>(slot + layout.alpha);
  const uint64_t first_row = (static_cast<uint64_t>(a.kv_head) * a.max_seq + begin) * hd;
  const uint8_t* k_src = reinterpret_cast<const uint8_t*>(m.ptr<KvT>(a.k_cache) + first_row);
  const uint8_t* v_src = reinterpret_cast<const uint8_t*>(m.ptr<KvT>(a.v_cache) + first_row);
  const uint32_t buffer = sizeof(KvT) * chunk * hd;
  constexpr uint32_t kBuffers = isa::kAttnChunkBuffers;
  // Rows [from, to) of the split (inside chunk c) into chunk c's buffers.
  auto copy = [&](uint32_t c, uint32_t from, uint32_t to) {
    uint8_t* kb = slot + layout.k + (c % kBuffers) * buffer;
    uint8_t* vb = slot + layout.v + (c % kBuffers) * buffer;
    const uint32_t r0 = c * chunk;
    for (uint32_t j = (from - r0) * row16 + ctx.tid; j < (to - r0) * row16; j += kConsumerThreads) {
      CpAsync<16>(kb + 16 * j, k_src + 16 * (r0 * row16 + j), 16);
      CpAsync<16>(vb + 16 * j, v_src + 16 * (r0 * row16 + j), 16);
    }
  };
  auto rows_of = [&](uint32_t c) { return c * chunk < n ? min(chunk, n - c * chunk) : 0u; };
  const bool early = ctx.act_waited != nullptr && (ctx.act_flags & kActivationEarly) != 0;
  const uint32_t old = early ? min(rows_of(0), ctx.act_length - 1 > begin ? ctx.act_length - 1 - begin : 0u) : 0;
  copy(0, 0, old);
  CpAsyncCommit();
  if (early) MbarrierWait(ctx.act_waited, ctx.act_phase, {ctx.error, ctx.sm, ctx.index, 0, 0, kStuckActivationWait});
  const float* q_src = m.ptr<float>(a.q) + a.kv_head * group * hd;
  for (uint32_t j = ctx.tid; j < group * hd4; j += kConsumerThreads) {
    CpAsync<16>(q + 4 * QSlotIndex<KvT>(j, hd4), q_src + 4 * j, 16);
  }
  copy(0, old, rows_of(0));
  CpAsyncCommit();
  for (uint32_t c = 1; c + 1 < kBuffers; ++c) {  // a commit group per chunk, empty past the last
    copy(c, c * chunk, c * chunk + rows_of(c));
    CpAsyncCommit();
  }
  const uint32_t d = ctx.tid % hd, pg = ctx.tid / hd;
  AttnAcc acc{};
  float run_max = -INFINITY, run_sum = 0.0f;  // warp h < group: head h's
  for (uint32_t c = 0; c < chunks; ++c) {
    CpAsyncWait<kBuffers - 2>();  // chunk c (and q)
    // Every thread is past chunk c - 1 (its scores, alpha and buffers are free): chunk c + kBuffers - 1 goes into
    // the buffers chunk c - 1 used.
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    if (c == 0) CountSplitRows(ctx);  // its first chunk (chunked splits run in the decode variant only)
    const uint32_t ahead = c + kBuffers - 1;
    copy(ahead, ahead * chunk, ahead * chunk + rows_of(ahead));
    CpAsyncCommit();
    const uint32_t rows = min(chunk, n - c * chunk);
    const KvT* kc = reinterpret_cast<const KvT*>(slot + layout.k + (c % kBuffers) * buffer);
    const KvT* vc = reinterpret_cast<const KvT*>(slot + layout.v + (c % kBuffers) * buffer);
    AttnScores(q, kc, scores, group, rows, hd, a.scale, ctx.tid);
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    for (uint32_t h = ctx.warp; h < group; h += kConsumerWarps) {
      float mx;
      const float l = AttnExpScores(scores, h, rows, run_max, ctx.lane, &mx);
      const float rescale = run_max == -INFINITY ? 0.0f : expf(run_max - mx);
      run_sum = run_sum * rescale + l;
      run_max = mx;
      if (ctx.lane == 0) alpha[h] = rescale;
    }
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
#pragma unroll
    for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
      if (h < group) acc.h[h] *= alpha[h];
    }
    acc = AttnAccumulate(acc, vc, scores, group, rows, hd, kConsumerThreads / hd, pg, d);
  }
  CpAsyncWait<0>();  // (only empty groups are left)
  float* red = reinterpret_cast<float*>(slot + layout.red);
#pragma unroll
  for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
    if (h < group) red[(pg * group + h) * hd + d] = acc.h[h];
  }
  *head_max = run_max;
  *head_sum = run_sum;
  return red;
}

// The split's outputs from the position groups' sums in `red` (the consumers' barrier first), then warp h's
// (max, sum) pair; with the fused reduce, the last split of the KV head merges the group's partials. kFused: the
// fused reduce is compiled in (not in the decode variant: isa::KernelVariantOf runs its programs in the tensor one).
template <bool kFused>
__device__ __forceinline__ void AttnPartialFinish(const isa::AttnPartialArgs& a, ConsumerContext& ctx, const float* red,
                                                  float head_max, float head_sum, uint32_t partial_tag) {
  const isa::MachineView& m = ctx.machine;
  const uint32_t group = a.num_heads / a.num_kv_heads, hd = a.head_dim, groups = kConsumerThreads / hd;
  const uint32_t first_head = a.kv_head * group;
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  float* po = m.ptr<float>(a.partial_o);
  for (uint32_t i = ctx.tid; i < group * hd; i += kConsumerThreads) {
    float sum = 0.0f;
    for (uint32_t g = 0; g < groups; ++g) sum += red[g * group * hd + i];
    po[(static_cast<uint64_t>(a.split) * a.num_heads + first_head) * hd + i] = MaybeTag(sum, partial_tag);
  }
  // The (max, sum) pairs last: ATTN_REDUCE polls them, then loads the outputs, stored before (by other threads, so
  // they may still land later: it reads any untagged one again).
  if (ctx.warp < group && ctx.lane == 0) {
    float* ml = m.ptr<float>(a.partial_ml) + (static_cast<uint64_t>(a.split) * a.num_heads + first_head + ctx.warp) * 2;
    ml[0] = MaybeTag(head_max, partial_tag);
    ml[1] = MaybeTag(head_sum, partial_tag);
  }
  if (!kFused || a.out == isa::kNoTensor) return;
  // The fused reduce: every consumer's partial stores are issued (the barrier), then one thread publishes this
  // split's arrival with release semantics and learns whether it was the group's last; that split acquires the
  // others' partials and merges them. The last arriver also resets the counter for the next step (the next
  // step's splits of this group start only after this instruction's signal, through the layer's barriers).
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  int32_t* arrivals = m.ptr<int32_t>(a.arrivals) + a.kv_head;
  if (ctx.tid == 0) {
    int32_t before;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(before) : "l"(arrivals) : "memory");
    const bool last = before + 1 == static_cast<int32_t>(a.num_splits);
    if (last) asm volatile("st.relaxed.gpu.global.s32 [%0], 0;" ::"l"(arrivals) : "memory");
    ctx.scratch[0] = last ? 1.0f : 0.0f;
  }
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  if (ctx.scratch[0] == 0.0f) return;  // (the instruction-end barrier orders this read before scratch's next use)
  const uint32_t active = isa::ActiveSplits(ctx.act_length, a.num_splits, a.min_positions);
  const uint32_t tag = OutputTag(ctx.flags, ctx.step), elems = group * hd;
  const uint32_t pairs = tile::SharedAddress(red);  // free now: 1 KB a head, room for 128 splits' (max, sum)
  if (elems > kConsumerThreads && elems <= 2 * kConsumerThreads && active > 16 && active <= 32) {
    MergeThroughSlot<2>(m, a, first_head, group, active, pairs, ctx.tid, tag);
  } else {
    MergePartials(m, a.partial_o, a.partial_ml, a.out, first_head, group, active, a.num_heads, hd, ctx.tid, tag);
  }
}

// kChunks: the chunked form is compiled in (the decode variant's; the activation loader plans it only there).
// kFused: the fused reduce is (the other variants': AttnPartialFinish). KvT: the caches' element (float or bf16).
template <typename KvT, bool kChunks, bool kFused>
__device__ __forceinline__ void RunAttnPartialOf(const isa::AttnPartialArgs& a, ConsumerContext& ctx) {
  const isa::MachineView& m = ctx.machine;
  uint32_t begin, end;
  isa::SplitRange(ctx.act_length, a.split, a.num_splits, a.min_positions, &begin, &end);
  const uint32_t group = a.num_heads / a.num_kv_heads, hd = a.head_dim, n = end - begin, hd4 = hd / 4;
  const uint32_t row16 = hd * sizeof(KvT) / 16;  // a K / V row's 16-byte pieces
  const uint32_t first_head = a.kv_head * group;
  // Without the fused merge the partials are the output: tagged when the instruction tags (ATTN_REDUCE reads them).
  const uint32_t partial_tag = a.out == isa::kNoTensor ? OutputTag(ctx.flags, ctx.step) : kNoTag;
  static_assert(isa::kAttnMaxGroupHeads <= kConsumerWarps, "a warp per head");
  float head_max = -INFINITY, head_sum = 0.0f;  // warp h < group: head h's, stored after the outputs
  if (kChunks && (ctx.act_flags & kActivationChunked) != 0) {
    const float* red = AttnPartialChunks<KvT>(a, ctx, begin, n, &head_max, &head_sum);
    AttnPartialFinish<kFused>(a, ctx, red, head_max, head_sum, partial_tag);
    return;
  }
  // q (the group's heads), and the K and V rows when the flag says the slot has room for them, come into the slot
  // here: cp.async through L2 (one round trip sooner than the activation loader's proxy fence + bulk copies), what
  // this step wrote after the waits (below), V of this step's row in a commit group the scores do not wait for.
  const bool kv_in_slot = (ctx.act_flags & kActivationKv) != 0;
  const isa::AttnPartialSlot layout = isa::AttnPartialLayout(group, hd, n, kv_in_slot, sizeof(KvT));
  uint8_t* slot = reinterpret_cast<uint8_t*>(ctx.act);
  float* q = reinterpret_cast<float*>(slot + layout.q);
  float* scores = reinterpret_cast<float*>(slot + layout.scores);  // [group][n]
  float* red = reinterpret_cast<float*>(slot + layout.red);        // [position groups][group][hd]

  // Rows [begin, end) of the split: in the slot, or in the caches (generic loads serve both).
  const uint64_t first_row = (static_cast<uint64_t>(a.kv_head) * a.max_seq + begin) * hd;
  const KvT* kc = kv_in_slot ? reinterpret_cast<const KvT*>(slot + layout.k) : m.ptr<KvT>(a.k_cache) + first_row;
  const KvT* vc = kv_in_slot ? reinterpret_cast<const KvT*>(slot + layout.v) : m.ptr<KvT>(a.v_cache) + first_row;
  const float* q_src = m.ptr<float>(a.q) + first_head * hd;
  const uint8_t* k_src = reinterpret_cast<const uint8_t*>(m.ptr<KvT>(a.k_cache) + first_row);
  const uint8_t* v_src = reinterpret_cast<const uint8_t*>(m.ptr<KvT>(a.v_cache) + first_row);
  // Handed over before the waits (kActivationEarly): the rows earlier steps wrote, [0, old) of the split, are copied
  // now; this step's row (the context's last) and q after the waits.
  const bool early = ctx.act_waited != nullptr && (ctx.act_flags & kActivationEarly) != 0;
  const uint32_t old = early ? min(n, ctx.act_length - 1 > begin ? ctx.act_length - 1 - begin : 0u) : 0;
  for (uint32_t j = ctx.tid; j < old * row16; j += kConsumerThreads) {
    CpAsync<16>(slot + layout.k + 16 * j, k_src + 16 * j, 16);
    CpAsync<16>(slot + layout.v + 16 * j, v_src + 16 * j, 16);
  }
  CpAsyncCommit();
  if (early) MbarrierWait(ctx.act_waited, ctx.act_phase, {ctx.error, ctx.sm, ctx.index, 0, 0, kStuckActivationWait});
  for (uint32_t j = ctx.tid; n > 0 && j < group * hd4; j += kConsumerThreads) {
    CpAsync<16>(q + 4 * QSlotIndex<KvT>(j, hd4), q_src + 4 * j, 16);
  }
  for (uint32_t j = old * row16 + ctx.tid; kv_in_slot && j < n * row16; j += kConsumerThreads) {
    CpAsync<16>(slot + layout.k + 16 * j, k_src + 16 * j, 16);
  }
  CpAsyncCommit();
  for (uint32_t j = old * row16 + ctx.tid; kv_in_slot && j < n * row16; j += kConsumerThreads) {
    CpAsync<16>(slot + layout.v + 16 * j, v_src + 16 * j, 16);
  }
  CpAsyncCommit();
  CpAsyncWait<1>();
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  if (kChunks && n > 0) CountSplitRows(ctx);  // (kChunks: the decode variant's; an empty split is the loader's)
  AttnScores(q, kc, scores, group, n, hd, a.scale, ctx.tid);
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  for (uint32_t h = ctx.warp; h < group; h += kConsumerWarps) {  // a warp per head: max, exp, sum
    head_sum = AttnExpScores(scores, h, n, -INFINITY, ctx.lane, &head_max);
  }
  CpAsyncWait<0>();  // V
  NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
  // Output: a thread per (position group, dim), every head of the group (each V element read once).
  // (AttnAccumulate's loop, written out: called here, with its accumulators by reference or by value, it cost the
  // tensor-core variant 280 bytes of spills and its prefill 5%.)
  const uint32_t groups = kConsumerThreads / hd, d = ctx.tid % hd, pg = ctx.tid / hd;
  float acc[kMaxGroupHeads] = {};
  for (uint32_t p = pg; p < n; p += 4 * groups) {
    float v[4];
#pragma unroll
    for (uint32_t u = 0; u < 4; ++u) {
      if (p + u * groups < n) v[u] = KvValue(vc, (p + u * groups) * hd + d);
    }
#pragma unroll
    for (uint32_t u = 0; u < 4; ++u) {
      if (p + u * groups >= n) break;
#pragma unroll
      for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
        if (h < group) acc[h] += scores[h * n + p + u * groups] * v[u];
      }
    }
  }
#pragma unroll
  for (uint32_t h = 0; h < kMaxGroupHeads; ++h) {
    if (h < group) red[(pg * group + h) * hd + d] = acc[h];
  }
  AttnPartialFinish<kFused>(a, ctx, red, head_max, head_sum, partial_tag);
}

// ATTN_PARTIAL over an f32 or a bf16 KV cache (the cache tensor's dtype, isa::KvBytes).
template <bool kChunks, bool kFused>
__device__ __forceinline__ void RunAttnPartial(const isa::AttnPartialArgs& a, ConsumerContext& ctx) {
  if (ctx.machine.IsBf16(a.k_cache)) {
    RunAttnPartialOf<__nv_bfloat16, kChunks, kFused>(a, ctx);
  } else {
    RunAttnPartialOf<float, kChunks, kFused>(a, ctx);
  }
}

}  // namespace loom::megakernel
