#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "google/protobuf/arena.h"

#include "absl/strings/str_cat.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/reference_vm.h"
#include "runtime/trace.h"
#include "scheduler/prefill.h"

namespace loom::runtime {
namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::Status CheckLogitsFinite(const std::vector<float>& logits, int64_t position) {
  int64_t nan = 0, inf = 0;
  for (float v : logits) nan += std::isnan(v), inf += std::isinf(v);
  if (nan + inf == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "the logits that chose the token at position ", position, " are not finite (", nan, " NaN, ", inf,
      " infinite of ", logits.size(),
      "): the model overflowed or its weights are broken; the generated tokens are meaningless"));
}

// A prefill pass lowered for `rows` rows (and every row's logits or the last's).
struct Session::LoweredPass {
  uint32_t rows;
  bool all_logits;
  std::shared_ptr<const scheduler::Schedule> pass;
  // GPU, lowered ahead: its program decoded and prepared there (else GpuDecoder does both at its first run).
  std::shared_ptr<const PreparedProgram> prepared;
};

// The passes a Session has lowered, shared with LowerAhead's thread (under `mu`). A pass is handed out as a
// shared_ptr: evicting it from the list leaves a Start that runs it its copy.
struct Session::Passes {
  // The most passes kept: LowerAhead's (19 for chunks of 2048 rows: 16, 32, 64, then every 128) and a few more.
  static constexpr size_t kKept = 32;

  std::mutex mu;
  std::condition_variable changed;  // a pass landed, or the thread ended
  std::vector<std::shared_ptr<const LoweredPass>> lowered;
  std::vector<uint32_t> pending;    // LowerAhead's rows still to lower (every-row logits off), smallest first
  uint32_t lowering = 0;            // the rows LowerAhead's thread is lowering now (0: none)
  bool stop = false;
  int lowered_ahead = 0;
  std::thread thread;

  ~Passes() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    if (thread.joinable()) thread.join();
  }
  std::shared_ptr<const LoweredPass> Find(uint32_t rows, bool all_logits) const {
    for (const auto& p : lowered) {
      if (p->rows == rows && p->all_logits == all_logits) return p;
    }
    return nullptr;
  }
  void Add(std::shared_ptr<const LoweredPass> pass) {
    if (Find(pass->rows, pass->all_logits) != nullptr) return;
    if (lowered.size() >= kKept) lowered.erase(lowered.begin());
    lowered.push_back(std::move(pass));
  }
};

namespace {

// A prefill pass of `rows` rows of `decode`, on an arena of its own (its messages cost no allocation each: the
// allocator took about half of the lowering's time) that lives as long as the pass; with `machine`, its program
// prepared for it (GpuMachine::Prepare: no CUDA call, any thread).
absl::StatusOr<std::shared_ptr<const Session::LoweredPass>> LowerPass(const graph::Graph& graph,
                                                                      const scheduler::Schedule& decode, uint32_t rows,
                                                                      bool all_logits, bool verify,
                                                                      const GpuMachine* machine) {
  scheduler::PrefillOptions options;
  options.all_logits = all_logits;
  options.verify = verify;  // off by default, as `loom run` lowers passes (the tests verify every shape they run)
  auto arena = std::make_shared<google::protobuf::Arena>();
  scheduler::Schedule* pass = google::protobuf::Arena::Create<scheduler::Schedule>(arena.get());
  if (absl::Status s = scheduler::LowerPrefillInto(graph, decode, rows, options, pass); !s.ok()) return s;
  auto lowered = std::make_shared<Session::LoweredPass>();
  lowered->rows = rows, lowered->all_logits = all_logits;
  lowered->pass = std::shared_ptr<const scheduler::Schedule>(std::move(arena), pass);  // (aliasing: owns the arena)
  if (machine != nullptr) {
    absl::StatusOr<GpuProgram> p = ProgramFromSchedule(*pass);
    if (!p.ok()) return p.status();
    absl::StatusOr<std::shared_ptr<const PreparedProgram>> prepared =
        machine->Prepare(std::make_shared<const GpuProgram>(*std::move(p)));
    if (!prepared.ok()) return prepared.status();
    lowered->prepared = *std::move(prepared);
  }
  return lowered;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const graph::Graph& graph, const scheduler::Schedule& schedule,
                                                         const graph::WeightStore& weights, Backend backend) {
  if (schedule.has_graph()) {
    return absl::FailedPreconditionError(
        "a general graph's pass (no token decoding): run it with `loom run --model=<file.onnx>` (GraphRunner)");
  }
  std::unique_ptr<Session> s(new Session);
  s->backend_ = backend;
  s->graph_ = graph;
  s->schedule_ = schedule;
  s->passes_ = std::make_unique<Passes>();
  if (backend == Backend::kGpu) {
    absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(schedule, weights);
    if (!d.ok()) return d.status();
    s->gpu_ = *std::move(d);
  } else {
    absl::StatusOr<std::unique_ptr<ReferenceVm>> vm = ReferenceVm::Create(schedule, weights);
    if (!vm.ok()) return vm.status();
    s->vm_ = *std::move(vm);
  }
  return s;
}

Session::~Session() { passes_.reset(); }  // (LowerAhead's thread reads graph_ and schedule_: stopped first)

uint32_t Session::vocab_size() const { return schedule_.vocab_size(); }
uint32_t Session::max_seq() const { return schedule_.max_seq(); }

absl::Status Session::LowerAhead(const StartOptions& options) {
  if (!options.prefill || !options.buckets || !scheduler::HasPrefillWeights(schedule_) ||
      !scheduler::PrefillInBuckets(graph_)) {
    return absl::OkStatus();
  }
  Passes& p = *passes_;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.thread.joinable() || p.lowered_ahead > 0) {
      return absl::FailedPreconditionError("LowerAhead is already under way or done");
    }
  }
  const uint32_t most = options.chunk_rows > 0 ? options.chunk_rows : scheduler::kDefaultPrefillChunkRows;
  std::vector<uint32_t> buckets = scheduler::PrefillBuckets(most, schedule_.max_seq() - 1);
  const bool verify = options.verify;
  const GpuMachine* machine = gpu_ != nullptr ? &gpu_->machine() : nullptr;
  if (gpu_ != nullptr && !buckets.empty()) {
    // The largest pass here, its arena reserved (a later pass's arena is no larger: activations grow with rows).
    // (Where it cannot be lowered, or its arena does not fit the GPU, the Starts that need it say so; shorter prompts
    // still run.)
    absl::StatusOr<std::shared_ptr<const LoweredPass>> largest =
        LowerPass(graph_, schedule_, buckets.back(), false, verify, machine);
    if (largest.ok()) {
      gpu_->machine().ReserveArena((*largest)->pass->arena_bytes()).IgnoreError();
      std::lock_guard<std::mutex> lock(p.mu);
      p.Add(*std::move(largest));
      ++p.lowered_ahead;
      buckets.pop_back();
    }
  }
  std::lock_guard<std::mutex> lock(p.mu);
  p.pending = std::move(buckets);
  // (The thread holds its Passes, not passes_: ~Session resets passes_, nulling it before ~Passes joins the thread.)
  p.thread = std::thread([this, &p, verify, machine] {
    for (;;) {
      uint32_t rows = 0;
      {
        std::lock_guard<std::mutex> lock(p.mu);
        while (rows == 0 && !p.stop && !p.pending.empty()) {
          if (p.Find(p.pending.front(), false) == nullptr) rows = p.pending.front();
          p.pending.erase(p.pending.begin());
        }
        if (rows == 0) {
          p.pending.clear();
          p.changed.notify_all();
          return;
        }
        p.lowering = rows;
      }
      // graph_, schedule_ and the machine's shape are only read, here and by every other lowering.
      absl::StatusOr<std::shared_ptr<const LoweredPass>> pass =
          LowerPass(graph_, schedule_, rows, false, verify, machine);
      std::lock_guard<std::mutex> lock(p.mu);
      p.lowering = 0;
      if (pass.ok()) {  // (a failure: the Start that needs the pass lowers it again and says why)
        p.Add(*std::move(pass));
        ++p.lowered_ahead;
      }
      p.changed.notify_all();
    }
  });
  return absl::OkStatus();
}

int Session::WaitLoweredAhead() {
  Passes& p = *passes_;
  std::unique_lock<std::mutex> lock(p.mu);
  p.changed.wait(lock, [&] { return p.pending.empty() && p.lowering == 0; });
  return p.lowered_ahead;
}

absl::StatusOr<std::shared_ptr<const Session::LoweredPass>> Session::PassFor(uint32_t rows, bool all_logits,
                                                                             bool verify) {
  Passes& p = *passes_;
  {
    std::unique_lock<std::mutex> lock(p.mu);
    for (;;) {
      if (std::shared_ptr<const LoweredPass> pass = p.Find(rows, all_logits)) return pass;
      if (all_logits || p.lowering != rows) break;
      p.changed.wait(lock);  // LowerAhead's thread is lowering this one
    }
    if (!all_logits) p.pending.erase(std::remove(p.pending.begin(), p.pending.end(), rows), p.pending.end());
  }
  const auto start = std::chrono::steady_clock::now();
  // (Its GPU program: GpuDecoder decodes it, on this thread either way.)
  absl::StatusOr<std::shared_ptr<const LoweredPass>> pass =
      LowerPass(graph_, schedule_, rows, all_logits, verify, nullptr);
  if (!pass.ok()) return pass.status();
  pass_lower_ms_ += MsSince(start);  // (zeroed by each Start: a chunked prompt's lowerings add up)
  std::lock_guard<std::mutex> lock(p.mu);
  p.Add(*pass);
  return pass;
}

absl::Status Session::KeepLastLogits() {
  absl::StatusOr<std::vector<float>> l = vm_ ? absl::StatusOr<std::vector<float>>(vm_->logits()) : gpu_->logits();
  if (!l.ok()) return l.status();
  kept_logits_.insert(kept_logits_.end(), l->begin(), l->end());
  return absl::OkStatus();
}

absl::Status Session::KeepPassLogits(const scheduler::Schedule& pass) {
  for (const scheduler::Tensor& t : pass.tensors()) {
    if (t.name() != "prefill.logits") continue;
    std::vector<float> rows(t.bytes() / sizeof(float));
    if (vm_) {
      const std::vector<uint8_t> bytes = vm_->ReadArena(t.offset(), t.bytes());
      std::memcpy(rows.data(), bytes.data(), rows.size() * sizeof(float));
    } else if (absl::Status s = gpu_->machine().ReadArena(t.offset(), rows.data(), rows.size() * sizeof(float));
               !s.ok()) {
      return s;
    }
    kept_logits_.insert(kept_logits_.end(), rows.begin(), rows.end());
    return absl::OkStatus();
  }
  return absl::InternalError("the prefill pass has no prefill.logits (lowered without all_logits)");
}

absl::Status Session::RunSteps(int n, double* ms) {
  const int per_launch = keep_logits_ ? 1 : n;
  for (int done = 0; done < n; done += per_launch) {
    const auto start = std::chrono::steady_clock::now();
    if (vm_) {
      if (absl::Status s = vm_->Run(per_launch); !s.ok()) return s;
      *ms += MsSince(start);
    } else {
      absl::StatusOr<float> kernel_ms = gpu_->Run(per_launch);
      if (!kernel_ms.ok()) return kernel_ms.status();
      *ms += *kernel_ms;
    }
    if (keep_logits_) {
      if (absl::Status s = KeepLastLogits(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Session::Start(const std::vector<int32_t>& prompt, const StartOptions& options) {
  const auto entered = std::chrono::steady_clock::now();
  ttft_ms_ = 0;
  absl::Status started = StartPrompt(prompt, options);
  if (started.ok()) ttft_ms_ = MsSince(entered);
  return started;
}

absl::Status Session::StartPrompt(const std::vector<int32_t>& prompt, const StartOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt needs at least one token");
  if (prompt.size() >= schedule_.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat("a prompt of ", prompt.size(),
                                              " tokens leaves no room in the KV cache of ", schedule_.max_seq(),
                                              " (compile with a larger max_seq)"));
  }
  started_ = false;
  if (absl::Status s = vm_ ? vm_->Reset(prompt) : gpu_->Reset(prompt); !s.ok()) return s;
  used_prefill_ = false;
  prefill_note_.clear();
  keep_logits_ = options.keep_logits;
  kept_logits_.clear();
  pass_instructions_ = 0;
  pass_lower_ms_ = 0;
  pass_upload_ms_ = 0;
  bool prefill = false;
  if (!options.prefill) {
    prefill_note_ = "prefill off";
  } else if (prompt.size() == 1) {
    // One decode step reads the weights once with every SM streaming them; a pass of one row runs tensor-core
    // tiles on a fraction of the SMs, and is lowered first: Llama-3.2-1B on an H100, a step 0.93 ms against a
    // pass's 1.66 ms kernel after a 4 ms lowering (docs/performance.md). From two rows on, the pass is faster.
    prefill_note_ = "a one-token prompt runs as one decode step (faster than a pass of one row)";
  } else if (!scheduler::HasPrefillWeights(schedule_)) {
    const absl::Status why = scheduler::PrefillSupported(graph_);
    prefill_note_ = why.ok() ? "compiled without the prefill weights" : std::string(why.message());
  } else {
    prefill = true;
  }
  if (prefill) {
    // A decoder's prompt longer than options.chunk_rows runs as passes of chunk_rows rows at successive positions
    // (one lowering for them all), its rest in a last pass; with buckets, a pass of fewer rows is its bucket's
    // (scheduler::PrefillBucketRows: one lowering for every length in the same bucket). Every row's
    // logits take passes of the rows' own count.
    const uint32_t total = static_cast<uint32_t>(prompt.size());
    const bool decoder = scheduler::PrefillInBuckets(graph_);
    const uint32_t chunk = decoder && options.chunk_rows > 0 ? options.chunk_rows : total;
    prompt_ms_ = 0;
    for (uint32_t begin = 0; begin < total;) {
      const uint32_t rows = std::min(chunk, total - begin);
      const uint32_t lowered = options.buckets && !options.keep_logits && decoder
                                   ? scheduler::PrefillBucketRows(rows, schedule_.max_seq() - 1 - begin)
                                   : rows;
      absl::StatusOr<std::shared_ptr<const LoweredPass>> lowered_pass =
          PassFor(lowered, options.keep_logits, options.verify);
      if (!lowered_pass.ok()) {
        if (begin > 0) return lowered_pass.status();  // (the first chunk's pass lowered: a later one's is the same shape)
        prefill_note_ = std::string(lowered_pass.status().message());
        prefill = false;
        break;
      }
      const scheduler::Schedule* pass = (*lowered_pass)->pass.get();
      for (const scheduler::SmQueue& q : pass->queues()) pass_instructions_ += q.instructions_size();
      if (vm_) {
        const auto start = std::chrono::steady_clock::now();
        if (absl::Status s = vm_->Prefill(*pass, rows); !s.ok()) return s;
        prompt_ms_ += MsSince(start);
      } else {
        absl::StatusOr<float> ms = gpu_->Prefill(*pass, false, rows, (*lowered_pass)->prepared);
        if (!ms.ok()) return ms.status();
        prompt_ms_ += *ms;
        pass_upload_ms_ += gpu_->upload_ms();
      }
      if (keep_logits_) {
        if (absl::Status s = KeepPassLogits(*pass); !s.ok()) return s;
      }
      begin += rows;
    }
  }
  if (prefill) {
    used_prefill_ = true;
    started_ = true;
    return CheckLastLogits();
  }
  // One decode step per prompt token: step p reads token p and writes token p + 1 (forced inside the prompt).
  prompt_ms_ = 0;
  if (absl::Status s = RunSteps(static_cast<int>(prompt.size()), &prompt_ms_); !s.ok()) return s;
  started_ = true;
  return CheckLastLogits();
}

absl::Status Session::CheckStarted(const char* call) const {
  if (started_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(call, " before start(): no prompt has been consumed (start a generation first)"));
}

// On the GPU, the chosen token's logit alone (two 4-byte reads a Step, not the vocabulary's 0.5 MB: a streaming
// caller steps once a token): logits that went non-finite as a whole (a NaN weight, an overflow) make it NaN or
// infinite; only then are all of them read, for the message. The CPU VM's are on the host: all checked.
absl::Status Session::CheckLastLogits() const {
  absl::StatusOr<int32_t> pos = position();
  if (!pos.ok()) return pos.status();
  if (gpu_) {
    int32_t token = 0;
    float chosen = 0.0f;
    const uint64_t tokens_at = schedule_.tensors(schedule_.io().tokens()).offset() + uint64_t(*pos) * 4;
    if (absl::Status s = gpu_->machine().ReadArena(tokens_at, &token, 4); !s.ok()) return s;
    if (token >= 0 && static_cast<uint32_t>(token) < schedule_.vocab_size()) {
      const uint64_t logit_at = schedule_.tensors(schedule_.io().logits()).offset() + uint64_t(token) * 4;
      if (absl::Status s = gpu_->machine().ReadArena(logit_at, &chosen, 4); !s.ok()) return s;
      if (std::isfinite(chosen)) return absl::OkStatus();
    }
  }
  absl::StatusOr<std::vector<float>> l = logits();
  if (!l.ok()) return l.status();
  return CheckLogitsFinite(*l, *pos);
}

absl::Status Session::CheckRoom(int n) const {
  absl::StatusOr<int32_t> pos = position();
  if (!pos.ok()) return pos.status();
  if (*pos + static_cast<int64_t>(n) >= schedule_.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat("position ", *pos, " + ", n, " tokens exceeds the KV cache of ",
                                              schedule_.max_seq(), " (compile with a larger max_seq)"));
  }
  return absl::OkStatus();
}

absl::Status Session::Step(int n) {
  if (absl::Status s = CheckStarted("step()"); !s.ok()) return s;
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("steps must be >= 0, not ", n));
  if (absl::Status s = CheckRoom(n); !s.ok()) return s;
  if (n == 0) return absl::OkStatus();
  step_ms_ = 0;
  if (absl::Status s = RunSteps(n, &step_ms_); !s.ok()) return s;
  return CheckLastLogits();
}

absl::StatusOr<std::string> Session::TraceSteps(int n, const std::string& json_path, int steps_per_launch) {
  if (!gpu_) {
    return absl::FailedPreconditionError(
        "traces are timings of the GPU kernel; this session runs on the CPU reference VM (backend \"gpu\" traces)");
  }
  if (absl::Status s = CheckStarted("trace_steps()"); !s.ok()) return s;
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("steps must be >= 1, not ", n));
  if (steps_per_launch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("steps per launch must be >= 0, not ", steps_per_launch));
  }
  if (keep_logits_) {
    return absl::FailedPreconditionError(
        "a generation that keeps every step's logits runs one launch a step: it is not traced");
  }
  if (absl::Status s = CheckRoom(n); !s.ok()) return s;
  const int per_launch = steps_per_launch > 0 ? std::min(steps_per_launch, n) : n;
  std::vector<TraceEvent> events;
  step_ms_ = 0;
  for (int done = 0; done < n; done += per_launch) {
    absl::StatusOr<float> ms = gpu_->Run(std::min(per_launch, n - done), /*trace=*/true);
    if (!ms.ok()) return ms.status();
    step_ms_ += *ms;
    events.insert(events.end(), gpu_->machine().trace().begin(), gpu_->machine().trace().end());
  }
  if (absl::Status s = CheckLastLogits(); !s.ok()) return s;
  absl::StatusOr<GpuProgram> program = ProgramFromSchedule(schedule_);
  if (!program.ok()) return program.status();
  const std::vector<std::vector<std::string>> ops = OpNames(schedule_);
  TraceInput in{&*program, &gpu_->machine().queue_begin(), &events, static_cast<uint32_t>(n),
                schedule_.weight_bytes_per_step(), &ops};
  if (absl::Status s = WriteChromeTrace(json_path, in); !s.ok()) return s;
  return TraceSummary(in);
}

absl::StatusOr<int32_t> Session::position() const {
  if (vm_) return vm_->position();
  return gpu_->position();
}

absl::StatusOr<std::vector<int32_t>> Session::tokens() const {
  if (vm_) return vm_->tokens();
  return gpu_->tokens();
}

absl::StatusOr<std::vector<float>> Session::logits() const {
  if (absl::Status s = CheckStarted("logits()"); !s.ok()) return s;
  if (vm_) return vm_->logits();
  return gpu_->logits();
}

absl::StatusOr<const float*> Session::device_logits() const {
  if (!gpu_) return absl::FailedPreconditionError("device logits: this session runs on the CPU reference VM");
  if (absl::Status s = CheckStarted("logits()"); !s.ok()) return s;
  return reinterpret_cast<const float*>(gpu_->machine().arena_device() +
                                        schedule_.tensors(schedule_.io().logits()).offset());
}

}  // namespace loom::runtime
