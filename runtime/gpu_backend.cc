// GpuDecoder: a compiled decode schedule on the megakernel.
#include "runtime/gpu_backend.h"

#include <chrono>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "runtime/gpu_machine.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/options.h"
#include "scheduler/packing.h"
#include "scheduler/prefill.h"

namespace loom::runtime {

using namespace megakernel;  // the kernel's constants (megakernel/)

static_assert(SmemFixedBytes() <= scheduler::kSmemReserveBytes,
              "the scheduler reserves less shared memory than the kernel keeps beside pages and activations");
static_assert(kMaxActivationSlots == scheduler::kMaxActivationSlots);

bool GpuAvailable(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    // Without a driver the runtime reports cudaErrorInsufficientDriver ("driver version is insufficient"), which
    // blames a driver that is not there: the driver's own version (0: none loaded) tells the cases apart.
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (driver == 0) {
      *why = "no CUDA device: this machine has no NVIDIA driver loaded (no GPU?)";
    } else if (e == cudaErrorInsufficientDriver) {
      *why = absl::StrCat("the NVIDIA driver supports CUDA up to ", driver / 1000, ".", driver % 1000 / 10,
                          "; this build of Loom needs CUDA ", runtime / 1000, ".", runtime % 1000 / 10);
    } else {
      *why = e != cudaSuccess ? absl::StrCat("no CUDA device (", cudaGetErrorString(e), ")") : "no CUDA device";
    }
    return false;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    *why = absl::StrCat("device 0 is not a Hopper GPU (sm_90a needed): ", prop.name);
    return false;
  }
  return true;
}

absl::StatusOr<GpuProgram> ProgramFromSchedule(const scheduler::Schedule& schedule) {
  absl::StatusOr<scheduler::DecodedSchedule> decoded = scheduler::DecodeSchedule(schedule);
  if (!decoded.ok()) return decoded.status();
  GpuProgram p;
  p.queues = decoded->queues;
  for (const scheduler::Tensor& t : schedule.tensors()) {
    p.tensors.push_back({t.offset(), t.bytes(),
                         t.region() == scheduler::WEIGHTS ? uint32_t{isa::kWeightRegion} : uint32_t{isa::kArenaRegion},
                         static_cast<uint32_t>(t.dtype())});
  }
  p.arena_bytes = schedule.arena_bytes();
  p.num_barriers = static_cast<uint32_t>(schedule.barriers_size());
  p.page_bytes = schedule.options().smem().page_bytes();
  p.num_pages = schedule.options().smem().num_pages();
  p.activation_bytes = schedule.options().smem().activation_bytes();
  p.activation_slots = schedule.options().smem().activation_slots();
  p.matvec_pages_in_flight = schedule.options().smem().matvec_pages_in_flight();
  return p;
}

absl::StatusOr<std::unique_ptr<GpuDecoder>> GpuDecoder::Create(const scheduler::Schedule& schedule,
                                                               const graph::WeightStore& weights) {
  if (schedule.has_graph()) return absl::FailedPreconditionError("a general graph's pass: not a decoder (GraphRunner)");
  absl::StatusOr<GpuProgram> program = ProgramFromSchedule(schedule);
  if (!program.ok()) return program.status();
  std::string why;
  if (!GpuAvailable(&why)) return absl::UnavailableError(why);
  // Before packing: a model that cannot fit is refused in a second, not after minutes of work.
  if (absl::Status s = CheckDeviceMemory(schedule.weight_bytes(), schedule.arena_bytes(),
                                         scheduler::PrefillWeightBytes(schedule));
      !s.ok()) {
    return s;
  }
  // The weights packed and uploaded a window at a time (the next one packing while one uploads): the host holds two
  // windows beside the weights it was given, not a second copy of them all.
  absl::StatusOr<std::unique_ptr<GpuMachine>> machine = GpuMachine::Create(*program, schedule.weight_bytes());
  if (!machine.ok()) return machine.status();
  if (absl::Status s = scheduler::PackWeightsInWindows(
          schedule, weights, kPackWindowBytes,
          [&](uint64_t offset, const uint8_t* data, uint64_t bytes) {
            return (*machine)->WriteWeights(offset, data, bytes);
          });
      !s.ok()) {
    return s;
  }
  std::unique_ptr<GpuDecoder> d(new GpuDecoder);
  d->schedule_ = schedule;
  d->machine_ = *std::move(machine);
  return d;
}

GpuDecoder::~GpuDecoder() {
  passes_.clear();  // device buffers, before the machine
}

absl::Status GpuDecoder::Reset(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt needs at least one token");
  if (prompt.size() > schedule_.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat("prompt of ", prompt.size(), " tokens exceeds the KV cache of ",
                                              schedule_.max_seq()));
  }
  for (int32_t t : prompt) {
    if (t < 0 || static_cast<uint32_t>(t) >= schedule_.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", t, " outside the vocabulary of ",
                                                     schedule_.vocab_size()));
    }
  }
  // The decode schedule's tensors (KV cache, state); a prefill pass's scratch needs no clearing.
  if (absl::Status s = machine_->ZeroArena(schedule_.arena_bytes()); !s.ok()) return s;
  const scheduler::Tensor& tokens = schedule_.tensors(schedule_.io().tokens());
  if (absl::Status s = machine_->WriteArena(tokens.offset(), prompt.data(), prompt.size() * 4); !s.ok()) return s;
  prompt_length_ = static_cast<int32_t>(prompt.size());
  return SetPosition(0);
}

absl::Status GpuDecoder::SetPosition(int32_t position) {
  int32_t state[isa::kStepStateWords] = {};
  state[isa::kStatePosition] = position;
  state[isa::kStatePromptLength] = prompt_length_;
  return machine_->WriteArena(schedule_.tensors(schedule_.io().step_state()).offset(), state, sizeof(state));
}

absl::StatusOr<float> GpuDecoder::Run(int steps, bool trace) {
  absl::StatusOr<int32_t> pos = position();
  if (!pos.ok()) return pos.status();
  if (steps < 0 || *pos + steps >= static_cast<int64_t>(schedule_.max_seq())) {
    return absl::OutOfRangeError(absl::StrCat("position ", *pos, " + ", steps, " steps exceeds the KV cache of ",
                                              schedule_.max_seq()));
  }
  return machine_->Run(static_cast<uint32_t>(steps), trace);
}

struct GpuDecoder::CachedPass {
  uint32_t rows;
  int instructions;
  uint64_t arena_bytes;
  std::unique_ptr<GpuMachine::OnceProgram> program;
  uint32_t used_rows;  // the rows its uploaded table's last-row entry is for (scheduler::PrefillLastRowFor)
};
// Session::LowerAhead's 19 buckets (chunks of 2048 rows) and a few more: a pass's upload is its instructions and
// tables (5 MB at 2048 rows of Llama-3.2-1B), the arena is shared.
constexpr size_t kCachedPasses = 32;

absl::StatusOr<float> GpuDecoder::Prefill(const scheduler::Schedule& pass, bool trace, uint32_t prompt_rows,
                                          std::shared_ptr<const PreparedProgram> prepared) {
  if (!pass.has_prefill() || pass.tensors_size() < schedule_.tensors_size() ||
      pass.weight_bytes() != schedule_.weight_bytes() || pass.num_sms() != schedule_.num_sms()) {
    return absl::InvalidArgumentError("not a prefill pass of this schedule");
  }
  absl::StatusOr<int32_t> start = position();
  if (!start.ok()) return start.status();
  const uint32_t rows = pass.prefill().rows();  // its K / V rows reach this far, padding included
  if (*start + static_cast<int64_t>(rows) >= schedule_.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat("position ", *start, " + ", rows,
                                              " prompt rows exceeds the KV cache of ", schedule_.max_seq()));
  }
  int instructions = 0;
  for (const scheduler::SmQueue& q : pass.queues()) instructions += q.instructions_size();
  CachedPass* cached = nullptr;
  for (const auto& c : passes_) {
    if (c->rows == rows && c->instructions == instructions && c->arena_bytes == pass.arena_bytes()) cached = c.get();
  }
  upload_ms_ = 0;
  if (cached == nullptr) {
    const auto start = std::chrono::steady_clock::now();
    if (prepared == nullptr) {
      absl::StatusOr<GpuProgram> program = ProgramFromSchedule(pass);
      if (!program.ok()) return program.status();
      absl::StatusOr<std::shared_ptr<const PreparedProgram>> p =
          machine_->Prepare(std::make_shared<const GpuProgram>(*std::move(program)));
      if (!p.ok()) return p.status();
      prepared = *std::move(p);
    }
    absl::StatusOr<std::unique_ptr<GpuMachine::OnceProgram>> up = machine_->Upload(std::move(prepared));
    if (!up.ok()) return up.status();
    if (passes_.size() >= kCachedPasses) passes_.erase(passes_.begin());
    passes_.push_back(
        std::make_unique<CachedPass>(CachedPass{rows, instructions, pass.arena_bytes(), *std::move(up), rows}));
    cached = passes_.back().get();
    upload_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  // A bucket's pass run for fewer rows reads its last row where they end: its uploaded table's entry for that row
  // written when the cached pass last ran for another count (it serves every row count of its bucket).
  const uint32_t used = prompt_rows != 0 ? prompt_rows : rows;
  if (used != cached->used_rows) {
    absl::StatusOr<scheduler::PrefillLastRow> last = scheduler::PrefillLastRowFor(pass, used);
    if (!last.ok()) return last.status();
    const scheduler::Tensor& t = pass.tensors(last->tensor);
    const isa::TensorDesc desc{last->offset, t.bytes(), uint32_t{isa::kArenaRegion}, static_cast<uint32_t>(t.dtype())};
    if (cudaMemcpy(static_cast<uint8_t*>(cached->program->buffers[2]) + uint64_t{last->tensor} * sizeof(desc), &desc,
                   sizeof(desc), cudaMemcpyHostToDevice) != cudaSuccess) {
      return absl::InternalError("writing the pass's last-row entry");
    }
    cached->used_rows = used;
  }
  if (absl::Status s = machine_->ReserveArena(pass.arena_bytes()); !s.ok()) return s;
  const uint64_t pass_state = pass.tensors(pass.prefill().state()).offset();
  int32_t state[isa::kStepStateWords] = {};
  state[isa::kStatePosition] = *start + static_cast<int32_t>(used) - 1;
  state[isa::kStatePromptLength] = prompt_length_;
  if (absl::Status s = machine_->WriteArena(pass_state, state, sizeof(state)); !s.ok()) return s;
  absl::StatusOr<float> ms = machine_->RunOnce(*cached->program, trace);
  if (!ms.ok()) return ms;
  if (absl::Status s = machine_->ReadArena(pass_state, state, sizeof(state)); !s.ok()) return s;
  if (state[isa::kStateOverflow] != 0) return absl::OutOfRangeError("prefill: the KV cache overflowed");
  if (absl::Status s = SetPosition(state[isa::kStatePosition]); !s.ok()) return s;
  return ms;
}

absl::StatusOr<int32_t> GpuDecoder::position() const {
  int32_t position = 0;
  const uint64_t offset = schedule_.tensors(schedule_.io().step_state()).offset() + 4 * isa::kStatePosition;
  if (absl::Status s = machine_->ReadArena(offset, &position, 4); !s.ok()) return s;
  return position;
}

absl::StatusOr<std::vector<int32_t>> GpuDecoder::tokens() const {
  absl::StatusOr<int32_t> pos = position();
  if (!pos.ok()) return pos.status();
  std::vector<int32_t> tokens(*pos + 1);
  if (absl::Status s = machine_->ReadArena(schedule_.tensors(schedule_.io().tokens()).offset(), tokens.data(),
                                           tokens.size() * 4);
      !s.ok()) {
    return s;
  }
  return tokens;
}

absl::StatusOr<std::vector<float>> GpuDecoder::logits() const {
  std::vector<float> logits(schedule_.vocab_size());
  if (absl::Status s = machine_->ReadArena(schedule_.tensors(schedule_.io().logits()).offset(), logits.data(),
                                           logits.size() * 4);
      !s.ok()) {
    return s;
  }
  return logits;
}

}  // namespace loom::runtime
