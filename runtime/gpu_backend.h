// The GPU backend as the host sees it: upload a schedule and its packed
// weights, run decode steps inside the persistent megakernel, read back tokens
// (runtime::Session drives it for `loom run` and Python).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/host_tensor.h"
#include "scheduler/schedule.pb.h"

namespace loom::runtime {

class GpuMachine;
struct GpuProgram;
struct PreparedProgram;

// The window GpuDecoder::Create packs and uploads the weights in (scheduler::PackWeightsInWindows): 4 GiB holds about
// nine of a Llama-3.1-70B's int4 layers (~0.45 GB, four or five packed tensors each), enough packings for 8 threads
// to share (windows of 1 GiB, two layers, packed at 0.40 GB/s where the whole region packed at 1.10: a window's
// threads wait for its largest tensor); two of them (one packing, one uploading) are small beside the weights
// themselves (37 GB for that model).
inline constexpr uint64_t kPackWindowBytes = uint64_t{4} << 30;

// A decode schedule resident on the GPU: weights uploaded once, then any number
// of generations. Reset() loads a prompt at position 0; Run() decodes steps.
class GpuDecoder {
 public:
  static absl::StatusOr<std::unique_ptr<GpuDecoder>> Create(const scheduler::Schedule& schedule,
                                                           const graph::WeightStore& weights);
  ~GpuDecoder();
  absl::Status Reset(const std::vector<int32_t>& prompt);
  // Moves the position back (or forward, over tokens already in the cache) without touching the KV cache.
  absl::Status SetPosition(int32_t position);
  // Runs a prefill pass of this schedule (scheduler::LowerPrefill) once: its rows, at positions
  // [position, +rows), fill the KV cache, the token after them is written (when past the prompt) and the position
  // moves past them. Returns the kernel time in ms. `rows` (0: the pass's): the prompt's rows of a bucket's pass
  // (scheduler::PrefillLastRowFor), the rest padding. `prepared`: the pass's program, decoded (ProgramFromSchedule)
  // and prepared (GpuMachine::Prepare) beforehand, maybe on another thread (else both here, the first time the pass
  // runs).
  absl::StatusOr<float> Prefill(const scheduler::Schedule& pass, bool trace = false, uint32_t rows = 0,
                                std::shared_ptr<const PreparedProgram> prepared = nullptr);
  // Wall time the last Prefill spent decoding and uploading its pass (0 when the pass was uploaded before), in ms.
  double upload_ms() const { return upload_ms_; }
  // Decodes `steps` steps in one launch; returns the kernel time in ms.
  absl::StatusOr<float> Run(int steps, bool trace = false);
  absl::StatusOr<int32_t> position() const;
  absl::StatusOr<std::vector<int32_t>> tokens() const;
  absl::StatusOr<std::vector<float>> logits() const;
  GpuMachine& machine() { return *machine_; }

 private:
  GpuDecoder() = default;
  scheduler::Schedule schedule_;
  std::unique_ptr<GpuMachine> machine_;
  // Prefill passes already uploaded, by (rows, instructions, arena bytes): a pass depends on its row count only.
  struct CachedPass;
  std::vector<std::unique_ptr<CachedPass>> passes_;
  double upload_ms_ = 0;
  int32_t prompt_length_ = 0;
};

struct GpuProgram;
// The device program of a decode schedule.
absl::StatusOr<GpuProgram> ProgramFromSchedule(const scheduler::Schedule& schedule);

// True when a CUDA device is present; `why` says why not otherwise.
bool GpuAvailable(std::string* why);

}  // namespace loom::runtime
