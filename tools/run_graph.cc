#include "tools/run_graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/evaluator.h"
#include "graph/npy.h"
#include "runtime/graph_runner.h"

namespace loom::tools {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "loom: %s\n", std::string(status.message()).c_str());
  return 1;
}

absl::StatusOr<runtime::TensorMap> Inputs(const graph::Graph& graph, const scheduler::Schedule& pass,
                                          const GraphRunFlags& flags) {
  runtime::TensorMap inputs;
  const std::vector<const graph::TensorDef*> defs = graph.TensorsOfKind(graph::INPUT);
  if (flags.input.empty() || flags.input == "random") {  // uniform in [-1, 1), seeded
    std::mt19937_64 rng(flags.seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (const graph::TensorDef* d : defs) {
      graph::HostTensor t = graph::HostTensor::Zeros(*d);
      for (float& v : t.f32) v = u(rng);
      if (d->dtype() == graph::I32) {  // ids: uniform over the rows of the smallest table they index
        uint64_t limit = 1;
        for (const scheduler::IoTensor& io : pass.graph().inputs()) {
          if (io.name() == d->name()) limit = std::max<uint64_t>(io.id_limit(), 1);
        }
        std::uniform_int_distribution<int32_t> ids(0, static_cast<int32_t>(std::min<uint64_t>(limit, INT32_MAX) - 1));
        for (int32_t& v : t.i32) v = ids(rng);
      }
      inputs[d->name()] = std::move(t);
    }
    return inputs;
  }
  for (absl::string_view entry : absl::StrSplit(flags.input, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (parts.size() == 1) {
      if (defs.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--input: the graph has ", defs.size(), " inputs; name each as name=file.npy"));
      }
      parts.insert(parts.begin(), defs[0]->name());
    }
    if (!graph.HasTensor(parts[0]) || graph.tensor(parts[0]).kind() != graph::INPUT) {
      return absl::InvalidArgumentError(absl::StrCat("--input: the graph has no input '", parts[0], "'"));
    }
    absl::StatusOr<graph::HostTensor> t = graph::ReadNpy(parts[1]);
    if (!t.ok()) return t.status();
    inputs[parts[0]] = *std::move(t);
  }
  for (const graph::TensorDef* d : defs) {
    if (!inputs.contains(d->name())) {
      return absl::InvalidArgumentError(absl::StrCat("--input: no file for input '", d->name(), "'"));
    }
  }
  return inputs;
}

}  // namespace

int RunGraph(const graph::Model& model, const scheduler::Schedule& pass, const GraphRunFlags& flags) {
  if (!flags.out.empty()) {  // created as `loom export` creates its folder, before any work
    std::error_code ec;
    std::filesystem::create_directories(flags.out, ec);
    if (ec) return Fail(absl::PermissionDeniedError(absl::StrCat(flags.out, ": cannot create: ", ec.message())));
  }
  absl::StatusOr<runtime::TensorMap> inputs = Inputs(model.graph, pass, flags);
  if (!inputs.ok()) return Fail(inputs.status());
  int instructions = 0;
  for (const scheduler::SmQueue& q : pass.queues()) instructions += q.instructions_size();
  std::fprintf(stderr, "graph pass: %d instructions on %u SMs, %d stages, weights %.1f MB, arena %.1f MB\n",
               instructions, pass.num_sms(), pass.barriers_size(), pass.weight_bytes() / 1e6, pass.arena_bytes() / 1e6);
  absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner = runtime::GraphRunner::Create(
      pass, model.weights,
      flags.backend == "gpu" ? runtime::GraphRunner::Backend::kGpu : runtime::GraphRunner::Backend::kCpu);
  if (!runner.ok()) return Fail(runner.status());
  absl::StatusOr<runtime::TensorMap> outputs;
  std::vector<float> ms;
  const int runs = std::max(1, flags.repeat);
  for (int i = 0; i < runs; ++i) {
    outputs = (*runner)->Run(*inputs, !flags.trace.empty() && i == runs - 1);
    if (!outputs.ok()) return Fail(outputs.status());
    if (flags.trace.empty() || i < runs - 1 || runs == 1) ms.push_back((*runner)->last_ms());  // untraced times
  }
  if (!flags.trace.empty()) {
    absl::StatusOr<std::string> report = (*runner)->TraceReport(flags.trace);
    if (!report.ok()) return Fail(report.status());
    std::printf("%s", report->c_str());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s: %s pass in %.3f ms (%s over %zu runs)\n", pass.model().c_str(), flags.backend.c_str(),
              ms[ms.size() / 2], flags.backend == "gpu" ? "kernel time, median" : "wall time, median", ms.size());

  std::unique_ptr<graph::Evaluator> oracle;
  if (flags.check) {
    oracle = std::make_unique<graph::Evaluator>(model.graph, model.weights);
    absl::flat_hash_map<std::string, graph::HostTensor> in(inputs->begin(), inputs->end());
    if (absl::Status s = oracle->Run(in); !s.ok()) return Fail(s);
  }
  bool agree = true;
  for (const scheduler::IoTensor& io : pass.graph().outputs()) {
    const graph::HostTensor& y = outputs->at(io.name());
    double sum = 0, lo = INFINITY, hi = -INFINITY;
    for (float v : y.f32) sum += v, lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
    std::printf("output '%s' [%s]: mean %.5g, min %.5g, max %.5g", io.name().c_str(),
                absl::StrJoin(y.shape, ", ").c_str(), y.f32.empty() ? 0.0 : sum / y.f32.size(), lo, hi);
    if (oracle != nullptr) {
      const graph::HostTensor& ref = oracle->Get(io.name());
      double err = 0, norm = 0, worst = 0;
      for (size_t i = 0; i < y.f32.size(); ++i) {
        const double d = y.f32[i] - ref.Get(static_cast<int64_t>(i));
        err += d * d;
        norm += static_cast<double>(ref.Get(static_cast<int64_t>(i))) * ref.Get(static_cast<int64_t>(i));
        worst = std::max(worst, std::fabs(d));
      }
      const double rel = std::sqrt(err / std::max(norm, 1e-30));
      const bool ok = std::isfinite(rel) && rel <= runtime::kGraphTolerance;
      agree &= ok;
      std::printf("; against the oracle: relative RMS error %.2e, max abs %.3g %s", rel, worst,
                  ok ? "(ok)" : "(TOO LARGE)");
    }
    std::printf("\n");
    if (!flags.out.empty()) {
      std::string file = io.name();  // a tensor name may hold '/' or ':'
      for (char& c : file) c = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
      if (absl::Status s = graph::WriteNpy(absl::StrCat(flags.out, "/", file, ".npy"), y); !s.ok()) return Fail(s);
    }
  }
  if (oracle != nullptr) {
    std::printf(agree ? "every output agrees with the op-by-op oracle (relative RMS error <= %.0e)\n"
                      : "outputs DIFFER from the op-by-op oracle (relative RMS error > %.0e)\n",
                runtime::kGraphTolerance);
  }
  return agree ? 0 : 1;
}

}  // namespace loom::tools
