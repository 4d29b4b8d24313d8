// GpuProgram on the host: checked against what the megakernel as built runs, its step-tagged ranges, its queues
// laid out for a launch, its kernel variant. No CUDA call (GpuMachine::Prepare runs these on any thread).
#include "runtime/gpu_program.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "instructions/isa.h"
#include "megakernel/megakernel_launch.h"

namespace loom::runtime {

using namespace megakernel;  // the kernel's constants (megakernel/)

absl::Status CheckProgramForDevice(const GpuProgram& p) {
  if (p.page_bytes % 4096 != 0 || p.page_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("page size ", p.page_bytes, " must be a multiple of 4096 bytes"));
  }
  if (p.num_pages < 2 || p.num_pages > kMaxPages) {
    return absl::InvalidArgumentError(absl::StrCat("pages per SM must be 2..", kMaxPages, ", not ", p.num_pages));
  }
  if (p.activation_slots < 1 || p.activation_slots > kMaxActivationSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation slots per SM must be 1..", kMaxActivationSlots, ", not ", p.activation_slots));
  }
  if (p.activation_bytes % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation ring size ", p.activation_bytes, " must be a multiple of 16 bytes"));
  }
  bool graph_ops = false;
  for (const auto& q : p.queues) {
    for (const isa::Instruction& inst : q) graph_ops |= isa::KernelVariantOf(inst.op()) == isa::kGraphKernel;
  }
  for (size_t sm = 0; sm < p.queues.size(); ++sm) {
    for (size_t i = 0; i < p.queues[sm].size(); ++i) {
      const isa::Instruction& inst = p.queues[sm][i];
      const std::string where = absl::StrCat("SM ", sm, " instruction ", i, " (", isa::OpcodeName(inst.op()), ")");
      // Wide tiles run in a kernel variant of their own, without the general-graph opcodes (isa::kWideKernel).
      if (isa::KernelVariantOf(inst) == isa::kWideKernel && graph_ops) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a wide GEMM tile in a program with general-graph "
                                                       "opcodes (their kernel has 128-column tiles only)"));
      }
      // What the kernel implements per instruction (matvec widths, attention head shapes) is part of
      // isa::ValidateInstruction, which the compiler and every schedule load run.
      if (absl::Status s = isa::CheckPageBytes(inst, p.page_bytes); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
      }
      if (isa::UsesTensorCores(inst.op()) && p.page_bytes < isa::kGemmSlabBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": its pages hold ", isa::kGemmSlabBytes, " bytes, a page ", p.page_bytes));
      }
      if (inst.op() == isa::Opcode::GEMM && inst.as<isa::GemmArgs>().wide && p.page_bytes < isa::kGemmWideStepBytes) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a wide tile's K step takes a page of ",
                                                       isa::kGemmWideStepBytes, " bytes, a page is ", p.page_bytes));
      }
      if (inst.op() == isa::Opcode::CONV_GEMM &&
          isa::ConvGemmRingPages(inst.as<isa::ConvGemmArgs>(), p.page_bytes) > p.num_pages) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": a bf16 input's tile holds ", isa::ConvGemmRingPages(inst.as<isa::ConvGemmArgs>(), p.page_bytes),
            " pages of the ring at once; it has ", p.num_pages));
      }
      if (isa::ActivationBytes(inst) > p.activation_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(where, " needs ", isa::ActivationBytes(inst),
                                                       " bytes of activation ring, the SM has ", p.activation_bytes));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The tensors an instruction with kFlagTagOut stores tagged (kNoTensor: none).
std::array<uint32_t, 2> TaggedOutputs(const isa::Instruction& inst) {
  constexpr uint32_t kNone = isa::kNoTensor;
  if ((inst.flags & isa::kFlagTagOut) == 0) return {kNone, kNone};
  switch (inst.op()) {
    case isa::Opcode::MATVEC: return {inst.as<isa::MatvecArgs>().out, kNone};
    case isa::Opcode::MATVEC_FP8: return {inst.as<isa::MatvecFp8Args>().out, kNone};
    case isa::Opcode::MATVEC_W4: return {inst.as<isa::MatvecW4Args>().out, kNone};
    case isa::Opcode::ATTN_PARTIAL: {  // the fused merge's output, else the partials (ATTN_REDUCE reads them)
      const isa::AttnPartialArgs& a = inst.as<isa::AttnPartialArgs>();
      return a.out != kNone ? std::array<uint32_t, 2>{a.out, kNone} : std::array<uint32_t, 2>{a.partial_o, a.partial_ml};
    }
    case isa::Opcode::ATTN_REDUCE: return {inst.as<isa::AttnReduceArgs>().out, kNone};
    case isa::Opcode::EMBED: return {inst.as<isa::EmbedArgs>().out, kNone};
    case isa::Opcode::ARGMAX_REDUCE: return {inst.as<isa::ArgmaxReduceArgs>().embed_out, kNone};  // the next row
    default: return {kNone, kNone};
  }
}

}  // namespace

std::vector<std::pair<uint64_t, uint64_t>> TaggedRanges(const GpuProgram& p) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& q : p.queues) {
    for (const isa::Instruction& inst : q) {
      for (const uint32_t t : TaggedOutputs(inst)) {
        if (t < p.tensors.size()) ranges.push_back({p.tensors[t].offset, p.tensors[t].offset + p.tensors[t].bytes});
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  for (auto& r : merged) r.second -= r.first;  // (offset, bytes)
  return merged;
}

const char* VariantName(isa::KernelVariant v) {
  constexpr const char* kNames[] = {"decode", "tensor-core", "general-graph", "wide-tile", "FP8 decode", "int4 decode"};
  return v < std::size(kNames) ? kNames[v] : "unknown";
}

std::vector<isa::Instruction> Flatten(const GpuProgram& p, std::vector<uint32_t>* begin) {
  std::vector<isa::Instruction> all;
  for (const auto& q : p.queues) {
    begin->push_back(static_cast<uint32_t>(all.size()));
    all.insert(all.end(), q.begin(), q.end());
  }
  begin->push_back(static_cast<uint32_t>(all.size()));
  return all;
}

absl::StatusOr<isa::KernelVariant> ProgramVariant(const GpuProgram& p) {
  isa::KernelVariant v = isa::KernelVariantOfPages(p.page_bytes);
  for (const auto& q : p.queues) {
    for (const isa::Instruction& inst : q) v = std::max(v, isa::KernelVariantOf(inst));
  }
  if (p.kernel_variant) v = *p.kernel_variant;
  if (!megakernel::MegakernelHasVariant(v)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the program runs in the ", VariantName(v), " kernel variant, which this build of the megakernel lacks (the "
        "debug library has the decode variant only: configure with -DLOOM_DEVICE_DEBUG=ON for every variant)"));
  }
  if (p.kernel_variant) return v;  // (a test's: not checked against it)
  for (size_t sm = 0; sm < p.queues.size(); ++sm) {
    for (size_t i = 0; i < p.queues[sm].size(); ++i) {
      const isa::Instruction& inst = p.queues[sm][i];
      if (!isa::VariantRuns(v, inst)) {
        return absl::InvalidArgumentError(absl::StrCat("SM ", sm, " instruction ", i, " (", isa::OpcodeName(inst.op()),
                                                       "): not compiled into the ", VariantName(v),
                                                       " kernel variant the program runs in"));
      }
    }
  }
  return v;
}

}  // namespace loom::runtime
