// ONNX's own backend test data (Debian's libonnx-testdata: the node/ and pytorch-converted/ cases, models with
// inputs and expected outputs written by the ONNX project) through Loom's importer and the op-by-op oracle.
// Every case is either imported and matches every expected output within the tolerance, or refused with an
// error naming the file and the node, op, attribute or tensor; never wrong. Prints the pass / refused / fail
// count per op type (docs/onnx.md has the table).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <unistd.h>
#include <tuple>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/evaluator.h"
#include "graph/onnx_import.h"
#include "runtime/gpu_backend.h"
#include "runtime/graph_runner.h"
#include "scheduler/compiler.h"
#include "onnx/onnx.pb.h"
#include "tests/onnx_builders.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
// LOOM_ONNX_TESTDATA names another copy of the data (a GPU machine without the Debian package).
const std::string kData = std::getenv("LOOM_ONNX_TESTDATA") != nullptr ? std::getenv("LOOM_ONNX_TESTDATA")
                                                                           : "/usr/share/libonnx-testdata/data";
// The backend tests' own default tolerances are rtol 1e-3, atol 1e-7; a float32 oracle summing in another order
// needs a little absolute room near zero.
constexpr double kRtol = 1e-3, kAtol = 1e-5;

// The op types of a model, joined: the table's key.
std::string OpTypes(const fs::path& model) {
  std::ifstream in(model, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  onnx::ModelProto m;
  if (!m.ParseFromString(ss.str())) return "(unreadable)";
  std::set<std::string> types;
  for (const onnx::NodeProto& n : m.graph().node()) types.insert(n.op_type());
  return absl::StrJoin(types, "+");
}

struct Tally {
  int pass = 0, refused = 0, fail = 0;
};

// Every node/ and pytorch-converted/ case folder that holds a model.onnx, in order.
std::vector<fs::path> CaseDirs() {
  std::vector<fs::path> cases;
  for (const char* suite : {"node", "pytorch-converted"}) {
    std::vector<fs::path> in_suite;
    for (const fs::directory_entry& e : fs::directory_iterator(fs::path(kData) / suite)) {
      if (fs::exists(e.path() / "model.onnx")) in_suite.push_back(e.path());
    }
    std::sort(in_suite.begin(), in_suite.end());
    cases.insert(cases.end(), in_suite.begin(), in_suite.end());
  }
  return cases;
}

// The test_data_set_* folders of a case.
std::vector<fs::path> DataSets(const fs::path& dir) {
  std::vector<fs::path> sets;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  }
  std::sort(sets.begin(), sets.end());
  return sets;
}

// Runs one case; "" when every data set matches, else what differed.
std::string RunCase(const graph::OnnxModel& m, const fs::path& dir) {
  std::vector<fs::path> sets;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return "no test data";
  for (const fs::path& set : sets) {
    absl::flat_hash_map<std::string, graph::HostTensor> inputs;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      absl::StatusOr<graph::HostTensor> t = graph::ReadOnnxTensor((set / absl::StrCat("input_", i, ".pb")).string());
      if (!t.ok()) return std::string(t.status().message());
      inputs[m.inputs[i]] = *std::move(t);
    }
    graph::Evaluator ev(m.graph, m.weights);
    if (absl::Status s = ev.Run(inputs); !s.ok()) return std::string(s.message());
    for (size_t k = 0; k < m.outputs.size(); ++k) {
      absl::StatusOr<graph::HostTensor> want =
          graph::ReadOnnxTensor((set / absl::StrCat("output_", k, ".pb")).string());
      if (!want.ok()) return std::string(want.status().message());
      const graph::HostTensor& got = ev.Get(m.outputs[k]);
      if (got.size() != want->size()) {
        return absl::StrCat("output ", k, ": ", got.size(), " elements, expected ", want->size());
      }
      for (int64_t i = 0; i < got.size(); ++i) {
        const double g = got.Get(i), w = want->Get(i);
        if (std::isnan(g) != std::isnan(w) || std::fabs(g - w) > kAtol + kRtol * std::fabs(w)) {
          return absl::StrCat(set.filename().string(), " output ", k, " element ", i, ": ", g, ", expected ", w);
        }
      }
    }
  }
  return "";
}

TEST(OnnxBackend, EveryCaseMatchesOrIsRefusedByName) {
  if (!fs::is_directory(kData)) GTEST_SKIP() << kData << " is missing (apt-get install libonnx-testdata)";
  std::map<std::string, Tally> per_op;
  std::set<std::string> passed;
  std::map<std::string, std::string> refusals;  // case -> why
  Tally total;
  for (const fs::path& dir : CaseDirs()) {
    const std::string suite = dir.parent_path().filename().string();
    const fs::path model = dir / "model.onnx";
    Tally& t = per_op[OpTypes(model)];
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnx(model.string());
    if (!m.ok()) {
      ++t.refused, ++total.refused;
      const std::string why(m.status().message());
      refusals[dir.filename().string()] = why;
      EXPECT_EQ(why.find('\n'), std::string::npos) << why;  // one line
      EXPECT_NE(why.find(model.string()), std::string::npos) << why;  // naming the file
      continue;
    }
    const std::string diff = RunCase(*m, dir);
    if (diff.empty()) {
      ++t.pass, ++total.pass;
      passed.insert(dir.filename().string());
    } else {
      ++t.fail, ++total.fail;
      ADD_FAILURE() << suite << "/" << dir.filename().string() << ": " << diff;
    }
  }
  std::printf("\n%-48s %6s %8s %6s\n", "ops in the model", "pass", "refused", "fail");
  for (const auto& [ops, t] : per_op) {
    if (t.pass + t.fail > 0) std::printf("%-48s %6d %8d %6d\n", ops.c_str(), t.pass, t.refused, t.fail);
  }
  int refused_only = 0;
  for (const auto& [ops, t] : per_op) refused_only += t.pass + t.fail == 0 ? t.refused : 0;
  std::printf("%-48s %6d %8d %6d\n", "(every other op: refused by name)", 0, refused_only, 0);
  std::printf("%-48s %6d %8d %6d\n", "total", total.pass, total.refused, total.fail);
  if (std::getenv("LOOM_ONNX_REFUSALS") != nullptr) {
    for (const auto& [name, why] : refusals) std::printf("refused %s: %s\n", name.c_str(), why.c_str());
  }
  EXPECT_EQ(total.fail, 0);
  // What must import and match (a regression that refused everything would otherwise pass).
  for (const char* name : {"test_relu", "test_sigmoid", "test_add", "test_add_bcast", "test_mul_bcast",
                           "test_matmul_2d", "test_matmul_3d", "test_matmul_4d", "test_gemm_all_attributes",
                           "test_gemm_default_no_bias", "test_softmax_axis_0", "test_softmax_default_axis",
                           "test_transpose_default", "test_flatten_axis0",
                           "test_concat_2d_axis_1", "test_conv_with_strides_and_asymmetric_padding",
                           "test_conv_with_autopad_same", "test_maxpool_2d_default", "test_maxpool_2d_pads",
                           "test_averagepool_2d_pads_count_include_pad", "test_globalaveragepool",
                           "test_Conv2d_groups", "test_Conv2d_depthwise", "test_Conv2d_dilated", "test_Conv1d_pad2",
                           "test_BatchNorm2d_eval", "test_MaxPool2d", "test_AvgPool2d", "test_Linear",
                           "test_clip", "test_clip_splitbounds", "test_clip_default_inbounds", "test_hardsigmoid",
                           "test_hardswish", "test_sqrt", "test_max_example", "test_min_one_input",
                           "test_leakyrelu", "test_prelu_broadcast", "test_PReLU_2d_multiparam", "test_abs",
                           "test_globalmaxpool", "test_ZeroPad2d", "test_split_equal_parts_1d", "test_GLU",
                           "test_reduce_mean_default_axes_keepdims_example",
                           "test_reduce_max_default_axes_keepdim_example", "test_layer_normalization_4d_axis1",
                           "test_logsoftmax_axis_1", "test_softplus", "test_greater"}) {
    EXPECT_TRUE(passed.contains(name)) << name << " did not import and match: " << refusals[name];
  }
  // And what must be refused (Cos: no IR op), so the list above cannot pass by a harness that passes everything.
  EXPECT_FALSE(passed.contains("test_cos"));
  EXPECT_NE(refusals["test_cos"].find("(Cos): op type not supported"), std::string::npos) << refusals["test_cos"];
}

// A case's lowered pass on `runner`: "" when every output of every data set is within the graph tolerance
// (relative RMS error, the GEMM operands being bf16), else what differed.
std::string RunLoweredCase(const graph::OnnxModel& m, const fs::path& dir, runtime::GraphRunner& runner) {
  for (const fs::path& set : DataSets(dir)) {
    runtime::TensorMap inputs;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      absl::StatusOr<graph::HostTensor> t = graph::ReadOnnxTensor((set / absl::StrCat("input_", i, ".pb")).string());
      if (!t.ok()) return std::string(t.status().message());
      inputs[m.inputs[i]] = *std::move(t);
    }
    absl::StatusOr<runtime::TensorMap> got = runner.Run(inputs);
    if (!got.ok()) return std::string(got.status().message());
    for (size_t k = 0; k < m.outputs.size(); ++k) {
      absl::StatusOr<graph::HostTensor> want =
          graph::ReadOnnxTensor((set / absl::StrCat("output_", k, ".pb")).string());
      if (!want.ok()) return std::string(want.status().message());
      const graph::HostTensor& y = got->at(m.outputs[k]);
      if (y.size() != want->size()) {
        return absl::StrCat("output ", k, ": ", y.size(), " elements, expected ", want->size());
      }
      double err = 0, norm = 0;
      for (int64_t i = 0; i < y.size(); ++i) {
        const double d = y.Get(i) - want->Get(i);
        err += d * d;
        norm += want->Get(i) * want->Get(i);
      }
      const double rel = std::sqrt(err / std::max(norm, 1e-30));
      if (!(rel <= runtime::kGraphTolerance) && !(err <= 1e-12)) {
        return absl::StrCat(set.filename().string(), " output ", k, ": relative RMS error ", rel);
      }
    }
  }
  return "";
}

// Every case that imports is lowered to a graph pass and run on the CPU VM (and on the GPU where there is one),
// matching the expected outputs within the graph tolerance, or its lowering is refused in one line naming the op.
TEST(OnnxBackend, EveryImportedCaseRunsLoweredOrIsRefusedByName) {
  if (!fs::is_directory(kData)) GTEST_SKIP() << kData << " is missing (apt-get install libonnx-testdata)";
  std::string why_no_gpu;
  const bool gpu = runtime::GpuAvailable(&why_no_gpu);
  if (!gpu) std::printf("GPU part skipped: %s\n", why_no_gpu.c_str());
  std::map<std::string, Tally> per_op;
  std::map<std::string, std::string> refusals;
  std::set<std::string> lowered;
  Tally total;
  for (const fs::path& dir : CaseDirs()) {
    const std::string suite = dir.parent_path().filename().string();
    const fs::path model = dir / "model.onnx";
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnx(model.string());
    if (!m.ok()) continue;  // the import's own refusals: the test above
    Tally& t = per_op[OpTypes(model)];
    scheduler::CompileOptions options;
    absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, model.string(), options);
    if (!pass.ok()) {
      ++t.refused, ++total.refused;
      const std::string why(pass.status().message());
      refusals[dir.filename().string()] = why;
      EXPECT_EQ(pass.status().code(), absl::StatusCode::kUnimplemented) << dir << ": " << why;
      EXPECT_EQ(why.find('\n'), std::string::npos) << why;
      EXPECT_TRUE(why.find("op '") != std::string::npos || why.find("output '") != std::string::npos) << why;
      continue;
    }
    std::string diff;
    for (auto backend : {runtime::GraphRunner::Backend::kCpu, runtime::GraphRunner::Backend::kGpu}) {
      if (backend == runtime::GraphRunner::Backend::kGpu && !gpu) continue;
      absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner =
          runtime::GraphRunner::Create(*pass, m->weights, backend);
      diff = runner.ok() ? RunLoweredCase(*m, dir, **runner) : std::string(runner.status().message());
      if (!diff.empty()) {
        diff = absl::StrCat(backend == runtime::GraphRunner::Backend::kGpu ? "GPU: " : "VM: ", diff);
        break;
      }
    }
    if (diff.empty()) {
      ++t.pass, ++total.pass;
      lowered.insert(dir.filename().string());
    } else {
      ++t.fail, ++total.fail;
      ADD_FAILURE() << suite << "/" << dir.filename().string() << ": " << diff;
    }
  }
  std::printf("\nlowered to a graph pass (%s):\n%-48s %6s %8s %6s\n", gpu ? "CPU VM and GPU" : "CPU VM",
              "ops in the model", "pass", "refused", "fail");
  for (const auto& [ops, t] : per_op) std::printf("%-48s %6d %8d %6d\n", ops.c_str(), t.pass, t.refused, t.fail);
  std::printf("%-48s %6d %8d %6d\n", "total", total.pass, total.refused, total.fail);
  if (std::getenv("LOOM_ONNX_REFUSALS") != nullptr) {
    for (const auto& [name, why] : refusals) std::printf("not lowered %s: %s\n", name.c_str(), why.c_str());
  }
  EXPECT_EQ(total.fail, 0);
  for (const char* name : {"test_relu", "test_add_bcast", "test_flatten_axis1", "test_identity",
                           "test_transpose_default", "test_Conv2d_padding", "test_Conv2d_strided",
                           "test_maxpool_2d_pads", "test_averagepool_2d_pads_count_include_pad",
                           "test_globalaveragepool", "test_Conv2d_dilated", "test_BatchNorm2d_eval", "test_Linear"}) {
    EXPECT_TRUE(lowered.contains(name)) << name << " was not lowered and matched: " << refusals[name];
  }
}

// A hostile or foreign file is refused with its name, never crashes.
TEST(OnnxBackend, BadFilesAreRefused) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes("\x08\x07garbage\xff\xff\xff", "x.onnx");
  EXPECT_FALSE(m.ok());
  EXPECT_FALSE(graph::ImportOnnx("/no/such/model.onnx").ok());
  // Empty, or protobuf bytes without a graph: not a model (not "opset 0").
  EXPECT_EQ(graph::ImportOnnxBytes("", "e.onnx").status().message(), "e.onnx: empty file, not an ONNX model");
  EXPECT_EQ(graph::ImportOnnxBytes("\x08\x07", "v.onnx").status().message(),  // ir_version 7 and nothing else
            "v.onnx: not an ONNX model file (no graph)");
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(13);
  onnx::NodeProto* n = proto.mutable_graph()->add_node();
  n->set_op_type("Cos");
  n->set_name("e");
  n->add_input("x");
  n->add_output("y");
  onnx::ValueInfoProto* x = proto.mutable_graph()->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(4);
  m = graph::ImportOnnxBytes(proto.SerializeAsString(), "cos.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("cos.onnx: node 'e' (Cos): op type not supported"), std::string::npos)
      << m.status();
  x->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
  n->set_op_type("Relu");
  m = graph::ImportOnnxBytes(proto.SerializeAsString(), "sym.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("input 'x': dimension 0 is symbolic ('batch')"), std::string::npos)
      << m.status();
  proto.mutable_opset_import(0)->set_version(28);  // onnx 1.23's, not released
  m = graph::ImportOnnxBytes(proto.SerializeAsString(), "new.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("new.onnx: opset 28 of the default domain: Loom reads opsets 1-27"),
            std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace loom
