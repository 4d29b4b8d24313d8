// loom._loom: building graphs from Python (GraphBuilder), graphs as files and
// text, models from a graph and arrays of weights, and the op-by-op oracle.
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common.h"
#include "google/protobuf/text_format.h"
#include "graph/evaluator.h"
#include "graph/graph_builder.h"
#include "graph/model.h"
#include "runtime/graph_runner.h"
#include "scheduler/schedule.pb.h"

namespace loom::python {
namespace {

using Array = nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu>;

// Fills `attrs` from protobuf text format (the fields the keyword arguments do not cover).
template <typename Proto>
void MergeText(const std::string& text, Proto* attrs, const char* what) {
  if (text.empty()) return;
  if (!google::protobuf::TextFormat::MergeFromString(text, attrs)) {
    Invalid(absl::StrCat(what, ": cannot parse '", text, "' as ", Proto::descriptor()->full_name(), " text format"));
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

// An array for a tensor of the graph: float32 for bf16 and f32 tensors (bf16 ones are rounded), int32 for i32;
// its shape must be the tensor's (a scalar, rank 0, is a [1]: ONNX's rank-0 inputs are imported so).
graph::HostTensor ToHost(const graph::TensorDef& def, const nb::handle& value) {
  Array a;
  if (!nb::try_cast(value, a)) {
    Invalid(absl::StrCat("tensor '", def.name(), "': expected a C-contiguous numpy array on the CPU, got ",
                         nb::str(value.type()).c_str()));
  }
  std::vector<int64_t> shape(a.shape_ptr(), a.shape_ptr() + a.ndim());
  const std::vector<int64_t> want(def.shape().begin(), def.shape().end());
  if (shape.empty() && want == std::vector<int64_t>{1}) shape = want;
  if (shape != want) {
    Invalid(
        absl::StrCat("tensor '", def.name(), "': shape ", ShapeText(shape), ", the graph declares ", ShapeText(want)));
  }
  if (def.dtype() != graph::BF16 && def.dtype() != graph::F32 && def.dtype() != graph::I32) {
    Invalid(absl::StrCat("tensor '", def.name(), "' is ", graph::DType_Name(def.dtype()),
                         ": arrays are taken for BF16, F32 and I32 tensors (FP8 weights come from a checkpoint or "
                         "loom.load(..., scheme='FP8'))"));
  }
  graph::HostTensor t = graph::HostTensor::Zeros(def);
  const bool is_int = def.dtype() == graph::I32;
  if (is_int ? a.dtype() != nb::dtype<int32_t>() : a.dtype() != nb::dtype<float>()) {
    Invalid(absl::StrCat("tensor '", def.name(), "' is ", graph::DType_Name(def.dtype()), ": pass ",
                         is_int ? "int32" : "float32", " values"));
  }
  const size_t n = static_cast<size_t>(t.size());
  if (def.dtype() == graph::I32) {
    std::memcpy(t.i32.data(), a.data(), n * 4);
  } else if (def.dtype() == graph::F32) {
    std::memcpy(t.f32.data(), a.data(), n * 4);
  } else {
    const float* f = static_cast<const float*>(a.data());
    for (size_t i = 0; i < n; ++i) t.bf16[i] = graph::FloatToBf16(f[i]);
  }
  return t;
}

nb::object ToNumpy(const graph::HostTensor& t) {
  const size_t n = static_cast<size_t>(t.size());
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  if (t.dtype == graph::I32) {
    auto* data = new std::vector<int32_t>(t.i32);
    nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
    return nb::cast(nb::ndarray<nb::numpy, int32_t>(data->data(), shape.size(), shape.data(), owner));
  }
  auto* data = new std::vector<float>(n);
  for (size_t i = 0; i < n; ++i) (*data)[i] = t.Get(static_cast<int64_t>(i));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, float>(data->data(), shape.size(), shape.data(), owner));
}

graph::Model FromGraph(const graph::Graph& g, const nb::dict& weights) {
  graph::Model m;
  m.spec = g.def().name();
  m.graph = g;
  for (const graph::TensorDef* def : g.TensorsOfKind(graph::WEIGHT)) {
    if (!weights.contains(def->name().c_str())) {
      Invalid(absl::StrCat("weights: no array for the graph's weight '", def->name(), "' ",
                           ShapeText({def->shape().begin(), def->shape().end()})));
    }
    m.weights[def->name()] = ToHost(*def, weights[def->name().c_str()]);
  }
  for (auto [key, value] : weights) {
    const std::string name = nb::cast<std::string>(nb::str(key));
    if (!g.HasTensor(name) || g.tensor(name).kind() != graph::WEIGHT) {
      Invalid(absl::StrCat("weights: '", name, "' is not a weight of graph '", g.def().name(), "'"));
    }
  }
  return m;
}

// The oracle over a model: STATE tensors persist from run to run. Runs release the GIL; `mutex` takes concurrent
// calls from several Python threads one at a time.
struct Oracle {
  std::shared_ptr<const graph::Model> model;
  std::unique_ptr<graph::Evaluator> evaluator;
  std::mutex mutex;
};

// A compiled general graph's pass (an ONNX model's, or a GraphBuilder graph's) resident on the CPU VM or the GPU,
// run on arrays. Runs release the GIL; `mutex` takes concurrent calls one at a time.
struct GraphPass {
  std::shared_ptr<const graph::Model> model;
  std::unique_ptr<runtime::GraphRunner> runner;
  std::mutex mutex;
};

}  // namespace

void BindGraph(nb::module_& m) {
  nb::enum_<graph::DType>(m, "DType").value("BF16", graph::BF16).value("F32", graph::F32).value("I32", graph::I32);

  nb::class_<graph::Graph>(m, "Graph", "A verified model graph: tensors and ops.")
      .def_static(
          "load", [](const std::filesystem::path& path) { return Unwrap(graph::Graph::Load(path.string())); },
          nb::arg("path"), "Reads a .pb or .pbtxt graph file and verifies it.")
      .def(
          "save", [](const graph::Graph& g, const std::filesystem::path& path) { Check(g.Save(path.string())); },
          nb::arg("path"))
      .def_prop_ro("name", [](const graph::Graph& g) { return g.def().name(); })
      .def_prop_ro("num_ops", [](const graph::Graph& g) { return g.def().ops_size(); })
      .def(
          "text",
          [](const graph::Graph& g) {
            std::string out;
            google::protobuf::TextFormat::PrintToString(g.def(), &out);
            return out;
          },
          "The graph in protobuf text format (what a .pbtxt graph file holds).")
      .def(
          "tensors",
          [](const graph::Graph& g) {
            nb::list out;
            for (const graph::TensorDef& t : g.def().tensors()) {
              out.append(nb::make_tuple(t.name(), std::vector<int64_t>(t.shape().begin(), t.shape().end()),
                                        graph::DType_Name(t.dtype()), graph::TensorKind_Name(t.kind()), t.is_output()));
            }
            return out;
          },
          "(name, shape, dtype, kind, is_output) of every tensor.");

  nb::class_<graph::GraphBuilder>(m, "GraphBuilder",
                                  "Builds a graph op by op; each op returns its output's name, build() verifies.")
      .def(nb::init<std::string>(), nb::arg("name"))
      .def("input", &graph::GraphBuilder::Input, nb::arg("name"), nb::arg("shape"), nb::arg("dtype"))
      .def("weight", &graph::GraphBuilder::Weight, nb::arg("name"), nb::arg("shape"), nb::arg("dtype") = graph::BF16)
      .def("state", &graph::GraphBuilder::State, nb::arg("name"), nb::arg("shape"), nb::arg("dtype") = graph::F32)
      .def("embedding", &graph::GraphBuilder::Embedding, nb::arg("out"), nb::arg("table"), nb::arg("ids"))
      .def("rms_norm", &graph::GraphBuilder::RmsNorm, nb::arg("out"), nb::arg("x"), nb::arg("weight"), nb::arg("eps"),
           nb::arg("group_size") = 0)
      .def("layer_norm", &graph::GraphBuilder::LayerNorm, nb::arg("out"), nb::arg("x"), nb::arg("weight"),
           nb::arg("bias"), nb::arg("eps"))
      .def("linear", &graph::GraphBuilder::Linear, nb::arg("out"), nb::arg("x"), nb::arg("weight"),
           nb::arg("bias") = "")
      .def(
          "rope",
          [](graph::GraphBuilder& b, const std::string& out, const std::string& x, const std::string& pos, int head_dim,
             float theta, const std::string& attrs) {
            graph::RopeAttrs a;
            a.set_head_dim(head_dim);
            a.set_theta(theta);
            MergeText(attrs, &a, "rope attrs");
            return b.Rope(out, x, pos, a);
          },
          nb::arg("out"), nb::arg("x"), nb::arg("pos"), nb::arg("head_dim"), nb::arg("theta") = 10000.0f,
          nb::arg("attrs") = "", "attrs: more RopeAttrs fields in text format (llama3_scaling { ... }, yarn { ... }).")
      .def(
          "attention",
          [](graph::GraphBuilder& b, const std::string& out, const std::string& q, const std::string& k,
             const std::string& v, const std::string& k_cache, const std::string& v_cache, const std::string& pos,
             int num_heads, int num_kv_heads, int head_dim, float scale, bool causal) {
            graph::AttentionAttrs a;
            a.set_num_heads(num_heads);
            a.set_num_kv_heads(num_kv_heads);
            a.set_head_dim(head_dim);
            a.set_scale(scale);
            a.set_causal(causal);
            return b.Attention(out, q, k, v, k_cache, v_cache, pos, a);
          },
          nb::arg("out"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("k_cache"), nb::arg("v_cache"),
          nb::arg("pos"), nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("scale") = 0.0f,
          nb::arg("causal") = true)
      .def("silu_mul", &graph::GraphBuilder::SiluMul, nb::arg("out"), nb::arg("gate"), nb::arg("up"))
      .def("add", &graph::GraphBuilder::Add, nb::arg("out"), nb::arg("a"), nb::arg("b"))
      .def("conv1d", &graph::GraphBuilder::Conv1d, nb::arg("out"), nb::arg("x"), nb::arg("weight"), nb::arg("state"),
           nb::arg("bias") = "")
      .def(
          "conv2d",
          [](graph::GraphBuilder& b, const std::string& out, const std::string& x, const std::string& w,
             const std::string& bias, int stride, int pad) {
            graph::Conv2dAttrs a;
            a.set_stride_h(stride);
            a.set_stride_w(stride);
            a.set_pad_h(pad);
            a.set_pad_w(pad);
            return b.Conv2d(out, x, w, bias, a);
          },
          nb::arg("out"), nb::arg("x"), nb::arg("weight"), nb::arg("bias") = "", nb::arg("stride") = 1,
          nb::arg("pad") = 0)
      .def("argmax", &graph::GraphBuilder::Argmax, nb::arg("out"), nb::arg("x"))
      .def("mark_output", &graph::GraphBuilder::MarkOutput, nb::arg("name"))
      .def(
          "build", [](graph::GraphBuilder& b) { return Unwrap(std::move(b).Build()); },
          "Verifies and returns the graph (the builder is spent).");

  m.def("model_from_graph", &FromGraph, nb::arg("graph"), nb::arg("weights"),
        "A model of `graph` with `weights`: name -> float32 array (bf16 weights are rounded), int32 for i32.");

  nb::class_<GraphPass>(m, "GraphPass", "A compiled graph pass resident on a backend, run on arrays (Schedule.run).")
      .def(
          "__init__",
          [](GraphPass* p, const graph::Model& model, const scheduler::Schedule& schedule, const std::string& backend) {
            if (backend != "cpu" && backend != "gpu") Invalid(absl::StrCat("backend: unknown backend '", backend, "' (cpu or gpu)"));
            if (!schedule.has_graph()) {
              Invalid(absl::StrCat("the schedule of '", schedule.model(), "' is a decode schedule, not a graph pass: ",
                                   "loom.Session runs it"));
            }
            if (model.weights.empty() && !model.graph.TensorsOfKind(graph::WEIGHT).empty()) {
              Invalid(absl::StrCat("model '", model.spec, "' was loaded without weights"));
            }
            auto copy = std::make_shared<const graph::Model>(model);
            std::unique_ptr<runtime::GraphRunner> runner;
            {
              nb::gil_scoped_release release;
              runner = Unwrap(runtime::GraphRunner::Create(
                  schedule, copy->weights,
                  backend == "gpu" ? runtime::GraphRunner::Backend::kGpu : runtime::GraphRunner::Backend::kCpu));
            }
            new (p) GraphPass{copy, std::move(runner), {}};
          },
          nb::arg("model"), nb::arg("schedule"), nb::arg("backend"))
      .def(
          "run",
          [](GraphPass& p, const nb::dict& inputs) {
            runtime::TensorMap in;
            for (const graph::TensorDef* def : p.model->graph.TensorsOfKind(graph::INPUT)) {
              if (!inputs.contains(def->name().c_str())) {
                Invalid(absl::StrCat("inputs: no array for '", def->name(), "'"));
              }
              in[def->name()] = ToHost(*def, inputs[def->name().c_str()]);
            }
            for (const auto& [key, value] : inputs) {
              const std::string name = nb::cast<std::string>(nb::str(key));
              if (!p.model->graph.HasTensor(name) || p.model->graph.tensor(name).kind() != graph::INPUT) {
                Invalid(absl::StrCat("inputs: '", name, "' is not an input of the graph"));
              }
            }
            runtime::TensorMap values;
            float ms = 0;
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(p.mutex);
              values = Unwrap(p.runner->Run(in));
              ms = p.runner->last_ms();
            }
            std::map<std::string, nb::object> out;
            for (const auto& [name, value] : values) out[name] = ToNumpy(value);
            return std::make_pair(out, ms);
          },
          nb::arg("inputs"), "Runs the pass once; returns the graph's outputs by name and the run's time in ms.");

  nb::class_<Oracle>(m, "Oracle", "The op-by-op float32 evaluator of a model's graph; state persists across runs.")
      .def(
          "__init__",
          [](Oracle* o, const graph::Model& model) {
            auto copy = std::make_shared<const graph::Model>(model);
            new (o) Oracle{copy, std::make_unique<graph::Evaluator>(copy->graph, copy->weights), {}};
          },
          nb::arg("model"))
      .def(
          "run",
          [](Oracle& o, const nb::dict& inputs) {
            absl::flat_hash_map<std::string, graph::HostTensor> in;
            for (const graph::TensorDef* def : o.model->graph.TensorsOfKind(graph::INPUT)) {
              if (!inputs.contains(def->name().c_str()))
                Invalid(absl::StrCat("inputs: no array for '", def->name(), "'"));
              in[def->name()] = ToHost(*def, inputs[def->name().c_str()]);
            }
            std::vector<std::pair<std::string, graph::HostTensor>> values;
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(o.mutex);
              Check(o.evaluator->Run(in));
              for (const graph::TensorDef& t : o.model->graph.def().tensors()) {
                if (t.is_output()) values.emplace_back(t.name(), o.evaluator->Get(t.name()));
              }
            }
            std::map<std::string, nb::object> out;
            for (const auto& [name, value] : values) out[name] = ToNumpy(value);
            return out;
          },
          nb::arg("inputs"), "Evaluates every op once; returns the graph's outputs by name.")
      .def(
          "get",
          [](Oracle& o, const std::string& name) {
            if (!o.model->graph.HasTensor(name)) Invalid(absl::StrCat("no tensor '", name, "' in the graph"));
            graph::HostTensor value;
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(o.mutex);
              value = o.evaluator->Get(name);
            }
            return ToNumpy(value);
          },
          nb::arg("name"), "Any input, state or activation tensor after the last run.");
}

}  // namespace loom::python
