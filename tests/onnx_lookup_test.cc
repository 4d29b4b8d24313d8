// Integer graph inputs as embedding ids: ONNX's Gather from a constant table at an int64 input's values (a BERT
// encoder's word embeddings), the IR's EMBEDDING, lowered to EMBED instructions of a general graph's pass; the
// constant folds around it as transformers' exports write them (GatherElements of constants), IsNaN on activations
// (scaled_dot_product_attention's guard); an integer input read in arithmetic (an attention mask: float32 values);
// what is refused (ids outside the table, a float array for ids, an input read both ways); a Gather of an activation
// at consecutive indices (a slice) and the .npy reader's integer arrays.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/evaluator.h"
#include "graph/npy.h"
#include "graph/onnx_import.h"
#include "onnx/onnx.pb.h"
#include "tests/onnx_builders.h"
#include "tests/onnx_test_util.h"

namespace loom {
namespace {

using namespace onnx_test;  // NOLINT: the tests' helpers

void AddIntValue(onnx::ValueInfoProto* v, const std::string& name, const std::vector<int64_t>& dims) {
  AddValue(v, name, dims);
  v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
}

// ids int64 [2, 3] -> Gather(word table [10, 4]) + Gather(type table [2, 4], GatherElements of constants) ->
// [2, 3, 4]: the token-type ids are a constant buffer gathered by constant indices, folded at import; the word
// lookup is the pass's. Table values are halves (exact in bf16, as EMBED reads its table), so every backend gives
// the exact sums.
onnx::ModelProto LookupModel() {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(20);
  onnx::GraphProto* g = proto.mutable_graph();
  AddIntValue(g->add_input(), "ids", {2, 3});
  std::vector<float> words(40), types(8);
  for (size_t i = 0; i < words.size(); ++i) words[i] = 0.5f * static_cast<float>(static_cast<int>(i) - 17);
  for (size_t i = 0; i < types.size(); ++i) types[i] = 100.0f * static_cast<float>(i % 4 + 1) * (i < 4 ? 1 : -1);
  *g->add_initializer() = FloatTensor("words", {10, 4}, words);
  *g->add_initializer() = FloatTensor("types", {2, 4}, types);
  *g->add_initializer() = Int64Tensor("buffer", {2, 3}, {0, 1, 0, 1, 1, 0});
  *g->add_initializer() = Int64Tensor("pick", {2, 3}, {2, 2, 1, 0, 0, 1});
  onnx::NodeProto* ge = AddNamedNode(g, "GatherElements", {"buffer", "pick"}, "type_ids");
  onnx::AttributeProto* axis = ge->add_attribute();
  axis->set_name("axis"), axis->set_type(onnx::AttributeProto::INT), axis->set_i(1);
  AddNamedNode(g, "Gather", {"words", "ids"}, "w");
  AddNamedNode(g, "Gather", {"types", "type_ids"}, "t");
  AddNamedNode(g, "Add", {"w", "t"}, "y");
  AddValue(g->add_output(), "y", {2, 3, 4});
  return proto;
}

TEST(OnnxLookup, GatherAtIntegerInputIsAnEmbeddingLookup) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(LookupModel().SerializeAsString(), "lookup.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<int32_t> ids = {3, 0, 9, 9, 5, 1};
  const std::vector<int64_t> buffer = {0, 1, 0, 1, 1, 0}, pick = {2, 2, 1, 0, 0, 1};
  std::vector<float> want;
  for (int r = 0; r < 6; ++r) {
    const int64_t type = buffer[(r / 3) * 3 + pick[r]];
    for (int j = 0; j < 4; ++j) {
      const float word = 0.5f * static_cast<float>(ids[r] * 4 + j - 17);
      want.push_back(word + 100.0f * static_cast<float>(j + 1) * (type == 0 ? 1 : -1));
    }
  }
  const graph::HostTensor x = graph::HostTensor::FromI32({2, 3}, ids);
  graph::Evaluator e(m->graph, m->weights);
  ASSERT_TRUE(e.Run({{m->inputs[0], x}}).ok());
  const graph::HostTensor& y = e.Get(m->outputs[0]);
  ASSERT_EQ(y.shape, (std::vector<int64_t>{2, 3, 4}));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y.Get(static_cast<int64_t>(i)), want[i]) << "oracle at " << i;
  const std::vector<std::vector<float>> lowered = RunLowered(*m, {x}, "lookup.onnx");
  ASSERT_FALSE(lowered.empty());
  for (const std::vector<float>& got : lowered) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "lowered at " << i;
  }
}

// Ids outside the table are refused before the pass (EMBED would read them as row 0), naming the value; so is a
// float array for an integer input.
TEST(OnnxLookup, IdsAreCheckedBeforeThePass) {
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(LookupModel().SerializeAsString(), "lookup.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "lookup.onnx", scheduler::CompileOptions());
  ASSERT_TRUE(pass.ok()) << pass.status();
  ASSERT_EQ(pass->graph().inputs(0).id_limit(), 10u);
  absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner =
      runtime::GraphRunner::Create(*pass, m->weights, runtime::GraphRunner::Backend::kCpu);
  ASSERT_TRUE(runner.ok()) << runner.status();
  for (int32_t bad : {10, -1}) {
    absl::StatusOr<runtime::TensorMap> got =
        (*runner)->Run({{m->inputs[0], graph::HostTensor::FromI32({2, 3}, {1, 2, 3, 4, bad, 5})}});
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().message(),
              absl::StrCat("input 'ids': value 4 is ", bad, ", outside the table's rows [0, 10)"));
  }
  absl::StatusOr<runtime::TensorMap> floats =
      (*runner)->Run({{m->inputs[0], graph::HostTensor::FromF32({2, 3}, std::vector<float>(6))}});
  ASSERT_FALSE(floats.ok());
  EXPECT_EQ(floats.status().message(), "input 'ids' must be i32 [2, 3], got f32 [2, 3]");
}

// An integer input read in arithmetic (an attention mask: unsqueezed, cast to bool and to float, multiplied in) is
// a float32 input of the graph holding its integers; the runner takes it as integers (exactly, up to 2^24). An input
// read both as ids and in arithmetic, or a float activation cast to an integer type, is refused by name.
TEST(OnnxLookup, IntegerInputInArithmeticIsFloat32) {
  auto model = [](bool mask_as_ids_too, bool cast_float_to_int) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(20);
    onnx::GraphProto* g = proto.mutable_graph();
    AddIntValue(g->add_input(), "ids", {1, 4});
    AddIntValue(g->add_input(), "mask", {1, 4});
    std::vector<float> table(12);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i) + 1.0f;
    *g->add_initializer() = FloatTensor("table", {4, 3}, table);
    *g->add_initializer() = Int64Tensor("axes", {1}, {2});
    AddNamedNode(g, "Gather", {"table", "ids"}, "x");
    AddNamedNode(g, "Unsqueeze", {"mask", "axes"}, "m3");
    auto cast = [&](const std::string& in, const std::string& out, int to) {
      onnx::AttributeProto* a = AddNamedNode(g, "Cast", {in}, out)->add_attribute();
      a->set_name("to"), a->set_type(onnx::AttributeProto::INT), a->set_i(to);
    };
    cast("m3", "mb", onnx::TensorProto::BOOL);
    cast("mb", "mf", onnx::TensorProto::FLOAT);
    if (cast_float_to_int) cast("x", "xi", onnx::TensorProto::INT64);
    AddNamedNode(g, "Mul", {"x", "mf"}, "y");
    if (mask_as_ids_too) AddNamedNode(g, "Gather", {"table", "mask"}, "z");
    AddValue(g->add_output(), "y", {1, 4, 3});
    return graph::ImportOnnxBytes(proto.SerializeAsString(), "mask.onnx");
  };
  absl::StatusOr<graph::OnnxModel> both = model(true, false);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().message(), "mask.onnx: input 'mask': read both as a Gather's indices and in arithmetic "
                                     "(Loom reads an integer input one way)");
  absl::StatusOr<graph::OnnxModel> truncating = model(false, true);
  ASSERT_FALSE(truncating.ok());
  EXPECT_EQ(truncating.status().message(), "mask.onnx: node 'xi' (Cast): a cast of a float activation to an integer "
                                           "type (Loom casts integer-valued tensors only)");
  absl::StatusOr<graph::OnnxModel> m = model(false, false);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->graph.tensor("mask").dtype(), graph::F32);
  const std::vector<int32_t> ids = {2, 0, 3, 1}, mask = {1, 0, 5, 0};  // (5: any non-zero is true)
  std::vector<float> want;
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 3; ++j) want.push_back(mask[r] != 0 ? static_cast<float>(ids[r] * 3 + j) + 1.0f : 0.0f);
  }
  absl::StatusOr<scheduler::Schedule> pass = scheduler::Compile(m->graph, "mask.onnx", scheduler::CompileOptions());
  ASSERT_TRUE(pass.ok()) << pass.status();
  absl::StatusOr<std::unique_ptr<runtime::GraphRunner>> runner =
      runtime::GraphRunner::Create(*pass, m->weights, runtime::GraphRunner::Backend::kCpu);
  ASSERT_TRUE(runner.ok()) << runner.status();
  absl::StatusOr<runtime::TensorMap> got = (*runner)->Run(
      {{"ids", graph::HostTensor::FromI32({1, 4}, ids)}, {"mask", graph::HostTensor::FromI32({1, 4}, mask)}});
  ASSERT_TRUE(got.ok()) << got.status();
  const graph::HostTensor& y = got->at(m->outputs[0]);
  ASSERT_EQ(y.size(), 12);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y.Get(static_cast<int64_t>(i)), want[i]) << "at " << i;
  absl::StatusOr<runtime::TensorMap> big =
      (*runner)->Run({{"ids", graph::HostTensor::FromI32({1, 4}, ids)},
                      {"mask", graph::HostTensor::FromI32({1, 4}, {1, 16777217, 0, 0})}});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().message(),
            "input 'mask': value 1 is 16777217, past 2^24 (read as float32, which holds it inexactly)");
}

// Where(IsNaN(x), 0, x), as torch exports scaled_dot_product_attention's softmax: NaN becomes 0, the rest passes.
TEST(OnnxLookup, IsNaNOnActivations) {
  onnx::ModelProto proto;
  proto.add_opset_import()->set_version(20);
  onnx::GraphProto* g = proto.mutable_graph();
  AddValue(g->add_input(), "x", {6});
  *g->add_initializer() = FloatTensor("zero", {}, {0.0f});
  AddNamedNode(g, "IsNaN", {"x"}, "nan");
  AddNamedNode(g, "Where", {"nan", "zero", "x"}, "y");
  AddValue(g->add_output(), "y", {6});
  absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "isnan.onnx");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<float> x = {1.5f, NAN, -INFINITY, 0.0f, NAN, 3.0f};
  const std::vector<float> want = {1.5f, 0.0f, -INFINITY, 0.0f, 0.0f, 3.0f};
  const graph::HostTensor in = graph::HostTensor::FromF32({6}, x);
  std::vector<std::vector<float>> outs = {Evaluate(*m, in, 0)};
  for (std::vector<float>& lowered : RunLowered(*m, in, "isnan.onnx")) outs.push_back(std::move(lowered));
  ASSERT_GE(outs.size(), 2u);
  for (const std::vector<float>& y : outs) {
    ASSERT_EQ(y.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[i], want[i]) << "at " << i;
  }
}

// Gather of an activation at a run of consecutive constant indices is a slice, reshaped to the indices' shape (torch
// exports an identity as_strided so: AdaptiveAvgPool2d's in ConvNeXt); other index lists are refused by name.
TEST(OnnxLookup, GatherOfConsecutiveIndicesIsASlice) {
  for (bool consecutive : {true, false}) {
    onnx::ModelProto proto;
    proto.add_opset_import()->set_version(20);
    onnx::GraphProto* g = proto.mutable_graph();
    AddValue(g->add_input(), "x", {2, 6});
    *g->add_initializer() = Int64Tensor("at", {1, 4}, consecutive ? std::vector<int64_t>{1, 2, 3, 4}
                                                                  : std::vector<int64_t>{1, 3, 2, 4});
    onnx::NodeProto* n = AddNamedNode(g, "Gather", {"x", "at"}, "y");
    onnx::AttributeProto* axis = n->add_attribute();
    axis->set_name("axis"), axis->set_type(onnx::AttributeProto::INT), axis->set_i(1);
    AddValue(g->add_output(), "y", {2, 1, 4});
    absl::StatusOr<graph::OnnxModel> m = graph::ImportOnnxBytes(proto.SerializeAsString(), "run.onnx");
    if (!consecutive) {
      ASSERT_FALSE(m.ok());
      EXPECT_EQ(m.status().message(),
                "run.onnx: node 'y' (Gather): 4 indices of an activation, not consecutive (Loom gathers a run)");
      continue;
    }
    ASSERT_TRUE(m.ok()) << m.status();
    const graph::HostTensor x = graph::HostTensor::FromF32({2, 6}, Ramp(12, 1.0f, 0.0f));
    std::vector<std::vector<float>> outs = {Evaluate(*m, x, 0)};
    for (std::vector<float>& lowered : RunLowered(*m, x, "run.onnx")) outs.push_back(std::move(lowered));
    ASSERT_GE(outs.size(), 2u);
    for (const std::vector<float>& y : outs) {
      EXPECT_EQ(y, (std::vector<float>{x.f32[1], x.f32[2], x.f32[3], x.f32[4], x.f32[7], x.f32[8], x.f32[9], x.f32[10]}));
    }
  }
}

// .npy files of int64 and int32 read as i32 (ids); an int64 outside int32 is refused naming the value.
TEST(OnnxLookup, NpyIntegerArrays) {
  auto write = [](const std::string& path, const std::string& descr, const void* data, size_t bytes) {
    std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (3,), }";
    header.resize(118, ' ');
    header += '\n';
    std::ofstream out(path, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    out.write(reinterpret_cast<const char*>(&len), 2);
    out << header;
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  };
  const std::string dir = ::testing::TempDir();
  const int64_t wide[3] = {7, 0, 2147483647};
  write(dir + "/ids64.npy", "<i8", wide, sizeof(wide));
  absl::StatusOr<graph::HostTensor> t = graph::ReadNpy(dir + "/ids64.npy");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype, graph::I32);
  EXPECT_EQ(t->i32, (std::vector<int32_t>{7, 0, 2147483647}));
  const int32_t narrow[3] = {-1, 5, 9};
  write(dir + "/ids32.npy", "<i4", narrow, sizeof(narrow));
  t = graph::ReadNpy(dir + "/ids32.npy");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->i32, (std::vector<int32_t>{-1, 5, 9}));
  const int64_t big[3] = {1, 2147483648LL, 3};
  write(dir + "/big.npy", "<i8", big, sizeof(big));
  t = graph::ReadNpy(dir + "/big.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), dir + "/big.npy: value 1 (2147483648) is outside int32");
}

}  // namespace
}  // namespace loom
