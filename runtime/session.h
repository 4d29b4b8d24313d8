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

// How Start consumes a prompt.
struct StartOptions {
  // One prefill pass when the schedule has its weights and the prompt has two tokens or more (else, or if the pass
  // cannot be lowered, one decode step per prompt token; prefill_note() says why).
  bool prefill = true;
  // Keep every step's logits from the prompt's first position on (kept_logits()): the pass computes the LM head for
  // every prompt row, token by token and later Steps run one step a launch. Off: the last step's only.
  bool keep_logits = false;
  // Verify the prefill pass's schedule before running it (scheduler::VerifySchedule; `loom run --check`).
  bool verify = false;
  // A decoder's prompt in its bucket's pass (scheduler::PrefillBucketRows): one lowering for every length ending in
  // the same bucket (16, 32, 64, 128, then every 128 rows). The padding rows cost kernel time (Llama-3.2-1B on an
  // H200: 100 rows 1.92 ms in the pass of 128, 1.86 in their own) and save a lowering (8-10 ms) for every new length.
  bool buckets = true;
  // A decoder's prompt of more rows than this (0: none) in passes of this many rows, one after another at successive
  // positions (each attends to the rows before it in the KV cache), the rest in a last pass: one lowering serves a
  // prompt of any length, and a pass's instructions and scratch stay those of chunk_rows rows (a 32K-row pass of
  // Llama-3.2-1B is 630,917 instructions). scheduler::kDefaultPrefillChunkRows has the measurement.
  uint32_t chunk_rows = 2048;
};

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
  absl::Status Start(const std::vector<int32_t>& prompt, const StartOptions& options);
  absl::Status Start(const std::vector<int32_t>& prompt, bool prefill = true) {
    StartOptions options;
    options.prefill = prefill;
    return Start(prompt, options);
  }
  // Lowers in the background every prefill pass a Start with `options` meets (each bucket up to its chunk_rows, or up
  // to scheduler::kDefaultPrefillChunkRows rows without chunks), smallest first, so that a prompt length's first Start
  // waits for no lowering (Llama-3.2-1B: 8-40 ms a pass against a 1.5-10 ms kernel). On the GPU it also decodes each
  // pass into its device program there, and first lowers the largest pass here to grow the device arena to its size
  // (growing it copies the arena, KV cache included: 3-4 ms of a first Start for the 1B at a cache of 8448).
  // A Start whose pass is not lowered yet lowers it itself (or waits for the one being lowered). Nothing to do without
  // prefill weights or buckets; Start with other options still lowers its own passes. The Session's destructor stops
  // the thread.
  absl::Status LowerAhead(const StartOptions& options);
  // Waits until LowerAhead's passes are all lowered; returns how many it lowered.
  int WaitLoweredAhead();

  // Generates `n` more tokens: n decode steps (one kernel launch on the GPU, or one a step when the last Start kept
  // logits). Refused before a Start.
  // Start and Step fail (DataLoss) when the last step's logits are not finite: greedy tokens from NaN logits are
  // meaningless (argmax picks token 0), so they are not handed out as if they were (CheckLogitsFinite). On the GPU
  // a Step checks the chosen token's logit (logits gone non-finite as a whole: a NaN weight, an overflow), not
  // every one of them: a streaming caller steps once a token.
  absl::Status Step(int n);
  // Like Step, recording every instruction's timing: writes a Chrome trace JSON to `json_path` and returns the
  // summary (time per opcode, idle gaps, bandwidth). GPU only.
  // `steps_per_launch` > 0 splits the n steps into launches of that many (the trace holds them all).
  absl::StatusOr<std::string> TraceSteps(int n, const std::string& json_path, int steps_per_launch = 0);

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
  // The last Start's pass: its instructions and the time to lower it, in ms (0 when it was lowered before).
  int pass_instructions() const { return pass_instructions_; }
  double pass_lower_ms() const { return pass_lower_ms_; }
  // GPU: the time the last Start spent decoding and uploading passes that had not run before, in ms.
  double pass_upload_ms() const { return pass_upload_ms_; }
  // Every step's logits since the last Start with keep_logits, one vocab_size() row per step: the prompt's positions,
  // then each Step's (empty when the Start did not keep them).
  const std::vector<float>& kept_logits() const { return kept_logits_; }
  // Time of the last Start's prompt and of the last Step / TraceSteps, in ms (kernel time on the GPU, wall clock
  // on the CPU).
  double prompt_ms() const { return prompt_ms_; }
  double step_ms() const { return step_ms_; }
  // Time to first token as a caller feels it: wall clock of the last Start, from the prompt's ids to the first new
  // token on the host, everything counted (lowering the pass for a prompt length not seen before, its upload and
  // launch, the kernel, reading the token back; token by token, every step).
  double ttft_ms() const { return ttft_ms_; }

 // A lowered prefill pass, and on the GPU its program when lowered ahead (session.cc).
  struct LoweredPass;

 private:
  Session() = default;
  absl::StatusOr<std::shared_ptr<const LoweredPass>> PassFor(uint32_t rows, bool all_logits, bool verify);
  // Start without its timing.
  absl::Status StartPrompt(const std::vector<int32_t>& prompt, const StartOptions& options);
  // Runs n decode steps, one launch (or one a step when keeping logits); adds their kernel (GPU) or wall (CPU) ms.
  absl::Status RunSteps(int n, double* ms);
  // Appends the last step's logits to kept_logits_.
  absl::Status KeepLastLogits();
  // Appends the pass's logits of every prompt row (its prefill.logits tensor) to kept_logits_.
  absl::Status KeepPassLogits(const scheduler::Schedule& pass);
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
  // Prefill passes lowered so far (by prompt rows and whether every row's logits are computed: a pass depends on
  // these only), and LowerAhead's thread: session.cc.
  struct Passes;
  std::unique_ptr<Passes> passes_;
  bool keep_logits_ = false;
  std::vector<float> kept_logits_;
  int pass_instructions_ = 0;
  double pass_lower_ms_ = 0, pass_upload_ms_ = 0;
  bool started_ = false;  // a Start succeeded: the state holds a prompt and logits
  bool used_prefill_ = false;
  std::string prefill_note_;
  double prompt_ms_ = 0, step_ms_ = 0, ttft_ms_ = 0;
};

// OK when every logit is finite; else DataLoss naming the position of the token they chose (argmax) and how many
// are NaN or infinite (the model
// overflowed, or its weights are broken): what `loom run` and Session say instead of printing argmax-of-NaN tokens.
absl::Status CheckLogitsFinite(const std::vector<float>& logits, int64_t position);

}  // namespace loom::runtime
