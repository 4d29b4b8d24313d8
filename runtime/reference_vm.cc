#include "runtime/reference_vm.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "instructions/isa.h"
#include "scheduler/packing.h"
#include "scheduler/prefill.h"

namespace loom::runtime {

absl::StatusOr<std::unique_ptr<ReferenceVm>> ReferenceVm::Create(const scheduler::Schedule& schedule,
                                                                 const graph::WeightStore& weights) {
  std::unique_ptr<ReferenceVm> vm(new ReferenceVm);
  vm->schedule_ = schedule;
  absl::StatusOr<scheduler::DecodedSchedule> decoded = scheduler::DecodeSchedule(schedule);
  if (!decoded.ok()) return decoded.status();
  vm->decoded_ = *std::move(decoded);
  absl::StatusOr<std::vector<uint8_t>> packed = scheduler::PackWeights(schedule, weights);
  if (!packed.ok()) return packed.status();
  vm->weights_ = *std::move(packed);
  vm->arena_.assign((schedule.arena_bytes() + 7) / 8, 0);
  for (const scheduler::Tensor& t : schedule.tensors()) {
    vm->table_.push_back({t.offset(), t.bytes(),
                          t.region() == scheduler::WEIGHTS ? uint32_t{isa::kWeightRegion} : uint32_t{isa::kArenaRegion},
                          static_cast<uint32_t>(t.dtype())});
  }
  vm->counters_ = std::make_unique<std::atomic<uint32_t>[]>(schedule.barriers_size());
  for (int b = 0; b < schedule.barriers_size(); ++b) vm->counters_[b].store(0);
  return vm;
}

absl::Status ReferenceVm::Reset(const std::vector<int32_t>& prompt) {
  if (schedule_.has_graph()) return absl::FailedPreconditionError("a general graph's pass has no prompt (RunGraph)");
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt needs at least one token");
  if (prompt.size() > schedule_.max_seq()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt of ", prompt.size(), " tokens exceeds the KV cache of ", schedule_.max_seq()));
  }
  for (int32_t t : prompt) {
    if (t < 0 || static_cast<uint32_t>(t) >= schedule_.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", t, " outside the vocabulary of ",
                                                     schedule_.vocab_size()));
    }
  }
  std::fill(arena_.begin(), arena_.end(), 0);
  int32_t* tokens = Arena<int32_t>(schedule_.io().tokens());
  std::copy(prompt.begin(), prompt.end(), tokens);
  int32_t* state = Arena<int32_t>(schedule_.io().step_state());
  state[isa::kStatePosition] = 0;
  state[isa::kStatePromptLength] = static_cast<int32_t>(prompt.size());
  return absl::OkStatus();
}

absl::Status ReferenceVm::Run(int steps) {
  if (schedule_.has_graph()) return absl::FailedPreconditionError("a general graph's pass has no steps (RunGraph)");
  if (steps < 0) return absl::InvalidArgumentError("steps must be >= 0");
  if (position() + steps >= static_cast<int32_t>(schedule_.max_seq())) {
    return absl::OutOfRangeError(absl::StrCat("position ", position(), " + ", steps, " steps exceeds the KV cache of ",
                                              schedule_.max_seq()));
  }
  RunQueues(decoded_, table_, counters_.get(), next_step_, steps);
  next_step_ += static_cast<uint32_t>(steps);
  return absl::OkStatus();
}

absl::Status ReferenceVm::RunGraph() {
  if (!schedule_.has_graph()) return absl::FailedPreconditionError("not a general graph's pass");
  RunQueues(decoded_, table_, counters_.get(), next_step_, 1);
  ++next_step_;
  return absl::OkStatus();
}

void ReferenceVm::RunQueues(const scheduler::DecodedSchedule& d, const std::vector<isa::TensorDesc>& table,
                            std::atomic<uint32_t>* counters, uint32_t first, int steps) {
  const isa::MachineView machine{{weights_.data(), arena_bytes()}, table.data(), static_cast<uint32_t>(table.size())};
  std::vector<std::thread> sms;
  for (size_t sm = 0; sm < d.queues.size(); ++sm) {
    sms.emplace_back([sm, first, steps, &machine, &d, counters] {
      const std::vector<isa::Instruction>& queue = d.queues[sm];
      for (uint32_t step = first; step < first + static_cast<uint32_t>(steps); ++step) {
        for (const isa::Instruction& inst : queue) {
          for (int w = 0; w < inst.num_waits; ++w) {
            std::atomic<uint32_t>& counter = counters[inst.waits[w].barrier()];
            const uint32_t target = inst.waits[w].target(step);
            for (uint32_t v = counter.load(std::memory_order_acquire); !isa::Reached(v, target);
                 v = counter.load(std::memory_order_acquire)) {
              counter.wait(v, std::memory_order_acquire);
            }
          }
          isa::ExecuteReference(inst, machine);
          if (inst.signal != isa::kNoBarrier) {
            counters[inst.signal].fetch_add(1, std::memory_order_release);
            counters[inst.signal].notify_all();
          }
        }
      }
    });
  }
  for (std::thread& t : sms) t.join();
}

absl::Status ReferenceVm::Prefill(const scheduler::Schedule& pass, uint32_t prompt_rows) {
  if (!pass.has_prefill() || pass.tensors_size() < schedule_.tensors_size() ||
      pass.weight_bytes() != schedule_.weight_bytes()) {
    return absl::InvalidArgumentError("not a prefill pass of this schedule");
  }
  const int32_t start = position();
  const uint32_t rows = pass.prefill().rows();  // its K / V rows reach this far, padding included
  if (start + static_cast<int64_t>(rows) >= schedule_.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat("position ", start, " + ", rows, " prompt rows exceeds the KV cache of ",
                                              schedule_.max_seq()));
  }
  absl::StatusOr<scheduler::DecodedSchedule> decoded = scheduler::DecodeSchedule(pass);
  if (!decoded.ok()) return decoded.status();
  if (pass.arena_bytes() > arena_.size() * 8) arena_.resize((pass.arena_bytes() + 7) / 8, 0);
  std::vector<isa::TensorDesc> table;
  for (const scheduler::Tensor& t : pass.tensors()) {
    table.push_back({t.offset(), t.bytes(),
                     t.region() == scheduler::WEIGHTS ? uint32_t{isa::kWeightRegion} : uint32_t{isa::kArenaRegion},
                     static_cast<uint32_t>(t.dtype())});
  }
  uint32_t used = rows;
  if (prompt_rows != 0 && prompt_rows != rows) {
    absl::StatusOr<scheduler::PrefillLastRow> last = scheduler::PrefillLastRowFor(pass, prompt_rows);
    if (!last.ok()) return last.status();
    table[last->tensor].offset = last->offset;
    used = prompt_rows;
  }
  int32_t* state = Arena<int32_t>(schedule_.io().step_state());
  int32_t* pass_state = reinterpret_cast<int32_t*>(arena_bytes() + pass.tensors(pass.prefill().state()).offset());
  pass_state[isa::kStatePosition] = start + static_cast<int32_t>(used) - 1;
  pass_state[isa::kStatePromptLength] = state[isa::kStatePromptLength];
  pass_state[isa::kStateOverflow] = 0;
  std::unique_ptr<std::atomic<uint32_t>[]> counters(new std::atomic<uint32_t>[pass.barriers_size()]);
  for (int b = 0; b < pass.barriers_size(); ++b) counters[b].store(0);
  RunQueues(*decoded, table, counters.get(), 0, 1);
  state[isa::kStatePosition] = pass_state[isa::kStatePosition];
  state[isa::kStateOverflow] = pass_state[isa::kStateOverflow];
  return absl::OkStatus();
}

int32_t ReferenceVm::position() const { return Arena<int32_t>(schedule_.io().step_state())[isa::kStatePosition]; }

bool ReferenceVm::overflowed() const {
  return Arena<int32_t>(schedule_.io().step_state())[isa::kStateOverflow] != 0;
}

std::vector<int32_t> ReferenceVm::tokens() const {
  const int32_t* t = Arena<int32_t>(schedule_.io().tokens());
  return std::vector<int32_t>(t, t + position() + 1);
}

std::vector<float> ReferenceVm::logits() const {
  const float* l = Arena<float>(schedule_.io().logits());
  return std::vector<float>(l, l + schedule_.vocab_size());
}

}  // namespace loom::runtime
