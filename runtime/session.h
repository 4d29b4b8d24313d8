// Session: a compiled decode schedule resident on a backend (the CPU reference
// VM or the GPU megakernel), generating tokens. A prompt goes in by the
// one-pass prefill when the schedule carries its weights (token by token
// otherwise), which yields the first new token; each decode step then yields
// one more. The Python package's Session is this class.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "scheduler/schedule.pb.h"

namespace loom::runtime {

class GpuDecoder;
class ReferenceVm;

enum class Backend { kCpu, kGpu };

class Session {
 public:
  // `graph` is the decode graph `schedule` was compiled from (prefill passes are lowered from it), `weights` its
  // weights. The GPU backend uploads them once here.
  static absl::StatusOr<std::unique_ptr<Session>> Create(const graph::Graph& graph, const scheduler::Schedule& schedule,
                                                         const graph::WeightStore& weights, Backend backend);
  ~Session();

  // Loads `prompt` at position 0 and consumes it: one prefill pass when `prefill` and the schedule has its
  // weights (else, or if the pass cannot be lowered, one decode step per prompt token; prefill_note() says why).
  // Afterwards tokens() ends with the first new token.
  absl::Status Start(const std::vector<int32_t>& prompt, bool prefill = true);
  // Generates `n` more tokens: n decode steps (one kernel launch on the GPU). Refused before a Start.
  // Start and Step fail (DataLoss) when the last step's logits are not finite: greedy tokens from NaN logits are
  // meaningless (argmax picks token 0), so they are not handed out as if they were (CheckLogitsFinite). On the GPU
  // a Step checks the chosen token's logit (logits gone non-finite as a whole: a NaN weight, an overflow), not
  // every one of them: a streaming caller steps once a token.
  absl::Status Step(int n);
  // Like Step, recording every instruction's timing: writes a Chrome trace JSON to `json_path` and returns the
  // summary (time per opcode, idle gaps, bandwidth). GPU only.
  absl::StatusOr<std::string> TraceSteps(int n, const std::string& json_path);

  Backend backend() const { return backend_; }
  // Position of the last token: tokens() has position() + 1 entries.
  absl::StatusOr<int32_t> position() const;
  // The prompt followed by every token generated since Start.
  absl::StatusOr<std::vector<int32_t>> tokens() const;
  // Logits of the last step (the prefill pass's last row after Start with a pass), copied to the host. Refused
  // before a Start (nothing has run: there are none).
  absl::StatusOr<std::vector<float>> logits() const;
  // The same logits in device memory (GPU only): valid until the next Start, Step or TraceSteps.
  absl::StatusOr<const float*> device_logits() const;
  uint32_t vocab_size() const;
  uint32_t max_seq() const;
  // The last Start: whether a prefill pass consumed the prompt, and if not why (empty when it did).
  bool used_prefill() const { return used_prefill_; }
  const std::string& prefill_note() const { return prefill_note_; }
  // Time of the last Start's prompt and of the last Step / TraceSteps, in ms (kernel time on the GPU, wall clock
  // on the CPU).
  double prompt_ms() const { return prompt_ms_; }
  double step_ms() const { return step_ms_; }

 private:
  Session() = default;
  absl::StatusOr<const scheduler::Schedule*> PassFor(uint32_t rows);
  // OK when `n` more steps fit the KV cache.
  absl::Status CheckRoom(int n) const;
  absl::Status CheckStarted(const char* call) const;
  // CheckLogitsFinite on the last step's logits.
  absl::Status CheckLastLogits() const;

  Backend backend_ = Backend::kCpu;
  graph::Graph graph_;
  scheduler::Schedule schedule_;
  std::unique_ptr<ReferenceVm> vm_;
  std::unique_ptr<GpuDecoder> gpu_;
  // Prefill passes lowered so far, by prompt length (a pass depends on the length only).
  std::vector<std::pair<uint32_t, scheduler::Schedule>> passes_;
  bool started_ = false;  // a Start succeeded: the state holds a prompt and logits
  bool used_prefill_ = false;
  std::string prefill_note_;
  double prompt_ms_ = 0, step_ms_ = 0;
};

// OK when every logit is finite; else DataLoss naming the position of the token they chose (argmax) and how many
// are NaN or infinite (the model
// overflowed, or its weights are broken): what `loom run` and Session say instead of printing argmax-of-NaN tokens.
absl::Status CheckLogitsFinite(const std::vector<float>& logits, int64_t position);

}  // namespace loom::runtime
