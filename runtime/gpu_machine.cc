#include "runtime/gpu_machine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/progress.h"
#include "instructions/isa.h"
#include "megakernel/megakernel_launch.h"
#include "runtime/stuck_report.h"

namespace loom::runtime {

using namespace megakernel;  // the kernel's constants and launch (megakernel/)
namespace {

absl::Status CudaError(cudaError_t e, const std::string& what) {
  return absl::InternalError(absl::StrCat("CUDA: ", what, ": ", cudaGetErrorString(e)));
}

#define LOOM_CUDA(expr, what)                         \
  do {                                                \
    if (cudaError_t _e = (expr); _e != cudaSuccess) { \
      return CudaError(_e, what);                     \
    }                                                 \
  } while (0)

}  // namespace

absl::Status FitsDeviceMemory(uint64_t weight_bytes, uint64_t arena_bytes, uint64_t prefill_bytes,
                              uint64_t free_bytes, uint64_t total_bytes) {
  constexpr uint64_t kSlack = uint64_t{64} << 20;  // instructions, counters, trace, allocation granularity
  const uint64_t needed = weight_bytes + arena_bytes + kSlack;
  if (needed <= free_bytes) return absl::OkStatus();
  // The prefill pass's operand images are a second copy of the projections in bf16 (141 GB for a 70B model in int4):
  // say what leaving them out would need.
  const std::string without_prefill =
      prefill_bytes == 0 ? ""
                         : absl::StrFormat("; %.2f GB of the weights are the prefill pass's bf16 operand images: "
                                           "--prefill=false (prompts run as decode steps) needs %.2f GB",
                                           prefill_bytes / 1e9, (needed - prefill_bytes) / 1e9);
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the model needs %.2f GB of GPU memory (weights %.2f GB, KV cache and activations %.2f GB); the GPU has "
      "%.2f GB free of %.2f GB (a smaller --max_seq shrinks the KV cache)%s",
      needed / 1e9, weight_bytes / 1e9, arena_bytes / 1e9, free_bytes / 1e9, total_bytes / 1e9, without_prefill));
}

absl::Status CheckDeviceMemory(uint64_t weight_bytes, uint64_t arena_bytes, uint64_t prefill_bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return FitsDeviceMemory(weight_bytes, arena_bytes, prefill_bytes, free_bytes, total_bytes);
}

absl::StatusOr<std::unique_ptr<GpuMachine>> GpuMachine::Create(const GpuProgram& program,
                                                               const std::vector<uint8_t>& weights) {
  absl::StatusOr<std::unique_ptr<GpuMachine>> m = Create(program, weights.size());
  if (!m.ok()) return m;
  graph::Progress upload("uploading weights to the GPU", weights.size());
  if (absl::Status s = (*m)->WriteWeights(0, weights.data(), weights.size()); !s.ok()) return s;
  upload.Add(weights.size());
  upload.Done();
  return m;
}

absl::Status GpuMachine::WriteWeights(uint64_t offset, const void* data, uint64_t bytes) {
  if (offset > weights_size_ || bytes > weights_size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("weights write [", offset, ", +", bytes, ") outside the region of ",
                                              weights_size_));
  }
  LOOM_CUDA(cudaMemcpy(static_cast<uint8_t*>(weights_) + offset, data, bytes, cudaMemcpyHostToDevice),
            "uploading weights");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuMachine>> GpuMachine::Create(const GpuProgram& program, uint64_t weight_bytes) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    return absl::UnavailableError("no CUDA device");
  }
  cudaDeviceProp prop;
  LOOM_CUDA(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major != 9) {
    return absl::FailedPreconditionError(absl::StrCat("the megakernel is built for sm_90a (Hopper); device 0 is ",
                                                      prop.name, " (sm_", prop.major, prop.minor, ")"));
  }
  if (program.queues.size() > static_cast<size_t>(prop.multiProcessorCount)) {
    return absl::FailedPreconditionError(absl::StrCat("the schedule needs ", program.queues.size(), " SMs; ",
                                                      prop.name, " has ", prop.multiProcessorCount,
                                                      " (recompile with --num_sms=", prop.multiProcessorCount, ")"));
  }
  if (absl::Status s = CheckProgramForDevice(program); !s.ok()) return s;
  std::unique_ptr<GpuMachine> m(new GpuMachine);
  m->program_ = program;
  m->tagged_ranges_ = TaggedRanges(program);
  m->smem_bytes_ = SmemBytes(program.page_bytes, program.num_pages, program.activation_bytes);
  m->smem_limit_ = static_cast<uint32_t>(prop.sharedMemPerBlockOptin);
  if (m->smem_bytes_ > prop.sharedMemPerBlockOptin) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the schedule's shared memory (", program.num_pages, " pages of ", program.page_bytes, " + an activation ring of ",
        program.activation_bytes, " + ", SmemFixedBytes(), " = ", m->smem_bytes_, ") exceeds the ",
        prop.sharedMemPerBlockOptin, " a block may use"));
  }
  absl::StatusOr<isa::KernelVariant> variant = ProgramVariant(program);
  if (!variant.ok()) return variant.status();
  m->variant_ = *variant;
  const std::vector<isa::Instruction> all = Flatten(program, &m->queue_begin_);

  LOOM_CUDA(cudaMalloc(&m->weights_, std::max<size_t>(weight_bytes, 16)), "allocating weights");
  m->weights_size_ = weight_bytes;
  LOOM_CUDA(cudaMalloc(&m->arena_, std::max<uint64_t>(program.arena_bytes, 16)), "allocating the arena");
  LOOM_CUDA(cudaMalloc(&m->tensors_, std::max<size_t>(program.tensors.size(), 1) * sizeof(isa::TensorDesc)), "tensors");
  LOOM_CUDA(cudaMemcpy(m->tensors_, program.tensors.data(), program.tensors.size() * sizeof(isa::TensorDesc),
                       cudaMemcpyHostToDevice),
            "uploading tensors");
  LOOM_CUDA(cudaMalloc(&m->instructions_, std::max<size_t>(all.size(), 1) * sizeof(isa::Instruction)), "queues");
  LOOM_CUDA(cudaMemcpy(m->instructions_, all.data(), all.size() * sizeof(isa::Instruction), cudaMemcpyHostToDevice),
            "uploading queues");
  LOOM_CUDA(cudaMalloc(&m->queue_begin_device_, m->queue_begin_.size() * 4), "queue offsets");
  LOOM_CUDA(cudaMemcpy(m->queue_begin_device_, m->queue_begin_.data(), m->queue_begin_.size() * 4,
                       cudaMemcpyHostToDevice),
            "uploading queue offsets");
  LOOM_CUDA(cudaMalloc(&m->counters_, std::max<uint32_t>(program.num_barriers, 1) * 4), "barrier counters");
  LOOM_CUDA(cudaMemset(m->counters_, 0, std::max<uint32_t>(program.num_barriers, 1) * 4), "barrier counters");
  LOOM_CUDA(cudaHostAlloc(&m->error_, sizeof(DeviceError), cudaHostAllocMapped), "error record");
  *m->error_ = DeviceError{};
  LOOM_CUDA(cudaStreamCreateWithFlags(&m->watch_stream_, cudaStreamNonBlocking), "the watchdog's stream");
  LOOM_CUDA(cudaMalloc(&m->retired_, m->num_sms() * sizeof(uint64_t)), "the retired marks");
  LOOM_CUDA(cudaMemset(m->retired_, 0, m->num_sms() * sizeof(uint64_t)), "the retired marks");
  LOOM_CUDA(cudaHostAlloc(&m->watch_retired_, m->num_sms() * sizeof(uint64_t), cudaHostAllocDefault),
            "the watchdog's retired marks");
  if (const char* seconds = std::getenv("LOOM_WATCHDOG_SECONDS"); seconds != nullptr) {
    char* end = nullptr;
    const double s = std::strtod(seconds, &end);
    if (end == seconds || *end != '\0' || !(s >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("LOOM_WATCHDOG_SECONDS='", seconds,
                                                     "': not a number of seconds (0 turns the watchdog off)"));
    }
    m->watchdog_seconds_ = s;
  }
  if (absl::Status s = m->ZeroArena(); !s.ok()) return s;
  return m;
}

GpuMachine::~GpuMachine() {
  if (GpuHung()) return;  // a free would wait for the stuck kernel
  cudaFree(weights_);
  cudaFree(arena_);
  cudaFree(tensors_);
  cudaFree(instructions_);
  cudaFree(queue_begin_device_);
  cudaFree(counters_);
  cudaFree(trace_device_);
  cudaFreeHost(error_);
  cudaFreeHost(watch_counters_);
  cudaFree(retired_);
  cudaFreeHost(watch_retired_);
  if (watch_stream_ != nullptr) cudaStreamDestroy(watch_stream_);
}

absl::Status GpuMachine::WriteArena(uint64_t offset, const void* data, uint64_t bytes) {
  for (const auto& [begin, size] : tagged_ranges_) tags_current_ &= offset + bytes <= begin || begin + size <= offset;
  if (offset + bytes > program_.arena_bytes) return absl::OutOfRangeError("write past the arena");
  LOOM_CUDA(cudaMemcpy(arena_ + offset, data, bytes, cudaMemcpyHostToDevice), "writing the arena");
  return absl::OkStatus();
}

absl::Status GpuMachine::ReadArena(uint64_t offset, void* data, uint64_t bytes) const {
  if (offset + bytes > program_.arena_bytes) return absl::OutOfRangeError("read past the arena");
  LOOM_CUDA(cudaMemcpy(data, arena_ + offset, bytes, cudaMemcpyDeviceToHost), "reading the arena");
  return absl::OkStatus();
}

absl::Status GpuMachine::ZeroArena(uint64_t bytes) {
  tags_current_ = false;
  LOOM_CUDA(cudaMemset(arena_, 0, std::min(bytes, program_.arena_bytes)), "clearing the arena");
  return absl::OkStatus();
}

absl::Status GpuMachine::ZeroArena() {
  tags_current_ = false;
  LOOM_CUDA(cudaMemset(arena_, 0, std::max<uint64_t>(program_.arena_bytes, 16)), "clearing the arena");
  return absl::OkStatus();
}

absl::Status GpuMachine::CheckError(const char* what) const {
  if (error_->kind != kNoError) {
    const DeviceError& e = *error_;
    if (e.kind == kStuckGlobalWait) {
      return absl::InternalError(absl::StrCat("megakernel stuck: SM ", e.sm, " queue index ", e.queue_index,
                                              " opcode ", isa::OpcodeName(static_cast<isa::Opcode>(e.opcode)),
                                              " barrier ", e.barrier, " value ", e.value, " target ", e.target, " (",
                                              what, ")"));
    }
    if (e.kind == kStuckTaggedRead) {
      return absl::InternalError(absl::StrCat("megakernel stuck: SM ", e.sm, " queue index ", e.queue_index,
                                              " opcode ", isa::OpcodeName(static_cast<isa::Opcode>(e.opcode)),
                                              " reading tensor ", e.barrier, ": a value 0x", absl::Hex(e.value),
                                              " never carried the step's tag ", e.target, " (", what, ")"));
    }
    if (e.kind == kOpcodeNotCompiled) {  // (the GPU is fine: the record is cleared for the next launch)
      const DeviceError record = e;
      *error_ = DeviceError{};
      const std::string op = record.opcode < isa::kNumOpcodes
                                 ? std::string(isa::OpcodeName(static_cast<isa::Opcode>(record.opcode)))
                                 : absl::StrCat("opcode ", record.opcode, " (not in the table)");
      return absl::InternalError(absl::StrCat("SM ", record.sm, " queue index ", record.queue_index, ": ", op,
                                              " is not compiled into the ",
                                              VariantName(static_cast<isa::KernelVariant>(record.value)),
                                              " kernel variant this launch ran; it ran nothing (", what, ")"));
    }
    if (e.kind == kInstructionSlotRefilled) {  // (the kernel ran to its end: the record is cleared for the next launch)
      const DeviceError record = e;
      *error_ = DeviceError{};
      return absl::InternalError(absl::StrCat(
          "SM ", record.sm, " queue index ", record.queue_index, ": its instruction slot held another instruction "
          "(signal ", record.barrier, ", not ", record.value, ") when the storer read it: the slot was refilled before "
          "every warp role let it go, so this launch's results are not to be trusted (", what, ")"));
    }
    if (e.kind == kStuckSplitRows) {
      return absl::InternalError(absl::StrCat("megakernel stuck: SM ", e.sm, " queue index ", e.queue_index,
                                              ": the loader waits for attention split ", e.barrier,
                                              "'s K / V rows; the consumers counted ", e.value, " (", what, ")"));
    }
    const char* ring = e.kind == kStuckPageWait          ? "page"
                       : e.kind == kStuckInstructionWait ? "instruction slot"
                       : e.kind == kStuckActivationWait  ? "activation slot"
                                                         : "signal slot";
    return absl::InternalError(absl::StrCat("megakernel stuck: SM ", e.sm, " queue index ", e.queue_index,
                                            " opcode ", isa::OpcodeName(static_cast<isa::Opcode>(e.opcode)), " ",
                                            ring, " ", e.barrier, " parity ", e.value, " (", what, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> GpuMachine::Run(uint32_t steps, bool trace) {
  const uint64_t total = queue_begin_.back();
  KernelParams params{};
  params.instructions = instructions_;
  params.queue_begin = queue_begin_device_;
  params.machine = {{weights_, arena_}, tensors_, static_cast<uint32_t>(program_.tensors.size())};
  params.counters = counters_;
  params.first_step = next_step_;
  params.num_steps = steps;
  params.page_bytes = program_.page_bytes;
  params.num_pages = program_.num_pages;
  params.activation_bytes = program_.activation_bytes;
  params.activation_slots = program_.activation_slots;
  params.matvec_pages_in_flight = program_.matvec_pages_in_flight;
  params.skip_weight_loads = skip_weight_loads_ ? 1 : 0;
  params.kernel_variant = variant_;
  // Tagged tensors must hold the other parity than this launch's first step. After a launch of this program every one
  // was rewritten in its last step, so they do; after anything else, anything may be there: a byte of 0 or 1 sets
  // every float's lowest bit.
  if (!tags_current_) {
    for (const auto& [offset, bytes] : tagged_ranges_) {
      LOOM_CUDA(cudaMemsetAsync(arena_ + offset, (next_step_ & 1u) ? 0 : 1, bytes), "clearing the step tags");
    }
  }
  tags_current_ = false;
  absl::StatusOr<float> ms = LaunchTimed(params, smem_bytes_, trace ? total * steps : 0, "decode steps", program_.num_barriers,
                                           program_.queues);
  if (!ms.ok()) return ms;
  tags_current_ = true;
  next_step_ += steps;
  return ms;
}

namespace {
std::atomic<bool> gpu_hung{false};
}  // namespace

bool GpuHung() { return gpu_hung.load(); }

// The watchdog: spins on the launch's event as cudaEventSynchronize would (short launches see no added latency),
// then sleeps between queries; every kWatchPoll it copies the barrier counters and the SMs' retired marks (a stream
// of its own, pinned memory) and, when no counter moved for watchdog_seconds_, fails the launch with StuckReport.
absl::Status GpuMachine::WatchLaunch(cudaEvent_t stop, const uint32_t* counters, uint32_t num_barriers,
                                     const std::vector<std::vector<isa::Instruction>>& queues, uint32_t first_step,
                                     uint32_t steps) {
  if (watchdog_seconds_ <= 0 || num_barriers == 0) {
    if (cudaError_t e = cudaEventSynchronize(stop); e != cudaSuccess) return CudaError(e, "running the megakernel");
    return absl::OkStatus();
  }
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::milliseconds(20), kWatchPoll = std::chrono::milliseconds(100);
  const auto watchdog = std::chrono::duration<double>(watchdog_seconds_);
  if (watch_capacity_ < num_barriers) {
    cudaFreeHost(watch_counters_);
    watch_counters_ = nullptr;
    watch_capacity_ = 0;
    LOOM_CUDA(cudaHostAlloc(&watch_counters_, num_barriers * 4ull, cudaHostAllocDefault), "the watchdog's counters");
    watch_capacity_ = num_barriers;
  }
  std::vector<uint32_t> seen;
  const auto begin = Clock::now();
  auto last_move = begin, next_poll = begin + kWatchPoll;
  for (;;) {
    const cudaError_t q = cudaEventQuery(stop);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return CudaError(q, "running the megakernel");
    const auto now = Clock::now();
    if (now >= next_poll) {
      next_poll = now + kWatchPoll;
      LOOM_CUDA(cudaMemcpyAsync(watch_counters_, counters, num_barriers * 4ull, cudaMemcpyDeviceToHost, watch_stream_),
                "the watchdog's copy");
      LOOM_CUDA(cudaStreamSynchronize(watch_stream_), "the watchdog's copy");
      std::vector<uint32_t> current(watch_counters_, watch_counters_ + num_barriers);
      if (current != seen) {
        seen = std::move(current);
        last_move = now;
      } else if (now - last_move > watchdog) {
        gpu_hung = true;
        LOOM_CUDA(cudaMemcpyAsync(watch_retired_, retired_, num_sms() * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                  watch_stream_),
                  "the watchdog's copy");
        LOOM_CUDA(cudaStreamSynchronize(watch_stream_), "the watchdog's copy");
        const std::vector<uint64_t> retired(watch_retired_, watch_retired_ + num_sms());
        return absl::InternalError(absl::StrCat("megakernel stuck: no barrier moved for ", watchdog_seconds_, " s; ",
                                                StuckReport(seen, retired, launches_, queues, first_step, steps),
                                                ". The kernel runs on until this process ends; its GPU runs nothing "
                                                "more"));
      }
    }
    if (now - begin > kSpin) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

absl::StatusOr<float> GpuMachine::LaunchTimed(KernelParams& params, uint32_t smem, uint64_t trace_events,
                                             const char* what, uint32_t num_barriers,
                                             const std::vector<std::vector<isa::Instruction>>& queues) {
  // The trace, then each block's %smid (a few events' room).
  const uint64_t smid_events = (num_sms() * sizeof(uint32_t) + sizeof(TraceEvent) - 1) / sizeof(TraceEvent);
  if (trace_events > 0 && trace_capacity_ < trace_events + smid_events) {
    cudaFree(trace_device_);
    trace_device_ = nullptr;
    LOOM_CUDA(cudaMalloc(&trace_device_, (trace_events + smid_events) * sizeof(TraceEvent)), "allocating the trace");
    trace_capacity_ = trace_events + smid_events;
  }
  params.trace = trace_events > 0 ? trace_device_ : nullptr;
  params.smids = trace_events > 0 ? reinterpret_cast<uint32_t*>(trace_device_ + trace_events) : nullptr;
  DeviceError* error_device = nullptr;
  LOOM_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device), error_, 0), "error record");
  params.error = error_device;
  params.retired = retired_;
  params.launch = ++launches_;
  cudaEvent_t start, stop;
  LOOM_CUDA(cudaEventCreate(&start), "event");
  LOOM_CUDA(cudaEventCreate(&stop), "event");
  if (GpuHung()) return absl::FailedPreconditionError("a launch of this process is stuck on the GPU (see its error)");
  cudaEventRecord(start);
  cudaError_t launch = LaunchMegakernel(params, num_sms(), smem, nullptr);
  cudaEventRecord(stop);
  absl::Status watched =
      launch == cudaSuccess ? WatchLaunch(stop, params.counters, num_barriers, queues, params.first_step,
                                          params.num_steps)
                            : absl::OkStatus();
  float ms = 0;
  if (!GpuHung()) {
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  if (absl::Status s = CheckError(what); !s.ok()) return s;
  if (launch != cudaSuccess) return CudaError(launch, "launching the megakernel");
  if (!watched.ok()) return absl::Status(watched.code(), absl::StrCat(watched.message(), " (", what, ")"));
  if (trace_events > 0) {
    trace_.resize(trace_events);
    LOOM_CUDA(cudaMemcpy(trace_.data(), trace_device_, trace_.size() * sizeof(TraceEvent), cudaMemcpyDeviceToHost),
              "reading the trace");
    smids_.resize(num_sms());
    LOOM_CUDA(cudaMemcpy(smids_.data(), params.smids, smids_.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost),
              "reading the trace");
  }
  return ms;
}

}  // namespace loom::runtime

namespace loom::runtime {

absl::Status GpuMachine::ReserveArena(uint64_t bytes) {
  if (bytes <= program_.arena_bytes) return absl::OkStatus();
  if (absl::Status s = CheckDeviceMemory(0, bytes - program_.arena_bytes); !s.ok()) return s;
  uint8_t* grown = nullptr;
  LOOM_CUDA(cudaMalloc(&grown, bytes), "growing the arena");
  LOOM_CUDA(cudaMemset(grown + program_.arena_bytes, 0, bytes - program_.arena_bytes), "growing the arena");
  LOOM_CUDA(cudaMemcpy(grown, arena_, program_.arena_bytes, cudaMemcpyDeviceToDevice), "growing the arena");
  cudaFree(arena_);
  arena_ = grown;
  program_.arena_bytes = bytes;
  return absl::OkStatus();
}

GpuMachine::OnceProgram::~OnceProgram() {
  if (GpuHung()) return;  // a free would wait for the stuck kernel
  for (void* b : buffers) cudaFree(b);
}

absl::StatusOr<std::shared_ptr<const PreparedProgram>> GpuMachine::Prepare(
    std::shared_ptr<const GpuProgram> program) const {
  const GpuProgram& other = *program;
  if (other.queues.size() != program_.queues.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a program for ", other.queues.size(), " SMs on a machine of ",
                                                   program_.queues.size()));
  }
  if (absl::Status s = CheckProgramForDevice(other); !s.ok()) return s;
  auto up = std::make_shared<PreparedProgram>();
  up->smem = SmemBytes(other.page_bytes, other.num_pages, other.activation_bytes);
  if (up->smem > smem_limit_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pass's shared memory (", other.num_pages, " pages of ", other.page_bytes, " + an activation ring of ",
        other.activation_bytes, " + ", SmemFixedBytes(), " = ", up->smem, ") exceeds the ", smem_limit_,
        " a block may use"));
  }
  up->arena_bytes = other.arena_bytes;
  up->num_tensors = static_cast<uint32_t>(other.tensors.size());
  up->num_barriers = std::max<uint32_t>(other.num_barriers, 1);
  up->page_bytes = other.page_bytes;
  up->num_pages = other.num_pages;
  up->activation_bytes = other.activation_bytes;
  up->activation_slots = other.activation_slots;
  up->matvec_pages_in_flight = other.matvec_pages_in_flight;
  if (!TaggedRanges(other).empty()) {
    return absl::InvalidArgumentError("a program with step-tagged tensors runs as the machine's decode program");
  }
  absl::StatusOr<isa::KernelVariant> variant = ProgramVariant(other);
  if (!variant.ok()) return variant.status();
  up->variant = *variant;
  up->instructions = Flatten(other, &up->queue_begin);
  up->source = std::move(program);
  return up;
}

absl::StatusOr<std::unique_ptr<GpuMachine::OnceProgram>> GpuMachine::Upload(
    std::shared_ptr<const PreparedProgram> prepared) const {
  const PreparedProgram& p = *prepared;
  const std::vector<isa::TensorDesc>& tensors = p.source->tensors;
  auto up = std::make_unique<OnceProgram>();
  void** buf = up->buffers;
  LOOM_CUDA(cudaMalloc(&buf[0], std::max<size_t>(p.instructions.size(), 1) * sizeof(isa::Instruction)), "queues");
  LOOM_CUDA(cudaMemcpy(buf[0], p.instructions.data(), p.instructions.size() * sizeof(isa::Instruction),
                       cudaMemcpyHostToDevice),
            "queues");
  LOOM_CUDA(cudaMalloc(&buf[1], p.queue_begin.size() * 4), "queue offsets");
  LOOM_CUDA(cudaMemcpy(buf[1], p.queue_begin.data(), p.queue_begin.size() * 4, cudaMemcpyHostToDevice),
            "queue offsets");
  LOOM_CUDA(cudaMalloc(&buf[2], std::max<size_t>(tensors.size(), 1) * sizeof(isa::TensorDesc)), "tensors");
  LOOM_CUDA(cudaMemcpy(buf[2], tensors.data(), tensors.size() * sizeof(isa::TensorDesc), cudaMemcpyHostToDevice),
            "tensors");
  LOOM_CUDA(cudaMalloc(&buf[3], p.num_barriers * 4), "barrier counters");
  up->prepared = std::move(prepared);
  return up;
}

absl::StatusOr<std::unique_ptr<GpuMachine::OnceProgram>> GpuMachine::Upload(const GpuProgram& other) const {
  absl::StatusOr<std::shared_ptr<const PreparedProgram>> prepared = Prepare(std::make_shared<const GpuProgram>(other));
  if (!prepared.ok()) return prepared.status();
  return Upload(*std::move(prepared));
}

absl::StatusOr<float> GpuMachine::RunOnce(const GpuProgram& other, bool trace) {
  absl::StatusOr<std::unique_ptr<OnceProgram>> up = Upload(other);
  if (!up.ok()) return up.status();
  return RunOnce(**up, trace);
}

absl::StatusOr<float> GpuMachine::RunOnce(const OnceProgram& once, bool trace) {
  const PreparedProgram& up = *once.prepared;
  tags_current_ = false;
  if (absl::Status s = ReserveArena(up.arena_bytes); !s.ok()) return s;
  LOOM_CUDA(cudaMemset(once.buffers[3], 0, up.num_barriers * 4), "barrier counters");
  const uint64_t total = up.queue_begin.back();
  const uint32_t smem = up.smem;
  KernelParams params{};
  params.instructions = static_cast<isa::Instruction*>(once.buffers[0]);
  params.queue_begin = static_cast<uint32_t*>(once.buffers[1]);
  params.machine = {{weights_, arena_}, static_cast<isa::TensorDesc*>(once.buffers[2]), up.num_tensors};
  params.counters = static_cast<uint32_t*>(once.buffers[3]);
  params.first_step = 0;
  params.num_steps = 1;
  params.page_bytes = up.page_bytes;
  params.num_pages = up.num_pages;
  params.activation_bytes = up.activation_bytes;
  params.activation_slots = up.activation_slots;
  params.matvec_pages_in_flight = up.matvec_pages_in_flight;
  params.kernel_variant = up.variant;
  absl::StatusOr<float> ms =
      LaunchTimed(params, smem, trace ? total : 0, "prefill pass", up.num_barriers, up.source->queues);
  if (ms.ok() && trace) queue_begin_other_ = up.queue_begin;
  return ms;
}

}  // namespace loom::runtime
