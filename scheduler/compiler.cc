#include "scheduler/compiler.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "graph/proto_file.h"
#include "instructions/isa.h"
#include "scheduler/assign.h"
#include "scheduler/cost_model.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/lowering.h"
#include "scheduler/graph_lowering.h"
#include "scheduler/options.h"
#include "scheduler/prefill.h"
#include "scheduler/schedule_verifier.h"

namespace loom::scheduler {

Schedule AssembleSchedule(Program& program, const CompileOptions& options, const std::string& model) {
  Schedule s;
  AssembleScheduleInto(program, options, model, &s);
  return s;
}

void AssembleScheduleInto(Program& program, const CompileOptions& options, const std::string& model, Schedule* out) {
  for (Node& node : program.nodes) node.cost_ns = CostOf(node.inst, options.cost()).total_ns();
  const std::vector<std::vector<int>> queues = AssignToSms(program, options);
  Schedule& s = *out;
  s.set_format_version(kScheduleFormatVersion);
  s.set_model(model);
  *s.mutable_options() = options;
  s.set_num_sms(options.num_sms());
  uint64_t streamed = 0;
  for (const Node& node : program.nodes) streamed += isa::InstructionFootprint(node.inst, 0).weight_bytes;
  s.set_weight_bytes_per_step(streamed);
  for (const std::vector<int>& queue : queues) {
    SmQueue* q = s.add_queues();
    q->mutable_instructions()->Reserve(static_cast<int>(queue.size()));
    for (int index : queue) {
      Node& node = program.nodes[index];
      Instruction* inst = q->add_instructions();
      EncodeInstructionInto(node.inst, inst);
      inst->set_op(std::move(node.op));
      inst->set_cost_ns(node.cost_ns);
    }
  }
  for (Barrier& b : program.barriers) *s.add_barriers() = std::move(b);
  for (Tensor& t : program.tensors) *s.add_tensors() = std::move(t);
  for (PackedWeight& p : program.packing) *s.add_packing() = std::move(p);
  for (Constant& c : program.constants) *s.add_constants() = std::move(c);
  *s.mutable_io() = program.io;
  s.set_weight_bytes(program.weight_bytes);
  s.set_arena_bytes(program.arena_bytes);
  s.set_max_seq(program.max_seq);
  s.set_vocab_size(program.vocab_size);
}

absl::StatusOr<Schedule> Compile(const graph::Graph& graph, const std::string& model, const CompileOptions& options) {
  CompileOptions resolved = ResolveOptions(options);
  if (!IsDecoderGraph(graph)) {  // a general graph: one run-once pass
    // Its small instructions (a split's zeroing, a copy, a pool chunk) take 1-2 us each in the graph variant, not
    // the decode opcodes' 300 ns: modelled at that, the list scheduler put them ahead of the critical path's
    // (H100, ResNet-18 at batch 8: 0.678 -> 0.627-0.629 ms with 1500; docs/history/performance_log.md).
    if (options.cost().instruction_overhead_ns() <= 0) {
      resolved.mutable_cost()->set_instruction_overhead_ns(kGraphInstructionOverheadNs);
    }
    if (absl::Status s = ValidateOptions(resolved); !s.ok()) return s;
    return CompileGraphPass(graph, model, resolved);
  }
  // A matvec keeps its whole input vector in the activation ring: wide inputs (an 8B model's 14336-wide
  // down-proj) get a larger ring, with room for partial sums of a few dozen rows.
  constexpr uint32_t kRowsOfRoom = 64;
  uint64_t needed = 0;
  for (const graph::OpDef& op : graph.def().ops()) {
    if (op.type() == graph::LINEAR) {
      const graph::TensorDef& w = graph.tensor(op.inputs(1));
      const uint32_t k = static_cast<uint32_t>(w.shape(1));
      needed = std::max(needed, w.dtype() == graph::I4 && w.group_size() >= 32
                                    ? isa::MatvecW4ActivationBytes(kRowsOfRoom, k, std::countr_zero(w.group_size()))
                                    : isa::MatvecActivationBytes(kRowsOfRoom, k));
    }
  }
  // At most what leaves two pages: a wider input is refused by the matvec lowering, naming its op and bytes.
  const uint64_t most = (kMaxSmemBytes - kSmemReserveBytes - 2ull * resolved.smem().page_bytes()) / 1024 * 1024;
  FitActivationRing(std::min(needed, most), options, &resolved);
  if (absl::Status s = ValidateOptions(resolved); !s.ok()) return s;
  absl::StatusOr<Program> program = LowerDecodeGraph(graph, resolved);
  if (!program.ok()) return program.status();
  // The prefill pass's weights: by default when the graph has a prefill lowering, an error when asked for.
  if (!options.has_prefill() || options.prefill()) {
    if (absl::Status s = PrefillSupported(graph); s.ok()) {
      if (absl::Status a = AddPrefillWeights(graph, resolved, &*program); !a.ok()) return a;
    } else if (options.has_prefill()) {
      return s;
    }
  }
  Schedule s = AssembleSchedule(*program, resolved, model);
  if (absl::Status st = VerifySchedule(s); !st.ok()) {
    return absl::InternalError(absl::StrCat("compiled schedule failed verification: ", st.message()));
  }
  return s;
}

absl::StatusOr<Schedule> LoadSchedule(const std::string& path) {
  Schedule s;
  if (absl::Status st = ReadProtoFile(path, &s); !st.ok()) return st;
  if (s.format_version() != kScheduleFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": schedule format version ", s.format_version(),
                                                   ", this loom reads ", kScheduleFormatVersion));
  }
  if (absl::Status st = VerifySchedule(s); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  }
  return s;
}

}  // namespace loom::scheduler
