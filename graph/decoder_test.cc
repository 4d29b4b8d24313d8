// Decoder models: presets, graphs of each family, and export -> load round trips.
#include "graph/decoder.h"

#include <filesystem>

#include "graph/evaluator.h"
#include "graph/hf_config.h"
#include "graph/model.h"
#include "graph/proto_file.h"
#include "graph/safetensors.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

namespace fs = std::filesystem;

TEST(DecoderConfig, PresetOneBHasTheRightShapeAndBytes) {
  absl::StatusOr<DecoderConfig> c = DecoderPreset("llama-3.2-1b");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_TRUE(c->tie_word_embeddings);
  // 1,235,814,400 parameters in bf16 plus one embedding row.
  EXPECT_EQ(c->DecodeWeightBytes(), 2 * (1235814400LL + 2048));
  absl::StatusOr<Graph> g = BuildDecoderGraph(*c, 256);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->def().ops_size(), 1 + 16 * 15 + 3);
}

TEST(DecoderConfig, UnknownPresetListsTheKnownOnes) {
  absl::StatusOr<Model> m = LoadModel("random:gpt-5");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("unknown preset 'random:gpt-5'"), std::string::npos);
  EXPECT_NE(m.status().message().find("random:tiny"), std::string::npos);
}

// A family's front-end writes the config.json transformers loads for it, and reads it back to the same model.
TEST(DecoderModel, EveryPresetExportsAndLoadsBackToTheSameLogits) {
  for (const std::string& preset : DecoderPresetNames()) {
    if (preset == "llama-3.2-1b") continue;  // 2.5 GB
    absl::StatusOr<Model> m = LoadModel("random:" + preset);
    ASSERT_TRUE(m.ok()) << preset << ": " << m.status();
    const std::string dir = testing::TempDir() + "/export_" + preset;
    ASSERT_TRUE(ExportModel(*m, dir).ok()) << preset;
    absl::StatusOr<Model> back = LoadModel(dir);
    ASSERT_TRUE(back.ok()) << preset << ": " << back.status();
    EXPECT_EQ(back->config.family, m->config.family);
    EXPECT_EQ(back->config.rope.SerializeAsString(), m->config.rope.SerializeAsString()) << preset;
    EXPECT_EQ(back->graph.def().SerializeAsString(), m->graph.def().SerializeAsString()) << preset;
    EXPECT_TRUE(back->notes.empty()) << preset << ": " << back->notes[0];
    Evaluator e1(m->graph, m->weights), e2(back->graph, back->weights);
    const absl::flat_hash_map<std::string, HostTensor> in = {{"token", HostTensor::FromI32({1}, {5})},
                                                             {"pos", HostTensor::FromI32({1}, {3})}};
    ASSERT_TRUE(e1.Run(in).ok());
    ASSERT_TRUE(e2.Run(in).ok());
    EXPECT_EQ(e1.Get("logits").f32, e2.Get("logits").f32) << preset;
  }
}

TEST(DecoderConfig, FamilyFeaturesBecomeGraphOps) {
  auto count = [](const Graph& g, OpType type, const std::string& name_part) {
    int n = 0;
    for (const OpDef& op : g.def().ops()) n += op.type() == type && op.name().find(name_part) != std::string::npos;
    return n;
  };
  absl::StatusOr<DecoderConfig> qwen3 = DecoderPreset("tiny-qwen3");
  ASSERT_TRUE(qwen3.ok());
  absl::StatusOr<Graph> g = BuildDecoderGraph(*qwen3, 32);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(count(*g, RMS_NORM, "q_norm"), 2);  // per-head norms, one per layer
  for (const OpDef& op : g->def().ops()) {
    if (op.name() == "layers.0.q_norm") EXPECT_EQ(op.norm().group_size(), 64);
    if (op.name() == "layers.0.q") EXPECT_EQ(g->tensor(op.outputs(0)).shape(1), 8 * 64);  // not hidden (256)
  }
  absl::StatusOr<DecoderConfig> qwen2 = DecoderPreset("tiny-qwen2");
  ASSERT_TRUE(qwen2.ok());
  g = BuildDecoderGraph(*qwen2, 32);
  ASSERT_TRUE(g.ok()) << g.status();
  int biased = 0;
  for (const OpDef& op : g->def().ops()) biased += op.type() == LINEAR && op.inputs_size() == 3;
  EXPECT_EQ(biased, 2 * 3);  // q, k, v of each layer; not o, not the MLP
  qwen2->sliding_window = {0, 16};
  EXPECT_TRUE(BuildDecoderGraph(*qwen2, 16).ok());  // the window covers the whole cache
  absl::StatusOr<Graph> windowed = BuildDecoderGraph(*qwen2, 32);
  ASSERT_FALSE(windowed.ok());
  EXPECT_NE(windowed.status().message().find("sliding_window 16 (layer 1) is smaller than the KV cache of 32"),
            std::string::npos)
      << windowed.status();
}

TEST(DecoderModel, RandomWeightsAreDeterministic) {
  absl::StatusOr<Model> a = LoadModel("random:tiny");
  absl::StatusOr<Model> b = LoadModel("random:tiny");
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& [name, t] : a->weights) EXPECT_EQ(t.bf16, b->weights.at(name).bf16) << name;
  EXPECT_NE(a->weights.at("model.layers.0.mlp.up_proj.weight").bf16,
            a->weights.at("model.layers.1.mlp.up_proj.weight").bf16);
}

TEST(DecoderModel, ExportThenLoadGivesTheSameModelAndLogits) {
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

TEST(DecoderModel, FoldersThatLieAreRejected) {
  absl::StatusOr<Model> m = LoadModel("random:tiny");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/tiny_lies";
  ASSERT_TRUE(ExportModel(*m, dir).ok());
  // config claims a bigger hidden size than the weights have
  nlohmann::json j = *HfConfigToJson(m->config);
  j["intermediate_size"] = 1024;
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", j.dump()).ok());
  absl::StatusOr<Model> bad = LoadModel(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("has shape [512,256], config.json implies [1024,256]"), std::string::npos)
      << bad.status();
  // truncated weights file
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", HfConfigToJson(m->config)->dump()).ok());
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  bad = LoadModel(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.safetensors"), std::string::npos) << bad.status();
  EXPECT_FALSE(LoadModel(testing::TempDir() + "/no_such_model").ok());
}

TEST(DecoderModel, TensorsTheConfigDoesNotUseAreNoted) {
  absl::StatusOr<Model> m = LoadModel("random:tiny");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/tiny_extra";
  ASSERT_TRUE(ExportModel(*m, dir).ok());
  // The folder says attention_bias false but carries a bias (transformers would skip it too).
  std::vector<std::pair<std::string, const HostTensor*>> tensors;
  for (const auto& [name, shape] : DecoderWeightShapes(m->config)) tensors.emplace_back(name, &m->weights.at(name));
  const HostTensor bias = HostTensor::Zeros(BF16, {256});
  tensors.emplace_back("model.layers.0.self_attn.q_proj.bias", &bias);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  absl::StatusOr<Model> back = LoadModel(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->notes.size(), 1u);
  EXPECT_NE(back->notes[0].find("tensors config.json does not use, ignored: model.layers.0.self_attn.q_proj.bias"),
            std::string::npos)
      << back->notes[0];
}

// F32 weights (as a float32 save_pretrained writes them) load, rounded to bf16, with a note saying so.
TEST(DecoderModel, Float32WeightsLoadWithANote) {
  absl::StatusOr<Model> m = LoadModel("random:tiny-qwen3");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/qwen3_f32";
  ASSERT_TRUE(ExportModel(*m, dir).ok());
  std::vector<HostTensor> wide;
  wide.reserve(m->weights.size());
  std::vector<std::pair<std::string, const HostTensor*>> tensors;
  for (const auto& [name, shape] : DecoderWeightShapes(m->config)) {
    const HostTensor& t = m->weights.at(name);
    HostTensor f = HostTensor::Zeros(F32, t.shape);
    for (int64_t i = 0; i < t.size(); ++i) f.f32[i] = t.Get(i);
    wide.push_back(std::move(f));
    tensors.emplace_back(name, &wide.back());
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  absl::StatusOr<Model> back = LoadModel(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->notes.size(), 1u);
  EXPECT_NE(back->notes[0].find("weights stored as F32 are rounded to bf16"), std::string::npos) << back->notes[0];
  for (const auto& [name, t] : m->weights) EXPECT_EQ(t.bf16, back->weights.at(name).bf16) << name;  // exact
}

TEST(DecoderModel, ShardedIndexIsFollowed) {
  absl::StatusOr<Model> m = LoadModel("random:tiny");
  ASSERT_TRUE(m.ok());
  const std::string dir = testing::TempDir() + "/tiny_sharded";
  fs::create_directories(dir);
  std::vector<std::pair<std::string, const HostTensor*>> first, second;
  nlohmann::json map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, shape] : DecoderWeightShapes(m->config)) {
    const bool one = (i++ % 2) == 0;
    (one ? first : second).emplace_back(name, &m->weights.at(name));
    map[name] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", second).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json",
                                  nlohmann::json({{"weight_map", map}}).dump())
                  .ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", HfConfigToJson(m->config)->dump()).ok());
  absl::StatusOr<Model> back = LoadModel(dir);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, t] : m->weights) EXPECT_EQ(t.bf16, back->weights.at(name).bf16) << name;
}

}  // namespace
}  // namespace loom::graph
