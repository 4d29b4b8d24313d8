// Graph IR: textual graphs in, verification results out.
#include "graph/graph.h"

#include <filesystem>

#include "google/protobuf/text_format.h"
#include "graph/graph_builder.h"
#include "graph/proto_file.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

GraphDef Parse(const std::string& text) {
  GraphDef def;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &def)) << text;
  return def;
}

constexpr char kMlp[] = R"pb(
  name: "mlp"
  tensors { name: "x" shape: [ 1, 8 ] dtype: F32 kind: INPUT }
  tensors { name: "w" shape: [ 4, 8 ] dtype: BF16 kind: WEIGHT }
  tensors { name: "y" shape: [ 1, 4 ] dtype: F32 kind: ACTIVATION }
  tensors { name: "z" shape: [ 1, 4 ] dtype: F32 kind: ACTIVATION is_output: true }
  ops { name: "mm" type: LINEAR inputs: [ "x", "w" ] outputs: "y" }
  ops { name: "sq" type: SILU_MUL inputs: [ "y", "y" ] outputs: "z" }
)pb";

TEST(GraphVerify, AcceptsWellFormedGraphAndOrdersProducersFirst) {
  GraphDef def = Parse(kMlp);
  std::swap(*def.mutable_ops(0), *def.mutable_ops(1));  // declared out of order
  absl::StatusOr<Graph> g = Graph::Create(def);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->def().ops(g->topological_order()[0]).name(), "mm");
  EXPECT_EQ(g->producer("y")->name(), "mm");
  EXPECT_EQ(g->producer("x"), nullptr);
  ASSERT_EQ(g->consumers("y").size(), 1u);
}

struct BadCase {
  const char* what;
  std::string edit;      // text appended to kMlp (later fields of repeated messages)
  std::string expected;  // substring of the error
};

TEST(GraphVerify, RejectsBadGraphsNamingOpAndTensor) {
  const std::vector<BadCase> cases = {
      {"shape mismatch", R"(tensors { name: "w2" shape: [4, 9] dtype: BF16 kind: WEIGHT }
                            tensors { name: "y2" shape: [1, 4] dtype: F32 kind: ACTIVATION }
                            ops { name: "mm2" type: LINEAR inputs: ["x", "w2"] outputs: "y2" })",
       "op 'mm2' (LINEAR): tensor 'w2' has shape [4,9], expected [4,8]"},
      {"dtype mismatch", R"(tensors { name: "ids" shape: [1] dtype: F32 kind: INPUT }
                            tensors { name: "e" shape: [1, 8] dtype: F32 kind: ACTIVATION }
                            ops { name: "emb" type: EMBEDDING inputs: ["w", "ids"] outputs: "e" })",
       "op 'emb' (EMBEDDING): tensor 'ids' has dtype f32"},
      {"dangling input", R"(ops { name: "bad" type: ADD inputs: ["y", "nope"] outputs: "q" })",
       "op 'bad' reads undeclared tensor 'nope'"},
      {"never defined", R"(tensors { name: "lost" shape: [1] dtype: F32 kind: ACTIVATION })",
       "activation tensor 'lost' is never defined"},
      {"defined twice", R"(ops { name: "again" type: ADD inputs: ["y", "y"] outputs: "z" })",
       "tensor 'z' is defined twice: by op 'sq' and op 'again'"},
      {"writes a weight", R"(ops { name: "clobber" type: ADD inputs: ["y", "y"] outputs: "w" })",
       "op 'clobber' writes tensor 'w' of kind WEIGHT"},
      {"cycle", R"(tensors { name: "a" shape: [1, 4] dtype: F32 kind: ACTIVATION }
                   tensors { name: "b" shape: [1, 4] dtype: F32 kind: ACTIVATION }
                   ops { name: "p" type: ADD inputs: ["a", "y"] outputs: "b" }
                   ops { name: "q" type: ADD inputs: ["b", "y"] outputs: "a" })",
       "is on a cycle"},
      {"duplicate tensor", R"(tensors { name: "x" shape: [1] dtype: F32 kind: INPUT })",
       "tensor 'x' is declared twice"},
      {"no dtype", R"(tensors { name: "u" shape: [1] kind: INPUT })", "tensor 'u' has no dtype"},
      {"bad norm eps", R"(tensors { name: "g" shape: [8] dtype: BF16 kind: WEIGHT }
                          tensors { name: "n" shape: [1, 8] dtype: F32 kind: ACTIVATION }
                          ops { name: "norm" type: RMS_NORM inputs: ["x", "g"] outputs: "n" })",
       "op 'norm' (RMS_NORM): needs norm attrs with eps > 0"},
  };
  for (const BadCase& c : cases) {
    absl::Status s = VerifyGraph(Parse(std::string(kMlp) + c.edit));
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << c.what << ": got " << s.message();
  }
}

TEST(GraphFiles, TextAndBinaryRoundTrip) {
  absl::StatusOr<Graph> g = Graph::Create(Parse(kMlp));
  ASSERT_TRUE(g.ok());
  const std::string dir = testing::TempDir();
  for (const char* name : {"g.pbtxt", "g.pb"}) {
    const std::string path = dir + "/" + name;
    ASSERT_TRUE(g->Save(path).ok());
    absl::StatusOr<Graph> back = Graph::Load(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->def().SerializeAsString(), g->def().SerializeAsString());
  }
}

TEST(GraphFiles, CorruptFilesGiveOneLineErrorsNamingTheFile) {
  const std::string path = testing::TempDir() + "/broken.pbtxt";
  ASSERT_TRUE(WriteFileAtomically(path, "tensors { name: \"x\" shape: [1 dtype: F32 }").ok());
  absl::StatusOr<Graph> g = Graph::Load(path);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find(path), std::string::npos);
  EXPECT_NE(g.status().message().find("line 1"), std::string::npos);
  EXPECT_EQ(g.status().message().find('\n'), std::string::npos);

  const std::string bin = testing::TempDir() + "/broken.pb";
  ASSERT_TRUE(WriteFileAtomically(bin, std::string("\x12\xff\xff\xff\x0f garbage", 13)).ok());
  EXPECT_FALSE(Graph::Load(bin).ok());
  EXPECT_FALSE(Graph::Load(testing::TempDir() + "/does_not_exist.pb").ok());
}

TEST(GraphBuilder, BuildsEveryOpTypeAndInfersShapes) {
  GraphBuilder b("all_ops");
  const std::string ids = b.Input("ids", {3}, I32);
  const std::string pos = b.Input("pos", {1}, I32);
  b.Weight("table", {10, 8});
  b.Weight("g", {8});
  b.Weight("beta", {8});
  b.Weight("w", {8, 8});
  b.Weight("bias", {8});
  b.Weight("conv_w", {8, 3});
  b.Weight("conv2d_w", {4, 3, 3, 2});
  b.State("conv_state", {8, 2});
  b.State("kc", {2, 16, 4});
  b.State("vc", {2, 16, 4});
  b.Input("img", {1, 5, 5, 2}, F32);
  std::string x = b.Embedding("e", "table", ids);
  x = b.RmsNorm("rn", x, "g", 1e-5f);
  x = b.LayerNorm("ln", x, "g", "beta", 1e-5f);
  x = b.Linear("lin", x, "w", "bias");
  RopeAttrs rope;
  rope.set_head_dim(4);
  rope.set_theta(10000);
  const std::string q = b.Rope("q", x, pos, rope);
  const std::string kv = b.Linear("kv", x, "w");
  GraphDef probe;
  AttentionAttrs attn;
  attn.set_num_heads(2);
  attn.set_num_kv_heads(2);
  attn.set_head_dim(4);
  attn.set_causal(true);
  const std::string a = b.Attention("attn", q, kv, kv, "kc", "vc", pos, attn);
  const std::string s = b.SiluMul("silu", a, x);
  const std::string c = b.Conv1d("conv", s, "conv_w", "conv_state");
  const std::string sum = b.Add("sum", c, x);
  b.Argmax("am", sum);
  Conv2dAttrs conv;
  conv.set_stride_h(2);
  conv.set_stride_w(2);
  conv.set_pad_h(1);
  conv.set_pad_w(1);
  b.Conv2d("c2", "img", "conv2d_w", "", conv);
  absl::StatusOr<Graph> g = std::move(b).Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(ShapeString(g->tensor("c2")), "[1,3,3,4]");
  EXPECT_EQ(ShapeString(g->tensor("am")), "[3]");
}

}  // namespace
}  // namespace loom::graph
