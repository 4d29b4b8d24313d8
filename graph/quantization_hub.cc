// The hub's older quantized formats (graph/quantization.h): AutoAWQ's GEMM packing (`quant_method: "awq"`) and
// GPTQ's (`quant_method: "gptq"`, as GPTQModel, AutoGPTQ and transformers' GPTQConfig write it), each read back to
// what the library's own dequantization gives.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "graph/quantization_internal.h"

namespace loom::graph::quantization_internal {
namespace {

// A positive group size, or -1 (one group: a scale per output channel) where `allow_channel`.
absl::StatusOr<int> GroupSize(const nlohmann::json& q, const std::string& path, bool allow_channel) {
  const nlohmann::json group = q.value("group_size", nlohmann::json(128));
  if (!group.is_number_integer() || (group.get<int>() <= 0 && !(allow_channel && group.get<int>() == -1))) {
    return Refuse(path, "group_size", group,
                  allow_channel ? "must be a positive number of columns, or -1" : "must be a positive number of columns");
  }
  return group.get<int>();
}

// Bits [shift, shift + bits) of the little-endian int32 word `index` of `words`.
uint32_t Bits(const uint8_t* words, int64_t index, int shift, int bits) {
  uint32_t w;
  std::memcpy(&w, words + 4 * index, 4);
  return (w >> shift) & ((1u << bits) - 1);
}

}  // namespace

// AutoAWQ's config (`quant_method: "awq"`, as AwqConfig / to_transformers_dict write it): 4-bit weights with zero
// points in the GEMM packing. Fusing options (do_fuse, fuse_max_seq_len, backend, exllama_config) change how a
// runtime schedules the math, not the math: read and ignored.
absl::StatusOr<QuantizationConfig> ParseAwqConfig(const nlohmann::json& q, const std::string& path) {
  if (absl::Status s = OnlyKnownKeys(q,
                                     {"quant_method", "bits", "group_size", "zero_point", "version",
                                      "modules_to_not_convert", "backend", "do_fuse", "fuse_max_seq_len",
                                      "exllama_config"},
                                     path, "");
      !s.ok()) {
    return s;
  }
  const nlohmann::json version = q.value("version", nlohmann::json("gemm"));
  if (!version.is_string() || (version != "gemm" && version != "GEMM")) {
    return Refuse(path, "version", version, "Loom reads AWQ's GEMM packing (not gemv, marlin or exllama)");
  }
  if (q.value("bits", nlohmann::json(4)) != 4) return Refuse(path, "bits", q["bits"], "AWQ's GEMM packing is 4-bit");
  if (q.value("zero_point", nlohmann::json(true)) != true) {
    return Refuse(path, "zero_point", q["zero_point"], "AWQ's GEMM packing stores zero points");
  }
  absl::StatusOr<int> group = GroupSize(q, path, false);
  if (!group.ok()) return group.status();
  QuantizationConfig config;
  config.groups.push_back({{"Linear"}, WeightScheme{"awq-gemm", false, 4, false, *group}});
  config.ignore.push_back("lm_head");  // never converted (transformers keeps the output projection as stored)
  if (q.contains("modules_to_not_convert") && !q["modules_to_not_convert"].is_null()) {
    const nlohmann::json& skip = q["modules_to_not_convert"];
    if (!skip.is_array()) return Refuse(path, "modules_to_not_convert", skip, "must be a list");
    for (const nlohmann::json& m : skip) {
      if (!m.is_string()) return Refuse(path, "modules_to_not_convert", skip, "must be strings");
      config.ignore.push_back(ContainsPattern(m.get<std::string>()));
    }
  }
  return config;
}

// GPTQ's config: bits, group_size (-1: a scale per output channel), sym, desc_act, checkpoint_format ("gptq": zero
// points stored minus one, a word-wide subtraction; "gptq_v2": as they are), lm_head. Activation order (desc_act)
// quantized the columns in another order: each column's group is then g_idx[column], which the reading follows.
// What only steered the calibration or a runtime's kernel choice is read and ignored; per-module overrides
// (`dynamic`), adapters and a partial module list are refused.
absl::StatusOr<QuantizationConfig> ParseGptqConfig(const nlohmann::json& q, const std::string& path) {
  static const std::set<std::string> kIgnored = {
      "damp_percent", "damp_auto_increment", "true_sequential", "static_groups", "model_name_or_path",
      "model_file_base_name", "quantizer", "meta", "method", "mse", "v2", "v2_alpha", "act_group_aware",
      "hyb_act", "offload_to_disk", "offload_to_disk_path", "use_cuda_fp16", "model_seqlen", "batch_size",
      "pad_token_id", "use_exllama", "max_input_length", "exllama_config", "cache_block_outputs", "tokenizer",
      "dataset", "backend", "block_name_to_quantize", "module_name_preceding_first_block", "rotation", "pack_impl",
      "fail_safe", "device", "sym_first"};
  std::set<std::string> known = {"quant_method", "bits", "group_size", "sym", "desc_act", "checkpoint_format",
                                 "format", "lm_head", "pack_dtype", "dynamic", "adapter",
                                 "modules_in_block_to_quantize"};
  known.insert(kIgnored.begin(), kIgnored.end());
  if (absl::Status s = OnlyKnownKeys(q, known, path, ""); !s.ok()) return s;
  const nlohmann::json bits = q.value("bits", nlohmann::json(4));
  if (bits != 2 && bits != 4 && bits != 8) {
    return Refuse(path, "bits", bits, "Loom reads GPTQ's 2-, 4- and 8-bit packings (3, 5-7 bits pack across words)");
  }
  absl::StatusOr<int> group = GroupSize(q, path, true);
  if (!group.ok()) return group.status();
  const nlohmann::json desc_act = q.value("desc_act", nlohmann::json(false));
  if (!desc_act.is_boolean()) return Refuse(path, "desc_act", desc_act, "must be true or false");
  // checkpoint_format, or format as GPTQModel also writes it: the zero points' convention.
  std::string format = "gptq";
  for (const char* key : {"format", "checkpoint_format"}) {
    if (IsNull(q, key)) continue;
    if (q[key] != "gptq" && q[key] != "gptq_v2") {
      return Refuse(path, key, q[key], "Loom reads the gptq and gptq_v2 formats (not marlin, bitblas or planar)");
    }
    format = q[key].get<std::string>();
  }
  if (q.value("pack_dtype", nlohmann::json("int32")) != "int32") {
    return Refuse(path, "pack_dtype", q["pack_dtype"], "Loom reads int32 packing words");
  }
  for (const char* key : {"dynamic", "adapter", "modules_in_block_to_quantize"}) {
    if (!IsNull(q, key) && !(q[key].is_object() && q[key].empty())) {
      return Refuse(path, key, q[key], "per-module schemes and adapters change the math and are not read");
    }
  }
  QuantizationConfig config;
  // sym only says the zero points are all 2^(bits-1): they are stored either way.
  config.groups.push_back(
      {{"Linear"}, WeightScheme{format == "gptq" ? "gptq" : "gptq-v2", false, bits.get<int>(), false,
                                *group == -1 ? 0 : *group, desc_act.get<bool>()}});
  if (q.value("lm_head", nlohmann::json(false)) != true) config.ignore.push_back("lm_head");
  return config;
}

bool IsHubFormat(const std::string& format) {
  return format == "awq-gemm" || format == "gptq" || format == "gptq-v2";
}

absl::StatusOr<Parts> FindHubParts(const std::string& weight, int64_t rows, int64_t cols, const WeightScheme& s,
                                   const NeedFn& need, const BadFn& bad) {
  const int group = s.group_size > 0 ? s.group_size : static_cast<int>(cols);
  // AWQ: qweight I32 [cols, rows / 8] (8 nibbles a word, of the rows 0, 2, 4, 6, 1, 3, 5, 7 of its run of 8),
  // qzeros I32 [groups, rows / 8] the same way. GPTQ: qweight I32 [cols * bits / 32, rows] (a word holds 32 / bits
  // consecutive columns), qzeros I32 [groups, rows * bits / 32] (32 / bits consecutive rows). Scales [groups, rows].
  const int per = 32 / s.bits;
  const bool awq = s.format == "awq-gemm";
  if (rows % per != 0 || cols % group != 0 || (!awq && cols % per != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("quantized weight '", weight, "' [", rows, ", ", cols, "]: ",
                                                   awq ? "AWQ" : "GPTQ", " packs ", per, " values a word and ",
                                                   "columns by group_size ", group));
  }
  Parts p;
  p.groups = cols / group;
  const std::vector<int64_t> qweight = awq ? std::vector<int64_t>{cols, rows / per}
                                           : std::vector<int64_t>{cols / per, rows};
  const std::pair<const char*, std::vector<int64_t>> shapes[] = {
      {"qweight", qweight}, {"qzeros", {p.groups, rows / per}}, {"scales", {p.groups, rows}}};
  StoredTensor* slots[] = {&p.values, &p.zero_point, &p.scale};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<StoredTensor> t = need(shapes[i].first);
    if (!t.ok()) return t.status();
    *slots[i] = *t;
    const std::string& dt = t->entry->dtype;
    const bool dtype_ok = i < 2 ? dt == "I32" : (dt == "F16" || dt == "BF16" || dt == "F32");
    if (!dtype_ok || t->entry->shape != shapes[i].second) {
      return bad(*t, shapes[i].first, absl::StrCat("need ", i < 2 ? "I32 " : "F16 ", Shape(shapes[i].second)));
    }
  }
  if (!awq) {  // g_idx: each column's group, column / group_size unless desc_act (then needed)
    absl::StatusOr<StoredTensor> g_idx = need("g_idx");
    if (!g_idx.ok() && s.act_order) return g_idx.status();
    if (g_idx.ok()) {
      bool ok = g_idx->entry->dtype == "I32" && g_idx->entry->shape == std::vector<int64_t>{cols};
      const uint8_t* d = ok ? g_idx->file->Data(*g_idx->entry) : nullptr;
      for (int64_t c = 0; ok && c < cols; ++c) {
        int32_t v;
        std::memcpy(&v, d + 4 * c, 4);
        ok = s.act_order ? v >= 0 && v < p.groups : v == c / group;
      }
      if (!ok) {
        return bad(*g_idx, "g_idx", s.act_order ? absl::StrCat("need I32 [", cols, "] of groups below ", p.groups)
                                                : "not column / group_size, and desc_act is false");
      }
      p.g_idx = *g_idx;
    }
  }
  return p;
}

namespace {

// The integer codes of a hub-format weight: q(r, c), and the zero point z(r, g) of row r's group g.
class HubCodes {
 public:
  HubCodes(const Parts& p, int64_t rows, const WeightScheme& s)
      : values_(p.values.file->Data(*p.values.entry)), zeros_(p.zero_point.file->Data(*p.zero_point.entry)),
        rows_(rows), bits_(s.bits), per_(32 / s.bits), awq_(s.format == "awq-gemm") {
    // GPTQ's v1 format stored each zero point minus one, subtracting from the whole word; reading adds it back the
    // same way (GPTQModel's convert_gptq_v1_to_v2_format), carries and all.
    for (int i = 0; s.format == "gptq" && i < per_; ++i) v1_offset_ |= 1u << (i * s.bits);
  }
  int32_t Value(int64_t r, int64_t c) const {
    if (awq_) return static_cast<int32_t>(Bits(values_, c * (rows_ / 8) + r / 8, 4 * kAwqNibble[r % 8], 4));
    return static_cast<int32_t>(Bits(values_, (c / per_) * rows_ + r, static_cast<int>(c % per_) * bits_, bits_));
  }
  int32_t Zero(int64_t r, int64_t g) const {
    if (awq_) return static_cast<int32_t>(Bits(zeros_, g * (rows_ / 8) + r / 8, 4 * kAwqNibble[r % 8], 4));
    uint32_t word;
    std::memcpy(&word, zeros_ + 4 * (g * (rows_ / per_) + r / per_), 4);
    word += v1_offset_;
    return static_cast<int32_t>((word >> ((r % per_) * bits_)) & ((1u << bits_) - 1));
  }

 private:
  static constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // of row r % 8 in its word
  const uint8_t* values_;
  const uint8_t* zeros_;
  int64_t rows_;
  int bits_, per_;
  bool awq_;
  uint32_t v1_offset_ = 0;
};

}  // namespace

void ReadHubWeight(const Parts& p, int64_t rows, int64_t cols, const WeightScheme& s, const std::vector<float>& scales,
                   bool half, HostTensor* out) {
  const HubCodes codes(p, rows, s);
  const int group = s.group_size > 0 ? s.group_size : static_cast<int>(cols);
  // Each column's group: g_idx (checked by FindHubParts) in activation order, else column / group_size.
  std::vector<int32_t> group_of(cols);
  for (int64_t c = 0; c < cols; ++c) group_of[c] = static_cast<int32_t>(c / group);
  if (s.act_order) std::memcpy(group_of.data(), p.g_idx.file->Data(*p.g_idx.entry), 4 * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = group_of[c];
      const float w = static_cast<float>(codes.Value(r, c) - codes.Zero(r, g)) * scales[g * rows + r];
      out->bf16[r * cols + c] = FloatToBf16(half ? RoundToHalf(w) : w);
    }
  }
}

void ReadHubInt4(const Parts& p, int64_t rows, int64_t cols, const WeightScheme& s, HostTensor* out) {
  const HubCodes codes(p, rows, s);
  const int64_t groups = p.groups;
  const uint8_t* scales = p.scale.file->Data(*p.scale.entry);  // [groups, rows] 16-bit
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out->f8[(r * cols + c) / 2] |= static_cast<uint8_t>(codes.Value(r, c) << (4 * ((r * cols + c) & 1)));
    }
    for (int64_t g = 0; g < groups; ++g) {
      out->i32[r * groups + g] = codes.Zero(r, g);
      std::memcpy(&out->bf16[r * groups + g], scales + 2 * (g * rows + r), 2);
    }
  }
}

}  // namespace loom::graph::quantization_internal
