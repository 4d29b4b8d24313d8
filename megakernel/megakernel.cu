// The persistent megakernel: one block per SM, each an interpreter of its SM's
// queue of 128-byte instructions, replayed once per decode step.
//
// Warp roles (one if/else, so setmaxnreg can move registers to the consumers):
//   warps 0-7  (2 warpgroups) consumers: compute each instruction from its
//              activation slot and the page ring, store, hand it to the storer.
//   warp 8     weight loader: streams every MATVEC's packed weight tile into the
//              page ring, page by page, never waiting on dependencies — so it
//              runs ahead into the next instructions while consumers compute.
//   warp 9     storer: once the consumers finish an instruction, makes its
//              stores visible GPU-wide and signals its barrier, so the
//              consumers move on without waiting for it.
//   warp 10    controller: bulk-copies this SM's instructions, step after step,
//              into the SMEM instruction ring; every other role reads them there.
//   warp 11    activation loader: waits for each instruction's global barriers
//              (not those observed in the data: step tags), then gives it its
//              own activation slot (a range of the SM's activation ring), while
//              the consumers still compute the instructions before; they load
//              its activations into the slot. ATTN_PARTIAL gets its slot before
//              the waits and `act_waited` after them.
//
// Rings and who hands what to whom (all mbarriers, all (index, phase) states):
//   instruction slot: controller -> (weight loader, activation loader,
//                     consumers, storer), released by all four;
//   activation slot:  activation loader -> consumers;
//   page:             weight loader -> consumers;
//   signal slot:      consumers -> storer.
#include <cstdint>

#include "instructions/instruction.h"
#include "megakernel/activation_loader.cuh"
#include "megakernel/global_barrier.cuh"
#include "megakernel/kernel_params.h"
#include "megakernel/mbarrier.cuh"
#include "megakernel/megakernel_launch.h"
#include "megakernel/ops/ops.cuh"
#include "megakernel/pipeline_state.cuh"
#include "megakernel/shared_layout.cuh"

namespace loom::megakernel {
namespace {

constexpr uint32_t kConsumerRegisters = 232;
constexpr uint32_t kProducerRegisters = 40;
// setmaxnreg moves registers within what the block was given at launch: __launch_bounds__(kBlockThreads, 1) gives each
// thread 65536 / kBlockThreads rounded down to a multiple of 8 (168), and an increase beyond what the decreases free
// waits forever (48 producer registers, which this assert used to allow, hung the kernel).
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <=
                  kBlockThreads * (65536 / kBlockThreads / 8 * 8),
              "register file overflow");

__device__ void Controller(const KernelParams& p, const SharedLayout& s, uint32_t sm) {
  for (QueueWalk w(p, sm); w.more(p); w.advance()) {
    MbarrierWait(&s.inst_empty[w.slot.index], w.slot.phase ^ 1u,
                 w.Where(p, sm, 0, w.slot.index, kStuckInstructionWait));
    MbarrierArriveExpectTx(&s.inst_full[w.slot.index], isa::kInstructionBytes);
    BulkCopyToShared(&s.inst[w.slot.index], p.instructions + w.i, isa::kInstructionBytes, &s.inst_full[w.slot.index]);
  }
}

// The weight loader: for each instruction, the page hook of its opcode (LoadPages beside the opcode's device code,
// ops/loader_context.cuh), the opcodes that have one tested in table order (an if-chain: a switch over every opcode
// cost decode 0.4-0.5% ms/token on the H100), the slot let go at once for the others. Pages only for what the
// consumers of this variant run (isa::VariantCompiles, as their switch): an opcode the variant lacks streams nothing
// and its consumers report it.
template <uint32_t kVariant>
__device__ void Loader(const KernelParams& p, const SharedLayout& s, uint32_t sm) {
  QueueWalk w(p, sm);
  const uint32_t max_in_flight =
      p.matvec_pages_in_flight == 0 || p.matvec_pages_in_flight > p.num_pages ? p.num_pages : p.matvec_pages_in_flight;
  LoaderContext l{p, s, sm, w, {0, 0, p.num_pages}, {0, 0, p.num_pages}, 0, max_in_flight, 0};
  for (; w.more(p); w.advance()) {
    MbarrierWait(&s.inst_full[w.slot.index], w.slot.phase, w.Where(p, sm, 0, w.slot.index, kStuckInstructionWait));
    const isa::Instruction& inst = s.inst[w.slot.index];
    bool loaded = false;
#define LOOM_LOADER_HOOK(name, args)                                                                        \
  if constexpr (kHasPageHook<isa::args> &&                                                                  \
                isa::VariantCompiles(static_cast<isa::KernelVariant>(kVariant), isa::Opcode::name)) {       \
    if (!loaded && inst.op() == isa::Opcode::name) {                                                        \
      LoadPages<kVariant>(inst.as<isa::args>(), inst, l);                                                   \
      loaded = true;                                                                                        \
    }                                                                                                       \
  }
    LOOM_OPCODE_LIST(LOOM_LOADER_HOOK)
#undef LOOM_LOADER_HOOK
    if (!loaded) l.InstructionRead();
  }
}

// The storer: once the consumers hand an instruction over (`done`), signals its barrier and lets the instruction
// slot and the signal slot go. The signal is read from the instruction in global memory (loaded before the hand-off:
// its latency hides behind the wait), and the slot's copy is checked against it: a slot refilled before every role
// let it go holds a later instruction, whose signal would count toward another barrier and leave this one short for
// ever. That was seen on the H100 (a layout of the tensor-core variant hung prefill passes; the check found slots
// holding the instruction 16 on: docs/history/performance_log.md, "A refilled instruction slot"); the launch now
// fails naming it (kInstructionSlotRefilled) instead of hanging.
__device__ void Storer(const KernelParams& p, const SharedLayout& s, uint32_t sm) {
  PipelineState signal_slot{0, 0, kSignalSlots};
  uint64_t retired = static_cast<uint64_t>(p.launch) << 32;
  for (QueueWalk w(p, sm); w.more(p); w.advance()) {
    const uint32_t signal = __ldg(&p.instructions[w.i].signal);
    MbarrierWait(&s.done[signal_slot.index], signal_slot.phase,
                 w.Where(p, sm, 0, signal_slot.index, kStuckSignalWait));
    const uint32_t slot_signal = s.inst[w.slot.index].signal;  // consumers waited for the slot before handing it on
    MbarrierArrive(&s.inst_empty[w.slot.index]);
    // The release add alone publishes the consumers' stores: they precede it through the consumers' named barrier
    // and the `done` mbarrier (release / acquire in the CTA), and a release is cumulative over what precedes it.
    // (A __threadfence before it made every barrier hop ~0.5 us longer: docs/history/performance_log.md.)
    if (signal != isa::kNoBarrier) AddRelease(p.counters + signal, 1);
    if (p.retired != nullptr) StoreRelaxed(p.retired + sm, ++retired);
    MbarrierArrive(&s.freed[signal_slot.index]);
    if (slot_signal != signal) ReportSlotRefilled(p.error, sm, w.i - w.begin, slot_signal, signal);
    ++signal_slot;
  }
}

// kVariant (isa::KernelVariant): kTensorKernel and up run the tensor-core opcodes (GEMM, FLASH_ATTN), kGraphKernel
// the general-graph ones too, kWideKernel GEMM's 128 x 256 tiles. The tensor-core ones need many accumulator
// registers, and in the same consumer loop they push the decode opcodes into spills; decode programs run the
// variant without them.
// Each opcode's device entry, chosen by its argument struct. The consumer switch expands the opcode table
// (LOOM_OPCODE_LIST), so an opcode without an entry here does not compile; kVariant picks the forms a variant
// compiles (isa::KernelVariantOf(const Instruction&)).
#define LOOM_DEVICE_ENTRY(ARGS, ...)                                                      \
  template <uint32_t kVariant>                                                            \
  __device__ __forceinline__ void Consume(const isa::ARGS& a, ConsumerContext& ctx) { \
    __VA_ARGS__;                                                                          \
  }
LOOM_DEVICE_ENTRY(EmbedArgs, RunEmbed(a, ctx))
LOOM_DEVICE_ENTRY(RmsNormArgs, RunRmsNorm(a, ctx))
LOOM_DEVICE_ENTRY(MatvecArgs, RunMatvec<isa::IsDecodeVariant(kVariant)>(a, ctx))
LOOM_DEVICE_ENTRY(MatvecFp8Args, RunMatvecFp8(a, ctx))
LOOM_DEVICE_ENTRY(MatvecW4Args, RunMatvecW4(a, ctx))
LOOM_DEVICE_ENTRY(RopeAppendArgs, RunRopeAppend(a, ctx))
LOOM_DEVICE_ENTRY(AttnPartialArgs,
                  RunAttnPartial<isa::IsDecodeVariant(kVariant), !isa::IsDecodeVariant(kVariant)>(a, ctx))
LOOM_DEVICE_ENTRY(AttnReduceArgs, RunAttnReduce<!isa::IsDecodeVariant(kVariant)>(a, ctx))
LOOM_DEVICE_ENTRY(SiluMulArgs, RunSiluMul(a, ctx))
LOOM_DEVICE_ENTRY(AddArgs, RunAdd(a, ctx))
LOOM_DEVICE_ENTRY(ArgmaxPartialArgs, RunArgmaxPartial(a, ctx))
LOOM_DEVICE_ENTRY(ArgmaxReduceArgs, RunArgmaxReduce(a, ctx))
LOOM_DEVICE_ENTRY(Conv1dArgs, RunConv1d(a, ctx))
// The tensor-core opcodes (and PACK_ROWS, a GEMM's operand) run from the tensor variant up; the general-graph ones
// in their own variant: in the decode one they measured 11% slower decode (their code changes its register
// allocation), in the tensor one they doubled its spills.
LOOM_DEVICE_ENTRY(PackRowsArgs, RunPackRows(a, ctx))
LOOM_DEVICE_ENTRY(GemmArgs, RunGemm<kVariant == isa::kWideKernel>(a, ctx))
LOOM_DEVICE_ENTRY(FlashAttnArgs, RunFlashAttn(a, ctx))
LOOM_DEVICE_ENTRY(SumSplitsArgs, RunSumSplits(a, ctx))
LOOM_DEVICE_ENTRY(ConvGemmArgs, RunConvGemm(a, ctx))
LOOM_DEVICE_ENTRY(ImToColArgs, RunImToCol(a, ctx))
LOOM_DEVICE_ENTRY(PoolArgs, RunPool(a, ctx))
LOOM_DEVICE_ENTRY(ElementwiseArgs, RunElementwise(a, ctx))
LOOM_DEVICE_ENTRY(SoftmaxArgs, RunSoftmax(a, ctx))
LOOM_DEVICE_ENTRY(NormRowsArgs, RunNormRows(a, ctx))
LOOM_DEVICE_ENTRY(DwConvArgs, RunDwConv(a, ctx))
LOOM_DEVICE_ENTRY(NhwcBf16Args, RunNhwcBf16(a, ctx))
#undef LOOM_DEVICE_ENTRY

template <uint32_t kVariant>
__device__ __forceinline__ void Consumers(const KernelParams& p, const SharedLayout& s, uint32_t sm, uint32_t tid) {
  constexpr isa::KernelVariant kThisVariant = static_cast<isa::KernelVariant>(kVariant);
  PipelineState signal_slot{0, 0, kSignalSlots};
  PipelineState act{0, 0, p.activation_slots};
  uint32_t waited_phases = 0;  // bit i: the phase of act_waited[i] the next early hand-off of slot i completes
  ConsumerContext ctx;
  ctx.ring = PipelineState{0, 0, p.num_pages};
  ctx.tid = tid;
  ctx.warp = tid / 32;
  ctx.lane = tid % 32;
  ctx.machine = p.machine;
  ctx.scratch = s.scratch;
  ctx.pages = s.pages;
  ctx.full = s.full;
  ctx.empty = s.empty;
  ctx.page_bytes = p.page_bytes;
  ctx.error = p.error;
  ctx.sm = sm;
  ctx.launch_steps = p.num_steps;
  const uint32_t total = p.queue_begin[gridDim.x];
  for (QueueWalk w(p, sm); w.more(p); w.advance()) {
    ctx.step = p.first_step + w.local;
    ctx.launch_step = w.local;
    ctx.index = w.i - w.begin;
    const uint64_t start = p.trace != nullptr && tid == 0 ? GlobalTimer() : 0;
    MbarrierWait(&s.inst_full[w.slot.index], w.slot.phase, w.Where(p, sm, 0, w.slot.index, kStuckInstructionWait));
    const isa::Instruction& inst = s.inst[w.slot.index];
    MbarrierWait(&s.act_full[act.index], act.phase, w.Where(p, sm, inst.opcode, act.index, kStuckActivationWait));
    // Written now, not kept in a register across the opcode (the graph variant spills).
    if (p.trace != nullptr && tid == 0) p.trace[static_cast<uint64_t>(w.local) * total + w.i].handed = GlobalTimer();
    ctx.act = reinterpret_cast<float*>(s.act + s.act_offset[act.index]);
    ctx.act_waited = isa::IsDecodeVariant(kVariant) ? &s.act_waited[act.index] : nullptr;  // (decode only)
    ctx.act_phase = (waited_phases >> act.index) & 1u;
    // Step tags in decode programs only (they run this variant): elsewhere the tag code compiles away, and the
    // loader above polls every wait (TTFT was 1.5% slower with it in the tensor-core variant).
    ctx.flags = isa::IsDecodeVariant(kVariant) ? inst.flags | (p.trace != nullptr ? kContextTracing : 0u) : 0;
    ctx.ready = isa::IsDecodeVariant(kVariant) && p.trace != nullptr ? &s.act_ready[act.index] : nullptr;
    const uint64_t info = s.act_info[act.index];
    ctx.act_flags = static_cast<uint32_t>(info);
    ctx.act_length = static_cast<uint32_t>(info >> 32);
    // A slot handed over early completes its act_waited once (the loader arrives only then): its phase bit flips.
    if (ctx.act_flags & kActivationEarly) waited_phases ^= 1u << act.index;
    // Every case of the opcode table through one gate: its device entry where isa::VariantCompiles says this
    // variant compiles it, else the default's record (no flag kept across the switch: a register there moved the
    // tensor-core variants' allocation, +1% TTFT).
#define LOOM_CONSUMER_CASE(OP, ARGS)                                     \
  case isa::Opcode::OP:                                                  \
    if constexpr (isa::VariantCompiles(kThisVariant, isa::Opcode::OP)) { \
      Consume<kVariant>(inst.as<isa::ARGS>(), ctx);                      \
      break;                                                             \
    } else {                                                             \
      goto not_compiled;                                                 \
    }
    switch (inst.op()) {
      LOOM_OPCODE_LIST(LOOM_CONSUMER_CASE)
#undef LOOM_CONSUMER_CASE
      default:  // an opcode outside the table, or one this variant does not compile: it runs nothing, and the
                // host fails the launch naming it (GpuMachine checks every program before it runs, so this is the
                // last line, never the first)
      not_compiled:
        if (tid == 0) ReportNotCompiled(ctx.error, sm, ctx.index, inst.opcode, kVariant);
        break;
    }
    // Every consumer's stores are issued and its reads of the slots done: hand
    // the instruction to the storer, give the activation slot back.
    NamedBarrierSync(kConsumerBarrier, kConsumerThreads);
    MbarrierArrive(&s.act_empty[act.index]);
    if (tid == 0) {
      if (p.trace != nullptr) {
        const uint64_t ready = s.act_ready[act.index];
        TraceEvent& e = p.trace[static_cast<uint64_t>(w.local) * total + w.i];
        e.start = start;
        e.ready = ready > start ? ready : start;
        e.end = GlobalTimer();
        // The marks an opcode stamped (ConsumerContext::Mark), cleared for the next (zero at launch: Megakernel).
        uint64_t* marks = TraceMarks(s.scratch);
        e.pages_begin = marks[0];
        e.pages_end = marks[1];
        marks[0] = marks[1] = 0;
      }
      MbarrierWait(&s.freed[signal_slot.index], signal_slot.phase ^ 1u,
                   w.Where(p, sm, inst.opcode, signal_slot.index, kStuckSignalWait));
      MbarrierArrive(&s.done[signal_slot.index]);
    }
    // After the hand-off: the storer still reads the slot's signal, and releases it too.
    MbarrierArrive(&s.inst_empty[w.slot.index]);
    ++signal_slot;
    ++act;
  }
}

template <uint32_t kVariant>
__global__ void __launch_bounds__(kBlockThreads, 1) Megakernel(const __grid_constant__ KernelParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const SharedLayout s = Carve(smem, p);
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t sm = blockIdx.x;
  if (p.smids != nullptr && threadIdx.x == 0) {
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    p.smids[sm] = smid;
  }
  if (threadIdx.x == 0) {
    for (uint32_t i = 0; i < p.num_pages; ++i) {
      MbarrierInit(&s.full[i], 1);
      MbarrierInit(&s.empty[i], kConsumerThreads);
    }
    for (uint32_t i = 0; i < kSignalSlots; ++i) {
      MbarrierInit(&s.done[i], 1);
      MbarrierInit(&s.freed[i], 1);
    }
    for (uint32_t i = 0; i < kInstructionSlots; ++i) {
      MbarrierInit(&s.inst_full[i], 1);
      MbarrierInit(&s.inst_empty[i], kInstructionReleases);
    }
    for (uint32_t i = 0; i < p.activation_slots; ++i) {
      MbarrierInit(&s.act_waited[i], 1);
      MbarrierInit(&s.act_full[i], 1);
      MbarrierInit(&s.act_empty[i], kConsumerThreads);
      s.act_ready[i] = 0;
    }
    *s.split_rows = 0;
    TraceMarks(s.scratch)[0] = TraceMarks(s.scratch)[1] = 0;
    FenceBarrierInit();
  }
  __syncthreads();
  if (warp < kConsumerWarps) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
    Consumers<kVariant>(p, s, sm, threadIdx.x);
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    if (threadIdx.x % 32 == 0) {
      if (warp == kLoaderWarp) Loader<kVariant>(p, s, sm);
      if (warp == kStorerWarp) Storer(p, s, sm);
      if (warp == kControllerWarp) Controller(p, s, sm);
      if (warp == kActivationWarp) ActivationLoader<kVariant>(p, s, sm);
    }
  }
}

}  // namespace

namespace {

constexpr bool HasVariant(uint32_t variant) {
#ifdef LOOM_DEBUG_DECODE_VARIANT_ONLY
  return variant == isa::kDecodeKernel;
#else
  return variant < isa::kNumKernelVariants;
#endif
}

template <uint32_t kVariant>
void* KernelOf() {
  if constexpr (HasVariant(kVariant)) return reinterpret_cast<void*>(Megakernel<kVariant>);
  return nullptr;
}

}  // namespace

bool MegakernelHasVariant(uint32_t variant) { return HasVariant(variant); }

cudaError_t LaunchMegakernel(const KernelParams& params, uint32_t num_sms, uint32_t smem_bytes, cudaStream_t stream) {
  static uint32_t configured_smem[isa::kNumKernelVariants] = {};
  const uint32_t variant = params.kernel_variant;
  if (variant >= isa::kNumKernelVariants) return cudaErrorInvalidValue;
  void* const kernels[isa::kNumKernelVariants] = {KernelOf<isa::kDecodeKernel>(),     KernelOf<isa::kTensorKernel>(),
                                                  KernelOf<isa::kGraphKernel>(),      KernelOf<isa::kWideKernel>(),
                                                  KernelOf<isa::kDecodeFp8Kernel>(), KernelOf<isa::kDecodeW4Kernel>()};
  void* kernel = kernels[variant];
  if (kernel == nullptr) return cudaErrorInvalidDeviceFunction;  // (GpuMachine refuses such a program by name first)
  if (configured_smem[variant] < smem_bytes) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (e != cudaSuccess) return e;
    configured_smem[variant] = smem_bytes;
  }
  // Cooperative launch: fails, instead of hanging, if the blocks cannot all be resident.
  void* args[] = {const_cast<KernelParams*>(&params)};
  return cudaLaunchCooperativeKernel(kernel, dim3(num_sms), dim3(kBlockThreads), args, smem_bytes, stream);
}

}  // namespace loom::megakernel
