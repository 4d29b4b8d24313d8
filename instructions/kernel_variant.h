// The megakernel's kernel variants and which opcodes, and which forms of them, each compiles; included by
// instruction.h after every opcode's arguments (the instruction-level rules read them).
#pragma once

namespace loom::isa {

// The megakernel variant a program runs in: the largest its opcodes need. Each variant compiles only its opcodes, so
// the tensor-core ones' accumulator registers (and the general-graph ops' code) do not push the decode opcodes, or
// the prefill pass's, into spills.
enum KernelVariant : uint32_t {
  kDecodeKernel = 0,  // the decode opcodes (CONV1D too: a gated-conv decoder's steps)
  kTensorKernel = 1,  // + GEMM and FLASH_ATTN (prefill passes)
  kGraphKernel = 2,   // + CONV_GEMM, IM2COL, POOL, ELEMENTWISE, SOFTMAX, NORM_ROWS, DWCONV, NHWC_BF16 (general
                      //   graphs' passes)
  // kTensorKernel's opcodes + GEMM's 128 x 256 tiles (GemmArgs::wide), in a variant of their own: beside the
  // 128-column path their 128 accumulator registers per thread cost it 2-7% (gemm_bench, H100), and the graph
  // variant's spills doubled. Not with the general-graph opcodes (GpuMachine refuses the mix).
  kWideKernel = 3,
  // The decode opcodes + MATVEC_FP8 (decode programs with FP8 weights), in a variant of their own so the bf16
  // decode variant's code and registers stay as they are.
  kDecodeFp8Kernel = 4,
  // The decode opcodes + MATVEC_W4 (decode programs with int4 weights), for the same reason.
  kDecodeW4Kernel = 5,
};
inline constexpr uint32_t kNumKernelVariants = 6;
// The variants decode programs run in: step tags, early hand-offs and decode pages (their opcodes' decode forms).
LOOM_HD constexpr bool IsDecodeVariant(uint32_t v) {
  return v == kDecodeKernel || v == kDecodeFp8Kernel || v == kDecodeW4Kernel;
}
// The least variant that compiles `op`'s consumer code: the decode opcodes run in every variant, the tensor-core ones
// (and PACK_ROWS, a GEMM's operand) from kTensorKernel up, the general-graph ones in kGraphKernel alone. The device
// switch gates each case on VariantCompiles, so this is the one place that says which variant compiles what.
LOOM_HD constexpr KernelVariant KernelVariantOf(Opcode op) {
  if (op == Opcode::CONV_GEMM || op == Opcode::IM2COL || op == Opcode::POOL || op == Opcode::ELEMENTWISE ||
      op == Opcode::SOFTMAX || op == Opcode::NORM_ROWS || op == Opcode::DWCONV || op == Opcode::NHWC_BF16) {
    return kGraphKernel;
  }
  if (op == Opcode::MATVEC_FP8) return kDecodeFp8Kernel;
  if (op == Opcode::MATVEC_W4) return kDecodeW4Kernel;
  return op == Opcode::GEMM || op == Opcode::FLASH_ATTN || op == Opcode::SUM_SPLITS || op == Opcode::PACK_ROWS
             ? kTensorKernel
             : kDecodeKernel;
}
// Whether kernel variant `v` compiles `op`'s consumer code (an opcode of the table only).
LOOM_HD constexpr bool VariantCompiles(KernelVariant v, Opcode op) {
  switch (KernelVariantOf(op)) {
    case kDecodeKernel: return true;
    case kTensorKernel: return v == kTensorKernel || v == kGraphKernel || v == kWideKernel;
    default: return v == KernelVariantOf(op);
  }
}
// An instruction's variant: its opcode's, but a wide GEMM tile's is kWideKernel, and forms the default decode
// lowering never emits run in kTensorKernel, so the decode variant does not compile them: an ATTN_PARTIAL with the
// fused reduce (`out`: the `fused_attention_reduce` option), an ATTN_REDUCE of more than kAttnThreads elements (the
// lowering's are kAttnThreads: AttnReduceHeads). Code the decode steps never run cost them 0.5-0.8% twice
// (docs/history/performance_log.md, "the decode variant's code size").
LOOM_HD KernelVariant KernelVariantOf(const Instruction& inst) {
  if (inst.op() == Opcode::GEMM && inst.as<GemmArgs>().wide) return kWideKernel;
  if (inst.op() == Opcode::ATTN_PARTIAL && inst.as<AttnPartialArgs>().out != kNoTensor) return kTensorKernel;
  if (inst.op() == Opcode::ATTN_REDUCE) {
    const AttnReduceArgs& a = inst.as<AttnReduceArgs>();
    if (a.head_count * a.head_dim > kAttnThreads) return kTensorKernel;
  }
  return KernelVariantOf(inst.op());
}
// Whether a program running in variant `v` runs `inst` as written: its opcode compiled there, and its form (above)
// too (the forms kTensorKernel compiles, every variant from it up does).
LOOM_HD bool VariantRuns(KernelVariant v, const Instruction& inst) {
  if (!VariantCompiles(v, inst.op())) return false;
  const KernelVariant needs = KernelVariantOf(inst);
  return needs == kDecodeKernel || needs == v || (needs == kTensorKernel && VariantCompiles(v, Opcode::GEMM));
}
// The decode variant's page size: its matvec compiles only that page's forms, so a program with other pages runs in
// the tensor variant.
inline constexpr uint32_t kDecodePageBytes = 16384;
LOOM_HD KernelVariant KernelVariantOfPages(uint32_t page_bytes) {
  return page_bytes == kDecodePageBytes ? kDecodeKernel : kTensorKernel;
}
// Opcodes that stream GEMM slabs (16 KB) through the page ring on the tensor cores: their pages must hold one.
LOOM_HD bool UsesTensorCores(Opcode op) {
  return op == Opcode::GEMM || op == Opcode::FLASH_ATTN || op == Opcode::CONV_GEMM;
}

}  // namespace loom::isa
