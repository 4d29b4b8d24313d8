#include "scheduler/data_waits.h"

#include <algorithm>
#include <type_traits>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "instructions/isa.h"

namespace loom::scheduler {
namespace {

using Inst = isa::Instruction;
using isa::Opcode;

// What one decode step does with each tensor (data_waits.h's rules).
struct TensorUse {
  struct Write {
    uint64_t begin, end;
    size_t inst;
    bool merge;  // ATTN_PARTIAL's merge: every split of the KV head may be the one that writes the range
  };
  std::vector<Write> writes;
  std::vector<size_t> input_readers, residual_readers;
  std::vector<size_t> reduce_readers;  // ATTN_REDUCE reading its heads of the partials
  std::vector<size_t> early_writers;   // ARGMAX_REDUCE storing the next step's EMBED row (tags as its writers do)
  bool other_use = false;              // named by anything else: never tagged
};

class StepUses {
 public:
  StepUses(const std::vector<const Inst*>& step, const std::vector<uint64_t>& elements)
      : elements_(elements), uses_(elements.size()) {
    for (size_t i = 0; i < step.size(); ++i) Add(*step[i], i);
  }

  const TensorUse& use(uint32_t t) const { return uses_[t]; }
  size_t size() const { return uses_.size(); }

  // Whether the writers store every element of t exactly once per step and every other use is a reading MATVEC or
  // ATTN_REDUCE.
  bool Taggable(uint32_t t) const {
    const TensorUse& u = uses_[t];
    if (u.other_use || u.writes.empty() || (u.input_readers.empty() && u.reduce_readers.empty())) return false;
    std::vector<TensorUse::Write> w = u.writes;
    std::sort(w.begin(), w.end(),
              [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    uint64_t covered = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      if (i > 0 && w[i].merge && w[i - 1].merge && w[i].begin == w[i - 1].begin && w[i].end == w[i - 1].end) continue;
      if (w[i].begin != covered || w[i].end <= w[i].begin) return false;
      covered = w[i].end;
    }
    return covered == elements_[t];
  }

 private:
  void Other(uint32_t t) {
    if (t < uses_.size()) uses_[t].other_use = true;
  }
  void Write(uint32_t t, uint64_t begin, uint64_t end, size_t inst, bool merge = false) {
    if (t < uses_.size()) uses_[t].writes.push_back({begin, end, inst, merge});
  }

  // A MATVEC's, MATVEC_FP8's or MATVEC_W4's uses: its input read whole (taggable), its epilogue's writes.
  template <typename Args>
  void AddMatvec(const Args& a, size_t i) {
    Other(a.weight);
    if (a.prologue == isa::kPrologueRmsNorm) Other(a.norm_weight);
    if (a.bias != isa::kNoTensor) Other(a.bias);
    if (a.input < uses_.size()) {
      if (a.k == elements_[a.input] && a.k % 4 == 0) uses_[a.input].input_readers.push_back(i);
      else Other(a.input);
    }
    switch (a.epilogue) {
      case isa::kEpilogueStore: Write(a.out, a.row_begin, uint64_t{a.row_begin} + a.rows, i); break;
      case isa::kEpilogueResidualAdd:
        Write(a.out, a.row_begin, uint64_t{a.row_begin} + a.rows, i);
        if (a.residual < uses_.size()) uses_[a.residual].residual_readers.push_back(i);
        break;
      case isa::kEpilogueSiluMul:
        if (a.row_begin % 2 == 0 && a.rows % 2 == 0) {
          Write(a.out, a.row_begin / 2, (uint64_t{a.row_begin} + a.rows) / 2, i);
        } else {
          Other(a.out);
        }
        break;
      case isa::kEpilogueRopeKvAppend:
        Other(a.out), Other(a.k_cache), Other(a.v_cache), Other(a.step_state), Other(a.rope_table);
        break;
      default:
        Other(a.out);
        if constexpr (std::is_same_v<Args, isa::MatvecArgs>) Other(a.partials);
        break;
    }
  }

  void Add(const Inst& inst, size_t i) {
    switch (inst.op()) {
      case Opcode::MATVEC: AddMatvec(inst.as<isa::MatvecArgs>(), i); break;
      case Opcode::MATVEC_FP8: {
        const isa::MatvecFp8Args& a = inst.as<isa::MatvecFp8Args>();
        Other(a.scales);
        AddMatvec(a, i);
        break;
      }
      case Opcode::MATVEC_W4: {
        const isa::MatvecW4Args& a = inst.as<isa::MatvecW4Args>();
        Other(a.meta);
        AddMatvec(a, i);
        break;
      }
      case Opcode::ATTN_PARTIAL: {
        const isa::AttnPartialArgs& a = inst.as<isa::AttnPartialArgs>();
        Other(a.q), Other(a.k_cache), Other(a.v_cache), Other(a.step_state);
        if (a.out == isa::kNoTensor && a.arrivals == isa::kNoTensor) {  // the split's heads of the partials
          const uint64_t group = a.num_heads / std::max(1u, a.num_kv_heads);
          const uint64_t first = uint64_t{a.split} * a.num_heads + a.kv_head * group;
          Write(a.partial_o, first * a.head_dim, (first + group) * a.head_dim, i);
          Write(a.partial_ml, first * 2, (first + group) * 2, i);
        } else {
          Other(a.partial_o), Other(a.partial_ml);
        }
        if (a.arrivals != isa::kNoTensor) Other(a.arrivals);
        if (a.out != isa::kNoTensor) {
          const uint64_t per_kv_head = uint64_t{a.num_heads} / std::max(1u, a.num_kv_heads) * a.head_dim;
          if (a.arrivals != isa::kNoTensor) {
            Write(a.out, a.kv_head * per_kv_head, (a.kv_head + 1) * per_kv_head, i, /*merge=*/true);
          } else {
            Other(a.out);
          }
        }
        break;
      }
      case Opcode::ATTN_REDUCE: {
        const isa::AttnReduceArgs& a = inst.as<isa::AttnReduceArgs>();
        for (uint32_t t : {a.partial_o, a.partial_ml}) {
          if (t < uses_.size()) uses_[t].reduce_readers.push_back(i);
        }
        Write(a.out, uint64_t{a.head_begin} * a.head_dim, (uint64_t{a.head_begin} + a.head_count) * a.head_dim, i);
        break;
      }
      case Opcode::EMBED: {
        const isa::EmbedArgs& a = inst.as<isa::EmbedArgs>();
        Other(a.table), Other(a.tokens), Other(a.step_state);
        Write(a.out, uint64_t{a.row_begin} * a.hidden, (uint64_t{a.row_begin} + a.rows) * a.hidden, i);
        break;
      }
      case Opcode::ARGMAX_REDUCE: {  // the next step's EMBED row: neither a write nor a read of this step's
        const isa::ArgmaxReduceArgs& a = inst.as<isa::ArgmaxReduceArgs>();
        Other(a.partials), Other(a.step_state), Other(a.tokens);
        if (a.embed_out != isa::kNoTensor) {
          Other(a.embed_table);
          if (a.embed_out < uses_.size()) uses_[a.embed_out].early_writers.push_back(i);
        }
        break;
      }
      default:  // any argument word may name a tensor: none of them is tagged
        for (int w = 0; w < isa::ArgCount(inst.op()); ++w) Other(inst.args[w]);
        break;
    }
  }

  const std::vector<uint64_t>& elements_;
  std::vector<TensorUse> uses_;
};

// The marks data_waits.h's rules give: flags and in_data waits, per instruction.
struct Marks {
  std::vector<uint8_t> flags;
  std::vector<uint32_t> in_data;  // bit w: wait w
  std::vector<uint32_t> observed; // tensors some wait observes
};

Marks Compute(const std::vector<const Inst*>& step, const StepUses& uses) {
  Marks m{std::vector<uint8_t>(step.size(), 0), std::vector<uint32_t>(step.size(), 0), {}};
  absl::flat_hash_map<uint32_t, std::vector<size_t>> signallers;
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i]->signal != isa::kNoBarrier) signallers[step[i]->signal].push_back(i);
  }
  for (uint32_t t = 0; t < uses.size(); ++t) {
    if (!uses.Taggable(t)) continue;
    const TensorUse& u = uses.use(t);
    std::vector<size_t> writers;
    for (const auto& w : u.writes) writers.push_back(w.inst);
    std::sort(writers.begin(), writers.end());
    writers.erase(std::unique(writers.begin(), writers.end()), writers.end());
    bool observed = false;
    for (const std::vector<size_t>* readers : {&u.input_readers, &u.reduce_readers}) {
      for (size_t r : *readers) {
        const Inst& inst = *step[r];
        for (int w = 0; w < inst.num_waits; ++w) {
          const isa::Wait& wait = inst.waits[w];
          if (wait.previous_step() || wait.count() != wait.stride()) continue;
          auto it = signallers.find(wait.barrier());
          if (it == signallers.end() || it->second != writers) continue;
          m.in_data[r] |= 1u << w;
          observed = true;
        }
      }
    }
    if (!observed) continue;
    m.observed.push_back(t);
    for (size_t w : writers) m.flags[w] |= isa::kFlagTagOut;
    for (size_t w : u.early_writers) m.flags[w] |= isa::kFlagTagOut;
    for (size_t r : u.input_readers) m.flags[r] |= isa::kFlagTaggedInput;
    for (size_t r : u.reduce_readers) m.flags[r] |= isa::kFlagTaggedInput;
    for (size_t r : u.residual_readers) m.flags[r] |= isa::kFlagTaggedResidual;
  }
  return m;
}

std::vector<const Inst*> Cleared(const std::vector<const Inst*>& step, std::vector<Inst>* copy) {
  copy->clear();
  for (const Inst* inst : step) {
    Inst c = *inst;
    c.flags = 0;
    for (int w = 0; w < c.num_waits; ++w) c.waits[w].barrier_and_flags &= ~isa::kWaitInData;
    copy->push_back(c);
  }
  std::vector<const Inst*> out;
  for (const Inst& c : *copy) out.push_back(&c);
  return out;
}

}  // namespace

int MarkDataWaits(const std::vector<isa::Instruction*>& step, const std::vector<uint64_t>& tensor_elements) {
  std::vector<isa::Instruction> copy;
  const std::vector<const isa::Instruction*> cleared = Cleared({step.begin(), step.end()}, &copy);
  const Marks m = Compute(cleared, StepUses(cleared, tensor_elements));
  int observed = 0;
  for (size_t i = 0; i < step.size(); ++i) {
    step[i]->flags = m.flags[i];
    for (int w = 0; w < step[i]->num_waits; ++w) {
      isa::Wait& wait = step[i]->waits[w];
      wait.barrier_and_flags &= ~isa::kWaitInData;
      if (m.in_data[i] & (1u << w)) wait.barrier_and_flags |= isa::kWaitInData, ++observed;
    }
  }
  return observed;
}

absl::Status CheckDataWaits(const std::vector<const isa::Instruction*>& step,
                            const std::vector<uint64_t>& tensor_elements, const std::vector<std::string>& where) {
  std::vector<isa::Instruction> copy;
  const std::vector<const isa::Instruction*> cleared = Cleared(step, &copy);
  const StepUses uses(cleared, tensor_elements);
  const Marks m = Compute(cleared, uses);
  for (size_t i = 0; i < step.size(); ++i) {
    const isa::Instruction& inst = *step[i];
    for (int w = 0; w < inst.num_waits; ++w) {
      if (inst.waits[w].in_data() && !(m.in_data[i] & (1u << w))) {
        return absl::InvalidArgumentError(absl::StrCat(
            where[i], ": ", isa::OpcodeName(inst.op()), " observes its wait on barrier ", inst.waits[w].barrier(),
            " in the data, but the barrier's signallers are not exactly the tagging writers of a tensor it reads "
            "whole as its input (scheduler/data_waits.h)"));
      }
    }
    if (inst.flags & ~m.flags[i]) {
      return absl::InvalidArgumentError(absl::StrCat(where[i], ": ", isa::OpcodeName(inst.op()), " has step-tag flags ",
                                                     int{inst.flags}, " where the rules allow ", int{m.flags[i]},
                                                     " (scheduler/data_waits.h)"));
    }
  }
  // A tensor used tagged in any way (a wait observed in its data, a writer tagging it, a reader checking it): all its
  // writers tag it and all its readers check the tags, or a reader would wait for a tag no writer stores.
  for (uint32_t t : m.observed) {
    const TensorUse& u = uses.use(t);
    std::vector<size_t> writers;
    for (const auto& w : u.writes) writers.push_back(w.inst);
    bool used = false;
    for (const std::vector<size_t>* readers : {&u.input_readers, &u.reduce_readers}) {
      for (size_t r : *readers) {
        used |= (step[r]->flags & isa::kFlagTaggedInput) != 0;
        for (int w = 0; w < step[r]->num_waits; ++w) used |= step[r]->waits[w].in_data() && (m.in_data[r] >> w & 1u);
      }
    }
    for (size_t r : u.residual_readers) used |= (step[r]->flags & isa::kFlagTaggedResidual) != 0;
    for (size_t w : writers) used |= (step[w]->flags & isa::kFlagTagOut) != 0;
    for (size_t w : u.early_writers) used |= (step[w]->flags & isa::kFlagTagOut) != 0;
    if (!used) continue;
    auto need = [&](const std::vector<size_t>& insts, uint8_t flag, const char* what) -> absl::Status {
      for (size_t i : insts) {
        if (!(step[i]->flags & flag)) {
          return absl::InvalidArgumentError(absl::StrCat(where[i], ": ", isa::OpcodeName(step[i]->op()), " ", what,
                                                         " tensor ", t, ", which the schedule uses step-tagged, "
                                                         "without its step-tag flag"));
        }
      }
      return absl::OkStatus();
    };
    if (absl::Status s = need(writers, isa::kFlagTagOut, "writes"); !s.ok()) return s;
    if (absl::Status s = need(u.early_writers, isa::kFlagTagOut, "stores the next step's row of"); !s.ok()) return s;
    if (absl::Status s = need(u.input_readers, isa::kFlagTaggedInput, "reads"); !s.ok()) return s;
    if (absl::Status s = need(u.reduce_readers, isa::kFlagTaggedInput, "reduces"); !s.ok()) return s;
    if (absl::Status s = need(u.residual_readers, isa::kFlagTaggedResidual, "adds"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom::scheduler
