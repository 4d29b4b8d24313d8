// GpuMachine: a program (per-SM queues + tensor table) resident on the GPU with
// its weights and arena, run by the persistent megakernel. It knows nothing of
// models or protobufs; the decode backend and the opcode tests both build on it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/statusor.h"
#include "instructions/instruction.h"
#include "megakernel/kernel_params.h"
#include "runtime/gpu_program.h"

namespace loom::runtime {

// The kernel's names the runtime launches and reads it with (megakernel/kernel_params.h, device_debug.h).
using megakernel::DeviceError;
using megakernel::KernelParams;
using megakernel::TraceEvent;

// Whether `weight_bytes` of weights and `arena_bytes` of arena (KV cache and activations) fit the free memory of
// device 0; the error says how much is needed and how much is free, and where `prefill_bytes` of the weights are the
// prefill pass's operand images, what the model needs without them. FitsDeviceMemory: the same against given free
// and total bytes.
absl::Status CheckDeviceMemory(uint64_t weight_bytes, uint64_t arena_bytes, uint64_t prefill_bytes = 0);
absl::Status FitsDeviceMemory(uint64_t weight_bytes, uint64_t arena_bytes, uint64_t prefill_bytes,
                              uint64_t free_bytes, uint64_t total_bytes);

// Seconds without a barrier counter moving after which a launch is stopped: no instruction runs that long (the
// longest measured, an LM-head tile or a 2048-row GEMM tile, take microseconds to a millisecond), so only a wait
// that can never be met does.
inline constexpr double kWatchdogSeconds = 2.0;

class GpuMachine {
 public:
  // Checks the program against the device (SMs, shared memory, opcode limits)
  // and uploads it with `weights` (the WEIGHTS region). The arena starts zeroed.
  static absl::StatusOr<std::unique_ptr<GpuMachine>> Create(const GpuProgram& program,
                                                           const std::vector<uint8_t>& weights);
  // The same with a WEIGHTS region of `weight_bytes` allocated, unwritten: WriteWeights fills it (a window at a time:
  // scheduler::PackWeightsInWindows).
  static absl::StatusOr<std::unique_ptr<GpuMachine>> Create(const GpuProgram& program, uint64_t weight_bytes);
  absl::Status WriteWeights(uint64_t offset, const void* data, uint64_t bytes);
  ~GpuMachine();

  absl::Status WriteArena(uint64_t offset, const void* data, uint64_t bytes);
  absl::Status ReadArena(uint64_t offset, void* data, uint64_t bytes) const;
  absl::Status ZeroArena();
  // Zeroes the arena's first `bytes` only (a decode schedule's tensors, not a prefill pass's scratch after them).
  absl::Status ZeroArena(uint64_t bytes);

  // Runs `steps` decode steps in one launch; returns the kernel's time in ms
  // (CUDA events). Barrier counters carry on from the previous run.
  absl::StatusOr<float> Run(uint32_t steps, bool trace);
  // Runs another program once (one step, its own barrier counters from zero) over this machine's weights and
  // arena: a prefill pass, whose tensor table extends this program's with scratch past its arena (the arena
  // grows, keeping its contents). Checked against the device like Create's. Returns the kernel's time in ms.
  // With `trace`, trace() and queue_begin_other() then describe this run of `other`.
  absl::StatusOr<float> RunOnce(const GpuProgram& other, bool trace = false);
  absl::StatusOr<std::shared_ptr<const PreparedProgram>> Prepare(std::shared_ptr<const GpuProgram> program) const;
  // A program uploaded for RunOnce, to run many times (a prefill pass per prompt length).
  struct OnceProgram {
    ~OnceProgram();
    void* buffers[4] = {nullptr, nullptr, nullptr, nullptr};  // instructions, queue offsets, tensors, counters
    std::shared_ptr<const PreparedProgram> prepared;
  };
  absl::StatusOr<std::unique_ptr<OnceProgram>> Upload(std::shared_ptr<const PreparedProgram> prepared) const;
  absl::StatusOr<std::unique_ptr<OnceProgram>> Upload(const GpuProgram& other) const;  // (Prepare on a copy of it)
  absl::StatusOr<float> RunOnce(const OnceProgram& program, bool trace = false);
  // Grows the arena to `bytes` (new bytes zero), keeping its contents.
  absl::Status ReserveArena(uint64_t bytes);
  // Diagnostic for benchmarks: later runs skip every weight load (matvecs read
  // stale pages; results are garbage) to time compute and dependencies alone.
  void SetSkipWeightLoads(bool skip) { skip_weight_loads_ = skip; }
  // Per instruction of the last traced run: [step][concatenated queue index].
  const std::vector<TraceEvent>& trace() const { return trace_; }
  const std::vector<uint32_t>& queue_begin() const { return queue_begin_; }
  // Per block of the last traced run: the SM (%smid) it ran on.
  const std::vector<uint32_t>& smids() const { return smids_; }
  // The queue offsets of the last traced RunOnce.
  const std::vector<uint32_t>& queue_begin_other() const { return queue_begin_other_; }
  uint32_t num_sms() const { return static_cast<uint32_t>(program_.queues.size()); }
  // The WEIGHTS region on the device (for bandwidth probes over the same bytes).
  const uint8_t* weights_device() const { return weights_; }
  // The arena on the device (it moves when ReserveArena grows it).
  const uint8_t* arena_device() const { return arena_; }
  uint64_t weights_bytes() const { return weights_size_; }
  // The watchdog: a launch whose barrier counters do not move for `seconds` fails, naming where the SMs are: from
  // each SM's count of retired instructions (KernelParams::retired), the instruction it is on, and whether it is
  // stuck inside it (its waits are met) or waits (on which barrier, its value and target), and a barrier that is
  // short though every instruction that signals it has retired (a lost signal). The kernel cannot be stopped from
  // the host: it runs on until the process ends, and this process's GPU cannot run anything more (every later call
  // fails, and nothing waits for it: GpuHung()). 0: off (wait however long: a debugger can then attach). Default
  // kWatchdogSeconds, or the environment's LOOM_WATCHDOG_SECONDS. It reads the counters beside the launch.
  void SetWatchdog(double seconds) { watchdog_seconds_ = seconds; }

 private:
  GpuMachine() = default;
  isa::KernelVariant variant_ = isa::kDecodeKernel;  // the kernel the program needs (KernelParams::kernel_variant)
  absl::Status CheckError(const char* what) const;
  // Launches with `params` (error record and trace filled in here), times it with CUDA events, checks the error
  // record; with trace_events > 0, reads that many trace events into trace_.
  absl::StatusOr<float> LaunchTimed(KernelParams& params, uint32_t smem, uint64_t trace_events, const char* what,
                                    uint32_t num_barriers, const std::vector<std::vector<isa::Instruction>>& queues);
  // Waits for `stop` (the launch's end) under the watchdog: OK, or why the launch is stuck (`counters` of
  // `num_barriers`, for the steps [first_step, +steps) of `queues`).
  absl::Status WatchLaunch(cudaEvent_t stop, const uint32_t* counters, uint32_t num_barriers,
                           const std::vector<std::vector<isa::Instruction>>& queues, uint32_t first_step,
                           uint32_t steps);

  GpuProgram program_;
  // Arena byte ranges of the step-tagged tensors (instructions/instruction.h "Step tags"), merged: Run gives them the
  // other parity than its first step's before each launch, so nothing earlier reads as written this step.
  std::vector<std::pair<uint64_t, uint64_t>> tagged_ranges_;
  // Whether they hold the parity of the step before next_step_: true after a launch of this program that finished,
  // false after anything else wrote the arena (a pass, WriteArena, ZeroArena, a failed launch).
  bool tags_current_ = false;
  std::vector<uint32_t> queue_begin_;
  std::vector<uint32_t> queue_begin_other_;
  uint32_t smem_bytes_ = 0;
  uint32_t smem_limit_ = 0;  // the device's opt-in shared memory a block may use
  uint32_t next_step_ = 0;
  bool skip_weight_loads_ = false;
  uint8_t* weights_ = nullptr;
  uint64_t weights_size_ = 0;
  uint8_t* arena_ = nullptr;
  isa::TensorDesc* tensors_ = nullptr;
  isa::Instruction* instructions_ = nullptr;
  uint32_t* queue_begin_device_ = nullptr;
  uint32_t* counters_ = nullptr;
  TraceEvent* trace_device_ = nullptr;
  uint64_t trace_capacity_ = 0;
  DeviceError* error_ = nullptr;  // mapped host memory
  double watchdog_seconds_ = kWatchdogSeconds;
  cudaStream_t watch_stream_ = nullptr;  // the watchdog's copies of the counters, beside the launch
  uint32_t* watch_counters_ = nullptr;   // pinned host memory, watch_capacity_ counters
  uint32_t watch_capacity_ = 0;
  uint64_t* retired_ = nullptr;          // [num_sms] KernelParams::retired
  uint64_t* watch_retired_ = nullptr;    // pinned host memory, [num_sms]
  uint32_t launches_ = 0;                // KernelParams::launch of the last launch
  std::vector<TraceEvent> trace_;
  std::vector<uint32_t> smids_;
};

// Whether a launch of this process was left running by the watchdog: the GPU then runs nothing more, and nothing
// waits for it (device memory is not freed: a free would wait for the kernel).
bool GpuHung();

}  // namespace loom::runtime
