// Llama front-end: config parsing, presets, and export -> load round trips.
#include "graph/llama.h"

#include <filesystem>

#include "graph/evaluator.h"
#include "graph/model.h"
#include "graph/proto_file.h"
#include "graph/safetensors.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

namespace fs = std::filesystem;

TEST(LlamaConfig, PresetOneBHasTheRightShapeAndBytes) {
  absl::StatusOr<LlamaConfig> c = LlamaPreset("llama-3.2-1b");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_TRUE(c->tie_word_embeddings);
  // 1,235,814,400 parameters in bf16 plus one embedding row.
  EXPECT_EQ(c->DecodeWeightBytes(), 2 * (1235814400LL + 2048));
  absl::StatusOr<Graph> g = BuildLlamaDecodeGraph(*c, 256);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->def().ops_size(), 1 + 16 * 15 + 3);
}

TEST(LlamaConfig, UnknownPresetListsTheKnownOnes) {
  absl::StatusOr<Model> m = LoadModel("random:gpt-5");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("unknown preset 'random:gpt-5'"), std::string::npos);
  EXPECT_NE(m.status().message().find("random:tiny"), std::string::npos);
}

TEST(LlamaConfig, ParsesHuggingFaceJsonAndRejectsMissingFields) {
  absl::StatusOr<LlamaConfig> c = LlamaPreset("llama-3.2-1b");
  const std::string text = LlamaConfigToJson(*c).dump();
  absl::StatusOr<LlamaConfig> back = ParseLlamaConfig(text, "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->num_kv_heads, 8);
  EXPECT_EQ(back->llama3_scaling->original_max_position(), 8192);

  nlohmann::json j = LlamaConfigToJson(*c);
  j.erase("hidden_size");
  absl::StatusOr<LlamaConfig> missing = ParseLlamaConfig(j.dump(), "cfg/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "cfg/config.json: missing field 'hidden_size'");
  j = LlamaConfigToJson(*c);
  j["num_attention_heads"] = 7;
  EXPECT_FALSE(ParseLlamaConfig(j.dump(), "c").ok());
  j = LlamaConfigToJson(*c);
  j["model_type"] = "gpt2";
  EXPECT_FALSE(ParseLlamaConfig(j.dump(), "c").ok());
  EXPECT_FALSE(ParseLlamaConfig("{not json", "c").ok());
}

TEST(LlamaModel, RandomWeightsAreDeterministic) {
  absl::StatusOr<Model> a = LoadModel("random:tiny");
  absl::StatusOr<Model> b = LoadModel("random:tiny");
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& [name, t] : a->weights) EXPECT_EQ(t.bf16, b->weights.at(name).bf16) << name;
  EXPECT_NE(a->weights.at("model.layers.0.mlp.up_proj.weight").bf16,
            a->weights.at("model.layers.1.mlp.up_proj.weight").bf16);
}

TEST(LlamaModel, ExportThenLoadGivesTheSameModelAndLogits) {
  absl::StatusOr<Model> m = LoadModel("random:tiny");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/tiny_export";
  ASSERT_TRUE(ExportModel(*m, dir).ok());
  absl::StatusOr<Model> back = LoadModel(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, t] : m->weights) EXPECT_EQ(t.bf16, back->weights.at(name).bf16) << name;
  Evaluator e1(m->graph, m->weights), e2(back->graph, back->weights);
  const absl::flat_hash_map<std::string, HostTensor> in = {{"token", HostTensor::FromI32({1}, {5})},
                                                           {"pos", HostTensor::FromI32({1}, {0})}};
  ASSERT_TRUE(e1.Run(in).ok());
  ASSERT_TRUE(e2.Run(in).ok());
  EXPECT_EQ(e1.Get("logits").f32, e2.Get("logits").f32);
}

TEST(LlamaModel, FoldersThatLieAreRejected) {
  absl::StatusOr<Model> m = LoadModel("random:tiny");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/tiny_lies";
  ASSERT_TRUE(ExportModel(*m, dir).ok());
  // config claims a bigger hidden size than the weights have
  nlohmann::json j = LlamaConfigToJson(m->config);
  j["intermediate_size"] = 1024;
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", j.dump()).ok());
  absl::StatusOr<Model> bad = LoadModel(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("has shape [512,256], config.json implies [1024,256]"), std::string::npos)
      << bad.status();
  // truncated weights file
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", LlamaConfigToJson(m->config).dump()).ok());
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  bad = LoadModel(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.safetensors"), std::string::npos) << bad.status();
  EXPECT_FALSE(LoadModel(testing::TempDir() + "/no_such_model").ok());
}

TEST(LlamaModel, ShardedIndexIsFollowed) {
  absl::StatusOr<Model> m = LoadModel("random:tiny");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/tiny_sharded";
  fs::create_directories(dir);
  std::vector<std::pair<std::string, const HostTensor*>> first, second;
  nlohmann::json map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, shape] : LlamaWeightShapes(m->config)) {
    const bool one = (i++ % 2) == 0;
    (one ? first : second).emplace_back(name, &m->weights.at(name));
    map[name] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json",
                                  nlohmann::json({{"weight_map", map}}).dump())
                  .ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", LlamaConfigToJson(m->config).dump()).ok());
  absl::StatusOr<Model> back = LoadModel(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, t] : m->weights) EXPECT_EQ(t.bf16, back->weights.at(name).bf16) << name;
}

}  // namespace
}  // namespace loom::graph
