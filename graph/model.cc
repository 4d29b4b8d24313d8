#include "graph/model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/families/gated_conv.h"
#include "graph/hf_config.h"
#include "graph/host_memory.h"
#include "graph/json_file.h"
#include "graph/onnx_import.h"
#include "graph/progress.h"
#include "graph/proto_file.h"
#include "graph/safetensors.h"

namespace loom::graph {
namespace {

namespace fs = std::filesystem;

// A folder's safetensors files with every weight the config implies found in them, its shape and dtype checked.
struct HfWeightPlan {
  struct Source {
    std::string name;
    const SafetensorsFile* file;
    std::optional<WeightScheme> scheme;  // stored quantized (graph/quantization.h)
    int64_t rows = 0, cols = 0;
    uint64_t bytes = 0;  // stored (quantized sources)
    DType kept = DTYPE_UNSPECIFIED;  // quantized sources Loom computes with as stored: F8E4M3 or I4 (KeptDtype)
  };
  std::string dir;
  absl::flat_hash_map<std::string, std::shared_ptr<SafetensorsFile>> opened;  // owns the files of `sources`
  absl::flat_hash_map<std::string, const SafetensorsFile*> where;  // every stored tensor -> its file
  TensorLookup Lookup() const {
    return [this](const std::string& name) -> std::optional<StoredTensor> {
      auto it = where.find(name);
      if (it == where.end()) return std::nullopt;
      return StoredTensor{it->second, &it->second->header().tensors.at(name)};
    };
  }
  std::vector<Source> sources;
  uint64_t file_bytes = 0;  // of the sources, as stored
};

// Checks every weight the config implies against the files' headers, reading no weight: a folder that does not
// hold the model (a wrong folder, a config naming more layers than the files have) fails in a second, before the
// graph is built or any weight is read.
absl::StatusOr<HfWeightPlan> PlanHfWeights(const std::string& dir, const DecoderConfig& config, bool widen,
                                           std::vector<std::string>* notes) {
  HfWeightPlan plan;
  plan.dir = dir;
  std::vector<std::string> files;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  absl::flat_hash_map<std::string, std::string> file_of;  // tensor -> shard (sharded only)
  if (fs::exists(index_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(index_path.string());
    if (!text.ok()) return text.status();
    absl::StatusOr<nlohmann::json> parsed = ParseJsonObject(*text, index_path.string());
    if (!parsed.ok()) return parsed.status();
    nlohmann::json& index = *parsed;
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": no 'weight_map' object"));
    }
    std::set<std::string> shards;
    for (auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string() || absl::StrContains(shard.get<std::string>(), "/")) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": bad shard for '", name, "'"));
      }
      file_of[name] = (fs::path(dir) / shard.get<std::string>()).string();
      shards.insert(file_of[name]);
    }
    files.assign(shards.begin(), shards.end());
  } else if (fs::exists(single_path)) {
    files.push_back(single_path.string());
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }

  auto& opened = plan.opened;
  for (const std::string& f : files) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(f);
    if (!file.ok()) return file.status();
    opened[f] = std::move(*file);
  }
  for (const std::string& f : files) {
    for (const auto& [name, entry] : opened.at(f)->header().tensors) plan.where.emplace(name, opened.at(f).get());
  }
  std::vector<HfWeightPlan::Source>& sources = plan.sources;
  uint64_t& total_bytes = plan.file_bytes;
  std::set<std::string> converted;  // dtypes rounded to bf16
  std::set<std::string> used;       // stored tensors read
  std::map<std::pair<std::string, DType>, int> quantized;  // (scheme, dtype kept as stored) -> projections stored so
  for (const auto& [name, shape] : DecoderWeightShapes(config)) {
    // A projection the checkpoint stores quantized: its parts checked now, read back to bf16 later.
    if (config.quantization && shape.size() == 2 &&
        (absl::EndsWith(name, "_proj.weight") || name == "lm_head.weight")) {
      const std::string module = name.substr(0, name.size() - std::string(".weight").size());
      absl::StatusOr<std::optional<WeightScheme>> scheme = config.quantization->SchemeOf(module);
      if (!scheme.ok()) return scheme.status();
      if (*scheme) {
        absl::StatusOr<uint64_t> bytes = CheckQuantizedWeight(name, shape[0], shape[1], **scheme, plan.Lookup());
        if (!bytes.ok()) return bytes.status();
        const DType kept = widen ? DTYPE_UNSPECIFIED : KeptDtype(name, shape[0], shape[1], **scheme, plan.Lookup());
        HfWeightPlan::Source source{name, nullptr, **scheme, shape[0], shape[1], *bytes, kept};
        sources.push_back(std::move(source));
        total_bytes += *bytes;
        ++quantized[{(*scheme)->Describe(), kept}];
        for (const char* part : {"weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
                                 "qweight", "qzeros", "scales"}) {
          used.insert(absl::StrCat(module, ".", part));
        }
        continue;
      }
    }
    std::shared_ptr<SafetensorsFile> file;
    if (!file_of.empty()) {
      auto it = file_of.find(name);
      if (it == file_of.end()) {
        return absl::NotFoundError(absl::StrCat(index_path.string(), ": weight '", name, "' not in weight_map"));
      }
      file = opened.at(it->second);
    } else {
      file = opened.at(files[0]);
    }
    auto entry = file->header().tensors.find(name);
    if (entry == file->header().tensors.end()) {
      return absl::NotFoundError(absl::StrCat(file->path(), ": weight '", name, "' is missing"));
    }
    if (entry->second.shape != shape) {
      std::string want, got;
      for (int64_t d : shape) absl::StrAppend(&want, want.empty() ? "" : ",", d);
      for (int64_t d : entry->second.shape) absl::StrAppend(&got, got.empty() ? "" : ",", d);
      return absl::InvalidArgumentError(absl::StrCat(file->path(), ": weight '", name, "' has shape [", got,
                                                     "], config.json implies [", want, "]"));
    }
    const std::string& dtype = entry->second.dtype;
    if (dtype != "BF16" && dtype != "F16" && dtype != "F32") {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": weight '", name, "' has dtype ", dtype, "; need BF16, F16 or F32"));
    }
    if (dtype != "BF16") converted.insert(dtype);
    sources.push_back({name, file.get()});
    used.insert(name);
    total_bytes += entry->second.end - entry->second.begin;
  }
  for (const std::string& dtype : converted) {
    notes->push_back(absl::StrCat("weights stored as ", dtype, " are rounded to bf16 (Loom computes from bf16 weights)"));
  }
  for (const auto& [scheme, count] : quantized) {
    notes->push_back(absl::StrCat(count, " projections stored as ", scheme.first,
                                  scheme.second == F8E4M3 ? " are computed with as stored (FP8 matvec)"
                                  : scheme.second == I4   ? " are computed with as stored (int4 matvec)"
                                  : widen                 ? " are widened to bf16 as they are read (--widen_quantized)"
                                                : " are widened to bf16 as they are read (Loom has no kernels for "
                                                  "them yet)"));
  }
  // Tensors the config does not use (transformers skips them too, with a warning): say so, never silently.
  std::vector<std::string> unused;
  for (const auto& [path, file] : opened) {
    for (const auto& [name, entry] : file->header().tensors) {
      if (!used.contains(name)) unused.push_back(name);
    }
  }
  if (!unused.empty()) {
    std::sort(unused.begin(), unused.end());
    constexpr size_t kShown = 5;
    const size_t more = unused.size() > kShown ? unused.size() - kShown : 0;
    unused.resize(std::min(unused.size(), kShown));
    notes->push_back(absl::StrCat(dir, ": tensors config.json does not use, ignored: ", absl::StrJoin(unused, ", "),
                                  more > 0 ? absl::StrCat(" (and ", more, " more)") : ""));
  }
  return plan;
}

// Reads the weights of a plan, rounded to bf16, but for quantized ones Loom computes with as stored (source.kept).
absl::Status ReadHfWeights(const HfWeightPlan& plan,
                           const std::function<absl::Status(const std::string&, HostTensor)>& visit) {
  Progress progress(absl::StrCat("reading weights from ", plan.dir), plan.file_bytes);
  for (const HfWeightPlan::Source& source : plan.sources) {
    if (source.scheme) {
      const auto read = source.kept == F8E4M3 ? ReadFp8Weight : source.kept == I4 ? ReadInt4Weight : ReadQuantizedWeight;
      absl::StatusOr<HostTensor> t = read(source.name, source.rows, source.cols, *source.scheme, plan.Lookup());
      if (!t.ok()) return t.status();
      if (absl::Status s = visit(source.name, *std::move(t)); !s.ok()) return s;
      progress.Add(source.bytes);
      continue;
    }
    absl::StatusOr<HostTensor> t = source.file->ReadBf16(source.name);
    if (!t.ok()) return t.status();
    const SafetensorsEntry& e = source.file->header().tensors.at(source.name);
    progress.Add(e.end - e.begin);
    if (absl::Status s = visit(source.name, *std::move(t)); !s.ok()) return s;
  }
  progress.Done();
  return absl::OkStatus();
}

// The WEIGHT tensors of `graph` by name from <dir>/model.safetensors, each with exactly its shape.
absl::Status LoadGraphWeights(const std::string& dir, const Graph& graph, bool load, WeightStore* weights,
                              std::vector<std::string>* notes) {
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  std::set<std::string> used;
  for (const TensorDef* t : graph.TensorsOfKind(WEIGHT)) {
    auto entry = (*file)->header().tensors.find(t->name());
    if (entry == (*file)->header().tensors.end()) {
      return absl::NotFoundError(absl::StrCat(path, ": weight '", t->name(), "' is missing"));
    }
    if (!std::equal(entry->second.shape.begin(), entry->second.shape.end(), t->shape().begin(), t->shape().end())) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": weight '", t->name(), "' has shape [",
                                                     absl::StrJoin(entry->second.shape, ","), "], the graph needs [",
                                                     absl::StrJoin(t->shape(), ","), "]"));
    }
    used.insert(t->name());
    if (!load) continue;
    absl::StatusOr<HostTensor> w = (*file)->ReadBf16(t->name());
    if (!w.ok()) return w.status();
    weights->emplace(t->name(), *std::move(w));
  }
  std::vector<std::string> unused;
  for (const auto& [name, entry] : (*file)->header().tensors) {
    if (!used.contains(name)) unused.push_back(name);
  }
  if (!unused.empty()) {
    std::sort(unused.begin(), unused.end());
    notes->push_back(absl::StrCat(path, ": tensors the graph does not use, ignored: ", absl::StrJoin(unused, ", ")));
  }
  return absl::OkStatus();
}

// A projection a random FP8 model holds as FP8: a 2-D "*_proj.weight" (the LM head and embeddings stay bf16).
bool IsProjection(const std::string& name, const std::vector<int64_t>& shape) {
  return shape.size() == 2 && absl::EndsWith(name, "_proj.weight");
}

// What loading a decoder takes of host memory (its weights as bf16) and, with `packed_copies`, running it: that
// many packed images of the weights (the decode schedule's, the prefill pass's) and the KV cache (of kv_bytes an
// element).
absl::Status CheckHostMemoryFor(const std::string& spec, const DecoderConfig& c, int max_seq, int packed_copies,
                                const std::string& scheme, int kv_bytes) {
  // Bytes a projection's parameter takes under a random model's scheme: FP8 one, W4A16 half (the scales aside).
  const double saved = scheme == "FP8" ? 1.0 : scheme == "W4A16" ? 1.5 : 0.0;
  double projection_parameters = 0;
  for (const auto& [name, shape] : DecoderWeightShapes(c)) {
    if (IsProjection(name, shape)) projection_parameters += double(shape[0]) * shape[1];
  }
  const double weights = 2 * c.Parameters() - saved * projection_parameters;
  // The decode schedule's copy is packed as the weights are stored; the prefill pass's GEMM images are bf16 whatever
  // the scheme (its tensor cores read quantized weights widened).
  const double packed = (packed_copies > 0 ? weights : 0.0) + std::max(0, packed_copies - 1) * 2 * c.Parameters();
  const double kv = packed_copies > 0 ? 2.0 * kv_bytes * c.num_layers * c.num_kv_heads * double{c.head_dim} * max_seq : 0;
  std::string detail = absl::StrFormat("%.2fB parameters: %.1f GB of %s weights", c.Parameters() / 1e9, weights / 1e9,
                                       scheme.empty() ? "bf16" : absl::StrCat(scheme, " and bf16"));
  if (packed_copies > 0) {
    absl::StrAppendFormat(&detail, ", %.1f GB packed, %.1f GB of KV cache at %d positions", packed / 1e9, kv / 1e9,
                          max_seq);
  }
  return CheckHostMemory(static_cast<uint64_t>(weights + packed + kv), spec, detail);
}


// The graph's WEIGHT tensors named in `kept` take its dtype (FP8 or I4; the decoder graph is built bf16): decided
// from the config and the checkpoint's scheme before any weight is read, so a graph loaded without weights (loom
// compile) is the one its weights will run.
absl::Status DeclareKept(const std::map<std::string, std::pair<DType, int>>& kept, Model* model) {
  if (kept.empty()) return absl::OkStatus();
  GraphDef def = model->graph.def();
  for (TensorDef& t : *def.mutable_tensors()) {
    auto it = kept.find(t.name());
    if (t.kind() != WEIGHT || it == kept.end()) continue;
    t.set_dtype(it->second.first);
    if (it->second.first == I4) t.set_group_size(it->second.second);
  }
  absl::StatusOr<Graph> graph = Graph::Create(std::move(def));
  if (!graph.ok()) return graph.status();
  model->graph = *std::move(graph);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> ParseKvDtype(const std::string& name) {
  if (name == "f32") return F32;
  if (name == "bf16") return BF16;
  return absl::InvalidArgumentError(absl::StrCat("kv_dtype '", name, "': f32 or bf16"));
}

absl::StatusOr<Model> LoadModel(const std::string& spec, const ModelOptions& options) {
  Model model;
  model.spec = spec;
  const bool random = absl::StartsWith(spec, "random:");
  const std::string config_path = (fs::path(spec) / "config.json").string();
  if (options.kv_dtype != F32 && options.kv_dtype != BF16) {
    return absl::InvalidArgumentError(absl::StrCat("kv_dtype ", DType_Name(options.kv_dtype), ": F32 or BF16"));
  }
  if (absl::EndsWith(spec, ".onnx") && !fs::is_directory(spec)) {  // an ONNX model: graph and initializers
    if (options.kv_dtype != F32) {
      return absl::UnimplementedError(absl::StrCat(spec, ": kv_dtype BF16 applies to the decoder families' KV cache; "
                                                   "an ONNX graph's state keeps the dtypes the file gives it"));
    }
    absl::StatusOr<OnnxModel> onnx = ImportOnnx(spec);
    if (!onnx.ok()) return onnx.status();
    model.graph = std::move(onnx->graph);
    if (options.load_weights) model.weights = std::move(onnx->weights);
    model.config.family = "onnx";
    return model;
  }
  // A config.json: the configuration, and a note of the fields nothing reads.
  auto read_config = [&](const std::string& path) -> absl::Status {
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) return text.status();
    std::vector<std::string> unused;
    absl::StatusOr<DecoderConfig> config = ParseHfConfig(*text, path, &unused);
    if (!config.ok()) return config.status();
    model.config = *config;
    if (!unused.empty()) {
      model.notes.push_back(absl::StrCat(path, ": fields transformers does not read for ", model.config.family,
                                         " models either, ignored: ", absl::StrJoin(unused, ", ")));
    }
    return absl::OkStatus();
  };
  // A gated depthwise-conv LM (families/gated_conv.h): a preset, or a folder whose config.json names the family.
  std::optional<GatedConvConfig> gated;
  if (random && IsGatedConvPreset(spec.substr(7))) {
    absl::StatusOr<GatedConvConfig> config = GatedConvPreset(spec.substr(7));
    if (!config.ok()) return config.status();
    gated = *config;
  } else if (!random && fs::exists(config_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::optional<GatedConvConfig>> config = ParseGatedConvConfig(*text, config_path);
    if (!config.ok()) return config.status();
    gated = *config;
  }
  if (gated) {
    if (options.kv_dtype != F32) {
      return absl::UnimplementedError(absl::StrCat(spec, ": kv_dtype BF16: a gated-conv model has no KV cache"));
    }
    absl::StatusOr<Graph> graph = BuildGatedConvGraph(*gated, options.max_seq > 0 ? options.max_seq : 4096);
    if (!graph.ok()) return graph.status();
    model.graph = *std::move(graph);
    if (options.load_weights) {  // bf16 weights: refused before any is made or read when the host cannot hold them
      double bytes = 0;
      for (const TensorDef* t : model.graph.TensorsOfKind(WEIGHT)) bytes += 2.0 * NumElements(*t);
      if (absl::Status s = CheckHostMemory(static_cast<uint64_t>(bytes), spec, "its bf16 weights"); !s.ok()) return s;
    }
    model.gated_conv = gated;
    model.config.family = "gated-conv";
    model.config.hidden_size = gated->hidden;
    model.config.num_layers = gated->layers;
    model.config.intermediate_size = gated->intermediate;
    model.config.vocab_size = gated->vocab;
    model.config.max_position_embeddings = model.graph.def().max_seq();
    if (random) {
      if (options.load_weights) model.weights = RandomGatedConvWeights(model.graph, options.seed);
    } else if (absl::Status s = LoadGraphWeights(spec, model.graph, options.load_weights, &model.weights, &model.notes);
               !s.ok()) {
      return s;
    }
    return model;
  }
  if (random && absl::EndsWith(spec, ".json")) {  // random:<config.json>: that architecture, random weights
    if (absl::Status s = read_config(spec.substr(7)); !s.ok()) return s;
    if (model.config.quantization) {
      model.notes.push_back("random weights are bf16: the config's quantization_config has no weights to describe");
      model.config.quantization.reset();
    }
  } else if (random) {
    absl::StatusOr<DecoderConfig> config = DecoderPreset(spec.substr(7));
    if (!config.ok()) return config.status();
    model.config = *config;
  } else {
    if (!fs::is_directory(spec)) {
      return absl::NotFoundError(absl::StrCat(spec, ": not a model folder and not random:<preset>"));
    }
    if (absl::Status s = read_config(config_path); !s.ok()) return s;
  }
  if (!options.scheme.empty() && ((options.scheme != "FP8" && options.scheme != "W4A16") || !random)) {
    return absl::InvalidArgumentError(absl::StrCat("--scheme=", options.scheme,
                                                   random ? ": random weights are generated as FP8, W4A16 or bf16 (no "
                                                            "scheme)"
                                                          : " generates random weights (random:<preset>); a folder's "
                                                            "weights are as its config.json's quantization_config says"));
  }
  // The KV cache: as asked, else 4096 positions or as many as the request holds (rounded up to 256), within the
  // positions the model was trained for.
  const int requested = (options.request + 255) / 256 * 256;
  const int max_seq = options.max_seq > 0
                          ? options.max_seq
                          : std::min(model.config.max_position_embeddings, std::max(4096, requested));
  if (absl::Status s = model.config.CheckWindows(max_seq); !s.ok()) {
    return random ? s : absl::UnimplementedError(absl::StrCat(config_path, ": ", s.message()));
  }
  // The config alone decides what follows: the files must hold its weights, the host must hold them (and what
  // running them takes), all checked before the graph is built or a weight is read.
  std::optional<HfWeightPlan> plan;
  if (!random) {
    absl::StatusOr<HfWeightPlan> p = PlanHfWeights(spec, model.config, options.widen_quantized, &model.notes);
    if (!p.ok()) return p.status();
    plan = *std::move(p);
  }
  if (options.load_weights && !options.weight_visitor) {  // (a visitor takes each weight as it comes)
    if (absl::Status s = CheckHostMemoryFor(spec, model.config, max_seq, options.packed_copies,
                                            random ? options.scheme : "", options.kv_dtype == BF16 ? 2 : 4);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<Graph> graph = BuildDecoderGraph(model.config, max_seq, options.kv_dtype);
  if (!graph.ok()) return graph.status();
  model.graph = *std::move(graph);
  // The weights that stay quantized: a random model's projections with --scheme, a checkpoint's kept as stored.
  const int group = options.group_size;
  if (random && options.scheme == "W4A16") {
    for (const auto& [name, shape] : DecoderWeightShapes(model.config)) {
      if (IsProjection(name, shape) && (group < 32 || (group & (group - 1)) != 0 || shape[1] % group != 0)) {
        return absl::InvalidArgumentError(absl::StrCat("--group_size=", group, ": W4A16 groups are a power of two, at "
                                                       "least 32, dividing every projection's columns ('", name,
                                                       "' has ", shape[1], ")"));
      }
    }
  }
  std::map<std::string, std::pair<DType, int>> kept;  // weight -> (dtype, I4's group size)
  if (random && !options.scheme.empty()) {
    for (const auto& [name, shape] : DecoderWeightShapes(model.config)) {
      if (IsProjection(name, shape)) kept[name] = {options.scheme == "FP8" ? F8E4M3 : I4, group};
    }
  } else if (plan) {
    for (const HfWeightPlan::Source& source : plan->sources) {
      if (source.kept != DTYPE_UNSPECIFIED) kept[source.name] = {source.kept, source.scheme->group_size};
    }
  }
  if (absl::Status s = DeclareKept(kept, &model); !s.ok()) return s;
  if (!options.load_weights) return model;
  // Random: every projection but the LM head, as checkpoints of the scheme hold them, each quantized as it is made.
  std::function<HostTensor(const std::string&, HostTensor)> quantize;
  if (random) {
    if (options.scheme == "FP8") {
      quantize = [](const std::string& name, HostTensor w) {
        return IsProjection(name, w.shape) ? QuantizeRowsToFp8(w) : std::move(w);
      };
      model.notes.push_back("random projections quantized to FP8 (e4m3, a power-of-two scale per row)");
    } else if (options.scheme == "W4A16") {
      quantize = [group](const std::string& name, HostTensor w) {
        return IsProjection(name, w.shape) ? QuantizeGroupsToInt4(w, group) : std::move(w);
      };
      model.notes.push_back(absl::StrCat("random projections quantized to int4 (symmetric, a bf16 scale per ", group,
                                         " columns)"));
    }
  }
  // Each weight into the model, or to the caller's visitor; the kept ones checked to be read as they are declared
  // (the readers make exactly these quantized).
  auto visit = [&](const std::string& name, HostTensor w) -> absl::Status {
    if (auto it = kept.find(name); it != kept.end() && w.dtype != it->second.first) {
      return absl::InternalError(absl::StrCat(name, ": not read as ", DTypeName(it->second.first)));
    }
    if (options.weight_visitor) return options.weight_visitor(name, std::move(w));
    model.weights.emplace(name, std::move(w));
    return absl::OkStatus();
  };
  if (absl::Status s = random ? VisitRandomDecoderWeights(model.config, options.seed, quantize, visit)
                              : ReadHfWeights(*plan, visit);
      !s.ok()) {
    return s;
  }
  return model;
}

absl::Status ExportModel(const Model& model, const std::string& dir) {
  if (model.weights.empty()) return absl::FailedPreconditionError("export needs a model loaded with its weights");
  if (model.gated_conv) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
    std::vector<std::pair<std::string, const HostTensor*>> tensors;
    for (const TensorDef* t : model.graph.TensorsOfKind(WEIGHT)) {
      tensors.emplace_back(t->name(), &model.weights.at(t->name()));
    }
    if (absl::Status s = WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors); !s.ok()) return s;
    return WriteFileAtomically((fs::path(dir) / "config.json").string(), GatedConvConfigJson(*model.gated_conv));
  }
  absl::StatusOr<nlohmann::json> config = HfConfigToJson(model.config);
  if (!config.ok()) return config.status();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  std::vector<std::pair<std::string, const HostTensor*>> tensors;
  // FP8 weights as f32 (each e4m3 value times its row's scale), int4 ones as f32 too ((u - z) * s unrounded): exactly
  // the values Loom multiplies by.
  std::vector<HostTensor> widened;
  widened.reserve(DecoderWeightShapes(model.config).size());
  for (const auto& [name, shape] : DecoderWeightShapes(model.config)) {
    const HostTensor& w = model.weights.at(name);
    if (w.dtype != F8E4M3 && w.dtype != I4) {
      tensors.emplace_back(name, &w);
      continue;
    }
    HostTensor& f = widened.emplace_back(HostTensor::Zeros(F32, w.shape));
    for (int64_t i = 0; i < w.size(); ++i) f.f32[i] = w.dtype == I4 ? w.Int4Product(i) : w.Get(i);
    tensors.emplace_back(name, &f);
  }
  if (absl::Status s = WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors); !s.ok()) return s;
  return WriteFileAtomically((fs::path(dir) / "config.json").string(), config->dump(2) + "\n");
}

}  // namespace loom::graph
