// The persistent megakernel: one block per SM, each an interpreter of its SM's
// queue of 128-byte instructions, replayed once per decode step.
//
// Warp roles (one if/else, so setmaxnreg can move registers to the consumers):
//   warps 0-7  (2 warpgroups) consumers: wait on global barriers, load
//              activations, compute from the page ring, store, signal.
//   warp 8     loader: streams every MATVEC's packed weight tile into the page
//              ring, page by page, never waiting on dependencies — so it runs
//              ahead into the next instructions while consumers compute or wait.
//   warp 9     storer: once the consumers finish an instruction, makes its
//              stores visible GPU-wide and signals its barrier, so the
//              consumers move on without waiting for the fence.
//   warps 10-11 give their registers back and exit.
#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/global_barrier.cuh"
#include "megakernel/kernel_params.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/megakernel_launch.h"
#include "megakernel/ops/attention.cuh"
#include "megakernel/ops/matvec.cuh"
#include "megakernel/ops/vector_ops.cuh"
#include "megakernel/pipeline_state.cuh"

namespace loom::megakernel {
namespace {

constexpr uint32_t kConsumerRegisters = 232;
constexpr uint32_t kProducerRegisters = 40;
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536, "register file overflow");

struct SharedLayout {
  uint64_t* full;
  uint64_t* empty;
  uint64_t* done;    // [kSignalSlots] consumers -> storer: an instruction's stores are issued
  uint64_t* freed;   // [kSignalSlots] storer -> consumers: its signal is out, the slot is free
  float* scratch;
  float* act;
  uint8_t* pages;
};

__device__ __forceinline__ SharedLayout Carve(uint8_t* smem, const KernelParams& p) {
  SharedLayout s;
  s.full = reinterpret_cast<uint64_t*>(smem);
  s.empty = s.full + kMaxPages;
  s.done = s.empty + kMaxPages;
  s.freed = s.done + kSignalSlots;
  s.scratch = reinterpret_cast<float*>(s.freed + kSignalSlots);
  s.act = s.scratch + 2 * kScratchFloats;
  const uintptr_t pages = reinterpret_cast<uintptr_t>(reinterpret_cast<uint8_t*>(s.act) + p.activation_bytes);
  s.pages = reinterpret_cast<uint8_t*>((pages + 127) & ~uintptr_t{127});
  return s;
}

// A position in this SM's stream of weight bytes: every MATVEC tile of the
// queue, step after step. Next() yields the next chunk of at most `max_bytes`.
struct WeightCursor {
  uint32_t step;
  uint32_t index;   // instruction, absolute in p.instructions
  uint64_t offset;  // bytes into that instruction's tile

  __device__ __forceinline__ bool Next(const KernelParams& p, uint32_t begin, uint32_t end, uint32_t max_bytes,
                                       const uint8_t** src, uint32_t* bytes) {
    while (step < p.num_steps) {
      if (index >= end) {
        index = begin;
        ++step;
        continue;
      }
      const isa::Instruction& inst = p.instructions[index];
      if (inst.op() == isa::Opcode::MATVEC) {
        const isa::MatvecArgs& a = inst.as<isa::MatvecArgs>();
        const uint64_t total = static_cast<uint64_t>(a.rows) * a.k * 2;
        if (offset < total) {
          *src = p.machine.ptr<uint8_t>(a.weight) + static_cast<uint64_t>(a.row_begin) * a.k * 2 + offset;
          *bytes = static_cast<uint32_t>(total - offset < max_bytes ? total - offset : max_bytes);
          offset += *bytes;
          return true;
        }
      }
      ++index;
      offset = 0;
    }
    return false;
  }
};

// L2 prefetches are issued in chunks of this size.
constexpr uint32_t kPrefetchChunkBytes = 32768;

__device__ void Loader(const KernelParams& p, const SharedLayout& s, uint32_t sm) {
  PipelineState ring{0, 0, p.num_pages};
  const uint32_t begin = p.queue_begin[sm], end = p.queue_begin[sm + 1];
  WeightCursor load{0, begin, 0}, prefetch{0, begin, 0};
  uint64_t loaded = 0, prefetched = 0;
  const uint8_t* src;
  uint32_t bytes;
  while (load.Next(p, begin, end, p.page_bytes, &src, &bytes)) {
    uint64_t spins = 0;
    while (!MbarrierTryWait(&s.empty[ring.index], ring.phase ^ 1u)) {
      if (kDeviceDebug && ++spins > kDebugSpinLimit) {
        ReportStuck(p.error, sm, load.index - begin, static_cast<uint32_t>(isa::Opcode::MATVEC), ring.index,
                    ring.phase, 0, kStuckPageWait);
      }
    }
    MbarrierArriveExpectTx(&s.full[ring.index], bytes);
    BulkCopyToShared(s.pages + static_cast<size_t>(ring.index) * p.page_bytes, src, bytes, &s.full[ring.index]);
    ++ring;
    loaded += bytes;
    // Keep L2 filled ahead of the ring, whatever the consumers are waiting for.
    const uint8_t* ahead;
    uint32_t ahead_bytes;
    while (prefetched < loaded + p.l2_prefetch_bytes &&
           prefetch.Next(p, begin, end, kPrefetchChunkBytes, &ahead, &ahead_bytes)) {
      if (prefetched >= loaded) BulkPrefetchL2(ahead, ahead_bytes);  // not yet in (or on its way to) the ring
      prefetched += ahead_bytes;
    }
  }
}

__device__ void Storer(const KernelParams& p, const SharedLayout& s, uint32_t sm) {
  PipelineState slot{0, 0, kSignalSlots};
  const uint32_t begin = p.queue_begin[sm], end = p.queue_begin[sm + 1];
  for (uint32_t step = 0; step < p.num_steps; ++step) {
    for (uint32_t i = begin; i < end; ++i) {
      while (!MbarrierTryWait(&s.done[slot.index], slot.phase)) {
      }
      const uint32_t signal = p.instructions[i].signal;
      if (signal != isa::kNoBarrier) {
        __threadfence();
        AddRelease(p.counters + signal, 1);
      }
      MbarrierArrive(&s.freed[slot.index]);
      ++slot;
    }
  }
}

__device__ void Consumers(const KernelParams& p, const SharedLayout& s, uint32_t sm, uint32_t tid) {
  PipelineState slot{0, 0, kSignalSlots};
  ConsumerContext ctx;
  ctx.ring = PipelineState{0, 0, p.num_pages};
  ctx.tid = tid;
  ctx.warp = tid / 32;
  ctx.lane = tid % 32;
  ctx.machine = p.machine;
  ctx.act = s.act;
  ctx.scratch = s.scratch;
  ctx.pages = s.pages;
  ctx.full = s.full;
  ctx.empty = s.empty;
  ctx.page_bytes = p.page_bytes;
  ctx.error = p.error;
  ctx.sm = sm;
  const uint32_t begin = p.queue_begin[sm], end = p.queue_begin[sm + 1];
  const uint32_t total = p.queue_begin[gridDim.x];
  for (uint32_t local = 0; local < p.num_steps; ++local) {
    const uint32_t step = p.first_step + local;
    ctx.step = step;
    for (uint32_t i = begin; i < end; ++i) {
      const isa::Instruction& inst = p.instructions[i];
      ctx.index = i - begin;
      uint64_t start = 0, ready = 0;
      if (tid == 0) {
        if (p.trace != nullptr) start = GlobalTimer();
        for (uint32_t w = 0; w < inst.num_waits; ++w) {
          WaitGlobal(p.counters, inst.waits[w], step, p.error, sm, i - begin, inst.opcode);
        }
        if (p.trace != nullptr) ready = GlobalTimer();
      }
      NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
      switch (inst.op()) {
        case isa::Opcode::EMBED: RunEmbed(inst.as<isa::EmbedArgs>(), ctx); break;
        case isa::Opcode::RMS_NORM: RunRmsNorm(inst.as<isa::RmsNormArgs>(), ctx); break;
        case isa::Opcode::MATVEC: RunMatvec(inst.as<isa::MatvecArgs>(), ctx); break;
        case isa::Opcode::ROPE_KV_APPEND: RunRopeAppend(inst.as<isa::RopeAppendArgs>(), ctx); break;
        case isa::Opcode::ATTN_PARTIAL: RunAttnPartial(inst.as<isa::AttnPartialArgs>(), ctx); break;
        case isa::Opcode::ATTN_REDUCE: RunAttnReduce(inst.as<isa::AttnReduceArgs>(), ctx); break;
        case isa::Opcode::SILU_MUL: RunSiluMul(inst.as<isa::SiluMulArgs>(), ctx); break;
        case isa::Opcode::ADD: RunAdd(inst.as<isa::AddArgs>(), ctx); break;
        case isa::Opcode::ARGMAX_PARTIAL: RunArgmaxPartial(inst.as<isa::ArgmaxPartialArgs>(), ctx); break;
        case isa::Opcode::ARGMAX_REDUCE: RunArgmaxReduce(inst.as<isa::ArgmaxReduceArgs>(), ctx); break;
        default: break;
      }
      // Every consumer's stores are issued: hand the instruction to the storer.
      NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
      if (tid == 0) {
        if (p.trace != nullptr) p.trace[static_cast<uint64_t>(local) * total + i] = {start, ready, GlobalTimer()};
        while (!MbarrierTryWait(&s.freed[slot.index], slot.phase ^ 1u)) {
        }
        MbarrierArrive(&s.done[slot.index]);
      }
      ++slot;
    }
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) Megakernel(const __grid_constant__ KernelParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const SharedLayout s = Carve(smem, p);
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t sm = blockIdx.x;
  if (threadIdx.x == 0) {
    for (uint32_t i = 0; i < p.num_pages; ++i) {
      MbarrierInit(&s.full[i], 1);
      MbarrierInit(&s.empty[i], kConsumerThreads);
    }
    for (uint32_t i = 0; i < kSignalSlots; ++i) {
      MbarrierInit(&s.done[i], 1);
      MbarrierInit(&s.freed[i], 1);
    }
    FenceBarrierInit();
  }
  __syncthreads();
  if (warp < kConsumerWarps) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
    Consumers(p, s, sm, threadIdx.x);
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    if (warp == kLoaderWarp && threadIdx.x % 32 == 0) Loader(p, s, sm);
    if (warp == kStorerWarp && threadIdx.x % 32 == 0) Storer(p, s, sm);
  }
}

}  // namespace

cudaError_t LaunchMegakernel(const KernelParams& params, uint32_t num_sms, uint32_t smem_bytes, cudaStream_t stream) {
  static uint32_t configured_smem = 0;
  if (configured_smem < smem_bytes) {
    cudaError_t e = cudaFuncSetAttribute(Megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) return e;
    configured_smem = smem_bytes;
  }
  // Cooperative launch: fails, instead of hanging, if the blocks cannot all be resident.
  void* args[] = {const_cast<KernelParams*>(&params)};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(Megakernel), dim3(num_sms), dim3(kBlockThreads), args,
                                     smem_bytes, stream);
}

}  // namespace loom::megakernel
