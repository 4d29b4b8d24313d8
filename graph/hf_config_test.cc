// Reading Hugging Face config.json: the files transformers 4.x and 5.x write for
// every family (tests/data/hf_configs), each field that changes the math
// honoured or refused with the file and field named, defaults only where the
// family's transformers config class defines them.
#include "graph/hf_config.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "graph/proto_file.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A Llama-3.2-1B config as transformers 4.x writes it.
json Llama4x() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "tie_word_embeddings": true,
    "attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16", "transformers_version": "4.57.6"})");
}

// The same model as transformers 5.x writes it: rope settings under rope_parameters.
json Llama5x() {
  json j = Llama4x();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j["rope_parameters"] = json::parse(R"({"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3", "rope_theta": 500000.0})");
  return j;
}

absl::StatusOr<DecoderConfig> Parse(const json& j, std::vector<std::string>* unused = nullptr) {
  return ParseHfConfig(j.dump(), "m/config.json", unused);
}

std::string Error(const json& j) {
  absl::StatusOr<DecoderConfig> c = Parse(j);
  return c.ok() ? "parsed" : std::string(c.status().message());
}

TEST(HfConfig, BothLayoutsGiveTheSameModel) {
  absl::StatusOr<DecoderConfig> a = Parse(Llama4x()), b = Parse(Llama5x());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->rope.theta(), 500000.0f);
  EXPECT_EQ(a->rope.llama3_scaling().factor(), 32.0f);
  EXPECT_EQ(a->rope.llama3_scaling().original_max_position(), 8192);
  EXPECT_EQ(a->rope.SerializeAsString(), b->rope.SerializeAsString());
  EXPECT_TRUE(a->tie_word_embeddings);
  EXPECT_EQ(a->num_kv_heads, 8);
  // Both at once must agree; transformers 5 would silently prefer rope_scaling.
  json both = Llama4x();
  both["rope_parameters"] = Llama5x()["rope_parameters"];
  EXPECT_TRUE(Parse(both).ok());
  both["rope_parameters"]["factor"] = 8.0;
  EXPECT_NE(Error(both).find("m/config.json: field 'rope_parameters' = {\"factor\":8.0,"), std::string::npos);
  EXPECT_NE(Error(both).find(": disagrees with rope_scaling"), std::string::npos);
  json theta = Llama5x();
  theta["rope_theta"] = 10000.0;
  EXPECT_EQ(Error(theta), "m/config.json: field 'rope_parameters.rope_theta' = 500000.0: disagrees with the top-level "
                          "rope_theta 10000");
  // With rope_scaling present too, rope_parameters' rope_theta is still compared (docs/models.md: they agree).
  json three = Llama4x();
  three["rope_parameters"] = Llama5x()["rope_parameters"];
  three["rope_parameters"]["rope_theta"] = 10000.0;
  EXPECT_EQ(Error(three), "m/config.json: field 'rope_parameters.rope_theta' = 10000.0: disagrees with the top-level "
                          "rope_theta 500000");
  three.erase("rope_theta");
  three["rope_scaling"]["rope_theta"] = 500000.0;
  EXPECT_EQ(Error(three), "m/config.json: field 'rope_parameters.rope_theta' = 10000.0: disagrees with "
                          "rope_scaling.rope_theta 500000");
  three["rope_scaling"].erase("rope_theta");  // the only theta given is rope_parameters': it is the model's
  absl::StatusOr<DecoderConfig> only = Parse(three);
  ASSERT_TRUE(only.ok()) << only.status();
  EXPECT_EQ(only->rope.theta(), 10000.0f);
}

TEST(HfConfig, RopeTypes) {
  json j = Llama4x();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the old key name
  absl::StatusOr<DecoderConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.linear_factor(), 2.0f);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.yarn().original_max_position(), 32768);
  EXPECT_FLOAT_EQ(c->rope.yarn().attention_factor(), 0.1f * std::log(4.0f) + 1.0f);  // get_mscale(factor)
  EXPECT_EQ(c->rope.yarn().beta_fast(), 32.0f);
  EXPECT_EQ(c->rope.yarn().beta_slow(), 1.0f);
  EXPECT_TRUE(c->rope.yarn().truncate());
  j["rope_scaling"]["mscale"] = 0.707;  // DeepSeek style: mscale / mscale_all_dim
  j["rope_scaling"]["mscale_all_dim"] = 0.707;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_FLOAT_EQ(c->rope.yarn().attention_factor(), 1.0f);
  j["rope_scaling"]["attention_factor"] = 0.5;
  EXPECT_FLOAT_EQ(Parse(j)->rope.yarn().attention_factor(), 0.5f);
  // As Qwen2.5's model card has users add it, then as transformers writes it back (both keys).
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ASSERT_TRUE(Parse(j).ok());
  EXPECT_EQ(Parse(j)->rope.yarn().factor(), 4.0f);
  j["rope_scaling"]["rope_type"] = "yarn";
  std::vector<std::string> unused;
  ASSERT_TRUE(Parse(j, &unused).ok());
  EXPECT_TRUE(unused.empty()) << unused[0];
  j["rope_scaling"]["type"] = "linear";
  EXPECT_NE(Error(j).find("field 'rope_scaling.type' = \"linear\": disagrees with rope_type \"yarn\""),
            std::string::npos)
      << Error(j);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};  // original defaults to max_position_embeddings
  EXPECT_EQ(Parse(j)->rope.yarn().original_max_position(), 131072);
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(Error(j), "m/config.json: field 'rope_scaling.rope_type' = \"dynamic\": rope type not supported (Loom "
                      "implements default, linear, llama3 and yarn)");
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  EXPECT_NE(Error(j).find("\"longrope\": rope type not supported"), std::string::npos);
  j["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_EQ(Error(j), "m/config.json: 'rope_scaling': rope type \"linear\" needs field 'factor'");
  j["rope_scaling"] = nullptr;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->rope.has_llama3_scaling());
  j.erase("rope_theta");
  EXPECT_EQ(Parse(j)->rope.theta(), 10000.0f);  // transformers' default theta
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(Error(j), "m/config.json: field 'partial_rotary_factor' = 0.5: partial rotary embeddings are not supported");
}

TEST(HfConfig, MathChangingFieldsAreHonouredOrRefused) {
  json j = Llama4x();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  absl::StatusOr<DecoderConfig> c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->qkv_bias && c->o_bias && c->mlp_bias);
  j = Llama4x();
  j["hidden_act"] = "gelu";
  EXPECT_EQ(Error(j), "m/config.json: field 'hidden_act' = \"gelu\": Loom implements the SiLU-gated MLP (silu) only");
  j = Llama4x();
  j["sliding_window"] = 4;
  c = Parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sliding_window, std::vector<int>(16, 4));
  EXPECT_NE(c->CheckWindows(4096).message().find("sliding_window 4 (layer 0) is smaller than the KV cache of 4096"),
            std::string::npos);
  EXPECT_TRUE(c->CheckWindows(4).ok());
  j = Llama4x();
  j["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  EXPECT_EQ(Error(j), "m/config.json: field 'quantization_config.quant_method' = \"bitsandbytes\": Loom reads "
                      "compressed-tensors, AWQ and GPTQ checkpoints");
  j = Llama4x();
  j["architectures"] = {"LlamaForSequenceClassification"};
  EXPECT_NE(Error(j).find("Loom runs causal language models"), std::string::npos);
  j = Llama4x();
  j["model_type"] = "gpt2";
  EXPECT_EQ(Error(j), "m/config.json: field 'model_type' = \"gpt2\": not a family Loom reads (llama, mistral, qwen2, "
                      "qwen3)");
  j = Llama4x();
  j.erase("hidden_size");
  EXPECT_EQ(Error(j), "m/config.json: missing field 'hidden_size'");
  j = Llama4x();
  j["num_attention_heads"] = "32";
  EXPECT_EQ(Error(j), "m/config.json: field 'num_attention_heads' = \"32\": must be a positive integer");
  j = Llama4x();
  j["num_key_value_heads"] = 7;
  EXPECT_EQ(Error(j), "m/config.json: field 'num_key_value_heads' = 7: does not divide num_attention_heads 32");
  j = Llama4x();
  j["rms_norm_eps"] = -1;
  EXPECT_NE(Error(j).find("'rms_norm_eps' = -1: must be > 0"), std::string::npos);
  // Text that is not JSON: where it stops being JSON and what the parser expected there, on one line.
  auto error_of = [](const std::string& text) {
    return std::string(ParseHfConfig(text, "m/config.json").status().message());
  };
  EXPECT_EQ(error_of("{\"model_type\": \"llama\",\n \"rope_theta\": NaN}"),
            "m/config.json: not valid JSON: parse error at line 2, column 16: syntax error while parsing value - "
            "invalid literal; last read: '\"rope_theta\": N' (byte 40)");
  const std::string cut = error_of(Llama4x().dump().substr(0, 100));
  EXPECT_EQ(cut.rfind("m/config.json: not valid JSON: parse error at line 1, column 101: ", 0), 0u) << cut;
  EXPECT_NE(cut.find("(byte 101)"), std::string::npos) << cut;
  EXPECT_EQ(error_of(" \n").rfind("m/config.json: not valid JSON (the file is empty): parse error at line 2", 0), 0u)
      << error_of(" \n");
  EXPECT_EQ(error_of("{not json").rfind("m/config.json: not valid JSON: parse error at line 1, column 3: ", 0), 0u)
      << error_of("{not json");
  EXPECT_EQ(error_of("[1, 2]"), "m/config.json: not a JSON object but array");
}

// A shape field past any real model's (config_limits.h) is refused by name while parsing: the graph and weight
// tables a billion layers imply are never built.
TEST(HfConfig, ImplausibleSizesAreRefusedByField) {
  for (double layers : {1e5, 1e6, 1e9}) {
    json j = Llama4x();
    j["num_hidden_layers"] = layers;
    EXPECT_EQ(Error(j), absl::StrCat("m/config.json: field 'num_hidden_layers' = ", j["num_hidden_layers"].dump(),
                                     ": implausible: more than 1024, beyond any published model"));
  }
  for (auto [field, value] : {std::pair{"hidden_size", 1 << 20}, {"intermediate_size", 1 << 24},
                              {"vocab_size", 1 << 28}, {"max_position_embeddings", 1 << 30}, {"head_dim", 4096}}) {
    json j = Llama4x();
    j[field] = value;
    EXPECT_NE(Error(j).find(absl::StrCat("field '", field, "' = ", value, ": implausible: more than ")),
              std::string::npos)
        << Error(j);
  }
  json heads = Llama4x();  // head_dim derived from the others: named all the same
  heads.erase("head_dim");
  heads["hidden_size"] = 65536;
  heads["num_attention_heads"] = 32;
  EXPECT_EQ(Error(heads), "m/config.json: head_dim 2048: implausible: more than 1024, beyond any published model");
  json big = Llama4x();  // Llama 3.1 405B's shape is plausible
  big["num_hidden_layers"] = 126;
  big["hidden_size"] = 16384;
  big["intermediate_size"] = 53248;
  big["num_attention_heads"] = 128;
  big["head_dim"] = 128;
  EXPECT_TRUE(Parse(big).ok()) << Error(big);
}

TEST(HfConfig, DefaultsAreTheFamilyClassDefaults) {
  json j = Llama4x();
  for (const char* key : {"num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                          "tie_word_embeddings", "hidden_act"}) {
    j.erase(key);
  }
  absl::StatusOr<DecoderConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 32);  // LlamaConfig: None -> num_attention_heads
  EXPECT_EQ(c->head_dim, 64);      // hidden_size / num_attention_heads
  EXPECT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  j["model_type"] = "mistral";
  j["architectures"] = {"MistralForCausalLM"};
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);                             // MistralConfig's default
  EXPECT_EQ(c->sliding_window, std::vector<int>(16, 4096));  // absent: 4096, as MistralConfig
  j["sliding_window"] = nullptr;
  j["num_key_value_heads"] = nullptr;
  c = Parse(j);
  EXPECT_TRUE(c->sliding_window.empty());
  EXPECT_EQ(c->num_kv_heads, 32);  // null: as many as attention heads
  j["model_type"] = "qwen3";
  j["architectures"] = {"Qwen3ForCausalLM"};
  j.erase("sliding_window");
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);  // Qwen3Config: head_dim 128, not hidden / heads
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->max_position_embeddings, 32768);
}

TEST(HfConfig, QwenWindowsFollowUseSlidingWindowAndLayerTypes) {
  json j = Llama4x();
  j["model_type"] = "qwen2";
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["sliding_window"] = 4096;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = 8;
  absl::StatusOr<DecoderConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_EQ(c->sliding_window, std::vector<int>(16, 0));  // not used
  j["use_sliding_window"] = true;
  c = Parse(j);
  std::vector<int> want(16, 0);
  for (int l = 8; l < 16; ++l) want[l] = 4096;
  EXPECT_EQ(c->sliding_window, want);  // from max_window_layers on
  j["layer_types"] = json::array();
  for (int l = 0; l < 16; ++l) j["layer_types"].push_back(l == 3 ? "sliding_attention" : "full_attention");
  c = Parse(j);
  want.assign(16, 0);
  want[3] = 4096;
  EXPECT_EQ(c->sliding_window, want);  // layer_types wins
  j["layer_types"][5] = "chunked_attention";
  EXPECT_NE(Error(j).find("layer 5 has type \"chunked_attention\""), std::string::npos);
  j["layer_types"] = {"full_attention"};
  EXPECT_NE(Error(j).find("must list one type per layer (16)"), std::string::npos);
}

TEST(HfConfig, FieldsTransformersDoesNotReadAreListed) {
  json j = Llama4x();
  j["my_custom_field"] = 3;
  j["rope_scaling"]["unused_knob"] = 1;
  std::vector<std::string> unused;
  ASSERT_TRUE(Parse(j, &unused).ok());
  EXPECT_EQ(unused, (std::vector<std::string>{"my_custom_field", "rope_scaling.unused_knob"}));
}

// The files transformers itself wrote (tools/make_hf_config_fixtures.py): every
// one parses, and both versions' files of a model give the same DecoderConfig.
TEST(HfConfig, FilesTransformersWrote) {
  const fs::path root = fs::path(LOOM_SOURCE_DIR) / "tests/data/hf_configs";
  int parsed = 0;
  for (const char* version : {"transformers4", "transformers5"}) {
    ASSERT_TRUE(fs::is_directory(root / version)) << (root / version);
    for (const fs::directory_entry& e : fs::directory_iterator(root / version)) {
      if (e.path().extension() != ".json") continue;
      absl::StatusOr<std::string> text = ReadFileToString(e.path().string());
      ASSERT_TRUE(text.ok());
      std::vector<std::string> unused;
      absl::StatusOr<DecoderConfig> c = ParseHfConfig(*text, e.path().string(), &unused);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_TRUE(unused.empty()) << e.path() << ": " << unused[0];
      ++parsed;
      const fs::path other = root / "transformers4" / e.path().filename();
      if (std::string(version) == "transformers5" && fs::exists(other)) {
        absl::StatusOr<DecoderConfig> o = ParseHfConfig(*ReadFileToString(other.string()), other.string());
        ASSERT_TRUE(o.ok());
        EXPECT_EQ(o->rope.SerializeAsString(), c->rope.SerializeAsString()) << e.path();
        EXPECT_EQ(std::tie(o->hidden_size, o->num_layers, o->num_heads, o->num_kv_heads, o->head_dim,
                           o->intermediate_size, o->vocab_size, o->max_position_embeddings, o->rms_norm_eps,
                           o->tie_word_embeddings, o->qkv_bias, o->o_bias, o->mlp_bias, o->qk_norm, o->sliding_window),
                  std::tie(c->hidden_size, c->num_layers, c->num_heads, c->num_kv_heads, c->head_dim,
                           c->intermediate_size, c->vocab_size, c->max_position_embeddings, c->rms_norm_eps,
                           c->tie_word_embeddings, c->qkv_bias, c->o_bias, c->mlp_bias, c->qk_norm, c->sliding_window))
            << e.path();
      }
    }
  }
  EXPECT_GE(parsed, 30);
  // What some of them must mean.
  auto load = [&](const char* name) {
    absl::StatusOr<std::string> text = ReadFileToString((root / "transformers5" / name).string());
    EXPECT_TRUE(text.ok()) << name;
    absl::StatusOr<DecoderConfig> c = ParseHfConfig(text.ok() ? *text : "", name);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : DecoderConfig();
  };
  const DecoderConfig yarn = load("qwen2.5-7b-yarn.json");
  EXPECT_TRUE(yarn.qkv_bias && !yarn.o_bias);
  EXPECT_EQ(yarn.rope.yarn().original_max_position(), 32768);
  EXPECT_FLOAT_EQ(yarn.rope.yarn().attention_factor(), 0.1f * std::log(4.0f) + 1.0f);
  EXPECT_EQ(yarn.sliding_window, std::vector<int>(28, 0));  // use_sliding_window false
  const DecoderConfig mistral = load("mistral-7b-v0.1.json");
  EXPECT_EQ(mistral.sliding_window, std::vector<int>(32, 4096));
  EXPECT_TRUE(mistral.CheckWindows(4096).ok());  // the default KV cache: full attention is exact
  EXPECT_FALSE(mistral.CheckWindows(8192).ok());
  EXPECT_TRUE(load("mistral-7b-v0.3.json").sliding_window.empty());
  const DecoderConfig qwen3 = load("qwen3-8b.json");
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_FALSE(qwen3.tie_word_embeddings);
  const DecoderConfig linear = load("llama-linear-rope.json");
  EXPECT_EQ(linear.rope.linear_factor(), 2.0f);
  EXPECT_TRUE(linear.qkv_bias && linear.o_bias && linear.mlp_bias);
  EXPECT_EQ(load("smollm2-135m.json").hidden_size, 576);
  EXPECT_EQ(load("llama-3.1-8b.json").rope.llama3_scaling().factor(), 8.0f);
}

}  // namespace
}  // namespace loom::graph
