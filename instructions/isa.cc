// The opcode table's dispatch: names, argument names, and validation,
// footprints and references routed to each opcode's host side (ops_*.cc).
#include "instructions/isa.h"

#include "absl/strings/str_cat.h"
#include "instructions/opcode_host.h"

namespace loom::isa {

static_assert(kDTypeBf16 == graph::BF16, "device code reads a KV cache's dtype from the tensor table");

const char* OpcodeName(Opcode op) {
  switch (op) {
#define LOOM_NAME(name, args) \
  case Opcode::name:          \
    return #name;
    LOOM_OPCODE_LIST(LOOM_NAME)
#undef LOOM_NAME
    default:
      return "UNKNOWN";
  }
}

absl::StatusOr<Opcode> OpcodeFromName(const std::string& name) {
#define LOOM_FROM_NAME(op, args) \
  if (name == #op) return Opcode::op;
  LOOM_OPCODE_LIST(LOOM_FROM_NAME)
#undef LOOM_FROM_NAME
  return absl::InvalidArgumentError(absl::StrCat("unknown opcode '", name, "'"));
}

int ArgCount(Opcode op) {
  switch (op) {
#define LOOM_COUNT(name, args) \
  case Opcode::name:           \
    return static_cast<int>(sizeof(args) / 4);
    LOOM_OPCODE_LIST(LOOM_COUNT)
#undef LOOM_COUNT
    default:
      return 0;
  }
}

uint32_t FloatWords(Opcode op) {
  switch (op) {
#define LOOM_FLOAT_WORDS(name, args) \
  case Opcode::name:                 \
    return kFloatWords<args>;
    LOOM_OPCODE_LIST(LOOM_FLOAT_WORDS)
#undef LOOM_FLOAT_WORDS
    default:
      return 0;
  }
}

const char* const* ArgNames(Opcode op) {
  switch (op) {
#define LOOM_ARG_NAMES(name, args) \
  case Opcode::name:               \
    return args::kFields;
    LOOM_OPCODE_LIST(LOOM_ARG_NAMES)
#undef LOOM_ARG_NAMES
    default:
      return nullptr;
  }
}

absl::Status ValidateInstruction(const Instruction& inst, const std::vector<TensorInfo>& tensors) {
  ref::Checker checker(inst, tensors);
  switch (inst.op()) {
#define LOOM_VALIDATE(name, args)          \
  case Opcode::name:                       \
    ref::Validate(inst.as<args>(), checker);    \
    break;
    LOOM_OPCODE_LIST(LOOM_VALIDATE)
#undef LOOM_VALIDATE
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown opcode ", static_cast<int>(inst.opcode)));
  }
  return checker.status();
}

absl::Status CheckPageBytes(const Instruction& inst, uint32_t page_bytes) {
  if ((inst.op() == Opcode::MATVEC_FP8 || inst.op() == Opcode::MATVEC_W4) && page_bytes != kDecodePageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an ", inst.op() == Opcode::MATVEC_W4 ? "int4" : "FP8",
                                                   " matvec streams ", kDecodePageBytes,
                                                   "-byte pages only (its kernel variant's); smem.page_bytes is ",
                                                   page_bytes));
  }
  if (inst.op() != Opcode::MATVEC) return absl::OkStatus();
  const uint32_t k = inst.as<MatvecArgs>().k;
  if (MatvecSlotsFitPages(k, page_bytes)) return absl::OkStatus();
  const uint32_t slot = MatvecSlotElems(MatvecRowStride(k));
  return absl::InvalidArgumentError(absl::StrCat(
      "a row of ", k, " columns sums ", slot, "-column slots, each in one consumer warp, and a warp's share of a ",
      page_bytes, "-byte page is ", page_bytes / kMatvecPageSegmentBytes * kMatvecRowAlign,
      " columns: smem.page_bytes must be a multiple of ", kMatvecPageSegmentBytes * (slot / kMatvecRowAlign)));
}

Footprint InstructionFootprint(const Instruction& inst, uint32_t context) {
  switch (inst.op()) {
#define LOOM_FOOTPRINT(name, args) \
  case Opcode::name:               \
    return ref::Cost(inst.as<args>(), context);
    LOOM_OPCODE_LIST(LOOM_FOOTPRINT)
#undef LOOM_FOOTPRINT
    default:
      return {};
  }
}

void ExecuteReference(const Instruction& inst, const MachineView& machine) {
  switch (inst.op()) {
#define LOOM_REFERENCE(name, args)          \
  case Opcode::name:                        \
    ref::Reference(inst.as<args>(), machine);    \
    break;
    LOOM_OPCODE_LIST(LOOM_REFERENCE)
#undef LOOM_REFERENCE
    default:
      break;
  }
}

}  // namespace loom::isa
