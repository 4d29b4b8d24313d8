#include "scheduler/decoded_schedule.h"

#include "absl/strings/str_cat.h"
#include "instructions/isa.h"

namespace loom::scheduler {

void EncodeInstructionInto(const isa::Instruction& inst, Instruction* proto) {
  proto->set_opcode(isa::OpcodeName(inst.op()));
  for (int i = 0; i < inst.num_waits; ++i) {
    Wait* w = proto->add_waits();
    w->set_barrier(inst.waits[i].barrier());
    w->set_count(inst.waits[i].count());
    w->set_previous_step(inst.waits[i].previous_step());
    w->set_in_data(inst.waits[i].in_data());
  }
  proto->set_tag_out((inst.flags & isa::kFlagTagOut) != 0);
  proto->set_tagged_input((inst.flags & isa::kFlagTaggedInput) != 0);
  proto->set_tagged_residual((inst.flags & isa::kFlagTaggedResidual) != 0);
  if (inst.signal != isa::kNoBarrier) proto->set_signal(inst.signal);
  const int n = isa::ArgCount(inst.op());
  proto->mutable_args()->Add(inst.args, inst.args + n);
}

Instruction EncodeInstruction(const isa::Instruction& inst) {
  Instruction proto;
  EncodeInstructionInto(inst, &proto);
  return proto;
}

absl::StatusOr<isa::Instruction> DecodeInstruction(const Instruction& proto, const Schedule& schedule) {
  absl::StatusOr<isa::Opcode> op = isa::OpcodeFromName(proto.opcode());
  if (!op.ok()) return op.status();
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(*op);
  if (proto.args_size() != isa::ArgCount(*op)) {
    return absl::InvalidArgumentError(absl::StrCat(proto.opcode(), " takes ", isa::ArgCount(*op),
                                                   " argument words, has ", proto.args_size()));
  }
  for (int i = 0; i < proto.args_size(); ++i) inst.args[i] = proto.args(i);
  inst.flags = static_cast<uint8_t>((proto.tag_out() ? isa::kFlagTagOut : 0) |
                                    (proto.tagged_input() ? isa::kFlagTaggedInput : 0) |
                                    (proto.tagged_residual() ? isa::kFlagTaggedResidual : 0));
  if (proto.waits_size() > isa::kMaxWaits) {
    return absl::InvalidArgumentError(
        absl::StrCat(proto.opcode(), " has ", proto.waits_size(), " waits; at most ", isa::kMaxWaits));
  }
  inst.num_waits = static_cast<uint8_t>(proto.waits_size());
  for (int i = 0; i < proto.waits_size(); ++i) {
    const Wait& w = proto.waits(i);
    if (w.barrier() >= static_cast<uint32_t>(schedule.barriers_size())) {
      return absl::InvalidArgumentError(absl::StrCat(proto.opcode(), " waits on barrier ", w.barrier(),
                                                     ", the table has ", schedule.barriers_size()));
    }
    const uint32_t stride = schedule.barriers(w.barrier()).signals_per_step();
    if (stride > isa::kMaxSignalsPerStep) {
      return absl::InvalidArgumentError(absl::StrCat("barrier '", schedule.barriers(w.barrier()).name(), "' has ",
                                                     stride, " signals per step; at most ", isa::kMaxSignalsPerStep));
    }
    if (w.count() == 0 || w.count() > stride) {
      return absl::InvalidArgumentError(absl::StrCat(proto.opcode(), " waits for ", w.count(), " signals of barrier '",
                                                     schedule.barriers(w.barrier()).name(),
                                                     "', which gets ", stride, " per step: the wait can never be met"));
    }
    inst.waits[i].barrier_and_flags =
        w.barrier() | (w.previous_step() ? isa::kWaitPreviousStep : 0u) | (w.in_data() ? isa::kWaitInData : 0u);
    inst.waits[i].count_and_stride = w.count() | (stride << 16);
  }
  if (proto.has_signal()) {
    if (proto.signal() >= static_cast<uint32_t>(schedule.barriers_size())) {
      return absl::InvalidArgumentError(absl::StrCat(proto.opcode(), " signals barrier ", proto.signal(),
                                                     ", the table has ", schedule.barriers_size()));
    }
    inst.signal = proto.signal();
  } else {
    inst.signal = isa::kNoBarrier;
  }
  return inst;
}

absl::StatusOr<DecodedSchedule> DecodeSchedule(const Schedule& schedule) {
  if (schedule.num_sms() == 0) return absl::InvalidArgumentError("schedule has num_sms 0");
  if (schedule.queues_size() != static_cast<int>(schedule.num_sms())) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule has ", schedule.queues_size(), " queues for ", schedule.num_sms(), " SMs"));
  }
  DecodedSchedule d;
  for (const Barrier& b : schedule.barriers()) d.signals_per_step.push_back(b.signals_per_step());
  d.queues.resize(schedule.num_sms());
  d.cost_ns.resize(schedule.num_sms());
  for (uint32_t sm = 0; sm < schedule.num_sms(); ++sm) {
    const SmQueue& q = schedule.queues(sm);
    for (int i = 0; i < q.instructions_size(); ++i) {
      absl::StatusOr<isa::Instruction> inst = DecodeInstruction(q.instructions(i), schedule);
      if (!inst.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("SM ", sm, " instruction ", i, ": ", inst.status().message()));
      }
      d.queues[sm].push_back(*inst);
      d.cost_ns[sm].push_back(q.instructions(i).cost_ns());
    }
  }
  return d;
}

}  // namespace loom::scheduler
