// loom_bench: decode speed of the megakernel next to the memory-bandwidth floor,
// all measured in one process on one GPU:
//   1. read bandwidth: a plain read kernel over the packed weights (median of 20)
//   2. page-ring streaming: the same bytes through the megakernel's MATVEC with
//      no dependencies (what the interpreter costs before any barrier), and the
//      consumer rate: the same with weight loads skipped
//   3. decode: random prompt of C tokens (KV cache filled by decode steps), then
//      --tokens generated tokens in one launch, median of --repeats, per context C;
//      then the same with weight loads skipped ("no-loads": compute and the
//      dependency chain alone, garbage results). Floor: the weights read once at the measured bandwidth; floor+KV
//      adds the KV cache the timed steps read (issue 45's long-context target is against it).
// --models=a,b,c runs all of it per model (one at a time on the GPU), then
// prints the sweep: each model's ms/token per context against its own floor,
//   loom_bench --models=random:tests/data/hf_configs/transformers5/tinyllama-1.1b.json,random:llama-3.2-1b,...
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "graph/model.h"
#include "megakernel/bandwidth_probe.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/trace.h"
#include "scheduler/compiler.h"
#include "scheduler/options.h"
#include "scheduler/packing.h"

ABSL_FLAG(std::string, model, "random:llama-3.2-1b",
          "model: random:<preset>, random:<config.json> or a Hugging Face folder");
ABSL_FLAG(std::string, models, "", "comma-separated models to sweep (overrides --model), a summary table at the end");
ABSL_FLAG(std::string, contexts, "128,1024", "comma-separated context lengths to decode at");
ABSL_FLAG(int32_t, tokens, 128, "tokens generated per timed run");
ABSL_FLAG(int32_t, repeats, 5, "timed runs per context (median reported)");
ABSL_FLAG(int32_t, max_seq, 2048, "KV-cache capacity");
ABSL_FLAG(std::string, scheme, "",
          "random models: FP8 generates the projections as FP8 (a scale per row), W4A16 as int4 (a bf16 scale per "
          "--group_size columns)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "decoders' KV cache: f32, or bf16 (half its memory and of what decode attention reads; K and V rounded to "
          "bf16 as they are appended)");
ABSL_FLAG(int32_t, group_size, 128, "--scheme=W4A16: columns per scale");
ABSL_FLAG(std::string, options, "", "CompileOptions file (.pbtxt)");
ABSL_FLAG(std::string, trace, "",
          "write a Chrome trace of one run at the last context here (with --models: one file per model, its index "
          "before the extension)");
ABSL_FLAG(bool, trace_no_loads, false,
          "with --trace: also trace a run with weight loads skipped (what the consumers and the dependency chain take "
          "alone; garbage results), into the trace's name with .no_loads before the extension");

namespace loom {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "loom_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

constexpr uint32_t kStreamK = 2048;

// Every SM streams its share of the packed weights through MATVEC tiles (k = 2048) with no waits.
absl::StatusOr<std::unique_ptr<runtime::GpuMachine>> StreamMachine(const std::vector<uint8_t>& packed,
                                                                     const scheduler::Schedule& s) {
  constexpr uint32_t kK = kStreamK, kTileRows = 1024;
  const uint64_t rows_total = packed.size() / (2 * kK);
  runtime::GpuProgram p;
  p.tensors.push_back({0, rows_total * kK * 2, isa::kWeightRegion, graph::BF16});
  p.tensors.push_back({0, kK * 4, isa::kArenaRegion, graph::F32});
  p.tensors.push_back({kK * 4, rows_total * 4, isa::kArenaRegion, graph::F32});
  p.arena_bytes = kK * 4 + rows_total * 4;
  p.page_bytes = s.options().smem().page_bytes();
  p.num_pages = s.options().smem().num_pages();
  p.activation_bytes = s.options().smem().activation_bytes();
  p.activation_slots = s.options().smem().activation_slots();
  p.queues.resize(s.num_sms());
  const uint64_t per_sm = (rows_total + s.num_sms() - 1) / s.num_sms();
  for (uint32_t sm = 0; sm < s.num_sms(); ++sm) {
    for (uint64_t r = sm * per_sm; r < std::min(rows_total, (sm + 1) * per_sm); r += kTileRows) {
      isa::Instruction inst{};
      inst.opcode = static_cast<uint8_t>(isa::Opcode::MATVEC);
      inst.signal = isa::kNoBarrier;
      isa::MatvecArgs& a = inst.as<isa::MatvecArgs>();
      a.weight = 0;
      a.row_begin = static_cast<uint32_t>(r);
      a.rows = static_cast<uint32_t>(std::min<uint64_t>(kTileRows, std::min(rows_total, (sm + 1) * per_sm) - r));
      a.k = kK;
      a.input = 1;
      a.out = 2;
      a.bias = isa::kNoTensor;
      p.queues[sm].push_back(inst);
    }
  }
  absl::StatusOr<std::unique_ptr<runtime::GpuMachine>> m = runtime::GpuMachine::Create(p, packed);
  if (!m.ok()) return m.status();
  std::vector<float> x(kK);
  std::mt19937 rng(1);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  if (absl::Status st = (*m)->WriteArena(0, x.data(), kK * 4); !st.ok()) return st;
  return m;
}

// The interpreter's streaming rate with no dependencies in the way. With `skip_loads`, pages are not loaded at all:
// the rate the consumers can take pages at.
absl::StatusOr<double> StreamOnlyMs(runtime::GpuMachine& m, bool skip_loads) {
  m.SetSkipWeightLoads(skip_loads);
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    absl::StatusOr<float> t = m.Run(1, false);
    if (!t.ok()) return t.status();
    if (r >= 2) ms.push_back(*t);
  }
  m.SetSkipWeightLoads(false);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Per SM, the same streaming traced: how fast each SM streams its equal share while all stream at once, and on which
// SM (%smid) each block ran, in 3 launches. Decode stages wait for their slowest SM (docs/history/performance_log.md).
absl::Status PrintPerSmStreaming(runtime::GpuMachine& m, uint64_t packed_bytes) {  // m: a StreamMachine
  const uint32_t sms = m.num_sms();
  const uint64_t rows_total = packed_bytes / (2 * kStreamK), per_sm = (rows_total + sms - 1) / sms;
  std::vector<std::vector<double>> gbps(sms);
  std::vector<std::vector<uint32_t>> smids;
  for (int launch = 0; launch < 3; ++launch) {
    if (absl::StatusOr<float> t = m.Run(1, true); !t.ok()) return t.status();
    const std::vector<megakernel::TraceEvent>& trace = m.trace();
    const std::vector<uint32_t>& begin = m.queue_begin();
    for (uint32_t b = 0; b < sms; ++b) {
      if (begin[b + 1] == begin[b]) continue;
      const uint64_t first = trace[begin[b]].start, last = trace[begin[b + 1] - 1].end;
      const uint64_t rows = std::min(rows_total, (b + 1) * per_sm) - b * per_sm;  // as StreamMachine splits them
      if (last > first) gbps[b].push_back(static_cast<double>(rows * kStreamK * 2) / static_cast<double>(last - first));
    }
    smids.push_back(m.smids());
  }
  std::vector<std::pair<double, uint32_t>> rate;  // median GB/s, block
  for (uint32_t b = 0; b < sms; ++b) {
    if (gbps[b].empty()) continue;
    std::sort(gbps[b].begin(), gbps[b].end());
    rate.push_back({gbps[b][gbps[b].size() / 2], b});
  }
  if (rate.empty()) return absl::OkStatus();
  std::sort(rate.begin(), rate.end());
  bool identity = true;
  for (uint32_t b = 0; b < sms; ++b) identity = identity && smids[0][b] == b;
  const bool stable = smids[1] == smids[0] && smids[2] == smids[0];
  std::printf("per-SM streaming (the same tiles traced, all SMs at once): min %.1f, median "
              "%.1f, max %.1f GB/s\n  slowest blocks (SM):",
              rate.front().first, rate[rate.size() / 2].first, rate.back().first);
  for (size_t i = 0; i < std::min<size_t>(8, rate.size()); ++i) {
    std::printf(" %u (%u) %.1f", rate[i].second, smids[0][rate[i].second], rate[i].first);
  }
  std::printf("\n  fastest blocks (SM):");
  for (size_t i = rate.size() - std::min<size_t>(8, rate.size()); i < rate.size(); ++i) {
    std::printf(" %u (%u) %.1f", rate[i].second, smids[0][rate[i].second], rate[i].first);
  }
  std::printf("\n  block -> SM the same in 3 launches: %s; block index == SM id: %s\n", stable ? "yes" : "no",
              identity ? "yes" : "no");
  return absl::OkStatus();
}

// One model's line of the sweep.
struct SweepRow {
  std::string model;
  double gb = 0, floor_ms = 0;
  std::vector<double> ms;  // per context
};

// `text` inserted before the path's extension (at its end without one): trace.json -> trace<text>.json.
std::string InsertBeforeExtension(const std::string& path, const std::string& text) {
  const size_t dot = path.rfind('.');
  const size_t slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return absl::StrCat(path, text);
  return absl::StrCat(path.substr(0, dot), text, path.substr(dot));
}

// trace.json -> trace.2.json for model 2 of a sweep.
std::string TracePathFor(const std::string& path, size_t index, size_t models) {
  if (path.empty() || models < 2) return path;
  return InsertBeforeExtension(path, absl::StrCat(".", index));
}

// The whole bench for one model: its floor, streaming and consumer rates, decode per context (and a trace).
absl::StatusOr<SweepRow> BenchModel(const std::string& spec, scheduler::CompileOptions options,
                                    const std::vector<int>& contexts, const std::string& trace_path) {
  // Decode streams the decode weights only: the prefill pass's GEMM images are not packed unless asked for.
  if (!options.has_prefill()) options.set_prefill(false);
  graph::ModelOptions mo;
  mo.max_seq = absl::GetFlag(FLAGS_max_seq);
  mo.scheme = absl::GetFlag(FLAGS_scheme);
  mo.group_size = absl::GetFlag(FLAGS_group_size);
  {
    absl::StatusOr<graph::DType> kv = graph::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
    if (!kv.ok()) return kv.status();
    mo.kv_dtype = *kv;
  }
  std::fprintf(stderr, "loading %s...\n", spec.c_str());
  absl::StatusOr<graph::Model> model = graph::LoadModel(spec, mo);
  if (!model.ok()) return model.status();
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model->graph, spec, options);
  if (!s.ok()) return s.status();
  absl::StatusOr<std::unique_ptr<runtime::GpuDecoder>> decoder = runtime::GpuDecoder::Create(*s, model->weights);
  if (!decoder.ok()) return decoder.status();
  runtime::GpuDecoder& d = **decoder;

  absl::StatusOr<double> gbps = megakernel::MeasureReadBandwidth(d.machine().weights_device(),
                                                                 d.machine().weights_bytes(), 20);
  if (!gbps.ok()) return gbps.status();
  const double bytes = static_cast<double>(s->weight_bytes_per_step());
  const double floor_ms = bytes / (*gbps * 1e9) * 1e3;
  absl::StatusOr<std::vector<uint8_t>> packed = scheduler::PackWeights(*s, model->weights);
  if (!packed.ok()) return packed.status();
  absl::StatusOr<std::unique_ptr<runtime::GpuMachine>> stream = StreamMachine(*packed, *s);
  if (!stream.ok()) return stream.status();
  absl::StatusOr<double> stream_ms = StreamOnlyMs(**stream, false);
  if (!stream_ms.ok()) return stream_ms.status();
  absl::StatusOr<double> consume_ms = StreamOnlyMs(**stream, true);
  if (!consume_ms.ok()) return consume_ms.status();
  if (absl::Status st = PrintPerSmStreaming(**stream, packed->size()); !st.ok()) return st;
  stream->reset();
  packed->clear();
  packed->shrink_to_fit();
  model->weights.clear();  // on the GPU now

  SweepRow row{spec, bytes / 1e9, floor_ms, {}};
  std::printf("model %s: %.3f GB of weights read per token, %u SMs\n", spec.c_str(), bytes / 1e9, s->num_sms());
  std::printf("read bandwidth (plain read kernel over the packed weights, median of 20): %.0f GB/s -> floor %.3f ms/token\n",
              *gbps, floor_ms);
  std::printf("page-ring streaming (MATVEC tiles, no dependencies): %.3f ms for %.3f GB = %.0f GB/s\n", *stream_ms,
              static_cast<double>(d.machine().weights_bytes()) / 1e9,
              static_cast<double>(d.machine().weights_bytes()) / (*stream_ms * 1e-3) / 1e9);
  const double weight_gb = static_cast<double>(d.machine().weights_bytes()) / 1e9;
  std::printf("consumer rate (the same bf16 MATVEC tiles, weight loads skipped; not the quantized opcodes'): %.3f ms = "
              "%.0f GB/s, %.1f GB/s per SM\n",
              *consume_ms,
              weight_gb / (*consume_ms * 1e-3), weight_gb / (*consume_ms * 1e-3) / s->num_sms());
  // The KV cache a token reads: every cache's bytes a position (K and V of each layer), times the positions it
  // attends to (the timed steps' mean context); floor+KV adds them to the weights at the measured bandwidth.
  double kv_bytes_per_position = 0;
  for (const scheduler::Tensor& t : s->tensors()) {
    if (absl::EndsWith(t.name(), "_cache") && t.shape_size() == 3) {
      kv_bytes_per_position += static_cast<double>(t.bytes()) / static_cast<double>(t.shape(1));
    }
  }
  std::printf("\n%8s %8s %12s %12s %10s %10s %14s %10s %12s\n", "context", "tokens", "ms/token", "min..max", "floor",
              "x floor", "no-loads ms", "floor+KV", "x floor+KV");
  const int tokens = absl::GetFlag(FLAGS_tokens);
  std::mt19937 rng(7);
  for (int c : contexts) {
    if (c + tokens >= absl::GetFlag(FLAGS_max_seq)) return absl::OutOfRangeError("context + tokens > --max_seq");
    std::vector<int32_t> prompt(c);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % s->vocab_size());
    if (absl::Status st = d.Reset(prompt); !st.ok()) return st;
    if (c > 1) {
      absl::StatusOr<float> fill = d.Run(c - 1);  // the prompt, one decode step per token
      if (!fill.ok()) return fill.status();
    }
    // Timed twice: as it is, and with weight loads skipped (what compute and the dependency chain cost alone).
    double median[2], lo = 0, hi = 0;
    for (int skip = 0; skip < 2; ++skip) {
      d.machine().SetSkipWeightLoads(skip == 1);
      std::vector<float> ms;
      for (int r = 0; r < absl::GetFlag(FLAGS_repeats) + 1; ++r) {
        if (absl::Status st = d.SetPosition(c - 1); !st.ok()) return st;
        absl::StatusOr<float> t = d.Run(tokens);
        if (!t.ok()) return t.status();
        if (r > 0) ms.push_back(*t / tokens);  // the first is a warm-up
      }
      std::sort(ms.begin(), ms.end());
      median[skip] = ms[ms.size() / 2];
      if (skip == 0) lo = ms.front(), hi = ms.back();
    }
    d.machine().SetSkipWeightLoads(false);
    const double kv_floor_ms = (bytes + kv_bytes_per_position * (c + tokens / 2.0)) / (*gbps * 1e9) * 1e3;
    std::printf("%8d %8d %12.4f %5.3f..%5.3f %10.3f %9.3fx %14.4f %10.3f %11.3fx\n", c, tokens, median[0], lo, hi,
                floor_ms, median[0] / floor_ms, median[1], kv_floor_ms, median[0] / kv_floor_ms);
    row.ms.push_back(median[0]);
  }
  for (int skip = 0; skip < (absl::GetFlag(FLAGS_trace_no_loads) ? 2 : 1) && !trace_path.empty(); ++skip) {
    if (absl::Status st = d.SetPosition(contexts.back() - 1); !st.ok()) return st;
    constexpr int kTraceSteps = 8;
    d.machine().SetSkipWeightLoads(skip == 1);
    absl::StatusOr<float> t = d.Run(kTraceSteps, true);
    d.machine().SetSkipWeightLoads(false);
    if (!t.ok()) return t.status();
    absl::StatusOr<runtime::GpuProgram> program = runtime::ProgramFromSchedule(*s);
    if (!program.ok()) return program.status();
    const std::vector<std::vector<std::string>> ops = runtime::OpNames(*s);
    runtime::TraceInput in{&*program, &d.machine().queue_begin(), &d.machine().trace(), kTraceSteps,
                              s->weight_bytes_per_step(), &ops};
    const std::string path = skip == 0 ? trace_path : InsertBeforeExtension(trace_path, ".no_loads");
    if (absl::Status st = runtime::WriteChromeTrace(path, in); !st.ok()) return st;
    std::printf("\ncontext %d, traced%s (%s):\n%s", contexts.back(), skip == 1 ? " with weight loads skipped" : "",
                path.c_str(), runtime::TraceSummary(in).c_str());
  }
  return row;
}


int Main() {
  // The flags first: a bad one is named on any machine.
  if (absl::GetFlag(FLAGS_tokens) < 1) return Fail(absl::InvalidArgumentError("--tokens must be at least 1"));
  if (absl::GetFlag(FLAGS_repeats) < 1) return Fail(absl::InvalidArgumentError("--repeats must be at least 1"));
  std::vector<int> contexts;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_contexts), ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(c, &v) || v < 1) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--contexts: '", c, "' is not a positive context length")));
    }
    contexts.push_back(v);
  }
  if (contexts.empty()) return Fail(absl::InvalidArgumentError("--contexts: no context"));
  std::string why;
  if (!runtime::GpuAvailable(&why)) return Fail(absl::UnavailableError(why));
  scheduler::CompileOptions options;
  if (!absl::GetFlag(FLAGS_options).empty()) {
    absl::StatusOr<scheduler::CompileOptions> o = scheduler::LoadOptions(absl::GetFlag(FLAGS_options));
    if (!o.ok()) return Fail(o.status());
    options = *o;
  }
  options.set_max_seq(absl::GetFlag(FLAGS_max_seq));
  std::vector<std::string> models = absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());
  if (models.empty()) models.push_back(absl::GetFlag(FLAGS_model));
  std::vector<SweepRow> rows;
  for (size_t i = 0; i < models.size(); ++i) {
    if (i > 0) std::printf("\n");
    absl::StatusOr<SweepRow> row =
        BenchModel(models[i], options, contexts, TracePathFor(absl::GetFlag(FLAGS_trace), i, models.size()));
    if (!row.ok()) return Fail(absl::Status(row.status().code(), absl::StrCat(models[i], ": ", row.status().message())));
    rows.push_back(*std::move(row));
    std::fflush(stdout);
  }
  if (rows.size() < 2) return 0;
  std::printf("\nsweep (ms/token, median; x its own floor):\n%-60s %8s %9s", "model", "GB/token", "floor ms");
  for (int c : contexts) std::printf(" %19s", absl::StrCat("context ", c).c_str());
  std::printf("\n");
  for (const SweepRow& r : rows) {
    std::printf("%-60s %8.3f %9.3f", r.model.c_str(), r.gb, r.floor_ms);
    for (double ms : r.ms) std::printf("   %7.3f (%6.3fx)", ms, ms / r.floor_ms);  // a 1.4x target reads at 3 digits
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::Main();
}
