// Quantized checkpoints as compressed-tensors writes them (tests/data/quantized, written by the library itself:
// tools/make_quantized_fixtures.py): every projection read back to exactly the bf16 bits the library's own
// decompress gives, and every field or tensor Loom does not read refused by name.
#include "graph/quantization.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <unistd.h>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "graph/decode_oracle.h"
#include "graph/json_file.h"
#include "graph/model.h"
#include "graph/quantize.h"
#include "gtest/gtest.h"

namespace loom::graph {
namespace {

namespace fs = std::filesystem;

const std::string kData = std::string(LOOM_SOURCE_DIR) + "/tests/data/quantized/";

std::string Fnv1a64(const HostTensor& t) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* bytes = reinterpret_cast<const uint8_t*>(t.bf16.data());
  for (size_t i = 0; i < t.bf16.size() * 2; ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// The hash of a kept (FP8 or int4) weight's elements (HostTensor::Get) rounded to bf16: the library's decompressed
// bits, as the fixtures' reference.json holds them.
std::string DecompressedFnv1a64(const HostTensor& w) {
  HostTensor widened = HostTensor::Zeros(BF16, w.shape);
  for (int64_t i = 0; i < w.size(); ++i) widened.bf16[i] = FloatToBf16(w.Get(i));
  return Fnv1a64(widened);
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// `loom export` of `m` writes each projection named in `reference` as `dtype` (F32 or BF16) holding exactly the
// values Loom computes with (HostTensor::Get; int4: Int4Product, unrounded), every `step`-th element checked.
void ExpectExportedValues(const Model& m, const nlohmann::json& reference, const std::string& dtype, int64_t step) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("loom_export_", dtype, "_", ::getpid());
  ASSERT_TRUE(ExportModel(m, dir.string()).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open((dir / "model.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status();
  const uint64_t size = dtype == "F32" ? 4 : 2;
  for (const auto& [name, hash] : reference.items()) {
    const SafetensorsEntry& e = (*file)->header().tensors.at(name);
    const HostTensor& w = m.weights.at(name);
    ASSERT_EQ(e.dtype, dtype) << name;
    ASSERT_EQ(e.end - e.begin, size * w.size()) << name;
    const uint8_t* data = (*file)->Data(e);
    for (int64_t i = 0; i < w.size(); i += step) {
      float v;
      if (size == 4) {
        std::memcpy(&v, data + 4 * i, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, data + 2 * i, 2);
        v = Bf16ToFloat(b);
      }
      ASSERT_EQ(v, w.dtype == I4 ? w.Int4Product(i) : w.Get(i)) << name << " element " << i;
    }
  }
  fs::remove_all(dir);
}

TEST(Quantized, EveryFixtureReadsBackToTheLibrarysBits) {
  for (const char* scheme :
       {"w4a16-g32", "w4a16-asym-g64", "w8a16-channel", "fp8-channel", "fp8-tensor", "w4a16-g32-f16", "awq-g32",
        "gptq-g32-asym",
        "gptq-v2-g64-sym", "gptq-8bit-channel", "gptq-2bit-g32-asym", "gptq-desc-act-g32"}) {
    ModelOptions widened;
    widened.widen_quantized = true;  // (FP8 is otherwise kept as stored: below)
    absl::StatusOr<Model> m = LoadModel(kData + scheme, widened);
    ASSERT_TRUE(m.ok()) << scheme << ": " << m.status();
    const nlohmann::json reference = ReadJson(kData + scheme + "/reference.json");
    ASSERT_EQ(reference.size(), 7u) << scheme;
    for (const auto& [name, hash] : reference.items()) {
      ASSERT_TRUE(m->weights.contains(name)) << scheme << ": " << name;
      EXPECT_EQ(Fnv1a64(m->weights.at(name)), hash.get<std::string>()) << scheme << ": " << name;
    }
    bool noted = false;
    for (const std::string& note : m->notes) noted = noted || note.find("widened to bf16") != std::string::npos;
    EXPECT_TRUE(noted) << scheme;
    // The lm_head is in `ignore`: read as stored.
    EXPECT_TRUE(m->weights.contains("lm_head.weight"));
    absl::StatusOr<OracleDecode> run = DecodeWithOracle(*m, {3, 1, 4}, 3);
    ASSERT_TRUE(run.ok()) << run.status();
  }
}

// FP8 with a scale per row is kept as stored: e4m3 values and f32 scales whose products, rounded to bf16, are the
// library's decompressed bits; the graph declares those weights FP8 and the oracle computes with them.
TEST(Quantized, Fp8WeightsAreKeptAsStored) {
  for (const std::string fixture : {"fp8-channel", "fp8-tensor"}) {
  SCOPED_TRACE(fixture);
  absl::StatusOr<Model> m = LoadModel(kData + fixture);
  ASSERT_TRUE(m.ok()) << m.status();
  const nlohmann::json reference = ReadJson(kData + fixture + "/reference.json");
  for (const auto& [name, hash] : reference.items()) {
    const HostTensor& w = m->weights.at(name);
    ASSERT_EQ(w.dtype, F8E4M3) << name;
    EXPECT_EQ(m->graph.tensor(name).dtype(), F8E4M3) << name;
    EXPECT_EQ(DecompressedFnv1a64(w), hash.get<std::string>()) << name;
  }
  EXPECT_EQ(m->weights.at("lm_head.weight").dtype, BF16);
  // Loaded without weights (loom compile), the graph is already the one the weights will run.
  ModelOptions config_only;
  config_only.load_weights = false;
  absl::StatusOr<Model> graph_only = LoadModel(kData + fixture, config_only);
  ASSERT_TRUE(graph_only.ok()) << graph_only.status();
  for (const auto& [name, hash] : reference.items()) EXPECT_EQ(graph_only->graph.tensor(name).dtype(), F8E4M3) << name;
  bool noted = false;
  for (const std::string& note : m->notes) noted = noted || note.find("computed with as stored") != std::string::npos;
  EXPECT_TRUE(noted);
  absl::StatusOr<OracleDecode> run = DecodeWithOracle(*m, {3, 1, 4}, 3);
  ASSERT_TRUE(run.ok()) << run.status();

  // Exported (transformers' reference), the FP8 projections are float32: each value times its row's scale.
  ExpectExportedValues(*m, reference, "F32", 97);
  }
}

// 4-bit weights in groups of a power of two >= 32 columns are kept as stored, whoever packed them (compressed-
// tensors' pack-quantized, symmetric or with zero points; AutoAWQ's GEMM packing; GPTQ v1 and v2), with bf16 or
// float16 scales: each value's nibble, its group's scale and zero point, whose products rounded as the library
// rounds them (float16 first for float16 scales) are the library's decompressed bits; the graph declares those
// weights I4 with their group size. Activation order, other widths and per-channel scales are widened.
TEST(Quantized, Int4WeightsAreKeptAsStored) {
  const std::vector<std::tuple<std::string, int, bool>> kept = {
      {"w4a16-g32", 32, false},     {"w4a16-asym-g64", 64, false}, {"w4a16-g32-f16", 32, true},
      {"awq-g32", 32, true},        {"gptq-g32-asym", 32, true},   {"gptq-v2-g64-sym", 64, true}};
  for (const auto& [fixture, group, half] : kept) {
    SCOPED_TRACE(fixture);
    absl::StatusOr<Model> m = LoadModel(kData + fixture);
    ASSERT_TRUE(m.ok()) << m.status();
    const nlohmann::json reference = ReadJson(kData + fixture + "/reference.json");
    for (const auto& [name, hash] : reference.items()) {
      const HostTensor& w = m->weights.at(name);
      ASSERT_EQ(w.dtype, I4) << name;
      EXPECT_EQ(w.half_scales, half) << name;
      EXPECT_EQ(w.Int4GroupSize(), group) << name;
      EXPECT_EQ(m->graph.tensor(name).dtype(), I4) << name;
      EXPECT_EQ(m->graph.tensor(name).group_size(), static_cast<uint32_t>(group)) << name;
      EXPECT_EQ(DecompressedFnv1a64(w), hash.get<std::string>()) << name;
    }
    bool noted = false;
    for (const std::string& note : m->notes) noted = noted || note.find("(int4 matvec)") != std::string::npos;
    EXPECT_TRUE(noted);
    ModelOptions config_only;
    config_only.load_weights = false;
    absl::StatusOr<Model> graph_only = LoadModel(kData + fixture, config_only);
    ASSERT_TRUE(graph_only.ok()) << graph_only.status();
    for (const auto& [name, hash] : reference.items()) EXPECT_EQ(graph_only->graph.tensor(name).dtype(), I4) << name;
    absl::StatusOr<OracleDecode> run = DecodeWithOracle(*m, {3, 1, 4}, 3);
    ASSERT_TRUE(run.ok()) << run.status();
    // Exported (transformers' reference), the int4 projections are f32: each (u - z) * s exactly.
    ExpectExportedValues(*m, reference, "F32", 1);
  }
  for (const char* fixture : {"gptq-desc-act-g32", "gptq-2bit-g32-asym", "gptq-8bit-channel", "w8a16-channel"}) {
    absl::StatusOr<Model> widened = LoadModel(kData + fixture);
    ASSERT_TRUE(widened.ok()) << fixture << ": " << widened.status();
    for (const auto& [name, w] : widened->weights) EXPECT_NE(w.dtype, I4) << fixture << ": " << name;
  }
}

// random:<preset> --scheme=W4A16 is `loom quantize --scheme=W4A16` of the bf16 model read back, bit for bit.
TEST(Quantized, RandomInt4ProjectionsAreWhatQuantizeWrites) {
  for (int group : {128, 32}) {
    ModelOptions bf16, w4;
    bf16.max_seq = w4.max_seq = 64;
    w4.scheme = "W4A16";
    w4.group_size = group;
    absl::StatusOr<Model> a = LoadModel("random:tiny", bf16), b = LoadModel("random:tiny", w4);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    const fs::path dir = fs::temp_directory_path() / absl::StrCat("loom_w4_", ::getpid());
    fs::remove_all(dir);
    ASSERT_TRUE(QuantizeModel(*a, {"W4A16", group}, dir.string()).ok());
    absl::StatusOr<Model> back = LoadModel(dir.string());
    ASSERT_TRUE(back.ok()) << back.status();
    int projections = 0;
    for (const auto& [name, w] : b->weights) {
      const HostTensor& r = back->weights.at(name);
      ASSERT_EQ(w.dtype, r.dtype) << name;
      if (w.dtype != I4) continue;
      ++projections;
      EXPECT_EQ(w.f8, r.f8) << name;
      EXPECT_EQ(w.bf16, r.bf16) << name;
      EXPECT_EQ(w.i32, r.i32) << name;
    }
    EXPECT_EQ(projections, 14);
    fs::remove_all(dir);
  }
  ModelOptions bad;
  bad.scheme = "W4A16";
  bad.group_size = 96;
  EXPECT_NE(LoadModel("random:tiny", bad).status().message().find("--group_size=96"), std::string::npos);
}

// FloatToE4m3 (on the float's bits) against the definition (frexp, round to nearest even, saturating at 448) for
// every bf16 value scaled by powers of two and a million random floats; E4m3ToFloat inverts it on every code.
TEST(Quantized, FloatToE4m3RoundsToNearestEven) {
  auto reference = [](float f) -> uint8_t {
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    if (std::isnan(f)) return sign | 0x7f;
    const float a = std::fmin(std::fabs(f), kE4m3Max);
    if (a < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
    int e = 0;
    const float fraction = std::frexp(a, &e);
    int exponent = e - 1 + 7, mantissa = static_cast<int>(std::nearbyint((2 * fraction - 1) * 8));
    if (mantissa == 8) mantissa = 0, ++exponent;
    return sign | static_cast<uint8_t>(exponent << 3 | mantissa);
  };
  for (uint32_t b = 0; b < 0x10000; ++b) {
    for (float scale : {1.0f, 0.5f, 1.0f / 64, 1.0f / 4096, 3.0f}) {
      const float f = Bf16ToFloat(static_cast<Bf16Bits>(b)) * scale;
      if (std::isnan(f)) continue;
      ASSERT_EQ(FloatToE4m3(f), reference(f)) << f;
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToE4m3(f), reference(f)) << f << " (bits " << u << ")";
  }
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    ASSERT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(b))), b == 0x80 ? 0x80 : b) << b;
  }
}

// random:<preset> --scheme=FP8: each projection is the bf16 model's rounded per row (a power-of-two scale, every
// value within half an e4m3 step of the bf16 one), every other weight the bf16 model's bits; the graph says FP8.
TEST(Quantized, RandomFp8ProjectionsAreTheBf16OnesRoundedPerRow) {
  ModelOptions bf16, fp8;
  bf16.max_seq = fp8.max_seq = 64;
  fp8.scheme = "FP8";
  absl::StatusOr<Model> a = LoadModel("random:tiny", bf16), b = LoadModel("random:tiny", fp8);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  int projections = 0;
  for (const auto& [name, w] : a->weights) {
    const HostTensor& q = b->weights.at(name);
    if (q.dtype != F8E4M3) {
      EXPECT_EQ(q.bf16, w.bf16) << name;
      continue;
    }
    ++projections;
    EXPECT_EQ(b->graph.tensor(name).dtype(), F8E4M3) << name;
    const HostTensor again = QuantizeRowsToFp8(w);
    EXPECT_EQ(q.f8, again.f8) << name;
    EXPECT_EQ(q.f32, again.f32) << name;
    const int64_t cols = w.shape[1];
    for (int64_t i = 0; i < w.size(); ++i) {
      const float scale = q.f32[i / cols];
      int e = 0;
      ASSERT_EQ(std::frexp(scale, &e), 0.5f) << name << ": row scale " << scale << " is not a power of two";
      // e4m3 has 3 mantissa bits: the rounding error is at most 2^-4 of the value (2^-10 of the scale below 2^-6).
      const float v = w.Get(i), back = q.Get(i);
      ASSERT_LE(std::fabs(back - v), std::max(std::fabs(v) / 16, scale / 1024)) << name << " element " << i;
    }
  }
  EXPECT_EQ(projections, 7 * a->config.num_layers);
  fp8.load_weights = false;  // the graph alone says the same
  absl::StatusOr<Model> c = LoadModel("random:tiny", fp8);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const auto& [name, w] : b->weights) EXPECT_EQ(c->graph.tensor(name).dtype(), w.dtype) << name;
}

// A copy of a fixture with its config.json's quantization_config changed by `edit`: the load's error.
std::string LoadEdited(const std::string& scheme, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("loom_quantized_", scheme, "_", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kData + scheme + "/model.safetensors", dir / "model.safetensors");
  nlohmann::json config = ReadJson(kData + scheme + "/config.json");
  edit(config["quantization_config"]);
  std::ofstream(dir / "config.json") << config.dump();
  absl::StatusOr<Model> m = LoadModel(dir.string());
  fs::remove_all(dir);
  return m.ok() ? std::string("loaded") : std::string(m.status().message());
}

TEST(Quantized, FieldsThatChangeTheMathAreRefusedByName) {
  auto group = [](nlohmann::json& q) -> nlohmann::json& { return q["config_groups"]["group_0"]; };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[&](nlohmann::json& q) { group(q)["input_activations"] = {{"num_bits", 8}, {"type", "float"}}; },
       "field 'quantization_config.config_groups.group_0.input_activations' = {\"num_bits\":8,\"type\":\"float\"}: "
       "activation quantization changes the math"},
      {[&](nlohmann::json& q) { group(q)["weights"]["actorder"] = "group"; },
       "config_groups.group_0.weights.actorder' = \"group\": activation-ordered groups (g_idx) are not read"},
      {[&](nlohmann::json& q) { group(q)["weights"]["strategy"] = "block"; }, "weights.strategy' = \"block\""},
      {[&](nlohmann::json& q) { group(q)["weights"]["group_size"] = 48; },
       "quantized weight 'model.layers.0.self_attn.q_proj.weight': group_size 48 does not divide its 128 columns"},
      {[&](nlohmann::json& q) { group(q)["weights"]["group_size"] = 64; },
       "tensor 'model.layers.0.self_attn.q_proj.weight_scale' BF16 [128, 4]: need [128, 2]"},
      {[&](nlohmann::json& q) { group(q)["weights"]["num_bits"] = 8; },
       "tensor 'model.layers.0.self_attn.q_proj.weight_packed' I32 [128, 16]: need I32 [128, 32]"},
      {[&](nlohmann::json& q) { q["quant_method"] = "bitsandbytes"; },
       "field 'quantization_config.quant_method' = \"bitsandbytes\": Loom reads compressed-tensors, AWQ and GPTQ "
       "checkpoints"},
      {[&](nlohmann::json& q) { q["kv_cache_scheme"] = {{"num_bits", 8}}; }, "kv_cache_scheme"},
      {[&](nlohmann::json& q) { q["format"] = "marlin-24"; }, "field 'quantization_config.format' = \"marlin-24\""},
      {[&](nlohmann::json& q) { group(q)["weights"]["symmetric"] = false; },
       "tensor 'model.layers.0.self_attn.q_proj.weight_zero_point' is missing"},
      {[&](nlohmann::json& q) { group(q)["weights"]["new_field"] = 1; },
       "weights.new_field' = 1: not understood by Loom's reader"},
      {[&](nlohmann::json& q) { q["ignore"] = {"re:.*"}; }, "weight 'model.layers.0.self_attn.q_proj.weight' is missing"},
  };
  for (const auto& [edit, want] : cases) {
    const std::string got = LoadEdited("w4a16-g32", edit);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot:  " << got;
  }
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> awq = {
      {[](nlohmann::json& q) { q["version"] = "gemv"; }, "'quantization_config.version' = \"gemv\": Loom reads AWQ's GEMM"},
      {[](nlohmann::json& q) { q["zero_point"] = false; }, "AWQ's GEMM packing stores zero points"},
      {[](nlohmann::json& q) { q["group_size"] = 64; },
       "tensor 'model.layers.0.self_attn.q_proj.qzeros' I32 [4, 16]: need I32 [2, 16]"},
      {[](nlohmann::json& q) { q["modules_to_not_convert"] = {"mlp"}; },
       "weight 'model.layers.0.mlp.gate_proj.weight' is missing"},  // read as stored: it is not
      {[](nlohmann::json& q) { q["do_fuse"] = true; }, "loaded"},  // how a runtime fuses, not the math
  };
  for (const auto& [edit, want] : awq) {
    const std::string got = LoadEdited("awq-g32", edit);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot:  " << got;
  }
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> gptq = {
      {[](nlohmann::json& q) { q["desc_act"] = "yes"; }, "'quantization_config.desc_act' = \"yes\": must be true or false"},
      {[](nlohmann::json& q) { q["desc_act"] = true; }, "loaded"},  // the plain g_idx is one activation order
      {[](nlohmann::json& q) { q["bits"] = 3; }, "'quantization_config.bits' = 3: Loom reads GPTQ's 2-, 4- and 8-bit"},
      {[](nlohmann::json& q) { q["checkpoint_format"] = "marlin"; }, "'quantization_config.checkpoint_format' = "},
      {[](nlohmann::json& q) { q["dynamic"] = {{"-:.*down_proj", nlohmann::json::object()}}; },
       "'quantization_config.dynamic'"},
      {[](nlohmann::json& q) { q["group_size"] = 64; },
       "tensor 'model.layers.0.self_attn.q_proj.qzeros' I32 [4, 16]: need I32 [2, 16]"},
      {[](nlohmann::json& q) { q["damp_percent"] = 0.05; }, "loaded"},  // calibration only
  };
  for (const auto& [edit, want] : gptq) {
    const std::string got = LoadEdited("gptq-g32-asym", edit);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot:  " << got;
  }
  // A permuted g_idx under desc_act false: the checkpoint contradicts its config.
  const std::string got = LoadEdited("gptq-desc-act-g32", [](nlohmann::json& q) { q["desc_act"] = false; });
  EXPECT_NE(got.find("tensor 'model.layers.0.self_attn.q_proj.g_idx' I32 [128]: not column / group_size, and "
                     "desc_act is false"),
            std::string::npos)
      << got;
}

// `loom quantize` writes what the reader reads back: every projection within half a step of the original (bf16
// scales and results as the format has them), every other weight unchanged; bad settings refused.
std::string FileBytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// `loom quantize` streams (QuantizeCheckpoint: each weight quantized and written as it is read, one held at a time):
// its folder is bit for bit QuantizeModel's of the model loaded whole, for random weights and for a folder (an
// AWQ checkpoint's int4 projections, read as int4, quantized again).
TEST(Quantized, StreamedQuantizeIsTheInMemoryOneBitForBit) {
  const fs::path whole = fs::temp_directory_path() / absl::StrCat("loom_q_whole_", ::getpid());
  const fs::path streamed = fs::temp_directory_path() / absl::StrCat("loom_q_streamed_", ::getpid());
  for (const auto& [spec, scheme, group] : std::vector<std::tuple<std::string, std::string, int>>{
           {"random:tiny", "W4A16", 32}, {"random:tiny", "FP8", 0}, {kData + "awq-g32", "W4A16", 64},
           {kData + "fp8-channel", "W8A16", 0}}) {
    SCOPED_TRACE(spec + " " + scheme);
    fs::remove_all(whole);
    fs::remove_all(streamed);
    absl::StatusOr<Model> m = LoadModel(spec);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(QuantizeModel(*m, {scheme, group}, whole.string()).ok());
    std::vector<std::string> notes;
    const absl::Status s = QuantizeCheckpoint(spec, {}, {scheme, group}, streamed.string(), &notes);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(notes, m->notes);
    for (const char* file : {"model.safetensors", "config.json"}) {
      const std::string a = FileBytes(whole / file), b = FileBytes(streamed / file);
      EXPECT_FALSE(a.empty()) << file;
      EXPECT_TRUE(a == b) << file << ": " << a.size() << " against " << b.size() << " bytes";
    }
    EXPECT_TRUE(LoadModel(streamed.string()).ok());
  }
  // A bad scheme is refused before anything is written.
  fs::remove_all(streamed);
  EXPECT_FALSE(QuantizeCheckpoint("random:tiny", {}, {"INT3", 0}, streamed.string()).ok());
  EXPECT_FALSE(fs::exists(streamed));
  fs::remove_all(whole);
}

TEST(Quantized, QuantizeWritesWhatTheReaderReadsBack) {
  absl::StatusOr<Model> tiny = LoadModel("random:tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("loom_quantize_", ::getpid());
  for (const auto& [scheme, group] : std::vector<std::pair<std::string, int>>{
           {"FP8", 0}, {"W4A16", 128}, {"W4A16", 32}, {"W8A16", 0}}) {
    fs::remove_all(dir);
    ASSERT_TRUE(QuantizeModel(*tiny, {scheme, group}, dir.string()).ok()) << scheme;
    absl::StatusOr<Model> back = LoadModel(dir.string());
    ASSERT_TRUE(back.ok()) << scheme << ": " << back.status();
    ASSERT_TRUE(back->config.quantization.has_value());
    int projections = 0;
    for (const auto& [name, w] : tiny->weights) {
      const HostTensor& r = back->weights.at(name);
      if (name.find("_proj.weight") == std::string::npos) {
        EXPECT_EQ(r.bf16, w.bf16) << name;
        continue;
      }
      ++projections;
      const int64_t cols = w.shape[1], g = group > 0 ? group : cols;
      const float top = scheme == "FP8" ? 448.0f : scheme == "W4A16" ? 7.5f : 127.5f;
      for (int64_t row = 0; row < w.shape[0]; ++row) {
        for (int64_t c0 = 0; c0 < cols; c0 += g) {
          float absmax = 0;
          for (int64_t c = c0; c < c0 + g; ++c) absmax = std::max(absmax, std::fabs(w.Get(row * cols + c)));
          const float step = absmax / top;
          for (int64_t c = c0; c < c0 + g; ++c) {
            const float x = w.Get(row * cols + c), err = std::fabs(r.Get(row * cols + c) - x);
            const float bound = scheme == "FP8" ? std::fabs(x) / 16 + step * 0.002f + 1e-9f
                                                : step * (0.5f + top / 256) + std::fabs(x) / 256 + 1e-9f;
            ASSERT_LE(err, bound) << scheme << " " << name << " [" << row << ", " << c << "]";
          }
        }
      }
    }
    EXPECT_EQ(projections, 14) << scheme;
  }
  fs::remove_all(dir);
  EXPECT_NE(QuantizeModel(*tiny, {"INT3", 0}, dir.string()).message().find("one of FP8, W4A16, W8A16"),
            std::string::npos);
  EXPECT_NE(QuantizeModel(*tiny, {"W4A16", 96}, dir.string()).message().find("not a multiple of --group_size 96"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::graph
