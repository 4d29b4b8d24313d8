// loom._loom: the C++ API the Python package wraps (python/loom/). This file:
// errors, progress, models, compiling and schedules; graph_bindings.cc and
// session_bindings.cc the rest. Every failure is a Python exception carrying
// the C++ message; long work runs with the GIL released.
#include <Python.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"
#include "graph/model.h"
#include "graph/quantize.h"
#include "graph/progress.h"
#include "graph/proto_file.h"
#include "runtime/gpu_backend.h"
#include "scheduler/compiler.h"
#include "scheduler/options.h"
#include "scheduler/prefill.h"
#include "scheduler/summary.h"

namespace loom::python {
namespace {

// loom.errors' exception classes (Python's: so type checkers and stubs see them), looked up once at import.
PyObject* g_error = nullptr;        // Error, a RuntimeError
PyObject* g_invalid = nullptr;      // InvalidArgumentError: also a ValueError
PyObject* g_not_found = nullptr;    // NotFoundError: also a FileNotFoundError
PyObject* g_unavailable = nullptr;  // UnavailableError: no GPU, or not this kind of GPU

void Translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const StatusError& e) {
    PyObject* type = g_error;
    switch (e.code) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kOutOfRange:
      case absl::StatusCode::kFailedPrecondition:
      case absl::StatusCode::kUnimplemented:  // a config field or shape Loom refuses
        type = g_invalid;
        break;
      case absl::StatusCode::kNotFound:
        type = g_not_found;
        break;
      case absl::StatusCode::kUnavailable:
        type = g_unavailable;
        break;
      default:
        break;
    }
    PyErr_SetString(type, e.what());
  }
}

// The progress hook calls back into Python (tqdm) from the thread doing the work, which holds no GIL.
void SetProgress(nb::object callback) {
  if (callback.is_none()) {
    graph::SetProgressHook(nullptr);
    return;
  }
  auto shared = std::make_shared<nb::object>(std::move(callback));
  graph::SetProgressHook([shared](const std::string& label, uint64_t done, uint64_t total, bool finished) {
    nb::gil_scoped_acquire gil;
    try {
      (*shared)(label, done, total, finished);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("loom progress callback");
    }
  });
}

graph::Model LoadModel(const std::string& spec, int max_seq, bool weights, uint64_t seed, const std::string& scheme,
                       bool widen_quantized, const std::string& kv_dtype) {
  if (max_seq < 0) Invalid("max_seq must be >= 0");
  graph::ModelOptions o;
  o.kv_dtype = Unwrap(graph::ParseKvDtype(kv_dtype));
  o.max_seq = max_seq;
  o.load_weights = weights;
  o.seed = seed;
  o.scheme = scheme;
  o.widen_quantized = widen_quantized;
  nb::gil_scoped_release release;
  return Unwrap(graph::LoadModel(spec, o));
}

scheduler::Schedule Compile(const graph::Model& model, const std::string& options_file, int64_t num_sms,
                            const std::string& policy, const std::string& granularity,
                            const std::vector<std::string>& unfuse, int64_t max_seq, std::optional<bool> prefill) {
  scheduler::OptionSettings s;
  s.options_file = options_file;
  s.num_sms = num_sms;
  s.policy = policy;
  s.granularity = granularity;
  s.unfuse = unfuse;
  s.max_seq = max_seq;
  s.prefill = prefill;
  scheduler::CompileOptions o = Unwrap(scheduler::OptionsFromSettings(s, ""));
  nb::gil_scoped_release release;
  return Unwrap(scheduler::Compile(model.graph, model.spec, o));
}

int Instructions(const scheduler::Schedule& s) {
  int n = 0;
  for (const scheduler::SmQueue& q : s.queues()) n += q.instructions_size();
  return n;
}

}  // namespace

void BindModel(nb::module_& m) {
  nb::class_<graph::Model>(m, "Model", "A model: its decode graph, its configuration and (when loaded) its weights.")
      .def_ro("spec", &graph::Model::spec, "What it was loaded from: random:<preset>, a folder, or a graph's name.")
      .def_ro("notes", &graph::Model::notes, "What loading noticed: config fields ignored, weights rounded to bf16.")
      .def_prop_ro("family", [](const graph::Model& x) { return x.config.family; })
      .def_prop_ro("num_layers", [](const graph::Model& x) { return x.config.num_layers; })
      .def_prop_ro("hidden_size", [](const graph::Model& x) { return x.config.hidden_size; })
      .def_prop_ro("num_heads", [](const graph::Model& x) { return x.config.num_heads; })
      .def_prop_ro("num_kv_heads", [](const graph::Model& x) { return x.config.num_kv_heads; })
      .def_prop_ro("head_dim", [](const graph::Model& x) { return x.config.head_dim; })
      .def_prop_ro("intermediate_size", [](const graph::Model& x) { return x.config.intermediate_size; })
      .def_prop_ro("vocab_size", [](const graph::Model& x) { return x.config.vocab_size; })
      .def_prop_ro(
          "parameters", [](const graph::Model& x) { return x.config.Parameters(); },
          "Parameter count (0 for a graph built by hand).")
      .def_prop_ro("has_weights", [](const graph::Model& x) { return !x.weights.empty(); })
      .def_prop_ro(
          "max_seq",
          [](const graph::Model& x) {
            // The KV caches' capacity: the middle dimension of the [kv_heads, max_seq, head_dim] state tensors.
            for (const graph::TensorDef* t : x.graph.TensorsOfKind(graph::STATE)) {
              if (t->shape_size() == 3) return static_cast<int64_t>(t->shape(1));
            }
            return int64_t{0};
          },
          "KV-cache capacity in tokens (0: the graph has no KV cache).")
      .def_prop_ro(
          "kv_dtype",
          [](const graph::Model& x) -> std::string {
            for (const graph::TensorDef* t : x.graph.TensorsOfKind(graph::STATE)) {
              if (t->shape_size() == 3) return t->dtype() == graph::BF16 ? "bf16" : "f32";
            }
            return "";
          },
          "The KV caches' element: \"f32\" or \"bf16\" (\"\": the graph has no KV cache).")
      .def(
          "graph", [](const graph::Model& x) { return x.graph; }, "The model's graph.")
      .def(
          "export",
          [](const graph::Model& x, const std::filesystem::path& dir) {
            nb::gil_scoped_release release;
            Check(graph::ExportModel(x, dir.string()));
          },
          nb::arg("dir"), "Writes config.json and model.safetensors into `dir` (random:<preset> models).")
      .def(
          "quantize",
          [](const graph::Model& x, const std::filesystem::path& dir, const std::string& scheme, int group_size) {
            nb::gil_scoped_release release;
            Check(graph::QuantizeModel(x, {scheme, group_size}, dir.string()));
          },
          nb::arg("dir"), nb::arg("scheme"), nb::arg("group_size") = 128,
          "Writes the model quantized (FP8, W4A16, W8A16) as a compressed-tensors folder (loom quantize).");

  m.def(
      "quantize_checkpoint",
      [](const std::string& spec, const std::filesystem::path& dir, const std::string& scheme, int group_size,
         uint64_t seed) {
        nb::gil_scoped_release release;
        graph::ModelOptions o;
        o.seed = seed;
        Check(graph::QuantizeCheckpoint(spec, o, {scheme, group_size}, dir.string()));
      },
      nb::arg("spec"), nb::arg("dir"), nb::arg("scheme"), nb::arg("group_size") = 128, nb::arg("seed") = 0x10057u,
      "Quantizes the model `spec` names into `dir`, one weight at a time (loom quantize; see loom.quantize).");
  m.def("load_model", &LoadModel, nb::arg("spec"), nb::arg("max_seq") = 0, nb::arg("weights") = true,
        nb::arg("seed") = 0x10057u, nb::arg("scheme") = "", nb::arg("widen_quantized") = false,
        nb::arg("kv_dtype") = "f32", "Loads random:<preset> or a Hugging Face folder (see loom.load).");
  m.def("compile", &Compile, nb::arg("model"), nb::arg("options_file") = "", nb::arg("num_sms") = 0,
        nb::arg("policy") = "", nb::arg("granularity") = "", nb::arg("unfuse") = std::vector<std::string>{},
        nb::arg("max_seq") = 0, nb::arg("prefill") = nb::none(), "Compiles a model's decode graph (see loom.compile).");

  nb::class_<scheduler::Schedule>(m, "Schedule", "A compiled schedule: per-SM instruction queues, barriers, tensors.")
      .def_static(
          "load",
          [](const std::filesystem::path& path) {
            nb::gil_scoped_release release;
            return Unwrap(scheduler::LoadSchedule(path.string()));
          },
          nb::arg("path"), "Reads a .pb or .pbtxt schedule file and verifies it.")
      .def(
          "save",
          [](const scheduler::Schedule& s, const std::filesystem::path& path) {
            Check(WriteProtoFile(path.string(), s));
          },
          nb::arg("path"), "Writes the schedule (.pbtxt: text format, else binary).")
      .def(
          "summary",
          [](const scheduler::Schedule& s, bool instructions) {
            return Unwrap(scheduler::ScheduleSummary(s, s.model(), instructions));
          },
          nb::arg("instructions") = false, "What `loom inspect` prints.")
      .def_prop_ro("model", [](const scheduler::Schedule& s) { return s.model(); })
      .def_prop_ro("num_sms", [](const scheduler::Schedule& s) { return s.num_sms(); })
      .def_prop_ro("max_seq", [](const scheduler::Schedule& s) { return s.max_seq(); })
      .def_prop_ro("vocab_size", [](const scheduler::Schedule& s) { return s.vocab_size(); })
      .def_prop_ro("num_instructions", &Instructions, "Instructions per decode step, over all SMs.")
      .def_prop_ro("num_barriers", [](const scheduler::Schedule& s) { return s.barriers_size(); })
      .def_prop_ro(
          "has_prefill", [](const scheduler::Schedule& s) { return scheduler::HasPrefillWeights(s); },
          "Whether prompts are consumed in one prefill pass (the prefill weights are packed).");

  m.def(
      "gpu_available",
      [] {
        std::string why;
        const bool ok = runtime::GpuAvailable(&why);
        return std::make_pair(ok, why);
      },
      "(True, '') on a Hopper GPU, else (False, why).");
  m.def("set_progress", &SetProgress, nb::arg("callback").none(),
        "callback(label, done_bytes, total_bytes, finished) for long loading and packing, or None.");
}

}  // namespace loom::python

using namespace loom::python;  // NOLINT: the module init below is a global C function

NB_MODULE(_loom, m) {
  m.doc() = "Loom's C++ runtime (the loom package wraps it).";
  m.attr("__version__") = LOOM_VERSION;
  nb::module_ errors = nb::module_::import_("loom.errors");
  for (auto [slot, name] : {std::pair{&g_error, "Error"}, std::pair{&g_invalid, "InvalidArgumentError"},
                            std::pair{&g_not_found, "NotFoundError"}, std::pair{&g_unavailable, "UnavailableError"}}) {
    *slot = nb::object(errors.attr(name)).release().ptr();  // held for the life of the process
  }
  nb::register_exception_translator(&Translate);
  BindModel(m);
  BindGraph(m);
  BindSession(m);
}
