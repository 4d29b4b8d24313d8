// ReferenceVm: runs a Schedule on the CPU exactly as the megakernel runs it on
// the GPU — one worker thread per SM walking its queue in order, global
// barrier counters with the same epoch-based targets, every opcode by its
// float32 reference, reading the same packed weight layout.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "instructions/instruction.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/schedule.pb.h"

namespace loom::runtime {

class ReferenceVm {
 public:
  // Verifies nothing: pass a schedule from Compile() or LoadSchedule().
  static absl::StatusOr<std::unique_ptr<ReferenceVm>> Create(const scheduler::Schedule& schedule,
                                                             const graph::WeightStore& weights);

  // Clears the arena (KV caches included), loads the prompt, position 0.
  absl::Status Reset(const std::vector<int32_t>& prompt);
  // Runs `steps` decode steps (all SM threads, barrier counters carry on).
  absl::Status Run(int steps);

  // Runs a prefill pass (scheduler::LowerPrefill of this schedule) once: its rows, at positions
  // [position, +rows), fill the KV cache, the token after them is written (when past the prompt) and the position
  // moves past them, as that many decode steps would. `rows` (0: the pass's): the prompt's rows of a bucket's pass
  // (scheduler::PrefillLastRowFor), the rest padding.
  absl::Status Prefill(const scheduler::Schedule& pass, uint32_t rows = 0);

  // A general graph's pass (Schedule.graph): writes arena bytes (its inputs), then runs its queues once (fresh
  // barrier targets each time, as a decode step's).
  void WriteArena(uint64_t offset, const void* data, uint64_t bytes) {
    std::memcpy(arena_bytes() + offset, data, bytes);
  }
  absl::Status RunGraph();

  // A copy of arena bytes (tests compare them with the GPU's).
  std::vector<uint8_t> ReadArena(uint64_t offset, uint64_t bytes) const {
    return std::vector<uint8_t>(arena_bytes() + offset, arena_bytes() + offset + bytes);
  }

  int32_t position() const;
  bool overflowed() const;
  // tokens[0, position] : the prompt followed by the generated tokens.
  std::vector<int32_t> tokens() const;
  // Logits of the last step.
  std::vector<float> logits() const;

 private:
  ReferenceVm() = default;
  template <typename T>
  T* Arena(uint32_t tensor) const {
    return reinterpret_cast<T*>(arena_bytes() + schedule_.tensors(tensor).offset());
  }
  uint8_t* arena_bytes() const { return reinterpret_cast<uint8_t*>(const_cast<uint64_t*>(arena_.data())); }

  // Runs the queues for steps [first, first + steps) on `counters` (one thread per SM).
  void RunQueues(const scheduler::DecodedSchedule& d, const std::vector<isa::TensorDesc>& table,
                 std::atomic<uint32_t>* counters, uint32_t first, int steps);

  scheduler::Schedule schedule_;
  scheduler::DecodedSchedule decoded_;
  std::vector<uint8_t> weights_;
  std::vector<uint64_t> arena_;  // uint64_t for alignment
  std::vector<isa::TensorDesc> table_;
  std::unique_ptr<std::atomic<uint32_t>[]> counters_;
  uint32_t next_step_ = 0;  // epoch of the next step to run
};

}  // namespace loom::runtime
