#include "graph/hf_config.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/config_limits.h"
#include "graph/families/families.h"
#include "graph/json_file.h"

namespace loom::graph {
namespace {

// The families Loom reads, one line each.
constexpr const Family* kFamilies[] = {&kLlamaFamily, &kMistralFamily, &kQwen2Family, &kQwen3Family};

// Fields of a config.json that do not change what a causal LM computes
// (bookkeeping, training and generation settings).
constexpr const char* kHarmlessFields[] = {
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "initializer_range", "use_cache",
    "pad_token_id", "bos_token_id", "eos_token_id", "attention_dropout", "pretraining_tp", "output_attentions",
    "output_hidden_states", "return_dict", "use_return_dict", "torchscript", "is_encoder_decoder", "is_decoder",
    "tokenizer_class", "id2label", "label2id", "problem_type", "task_specific_params", "chunk_size_feed_forward",
    "pruned_heads", "tie_encoder_decoder", "add_cross_attention", "finetuning_task", "prefix", "sep_token_id",
    "decoder_start_token_id", "cross_attention_hidden_size", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "tf_legacy_loss", "model_type"};

std::string Show(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

double YarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// One rope section (a `rope_scaling` or `rope_parameters` object) into *rope.
absl::Status ReadRopeSection(HfConfigReader& s, int max_position, RopeAttrs* rope) {
  std::string type = "default", alias;
  if (absl::Status st = s.OptionalString("rope_type", &type); !st.ok()) return st;
  if (s.Has("type")) {
    if (absl::Status st = s.OptionalString("type", &alias); !st.ok()) return st;
    if (s.Has("rope_type") && alias != type) return s.Error("type", absl::StrCat("disagrees with rope_type \"", type, "\""));
    type = alias;
  }
  if (s.Has("rope_theta")) {
    float theta = 0;
    if (absl::Status st = s.OptionalFloat("rope_theta", &theta); !st.ok()) return st;
    if (rope->theta() > 0 && theta != rope->theta()) {
      return s.Error("rope_theta", absl::StrCat("disagrees with the top-level rope_theta ", rope->theta()));
    }
    rope->set_theta(theta);
  }
  if (s.Has("partial_rotary_factor")) {
    float f = 1;
    if (absl::Status st = s.OptionalFloat("partial_rotary_factor", &f); !st.ok()) return st;
    if (f != 1.0f) return s.Error("partial_rotary_factor", "partial rotary embeddings are not supported");
  }
  auto positive = [&](const char* key, float* out) -> absl::Status {
    if (!s.Has(key)) return s.Error(absl::StrCat("rope type \"", type, "\" needs field '", key, "'"));
    if (absl::Status st = s.OptionalFloat(key, out); !st.ok()) return st;
    return *out > 0 ? absl::OkStatus() : s.Error(key, "must be > 0");
  };
  if (type == "default") return absl::OkStatus();
  if (type == "linear") {
    float factor = 0;
    if (absl::Status st = positive("factor", &factor); !st.ok()) return st;
    rope->set_linear_factor(factor);
    return absl::OkStatus();
  }
  int original = max_position;  // transformers' default for llama3 and yarn
  if (absl::Status st = s.OptionalInt("original_max_position_embeddings", &original); !st.ok()) return st;
  if (type == "llama3") {
    RopeScaling* l = rope->mutable_llama3_scaling();
    float factor = 0, low = 0, high = 0;
    for (auto [key, out] : {std::pair{"factor", &factor}, {"low_freq_factor", &low}, {"high_freq_factor", &high}}) {
      if (absl::Status st = positive(key, out); !st.ok()) return st;
    }
    if (!(high > low)) return s.Error("high_freq_factor", absl::StrCat("must exceed low_freq_factor ", low));
    l->set_factor(factor);
    l->set_low_freq_factor(low);
    l->set_high_freq_factor(high);
    l->set_original_max_position(original);
    return absl::OkStatus();
  }
  if (type == "yarn") {
    YarnScaling* y = rope->mutable_yarn();
    float factor = 0, beta_fast = 0, beta_slow = 0, mscale = 0, mscale_all_dim = 0, attention_factor = 0;
    bool truncate = true;
    if (absl::Status st = positive("factor", &factor); !st.ok()) return st;
    for (auto [key, out] : {std::pair{"beta_fast", &beta_fast}, {"beta_slow", &beta_slow}, {"mscale", &mscale},
                            {"mscale_all_dim", &mscale_all_dim}, {"attention_factor", &attention_factor}}) {
      if (absl::Status st = s.OptionalFloat(key, out); !st.ok()) return st;
    }
    if (absl::Status st = s.OptionalBool("truncate", &truncate); !st.ok()) return st;
    if (s.Has("attention_factor") && !(attention_factor > 0)) return s.Error("attention_factor", "must be > 0");
    if (!s.Has("attention_factor")) {  // transformers' rule, mscale and mscale_all_dim counting only when non-zero
      attention_factor = mscale != 0 && mscale_all_dim != 0
                             ? static_cast<float>(YarnMscale(factor, mscale) / YarnMscale(factor, mscale_all_dim))
                             : static_cast<float>(YarnMscale(factor, 1.0));
    }
    y->set_factor(factor);
    y->set_original_max_position(original);
    y->set_beta_fast(beta_fast != 0 ? beta_fast : 32.0f);  // `or 32`: zero means the default too
    y->set_beta_slow(beta_slow != 0 ? beta_slow : 1.0f);
    y->set_truncate(truncate);
    y->set_attention_factor(attention_factor);
    return absl::OkStatus();
  }
  return s.Error(s.Has("rope_type") ? "rope_type" : "type",
                 "rope type not supported (Loom implements default, linear, llama3 and yarn)");
}

// The rope settings in either layout transformers writes.
absl::Status ReadRope(HfConfigReader& r, int max_position, RopeAttrs* rope) {
  rope->Clear();
  if (r.Has("rope_theta")) {
    float theta = 0;
    if (absl::Status s = r.OptionalFloat("rope_theta", &theta); !s.ok()) return s;
    if (!(theta > 0)) return r.Error("rope_theta", "must be > 0");
    rope->set_theta(theta);
  }
  if (r.Has("partial_rotary_factor")) {
    float f = 1;
    if (absl::Status s = r.OptionalFloat("partial_rotary_factor", &f); !s.ok()) return s;
    if (f != 1.0f) return r.Error("partial_rotary_factor", "partial rotary embeddings are not supported");
  }
  const bool has_scaling = r.Has("rope_scaling"), has_parameters = r.Has("rope_parameters");
  r.Get("rope_scaling"), r.Get("rope_parameters");  // read even when null
  if (has_scaling && !r.Get("rope_scaling").is_object()) return r.Error("rope_scaling", "must be an object or null");
  if (has_parameters && !r.Get("rope_parameters").is_object()) {
    return r.Error("rope_parameters", "must be an object or null");
  }
  std::string key = has_scaling ? "rope_scaling" : "rope_parameters";
  HfConfigReader section = r.Object(key);
  if (has_parameters) {
    // transformers 5 nests rope_parameters by layer type when layers differ; one shared set is all Loom runs.
    const nlohmann::json& params = r.Get("rope_parameters");
    std::vector<std::string> nested;
    for (auto it = params.begin(); it != params.end(); ++it) {
      if (it->is_object()) nested.push_back(it.key());
    }
    if (!nested.empty()) {
      for (const std::string& n : nested) {
        if (params[n] != params[nested[0]]) {
          return r.Error("rope_parameters", absl::StrCat("layer types '", nested[0], "' and '", n,
                                                          "' have different rope settings; Loom runs one"));
        }
      }
      if (!has_scaling) {
        HfConfigReader outer = r.Object("rope_parameters");
        for (const std::string& n : nested) outer.Object(n);  // all read: they are equal
        key = absl::StrCat("rope_parameters.", nested[0]);
        section = outer.Object(nested[0]);
      }
    }
    if (has_scaling) {
      // Both layouts at once: transformers 5 lets rope_scaling win; Loom insists they agree.
      nlohmann::json a = r.Get("rope_scaling"), b = nested.empty() ? params : params[nested[0]];
      // rope_theta may sit at the top level and in either section: every one given must be the same number
      // (the section comparison below leaves it out, as rope_scaling need not carry it).
      if (b.contains("rope_theta") && !b["rope_theta"].is_null()) {
        HfConfigReader outer = r.Object("rope_parameters");
        HfConfigReader where = nested.empty() ? outer : outer.Object(nested[0]);
        float theta = 0;
        if (absl::Status st = where.OptionalFloat("rope_theta", &theta); !st.ok()) return st;
        if (rope->theta() > 0 && theta != rope->theta()) {
          return where.Error("rope_theta", absl::StrCat("disagrees with the top-level rope_theta ", rope->theta()));
        }
        if (a.contains("rope_theta") && a["rope_theta"].is_number() && theta != a["rope_theta"].get<float>()) {
          return where.Error("rope_theta", absl::StrCat("disagrees with rope_scaling.rope_theta ",
                                                        a["rope_theta"].get<float>()));
        }
        if (!(rope->theta() > 0)) rope->set_theta(theta);  // rope_scaling's own rope_theta is checked against it
      }
      for (nlohmann::json* j : {&a, &b}) {
        if (j->contains("type") && !j->contains("rope_type")) (*j)["rope_type"] = (*j)["type"];
        j->erase("type");
        j->erase("rope_theta");
      }
      if (a != b) return r.Error("rope_parameters", "disagrees with rope_scaling");
      HfConfigReader other = r.Object("rope_parameters");
      for (auto it = params.begin(); it != params.end(); ++it) other.Get(it.key());
    }
  }
  if (absl::Status s = ReadRopeSection(section, max_position, rope); !s.ok()) return s;
  if (!(rope->theta() > 0)) rope->set_theta(10000.0f);  // transformers' default_theta
  return absl::OkStatus();
}

}  // namespace

// ---- HfConfigReader ---------------------------------------------------------

HfConfigReader::HfConfigReader(const nlohmann::json& object, std::string path)
    : HfConfigReader(object, std::move(path), "", std::make_shared<Shared>()) {}

HfConfigReader::HfConfigReader(const nlohmann::json& object, std::string path, std::string prefix,
                               std::shared_ptr<Shared> shared)
    : object_(&object), path_(std::move(path)), prefix_(std::move(prefix)), shared_(std::move(shared)) {
  shared_->objects.emplace_back(prefix_, object_);
}

bool HfConfigReader::Contains(const std::string& key) const { return object_->contains(key); }

bool HfConfigReader::Has(const std::string& key) const {
  auto it = object_->find(key);
  return it != object_->end() && !it->is_null();
}

const nlohmann::json& HfConfigReader::Get(const std::string& key) {
  static const nlohmann::json kNull;
  shared_->used.insert(Full(key));
  auto it = object_->find(key);
  return it == object_->end() ? kNull : *it;
}

absl::Status HfConfigReader::Error(const std::string& key, const std::string& why) const {
  auto it = object_->find(key);
  return absl::InvalidArgumentError(absl::StrCat(path_, ": field '", Full(key), "'",
                                                 it == object_->end() ? "" : absl::StrCat(" = ", Show(*it)), ": ", why));
}

absl::Status HfConfigReader::Error(const std::string& why) const {
  // Inside a nested object, name it: "<file>: 'rope_scaling': <why>".
  const std::string where = prefix_.empty() ? "" : absl::StrCat("'", prefix_.substr(0, prefix_.size() - 1), "': ");
  return absl::InvalidArgumentError(absl::StrCat(path_, ": ", where, why));
}

absl::Status HfConfigReader::Int(const std::string& key, int* out) {
  if (!Has(key)) return absl::InvalidArgumentError(absl::StrCat(path_, ": missing field '", Full(key), "'"));
  return OptionalInt(key, out);
}

absl::Status HfConfigReader::OptionalInt(const std::string& key, int* out) {
  const nlohmann::json& v = Get(key);
  if (v.is_null()) return absl::OkStatus();
  // Integral floats (4096.0) are integers to Python too.
  const bool integral = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (!integral || v.get<double>() <= 0 || v.get<double>() > (1 << 30)) return Error(key, "must be a positive integer");
  *out = static_cast<int>(v.get<double>());
  return absl::OkStatus();
}

absl::Status HfConfigReader::OptionalFloat(const std::string& key, float* out) {
  const nlohmann::json& v = Get(key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_number() || !std::isfinite(v.get<double>())) return Error(key, "must be a number");
  *out = v.get<float>();
  return absl::OkStatus();
}

absl::Status HfConfigReader::OptionalBool(const std::string& key, bool* out) {
  const nlohmann::json& v = Get(key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_boolean()) return Error(key, "must be true or false");
  *out = v.get<bool>();
  return absl::OkStatus();
}

absl::Status HfConfigReader::OptionalString(const std::string& key, std::string* out) {
  const nlohmann::json& v = Get(key);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_string()) return Error(key, "must be a string");
  *out = v.get<std::string>();
  return absl::OkStatus();
}

HfConfigReader HfConfigReader::Object(const std::string& key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json& v = Get(key);
  return HfConfigReader(v.is_object() ? v : kEmpty, path_, Full(key) + ".", shared_);
}

std::vector<std::string> HfConfigReader::Unused() const {
  std::set<std::string> opened;
  for (const auto& [prefix, object] : shared_->objects) opened.insert(prefix);
  std::vector<std::string> unused;
  for (const auto& [prefix, object] : shared_->objects) {
    for (auto it = object->begin(); it != object->end(); ++it) {
      const std::string full = prefix + it.key();
      if (!shared_->used.contains(full) && !opened.contains(full + ".")) unused.push_back(full);
    }
  }
  return unused;
}

// ---- common fields and dispatch ----------------------------------------------

absl::Status ReadCommonConfig(HfConfigReader& r, const FamilyDefaults& defaults, DecoderConfig* c) {
  for (auto [key, field] : {std::pair{"hidden_size", &c->hidden_size}, {"num_hidden_layers", &c->num_layers},
                            {"num_attention_heads", &c->num_heads}, {"intermediate_size", &c->intermediate_size},
                            {"vocab_size", &c->vocab_size}}) {
    if (absl::Status s = r.Int(key, field); !s.ok()) return s;
  }
  // Absent: the family's class default; null: as many as attention heads (both as transformers).
  const bool kv_absent = !r.Contains("num_key_value_heads");
  c->num_kv_heads = kv_absent && defaults.num_kv_heads > 0 ? defaults.num_kv_heads : c->num_heads;
  if (absl::Status s = r.OptionalInt("num_key_value_heads", &c->num_kv_heads); !s.ok()) return s;
  if (c->num_heads % c->num_kv_heads != 0) {
    return r.Error("num_key_value_heads", absl::StrCat("does not divide num_attention_heads ", c->num_heads));
  }
  if (defaults.head_dim == 0 && c->hidden_size % c->num_heads != 0 && !r.Has("head_dim")) {
    return r.Error("hidden_size", absl::StrCat("is not a multiple of num_attention_heads ", c->num_heads,
                                               " and there is no head_dim"));
  }
  c->head_dim = defaults.head_dim > 0 ? defaults.head_dim : c->hidden_size / c->num_heads;
  if (absl::Status s = r.OptionalInt("head_dim", &c->head_dim); !s.ok()) return s;
  if (c->head_dim % 2 != 0) return r.Error("head_dim", "must be even for RoPE");
  c->max_position_embeddings = defaults.max_position_embeddings;
  if (absl::Status s = r.OptionalInt("max_position_embeddings", &c->max_position_embeddings); !s.ok()) return s;
  struct Bound {
    const char* field;
    int value, limit;
  };
  for (const Bound& b : {Bound{"num_hidden_layers", c->num_layers, kMaxLayers},
                         Bound{"hidden_size", c->hidden_size, kMaxWidth},
                         Bound{"intermediate_size", c->intermediate_size, kMaxIntermediate},
                         Bound{"vocab_size", c->vocab_size, kMaxVocab}, Bound{"num_attention_heads", c->num_heads, kMaxHeads},
                         Bound{"num_key_value_heads", c->num_kv_heads, kMaxHeads},
                         Bound{"head_dim", c->head_dim, kMaxHeadDim},
                         Bound{"max_position_embeddings", c->max_position_embeddings, kMaxPositions}}) {
    if (b.value <= b.limit) continue;
    const std::string why = absl::StrCat("implausible: more than ", b.limit, ", beyond any published model");
    // A value not in the file (head_dim from hidden_size / heads) names itself.
    return r.Has(b.field) ? r.Error(b.field, why) : r.Error(absl::StrCat(b.field, " ", b.value, ": ", why));
  }
  c->rms_norm_eps = defaults.rms_norm_eps;
  if (absl::Status s = r.OptionalFloat("rms_norm_eps", &c->rms_norm_eps); !s.ok()) return s;
  if (!(c->rms_norm_eps > 0)) return r.Error("rms_norm_eps", "must be > 0");
  if (absl::Status s = r.OptionalBool("tie_word_embeddings", &c->tie_word_embeddings); !s.ok()) return s;
  std::string act = "silu";
  if (absl::Status s = r.OptionalString("hidden_act", &act); !s.ok()) return s;
  if (act != "silu" && act != "swish") return r.Error("hidden_act", "Loom implements the SiLU-gated MLP (silu) only");
  if (r.Has("architectures")) {
    const nlohmann::json& arch = r.Get("architectures");
    if (!arch.is_array()) return r.Error("architectures", "must be a list");
    for (const nlohmann::json& a : arch) {
      if (!a.is_string() || !absl::EndsWith(a.get<std::string>(), "ForCausalLM")) {
        return r.Error("architectures", "Loom runs causal language models (a *ForCausalLM class)");
      }
    }
  }
  if (r.Has("attention_chunk_size")) return r.Error("attention_chunk_size", "not supported (Loom runs full attention)");
  if (r.Has("quantization_config")) {
    absl::StatusOr<QuantizationConfig> q = ParseQuantizationConfig(r.Get("quantization_config"), r.path());
    if (!q.ok()) return q.status();
    c->quantization = *std::move(q);
  }
  return ReadRope(r, c->max_position_embeddings, &c->rope);
}

absl::Status ReadWindowForAllLayers(HfConfigReader& r, DecoderConfig* c) {
  if (!r.Has("sliding_window")) {
    r.Get("sliding_window");
    return absl::OkStatus();
  }
  int window = 0;
  if (absl::Status s = r.OptionalInt("sliding_window", &window); !s.ok()) return s;
  c->sliding_window.assign(c->num_layers, window);
  return absl::OkStatus();
}

absl::StatusOr<DecoderConfig> ParseHfConfig(const std::string& json_text, const std::string& path,
                                            std::vector<std::string>* unused) {
  absl::StatusOr<nlohmann::json> parsed = ParseJsonObject(json_text, path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  HfConfigReader r(j, path);
  std::string model_type;
  if (!r.Has("model_type")) return absl::InvalidArgumentError(absl::StrCat(path, ": missing field 'model_type'"));
  if (absl::Status s = r.OptionalString("model_type", &model_type); !s.ok()) return s;
  const Family* family = nullptr;
  std::vector<std::string> known;
  for (const Family* f : kFamilies) {
    known.push_back(f->model_type);
    if (model_type == f->model_type) family = f;
  }
  if (family == nullptr) {
    return r.Error("model_type", absl::StrCat("not a family Loom reads (", absl::StrJoin(known, ", "), ")"));
  }
  DecoderConfig c;
  c.family = family->model_type;
  if (absl::Status s = family->read(r, &c); !s.ok()) return s;
  if (absl::Status s = c.Validate(); !s.ok()) return r.Error(std::string(s.message()));
  for (const char* key : kHarmlessFields) r.Get(key);
  if (unused != nullptr) *unused = r.Unused();
  return c;
}

absl::StatusOr<nlohmann::json> HfConfigToJson(const DecoderConfig& c) {
  const Family* family = nullptr;
  for (const Family* f : kFamilies) {
    if (c.family == f->model_type) family = f;
  }
  if (family == nullptr) return absl::InvalidArgumentError(absl::StrCat("no family '", c.family, "'"));
  nlohmann::json j = {
      {"architectures", {family->architecture}},
      {"model_type", family->model_type},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta()},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"torch_dtype", "bfloat16"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  const RopeAttrs& r = c.rope;
  if (r.has_llama3_scaling()) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.llama3_scaling().factor()},
                         {"low_freq_factor", r.llama3_scaling().low_freq_factor()},
                         {"high_freq_factor", r.llama3_scaling().high_freq_factor()},
                         {"original_max_position_embeddings", r.llama3_scaling().original_max_position()}};
  } else if (r.linear_factor() > 0) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.linear_factor()}};
  } else if (r.has_yarn()) {
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", r.yarn().factor()},
                         {"original_max_position_embeddings", r.yarn().original_max_position()},
                         {"beta_fast", r.yarn().beta_fast()},
                         {"beta_slow", r.yarn().beta_slow()},
                         {"truncate", r.yarn().truncate()},
                         {"attention_factor", r.yarn().attention_factor()}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (absl::Status s = family->write(c, &j); !s.ok()) return s;
  return j;
}

}  // namespace loom::graph
