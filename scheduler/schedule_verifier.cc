#include "scheduler/schedule_verifier.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "instructions/isa.h"
#include "scheduler/data_waits.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/options.h"

namespace loom::scheduler {
namespace {

// A prefill pass or a general graph's pass: its queues run once, not step after step.
bool RunsOnce(const Schedule& s) { return s.has_prefill() || s.has_graph(); }

constexpr int kStepsToSimulate = 2;  // a step, and the cross-step hand-off into the next
constexpr uint64_t kTensorAlignment = 16;  // what bulk copies need

absl::Status Fail(const std::string& why) { return absl::InvalidArgumentError(why); }

std::string Where(const Schedule& s, uint32_t sm, size_t index) {
  const Instruction& inst = s.queues(sm).instructions(index);
  return absl::StrCat("SM ", sm, " instruction ", index, " (", inst.opcode(), inst.op().empty() ? "" : " of ",
                      inst.op(), ")");
}

absl::Status CheckTensors(const Schedule& s, std::vector<isa::TensorInfo>* infos) {
  const uint64_t region_size[2] = {s.weight_bytes(), s.arena_bytes()};
  std::vector<std::pair<uint64_t, uint64_t>> arena;
  for (int i = 0; i < s.tensors_size(); ++i) {
    const Tensor& t = s.tensors(i);
    const std::string where = absl::StrCat("tensor ", i, " '", t.name(), "'");
    const int size = graph::DTypeSize(t.dtype());
    if (size == 0) return Fail(absl::StrCat(where, " has no dtype"));
    uint64_t elements = 1;
    for (int64_t d : t.shape()) {
      if (d <= 0 || d > (int64_t{1} << 40)) return Fail(absl::StrCat(where, " has dimension ", d));
      elements *= static_cast<uint64_t>(d);
      if (elements > (uint64_t{1} << 40)) return Fail(absl::StrCat(where, " is implausibly large"));
    }
    if (t.bytes() != elements * size) {
      return Fail(absl::StrCat(where, " declares ", t.bytes(), " bytes for ", elements, " elements"));
    }
    if (t.region() != WEIGHTS && t.region() != ARENA) return Fail(absl::StrCat(where, " has no valid region"));
    // A view may start at any f32 element (a CONCAT's slice, written by ELEMENTWISE alone, which checks alignment
    // before its float4 path); every other tensor is 16-byte aligned for bulk copies and vector loads.
    if (t.offset() % (t.view_of().empty() ? kTensorAlignment : 4) != 0) {
      return Fail(absl::StrCat(where, t.view_of().empty() ? " is not 16-byte aligned" : " is not 4-byte aligned"));
    }
    const uint64_t limit = region_size[t.region()];
    if (t.offset() > limit || t.bytes() > limit - t.offset()) {
      return Fail(absl::StrCat(where, " [", t.offset(), ", +", t.bytes(), ") overflows the ", Region_Name(t.region()),
                               " region of ", limit, " bytes"));
    }
    if (!t.view_of().empty()) {  // a range inside an earlier arena tensor
      int parent = -1;
      for (int j = 0; j < i; ++j) parent = s.tensors(j).name() == t.view_of() ? j : parent;
      if (parent < 0 || t.region() != ARENA || s.tensors(parent).region() != ARENA ||
          t.offset() < s.tensors(parent).offset() ||
          t.offset() + t.bytes() > s.tensors(parent).offset() + s.tensors(parent).bytes()) {
        return Fail(absl::StrCat(where, " is not inside the arena tensor '", t.view_of(), "' it views"));
      }
    } else if (t.region() == ARENA) {
      arena.emplace_back(t.offset(), t.offset() + t.bytes());
    }
    infos->push_back({t.name(), t.dtype(), elements});
  }
  std::sort(arena.begin(), arena.end());
  for (size_t i = 1; i < arena.size(); ++i) {
    if (arena[i].first < arena[i - 1].second) return Fail("two arena tensors overlap");
  }
  return absl::OkStatus();
}

absl::Status CheckIo(const Schedule& s, const std::vector<isa::TensorInfo>& t) {
  auto check = [&](const char* what, uint32_t id, graph::DType dtype, uint64_t elements) -> absl::Status {
    if (id >= t.size()) return Fail(absl::StrCat("io.", what, " names tensor ", id, " of ", t.size()));
    if (t[id].dtype != dtype || t[id].elements < elements) {
      return Fail(absl::StrCat("io.", what, " tensor '", t[id].name, "' must be ", graph::DTypeName(dtype), " with ",
                               elements, " elements"));
    }
    return absl::OkStatus();
  };
  if (s.has_graph()) {  // a general graph's pass: its named f32 inputs (or i32 ids) and outputs, no decode state
    if (s.graph().outputs_size() == 0) return Fail("graph: no outputs");
    for (const auto* list : {&s.graph().inputs(), &s.graph().outputs()}) {
      for (const IoTensor& io : *list) {
        const bool ids = list == &s.graph().inputs() && io.id_limit() > 0;  // i32 ids below id_limit
        if (io.tensor() >= t.size() || s.tensors(io.tensor()).region() != ARENA ||
            t[io.tensor()].dtype != (ids ? graph::I32 : graph::F32)) {
          return Fail(absl::StrCat("graph: '", io.name(), "' names no ", ids ? "i32" : "f32", " arena tensor"));
        }
      }
    }
    return absl::OkStatus();
  }
  if (absl::Status st = check("tokens", s.io().tokens(), graph::I32, uint64_t{s.max_seq()} + 1); !st.ok()) return st;
  if (absl::Status st = check("step_state", s.io().step_state(), graph::I32, isa::kStepStateWords); !st.ok()) return st;
  return check("logits", s.io().logits(), graph::F32, s.vocab_size());
}

absl::Status CheckPackingAndConstants(const Schedule& s, const std::vector<isa::TensorInfo>& infos) {
  auto find = [&](const std::string& name) -> int {
    for (int i = 0; i < s.tensors_size(); ++i) {
      if (s.tensors(i).name() == name) return i;
    }
    return -1;
  };
  for (const PackedWeight& p : s.packing()) {
    const int id = find(p.tensor());
    const graph::DType dtype =
        p.dtype() == graph::F32 || p.dtype() == graph::F8E4M3 || p.dtype() == graph::I4 || p.int4_meta() ? p.dtype()
                                                                                                         : graph::BF16;
    if (id < 0 || s.tensors(id).region() != WEIGHTS || s.tensors(id).dtype() != dtype) {
      return Fail(absl::StrCat("packing names '", p.tensor(), "', which is not a ", graph::DTypeName(dtype),
                               " tensor in WEIGHTS"));
    }
    const uint64_t stride = p.row_stride() > 0 ? p.row_stride() : p.cols();
    if (p.tile_rows() != 0 && (p.tile_rows() != isa::kGemmTileM || infos[id].elements % (isa::kGemmSlabBytes / 2) != 0)) {
      return Fail(absl::StrCat("packing of '", p.tensor(), "' is not a whole number of ", isa::kGemmTileM,
                               "-row operand image slabs"));
    }
    // (int4 values: rows of stride / 2 bytes; their meta: rows of groups words)
    const uint64_t row_elements = p.int4_meta() ? 1 : p.dtype() == graph::I4 ? stride / 2 : stride;
    if (p.cols() == 0 || stride < p.cols() || (p.tile_rows() == 0 && infos[id].elements % row_elements != 0) ||
        p.sources_size() == 0) {
      return Fail(absl::StrCat("packing of '", p.tensor(), "' has no sources or a bad column count / row stride"));
    }
  }
  for (const Constant& c : s.constants()) {
    const int id = find(c.tensor());
    const graph::DType dtype = id < 0 ? graph::DTYPE_UNSPECIFIED : s.tensors(id).dtype();
    if (id < 0 || s.tensors(id).region() != WEIGHTS || (dtype != graph::F32 && dtype != graph::I32) ||
        infos[id].elements != static_cast<uint64_t>(c.values_size())) {
      return Fail(absl::StrCat("constant '", c.tensor(), "' does not match an f32 or i32 WEIGHTS tensor of its size"));
    }
    for (float v : c.values()) {
      if (dtype == graph::I32 && !(std::nearbyint(v) == v && std::fabs(v) <= 16777216.0f)) {
        return Fail(absl::StrCat("constant '", c.tensor(), "' holds ", v, ", not an integer an f32 holds exactly"));
      }
    }
  }
  return absl::OkStatus();
}

// Runs the queues on counters for kStepsToSimulate steps; any state where no
// SM can move and some have work left is a deadlock.
absl::Status CheckProgress(const Schedule& s, const DecodedSchedule& d) {
  const uint32_t sms = s.num_sms();
  std::vector<uint32_t> counters(d.signals_per_step.size(), 0);
  std::vector<size_t> done(sms, 0);
  const size_t per_step_total = [&] {
    size_t n = 0;
    for (const auto& q : d.queues) n += q.size();
    return n;
  }();
  size_t executed = 0;
  const int steps = RunsOnce(s) ? 1 : kStepsToSimulate;  // a pass runs once
  const size_t goal = per_step_total * steps;
  while (executed < goal) {
    bool progress = false;
    for (uint32_t sm = 0; sm < sms; ++sm) {
      const auto& q = d.queues[sm];
      while (!q.empty() && done[sm] < q.size() * steps) {
        const uint32_t step = static_cast<uint32_t>(done[sm] / q.size());
        const isa::Instruction& inst = q[done[sm] % q.size()];
        bool ready = true;
        for (int w = 0; w < inst.num_waits && ready; ++w) {
          ready = isa::Reached(counters[inst.waits[w].barrier()], inst.waits[w].target(step));
        }
        if (!ready) break;
        if (inst.signal != isa::kNoBarrier) ++counters[inst.signal];
        ++done[sm];
        ++executed;
        progress = true;
      }
    }
    if (!progress) {
      for (uint32_t sm = 0; sm < sms; ++sm) {
        const auto& q = d.queues[sm];
        if (q.empty() || done[sm] >= q.size() * steps) continue;
        const uint32_t step = static_cast<uint32_t>(done[sm] / q.size());
        const size_t index = done[sm] % q.size();
        const isa::Instruction& inst = q[index];
        for (int w = 0; w < inst.num_waits; ++w) {
          const uint32_t b = inst.waits[w].barrier();
          if (!isa::Reached(counters[b], inst.waits[w].target(step))) {
            return Fail(absl::StrCat("deadlock: ", Where(s, sm, index), " in step ", step, " waits on barrier ", b,
                                     " '", s.barriers(b).name(), "' (value ", counters[b], ", target ",
                                     inst.waits[w].target(step), ") that can never be reached"));
          }
        }
      }
      return Fail("deadlock");
    }
  }
  return absl::OkStatus();
}

// A folded EMBED (isa::EmbedArgs::folded) runs only in a launch's first step: exactly one ARGMAX_REDUCE must store
// its row the step before, from the same table and shape; and an ARGMAX_REDUCE stores a next row only for one.
absl::Status CheckFoldedEmbedding(const std::vector<const isa::Instruction*>& step,
                                  const std::vector<std::string>& names) {
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i]->op() == isa::Opcode::ARGMAX_REDUCE) {
      const isa::ArgmaxReduceArgs& r = step[i]->as<isa::ArgmaxReduceArgs>();
      if (r.embed_out == isa::kNoTensor) continue;
      int embeds = 0;
      for (const isa::Instruction* e : step) {
        if (e->op() != isa::Opcode::EMBED) continue;
        const isa::EmbedArgs& a = e->as<isa::EmbedArgs>();
        embeds += a.folded == 1 && a.out == r.embed_out && a.table == r.embed_table && a.hidden == r.hidden &&
                  a.vocab == r.vocab && a.row_stride == r.row_stride;
      }
      if (embeds != 1) {
        return Fail(absl::StrCat(names[i], ": ARGMAX_REDUCE stores the next step's row of tensor ", r.embed_out,
                                 ", which ", embeds, " folded EMBEDs of the same table and shape write (needs 1)"));
      }
    } else if (step[i]->op() == isa::Opcode::EMBED && step[i]->as<isa::EmbedArgs>().folded == 1) {
      const isa::EmbedArgs& a = step[i]->as<isa::EmbedArgs>();
      bool stored = false;
      for (const isa::Instruction* r : step) {
        stored |= r->op() == isa::Opcode::ARGMAX_REDUCE && r->as<isa::ArgmaxReduceArgs>().embed_out == a.out;
      }
      if (!stored) {
        return Fail(absl::StrCat(names[i], ": a folded EMBED (it runs only in a launch's first step) whose row no "
                                 "ARGMAX_REDUCE stores the step before"));
      }
    }
  }
  return absl::OkStatus();
}

// Every instruction lies between the step's first and last instruction in the
// dependency order: what makes reusing activation buffers across steps safe.
absl::Status CheckStepOrder(const Schedule& s, const DecodedSchedule& d) {
  std::vector<std::pair<uint32_t, size_t>> where;
  std::vector<const isa::Instruction*> nodes;
  for (uint32_t sm = 0; sm < d.queues.size(); ++sm) {
    for (size_t i = 0; i < d.queues[sm].size(); ++i) {
      where.emplace_back(sm, i);
      nodes.push_back(&d.queues[sm][i]);
    }
  }
  const size_t n = nodes.size();
  if (n == 0) return Fail("schedule has no instructions");
  // The dependency graph with each barrier as a node between its signalers and its waiters (edges producer ->
  // barrier -> consumer through full same-step waits; partial waits prove no order): linear in the instructions,
  // where instruction-to-instruction edges would be signalers x waiters per barrier (millions in a prefill pass).
  const size_t barriers = d.signals_per_step.size();
  std::vector<int> signalers(barriers, 0);
  for (size_t i = 0; i < n; ++i) {
    if (nodes[i]->signal < barriers) ++signalers[nodes[i]->signal];
  }
  std::vector<std::vector<int>> waiters(barriers);  // instruction indices, once per wait
  std::vector<int> indegree(n + barriers, 0);
  for (size_t i = 0; i < n; ++i) {
    for (int w = 0; w < nodes[i]->num_waits; ++w) {
      const isa::Wait& wait = nodes[i]->waits[w];
      if (wait.previous_step() || wait.count() != wait.stride() || wait.barrier() >= barriers ||
          signalers[wait.barrier()] == 0) {
        continue;
      }
      waiters[wait.barrier()].push_back(static_cast<int>(i));
      ++indegree[i];
    }
  }
  for (size_t b = 0; b < barriers; ++b) indegree[n + b] = signalers[b];
  std::vector<int> sources, sinks;  // instructions nothing in the step precedes / follows
  for (size_t i = 0; i < n; ++i) {
    if (indegree[i] == 0) sources.push_back(static_cast<int>(i));
    if (nodes[i]->signal >= barriers || waiters[nodes[i]->signal].empty()) sinks.push_back(static_cast<int>(i));
  }
  auto name = [&](int i) { return Where(s, where[i].first, where[i].second); };
  if (sources.size() != 1 && !RunsOnce(s)) {  // a pass runs once: it may start anywhere
    return Fail(absl::StrCat("step order: ", name(sources.size() > 1 ? sources[1] : 0),
                             " does not depend on the step's first instruction (", sources.size(),
                             " instructions start a step)"));
  }
  if (sinks.size() != 1 && !(s.has_graph() && !sinks.empty())) {  // a graph's pass may end in several outputs
    return Fail(absl::StrCat("step order: nothing in the step depends on ", name(sinks.size() > 1 ? sinks[1] : 0),
                             " (", sinks.size(), " instructions end a step)"));
  }
  // A single source and a single sink in a DAG: every node reaches the sink and is reached from the source.
  // Check the DAG is acyclic (Kahn's order visits every node) and the last instruction is what the next step
  // waits on.
  std::deque<int> ready;
  for (size_t v = 0; v < n + barriers; ++v) {
    if (indegree[v] == 0) ready.push_back(static_cast<int>(v));
  }
  size_t seen = 0;
  while (!ready.empty()) {
    const int v = ready.front();
    ready.pop_front();
    ++seen;
    if (static_cast<size_t>(v) < n) {
      const uint32_t b = nodes[v]->signal;
      if (b < barriers && --indegree[n + b] == 0) ready.push_back(static_cast<int>(n + b));
    } else {
      for (int j : waiters[v - n]) {
        if (--indegree[j] == 0) ready.push_back(j);
      }
    }
  }
  if (seen != n + barriers) return Fail("step order: the dependencies inside a step form a cycle");
  const isa::Instruction& first = *nodes[sources[0]];
  bool first_waits_on_last = false;
  for (int w = 0; w < first.num_waits; ++w) {
    first_waits_on_last |= first.waits[w].previous_step() && first.waits[w].barrier() == nodes[sinks[0]]->signal &&
                           first.waits[w].count() == first.waits[w].stride();
  }
  if (!first_waits_on_last && !RunsOnce(s)) {
    return Fail(absl::StrCat("step order: the step's first instruction, ", name(sources[0]),
                             ", does not wait for the previous step's last, ", name(sinks[0])));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifySchedule(const Schedule& s) {
  absl::StatusOr<DecodedSchedule> decoded = DecodeSchedule(s);
  if (!decoded.ok()) return decoded.status();
  const DecodedSchedule& d = *decoded;

  // Barriers: declared signals match the instructions; every barrier fires.
  std::vector<uint32_t> signals(s.barriers_size(), 0);
  for (const auto& q : d.queues) {
    for (const isa::Instruction& inst : q) {
      if (inst.signal != isa::kNoBarrier) ++signals[inst.signal];
    }
  }
  for (int b = 0; b < s.barriers_size(); ++b) {
    if (signals[b] == 0) return Fail(absl::StrCat("barrier ", b, " '", s.barriers(b).name(), "' never fires"));
    if (signals[b] != s.barriers(b).signals_per_step()) {
      return Fail(absl::StrCat("barrier ", b, " '", s.barriers(b).name(), "' declares ",
                               s.barriers(b).signals_per_step(), " signals per step, instructions give ", signals[b]));
    }
  }

  std::vector<isa::TensorInfo> infos;
  if (absl::Status st = CheckTensors(s, &infos); !st.ok()) return st;
  if (absl::Status st = CheckIo(s, infos); !st.ok()) return st;
  if (absl::Status st = CheckPackingAndConstants(s, infos); !st.ok()) return st;

  const SmemConfig& smem = s.options().smem();
  if (smem.page_bytes() == 0 || smem.num_pages() < 2 || smem.activation_slots() < 1 ||
      smem.activation_slots() > kMaxActivationSlots || SmemTotalBytes(smem) > kMaxSmemBytes) {
    return Fail(absl::StrCat("shared memory: ", smem.num_pages(), " pages of ", smem.page_bytes(), " bytes + ",
                             smem.activation_bytes(), " bytes of activation ring in ", smem.activation_slots(),
                             " slots do not fit an SM's ", kMaxSmemBytes));
  }
  if (smem.matvec_pages_in_flight() > smem.num_pages()) {  // (0, in schedules written before the field: the ring)
    return Fail(absl::StrCat("options.smem.matvec_pages_in_flight ", smem.matvec_pages_in_flight(),
                             " is more than the ", smem.num_pages(), " pages of the ring"));
  }
  for (uint32_t sm = 0; sm < d.queues.size(); ++sm) {
    for (size_t i = 0; i < d.queues[sm].size(); ++i) {
      const isa::Instruction& inst = d.queues[sm][i];
      if (absl::Status st = isa::ValidateInstruction(inst, infos); !st.ok()) {
        return Fail(absl::StrCat(Where(s, sm, i), ": ", st.message()));
      }
      if (isa::UsesTensorCores(inst.op()) && smem.page_bytes() < isa::kGemmSlabBytes) {
        return Fail(absl::StrCat(Where(s, sm, i), ": its pages hold ", isa::kGemmSlabBytes, " bytes, a page ",
                                 smem.page_bytes()));
      }
      if (absl::Status st = isa::CheckPageBytes(inst, smem.page_bytes()); !st.ok()) {
        return Fail(absl::StrCat(Where(s, sm, i), ": ", st.message()));
      }
      if (inst.op() == isa::Opcode::CONV_GEMM &&
          isa::ConvGemmRingPages(inst.as<isa::ConvGemmArgs>(), smem.page_bytes()) > smem.num_pages()) {
        return Fail(absl::StrCat(Where(s, sm, i), ": a bf16 input's tile holds ",
                                 isa::ConvGemmRingPages(inst.as<isa::ConvGemmArgs>(), smem.page_bytes()),
                                 " pages of the ring at once; it has ", smem.num_pages()));
      }
      const isa::Footprint f = isa::InstructionFootprint(inst, s.max_seq());
      if (f.smem_bytes > smem.activation_bytes()) {
        return Fail(absl::StrCat(Where(s, sm, i), " needs ", f.smem_bytes, " bytes of activation buffer; the SM has ",
                                 smem.activation_bytes()));
      }
    }
  }
  // Waits observed in the data (instructions/instruction.h "Step tags") and the tags they rely on.
  std::vector<const isa::Instruction*> step;
  std::vector<std::string> names;
  for (uint32_t sm = 0; sm < d.queues.size(); ++sm) {
    for (size_t i = 0; i < d.queues[sm].size(); ++i) {
      step.push_back(&d.queues[sm][i]);
      names.push_back(Where(s, sm, i));
    }
  }
  if (absl::Status st = CheckDataWaits(step, TensorElements(s.tensors()), names); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  if (absl::Status st = CheckFoldedEmbedding(step, names); !st.ok()) return st;
  if (absl::Status st = CheckProgress(s, d); !st.ok()) return st;
  return CheckStepOrder(s, d);
}

}  // namespace loom::scheduler
