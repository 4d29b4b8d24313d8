// RunOnGpu: a compiled decode schedule on the megakernel.
#include "megakernel/gpu_backend.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "megakernel/gpu_machine.h"
#include "megakernel/trace.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/packing.h"

namespace loom::megakernel {

bool GpuAvailable(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? absl::StrCat("no CUDA device (", cudaGetErrorString(e), ")") : "no CUDA device";
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
  return p;
}

absl::StatusOr<GpuRunResult> RunOnGpu(const scheduler::Schedule& schedule, const graph::WeightStore& weights,
                                      const std::vector<int32_t>& prompt, int steps, const GpuRunOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt needs at least one token");
  for (int32_t t : prompt) {
    if (t < 0 || static_cast<uint32_t>(t) >= schedule.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", t, " outside the vocabulary of ",
                                                     schedule.vocab_size()));
    }
  }
  if (steps < 1 || static_cast<uint64_t>(steps) >= schedule.max_seq() || prompt.size() > schedule.max_seq()) {
    return absl::OutOfRangeError(absl::StrCat(steps, " steps do not fit the KV cache of ", schedule.max_seq()));
  }
  absl::StatusOr<GpuProgram> program = ProgramFromSchedule(schedule);
  if (!program.ok()) return program.status();
  absl::StatusOr<std::vector<uint8_t>> packed = scheduler::PackWeights(schedule, weights);
  if (!packed.ok()) return packed.status();
  absl::StatusOr<std::unique_ptr<GpuMachine>> machine = GpuMachine::Create(*program, *packed);
  if (!machine.ok()) return machine.status();
  GpuMachine& m = **machine;

  const scheduler::Tensor& tokens = schedule.tensors(schedule.io().tokens());
  const scheduler::Tensor& state = schedule.tensors(schedule.io().step_state());
  int32_t state_words[isa::kStepStateWords] = {};
  state_words[isa::kStatePromptLength] = static_cast<int32_t>(prompt.size());
  if (absl::Status s = m.WriteArena(tokens.offset(), prompt.data(), prompt.size() * 4); !s.ok()) return s;
  if (absl::Status s = m.WriteArena(state.offset(), state_words, sizeof(state_words)); !s.ok()) return s;

  const int per_launch = options.steps_per_launch > 0 ? options.steps_per_launch : steps;
  const bool trace = !options.trace_path.empty();
  GpuRunResult result;
  double total_ms = 0;
  std::vector<TraceEvent> all_events;
  for (int done = 0; done < steps; done += per_launch) {
    const uint32_t n = static_cast<uint32_t>(std::min(per_launch, steps - done));
    absl::StatusOr<float> ms = m.Run(n, trace);
    if (!ms.ok()) return ms.status();
    total_ms += *ms;
    if (trace) all_events.insert(all_events.end(), m.trace().begin(), m.trace().end());
  }
  result.ms_per_token = total_ms / steps;
  int32_t position = 0;
  if (absl::Status s = m.ReadArena(state.offset() + 4 * isa::kStatePosition, &position, 4); !s.ok()) return s;
  result.tokens.resize(position + 1);
  if (absl::Status s = m.ReadArena(tokens.offset(), result.tokens.data(), result.tokens.size() * 4); !s.ok()) return s;
  result.logits.resize(schedule.vocab_size());
  if (absl::Status s = m.ReadArena(schedule.tensors(schedule.io().logits()).offset(), result.logits.data(),
                                   result.logits.size() * 4);
      !s.ok()) {
    return s;
  }
  if (trace) {
    TraceInput in{&*program, &m.queue_begin(), &all_events, static_cast<uint32_t>(steps),
                  schedule.weight_bytes_per_step()};
    if (absl::Status s = WriteChromeTrace(options.trace_path, in); !s.ok()) return s;
    result.summary = TraceSummary(in);
  }
  return result;
}

}  // namespace loom::megakernel
