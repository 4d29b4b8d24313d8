// The 128-byte Loom instruction, shared verbatim by the host encoder, the CPU
// reference VM and the device interpreter (this header compiles under nvcc).
//
//   word  0      opcode (8) | flags (8) | num_waits (8) | reserved (8)
//   word  1      signal barrier id (kNoBarrier: none); +1 when the instruction is done
//   words 2..9   kMaxWaits waits: {barrier | in_data << 30 | previous_step << 31, count | stride << 16}
//   words 10..31 opcode arguments (an *Args struct of its family's header, included below):
//                tensor ids and tile coordinates
//
// A wait in decode step e is satisfied when counter[barrier] reaches
//   (e - previous_step) * stride + count        (stride = the barrier's signals per step)
// so counters never reset between steps or launches (compared wrap-safe).
//
// Step tags (flags, in_data): a tensor whose writers carry kFlagTagOut holds f32 values whose lowest mantissa bit is
// the parity of the step that wrote them. A wait marked in_data is then observed in the data itself: the device
// skips the counter and the instruction reads its input until every value carries this step's tag (one round
// trip where the counter and then the input took two or three). Its meaning, and the VM's, is the plain wait's;
// scheduler/data_waits.h says which waits qualify and docs/architecture.md "Step tags" why it is sound.
#pragma once

#include <cstddef>
#include <cstdint>

#include "instructions/opcodes.h"

#if defined(__CUDACC__)
#define LOOM_HD __host__ __device__ __forceinline__
#else
#define LOOM_HD inline
#endif

namespace loom::isa {

inline constexpr int kInstructionBytes = 128;
inline constexpr int kInstructionWords = kInstructionBytes / 4;
inline constexpr int kMaxWaits = 4;
inline constexpr int kHeaderWords = 2 + 2 * kMaxWaits;
inline constexpr int kArgWords = kInstructionWords - kHeaderWords;
inline constexpr uint32_t kNoBarrier = 0xffffffffu;
inline constexpr uint32_t kNoTensor = 0xffffffffu;  // an optional tensor argument that is absent
inline constexpr uint32_t kBarrierIdMask = 0x3fffffffu;
inline constexpr uint32_t kWaitInData = 0x40000000u;
inline constexpr uint32_t kWaitPreviousStep = 0x80000000u;

// Instruction::flags.
inline constexpr uint8_t kFlagTagOut = 1;         // stores its output with this step's tag (MATVEC, ATTN, EMBED)
inline constexpr uint8_t kFlagTaggedInput = 2;    // MATVEC, ATTN_REDUCE: reads its input until it has the step's tag
inline constexpr uint8_t kFlagTaggedResidual = 4; // MATVEC: the same for the residual its epilogue adds
inline constexpr uint32_t kMaxSignalsPerStep = 0xffffu;

enum class Opcode : uint8_t {
#define LOOM_OPCODE_ENUM(name, args) name,
  LOOM_OPCODE_LIST(LOOM_OPCODE_ENUM)
#undef LOOM_OPCODE_ENUM
      kCount
};
inline constexpr int kNumOpcodes = static_cast<int>(Opcode::kCount);

// Step state (an i32 tensor): where the decode loop is.
enum StepStateWord : uint32_t {
  kStatePosition = 0,     // position of the token being processed this step
  kStatePromptLength = 1, // tokens[0, prompt_length) are forced, not generated
  kStateOverflow = 2,     // set by ARGMAX_REDUCE when the KV cache is full
  kStepStateWords = 4,
};

// Tensors live in one of two regions: packed weights (read-only) or the arena.
enum Region : uint32_t { kWeightRegion = 0, kArenaRegion = 1, kNumRegions = 2 };

// graph::DType BF16 (isa.cc checks the value): the dtype device code reads from the table, a KV cache's (f32 or bf16).
inline constexpr uint32_t kDTypeBf16 = 1;

// One entry of the schedule's tensor table as the VM and device see it.
struct TensorDesc {
  uint64_t offset;  // bytes from the region's base
  uint64_t bytes;
  uint32_t region;
  uint32_t dtype;  // graph::DType
};
static_assert(sizeof(TensorDesc) == 24);

// Resolves tensor ids to addresses: the only way opcode code reaches memory.
struct MachineView {
  uint8_t* regions[kNumRegions];
  const TensorDesc* tensors;
  uint32_t num_tensors;

  template <typename T>
  LOOM_HD T* ptr(uint32_t tensor) const {
    const TensorDesc& t = tensors[tensor];
    // A select, not regions[t.region]: a run-time index would push the whole
    // view (and whatever holds it) into local memory on the GPU.
    static_assert(kNumRegions == 2, "MachineView::ptr selects between two regions");
    uint8_t* base = t.region == kArenaRegion ? regions[kArenaRegion] : regions[kWeightRegion];
    return reinterpret_cast<T*>(base + t.offset);
  }
  LOOM_HD bool IsBf16(uint32_t tensor) const { return tensors[tensor].dtype == kDTypeBf16; }
};

struct Wait {
  uint32_t barrier_and_flags;
  uint32_t count_and_stride;

  LOOM_HD uint32_t barrier() const { return barrier_and_flags & kBarrierIdMask; }
  LOOM_HD bool previous_step() const { return (barrier_and_flags & kWaitPreviousStep) != 0; }
  LOOM_HD bool in_data() const { return (barrier_and_flags & kWaitInData) != 0; }
  LOOM_HD uint32_t count() const { return count_and_stride & 0xffffu; }
  LOOM_HD uint32_t stride() const { return count_and_stride >> 16; }
  // Counter value that satisfies this wait in decode step `step`.
  LOOM_HD uint32_t target(uint32_t step) const {
    return (step - (previous_step() ? 1u : 0u)) * stride() + count();
  }
};
static_assert(sizeof(Wait) == 8);

// Wrap-safe "counter has reached target".
LOOM_HD bool Reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

struct Instruction {
  uint8_t opcode;
  uint8_t flags;
  uint8_t num_waits;
  uint8_t reserved;
  uint32_t signal;
  Wait waits[kMaxWaits];
  uint32_t args[kArgWords];

  LOOM_HD Opcode op() const { return static_cast<Opcode>(opcode); }
  template <typename Args>
  LOOM_HD const Args& as() const {
    static_assert(sizeof(Args) <= sizeof(args));
    return *reinterpret_cast<const Args*>(args);
  }
  template <typename Args>
  LOOM_HD Args& as() {
    return *reinterpret_cast<Args*>(args);
  }
};
static_assert(sizeof(Instruction) == kInstructionBytes);

}  // namespace loom::isa

// Opcode arguments, one header per opcode family (the same stem as its ops_<family>.cc and megakernel/ops/ file).
// All fields are 32-bit words; tensors are ids into the schedule's tensor table. kFields names them (for loom
// inspect and errors).

namespace loom::isa {
// The argument words that hold a float (bit i: word i), for printing (loom inspect); set beside each Args struct
// with one (FloatWord).
template <typename Args>
inline constexpr uint32_t kFloatWords = 0;
inline constexpr uint32_t FloatWord(size_t offset) { return 1u << (offset / 4); }
}  // namespace loom::isa

#include "instructions/vector.h"       // EMBED, RMS_NORM, ROPE_KV_APPEND, SILU_MUL, ADD, ARGMAX_*
#include "instructions/matvec.h"       // MATVEC, MATVEC_FP8, MATVEC_W4 and the packed weight layouts
#include "instructions/attention.h"    // ATTN_PARTIAL, ATTN_REDUCE
#include "instructions/gemm.h"         // GEMM, PACK_ROWS, SUM_SPLITS
#include "instructions/flash.h"        // FLASH_ATTN
#include "instructions/conv.h"         // CONV_GEMM, IM2COL, NHWC_BF16, DWCONV, POOL, CONV1D
#include "instructions/elementwise.h"  // ELEMENTWISE, SOFTMAX, NORM_ROWS
#include "instructions/kernel_variant.h"  // which variant compiles which opcode

namespace loom::isa {

// Bytes of an SM's activation ring one instruction takes on the device (0: the
// opcode reads its inputs from global memory), a multiple of 16. kVariant: the kernel variant asking;
// kNumKernelVariants on the host (every opcode). MATVEC_FP8 is tested only where it is compiled, so the other
// variants' activation loaders stay the code they were (testing only each variant's own opcodes throughout changed
// their code layout: +0.4% bf16 decode, +0.5% prefill at 2048 rows on the H100).
LOOM_HD constexpr bool ActivationTested(uint32_t variant, Opcode op) {
  return variant >= kNumKernelVariants || VariantCompiles(static_cast<KernelVariant>(variant), op);
}
template <uint32_t kVariant = kNumKernelVariants>
LOOM_HD uint32_t ActivationBytes(const Instruction& inst) {
  uint64_t bytes = 0;
  if (inst.op() == Opcode::MATVEC) {
    const MatvecArgs& a = inst.as<MatvecArgs>();
    bytes = MatvecActivationBytes(a.rows, a.k);
  } else if (ActivationTested(kVariant, Opcode::MATVEC_FP8) && inst.op() == Opcode::MATVEC_FP8) {
    const MatvecFp8Args& a = inst.as<MatvecFp8Args>();
    bytes = MatvecFp8ActivationBytes(a.rows, a.k);
  } else if (ActivationTested(kVariant, Opcode::MATVEC_W4) && inst.op() == Opcode::MATVEC_W4) {
    const MatvecW4Args& a = inst.as<MatvecW4Args>();
    bytes = MatvecW4ActivationBytes(a.rows, a.k, a.group_shift);
  } else if (inst.op() == Opcode::ATTN_PARTIAL) {
    const AttnPartialArgs& a = inst.as<AttnPartialArgs>();
    const uint32_t group = a.num_kv_heads == 0 ? 0 : a.num_heads / a.num_kv_heads;
    const uint32_t chunk = a.num_splits == 0 ? 0 : SplitChunk(a.max_seq, a.num_splits, a.min_positions);
    bytes = AttnPartialActivationBytes(group, a.head_dim, chunk < a.max_seq ? chunk : a.max_seq);
  } else if (inst.op() == Opcode::ATTN_REDUCE) {
    const AttnReduceArgs& a = inst.as<AttnReduceArgs>();
    bytes = AttnReduceActivationBytes(a.num_splits, a.head_count);
  } else if (inst.op() == Opcode::FLASH_ATTN) {
    bytes = FlashActivationBytes(inst.as<FlashAttnArgs>().head_dim);
  } else if (inst.op() == Opcode::GEMM) {
    bytes = GemmActivationBytes(inst.as<GemmArgs>());
  } else if (inst.op() == Opcode::CONV_GEMM) {
    bytes = ConvGemmActivationBytes(inst.as<ConvGemmArgs>());
  } else if (inst.op() == Opcode::POOL) {
    bytes = PoolActivationBytes(inst.as<PoolArgs>());
  } else if (inst.op() == Opcode::SUM_SPLITS) {
    bytes = SumSplitsActivationBytes(inst.as<SumSplitsArgs>());
  } else if (inst.op() == Opcode::PACK_ROWS) {
    bytes = PackRowsActivationBytes(inst.as<PackRowsArgs>());
  }
  bytes = (bytes + 15) / 16 * 16;
  return bytes > 0xffffffffull ? 0xffffffffu : static_cast<uint32_t>(bytes);
}

#define LOOM_CHECK_ARGS(name, args)                                                    \
  static_assert(sizeof(args) <= kArgWords * 4, #args " does not fit an instruction"); \
  static_assert(sizeof(args) == sizeof(args::kFields) / sizeof(char*) * 4, #args " kFields out of date");
LOOM_OPCODE_LIST(LOOM_CHECK_ARGS)
#undef LOOM_CHECK_ARGS

}  // namespace loom::isa
