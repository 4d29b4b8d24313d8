// loom: compile a model into a schedule, inspect it, run it, export and quantize models.
//   loom compile --model=<random:PRESET|HF-FOLDER> [--options=FILE] --out=schedule.pb
//   loom inspect schedule.pb [--instructions]
//   loom run --model=... --tokens=N [--prompt=1,2,3] [--backend=cpu|gpu]
//   loom export --model=<random:PRESET|HF-FOLDER> --out=DIR   (a quantized folder: its weights widened to bf16)
//   loom quantize --model=... --out=DIR --scheme=FP8|W4A16|W8A16 [--group_size=128]
// Every error is one line on stderr naming the file and the reason, exit code 1.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "google/protobuf/arena.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "graph/decode_oracle.h"
#include "graph/model.h"
#include "graph/quantize.h"
#include "graph/proto_file.h"
#include "instructions/isa.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/reference_vm.h"
#include "runtime/session.h"
#include "scheduler/compiler.h"
#include "scheduler/decoded_schedule.h"
#include "scheduler/options.h"
#include "scheduler/prefill.h"
#include "scheduler/simulator.h"
#include "scheduler/summary.h"
#include "tools/run_graph.h"

ABSL_FLAG(std::string, model, "",
          "model to load: random:<preset> (llama-3.2-1b, tiny, tiny-mistral, tiny-qwen2, tiny-qwen3), "
          "random:<config.json> (that architecture with random weights), a Hugging Face folder of a llama, mistral, "
          "qwen2 or qwen3 model, or an ONNX file (*.onnx: one pass of tile instructions; loom run --input)");
ABSL_FLAG(std::string, input, "random",
          "run on a general graph (ONNX): random (uniform in [-1, 1), --seed; integer ids uniform over their table), "
          "or name=file.npy,... (float32 .npy, int64 / int32 for integer inputs; a lone file.npy for a graph of one "
          "input)");
ABSL_FLAG(std::string, options, "", "CompileOptions file (.pbtxt text format or binary .pb); flags override it");
ABSL_FLAG(std::string, out, "",
          "output file (compile: schedule .pb/.pbtxt) or folder (export; run on a general graph: <output>.npy files)");
ABSL_FLAG(int32_t, num_sms, 0, "SMs to schedule for (0: options file or 132)");
ABSL_FLAG(std::string, policy, "", "SM assignment policy: round-robin, lpt or critical-path");
ABSL_FLAG(std::string, granularity, "", "barrier granularity: op or chunk");
ABSL_FLAG(std::string, unfuse, "",
          "comma-separated fusions to turn off: norm, qkv, residual, silu, argmax, embed");
ABSL_FLAG(int32_t, max_seq, 0,
          "KV-cache capacity in tokens (0: min(max_position_embeddings, 4096); run: grown to hold the prompt and "
          "--tokens, up to max_position_embeddings)");
ABSL_FLAG(int32_t, repeat, 1,
          "compile: compile this many times and print the median time; run on a general graph: run the pass this many "
          "times and print the median");
ABSL_FLAG(int32_t, prefill_rows, 0,
          "compile: lower the one-pass prefill of this many prompt rows (after the decode step it extends) and write "
          "that pass to --out instead");
ABSL_FLAG(bool, verify, true, "compile --prefill_rows: verify the pass (false: time the lowering alone)");
ABSL_FLAG(bool, instructions, false, "inspect: also list every instruction with its named arguments");
ABSL_FLAG(int32_t, tokens, 16, "run: tokens to generate after the prompt");
ABSL_FLAG(std::string, prompt, "1", "run: comma-separated prompt token ids");
ABSL_FLAG(std::string, backend, "cpu", "run: cpu (reference VM) or gpu (the persistent megakernel)");
ABSL_FLAG(bool, check, false,
          "run: also verify the prefill pass and decode with the op-by-op oracle, comparing tokens (a general graph: "
          "every output within a relative RMS error of 3e-2)");
ABSL_FLAG(std::string, trace, "", "run --backend=gpu: write a Chrome trace JSON of every instruction here");
ABSL_FLAG(int32_t, steps_per_launch, 0, "run --backend=gpu: decode steps per kernel launch (0: all in one)");
ABSL_FLAG(uint64_t, seed, 0x10057, "seed of random:<preset> weights");
ABSL_FLAG(std::string, scheme, "",
          "quantize: FP8 (e4m3, a scale per row), W4A16 (int4, a scale per group) or W8A16; compile / run of "
          "random:<preset>: FP8 generates the projections as FP8 (a power-of-two scale per row), W4A16 as int4 (a "
          "bf16 scale per --group_size columns)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "decoders' KV cache: f32, or bf16 (half its memory and of what decode attention reads; K and V rounded to "
          "bf16 as they are appended)");
ABSL_FLAG(bool, widen_quantized, false,
          "widen every quantized weight of a checkpoint to bf16 as it is read, FP8 ones too (they are computed with "
          "as stored otherwise)");
ABSL_FLAG(int32_t, group_size, 128, "--scheme=W4A16 (quantize, or random weights): columns per scale");
ABSL_FLAG(bool, prefill, true,
          "run: consume the prompt in one tensor-core prefill pass (false: token by token, one decode step per "
          "prompt token, without packing the prefill weights)");
ABSL_FLAG(bool, prefill_buckets, true,
          "run: lower the prompt's pass for its bucket (16, 32, 64, 128, then every 128 rows: one lowering serves "
          "every length in it; the rows past the prompt are padding); false: for its exact length");
ABSL_FLAG(int32_t, prefill_chunk, static_cast<int32_t>(loom::scheduler::kDefaultPrefillChunkRows),
          "run: a prompt of more rows than this in passes of this many rows, one after another (0: one pass)");
ABSL_FLAG(std::string, logits_out, "",
          "run: write every position's logits here (float32, (prompt + tokens - 1) x vocab, little-endian): the "
          "prefill pass computes every prompt row's, then one decode step per launch");

namespace loom {
namespace {

bool Given(const std::string& name);  // whether the command line set the flag (below)

struct Command {
  const char* name;
  const char* usage;
  std::vector<const char*> flags;
};

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"compile",
       "loom compile --model=<random:PRESET|HF-FOLDER> [--options=FILE] [--prefill_rows=N] --out=schedule.pb",
       {"model", "options", "out", "num_sms", "policy", "granularity", "unfuse", "max_seq", "repeat", "seed",
        "prefill_rows", "verify", "scheme", "group_size", "widen_quantized", "kv_dtype"}},
      {"inspect", "loom inspect schedule.pb [--instructions]", {"instructions"}},
      {"run", "loom run --model=... --tokens=N [--prompt=1,2,3] [--backend=cpu|gpu]",
       {"model", "tokens", "prompt", "backend", "prefill", "check", "trace", "steps_per_launch", "logits_out", "options", "num_sms",
        "policy", "granularity", "unfuse", "max_seq", "seed", "input", "out", "repeat", "scheme", "group_size",
        "widen_quantized", "kv_dtype", "prefill_buckets", "prefill_chunk"}},
      {"export", "loom export --model=<random:PRESET|HF-FOLDER> --out=DIR", {"model", "out", "seed", "widen_quantized"}},
      {"quantize", "loom quantize --model=<random:PRESET|HF-FOLDER> --out=DIR --scheme=FP8|W4A16|W8A16 [--group_size=128]",
       {"model", "out", "scheme", "group_size", "seed"}},
  };
  return commands;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "loom: %s\n", std::string(status.message()).c_str());
  // A launch the watchdog found stuck still runs: ending the process ends it. Nothing may wait for it on the way
  // out (the CUDA runtime's exit handlers would), so the process ends here.
  if (runtime::GpuHung()) {
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 1;
}

void PrintHelp(const Command* command) {
  if (command == nullptr) {
    std::printf("loom: a persistent megakernel runtime\n\ncommands:\n");
    for (const Command& c : Commands()) std::printf("  %s\n", c.usage);
    std::printf("\n`loom <command> --help` explains the command's flags.\n");
    return;
  }
  std::printf("usage: %s\n\nflags:\n", command->usage);
  for (const char* name : command->flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::printf("  --%s (default: \"%s\")\n      %s\n", name, flag->DefaultValue().c_str(), flag->Help().c_str());
  }
}

absl::StatusOr<scheduler::CompileOptions> OptionsFromFlags() {
  scheduler::OptionSettings settings;
  settings.options_file = absl::GetFlag(FLAGS_options);
  settings.num_sms = absl::GetFlag(FLAGS_num_sms);
  settings.policy = absl::GetFlag(FLAGS_policy);
  settings.granularity = absl::GetFlag(FLAGS_granularity);
  settings.unfuse = absl::StrSplit(absl::GetFlag(FLAGS_unfuse), ',', absl::SkipEmpty());
  settings.max_seq = absl::GetFlag(FLAGS_max_seq);
  return scheduler::OptionsFromSettings(settings, "--");
}

absl::StatusOr<graph::ModelOptions> ModelOptionsFromFlags(bool weights, const scheduler::CompileOptions& options,
                                                          int request) {
  if (absl::GetFlag(FLAGS_model).empty()) return absl::InvalidArgumentError("--model is required");
  graph::ModelOptions mo;
  mo.load_weights = weights;
  mo.max_seq = static_cast<int>(options.max_seq());
  mo.request = request;
  mo.seed = absl::GetFlag(FLAGS_seed);
  mo.scheme = absl::GetFlag(FLAGS_scheme);
  mo.group_size = absl::GetFlag(FLAGS_group_size);
  if (loom::Given("group_size") && mo.scheme != "W4A16") {
    return absl::InvalidArgumentError("--group_size is a W4A16 setting (--scheme=W4A16)");
  }
  mo.widen_quantized = absl::GetFlag(FLAGS_widen_quantized);
  {
    absl::StatusOr<graph::DType> kv = graph::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
    if (!kv.ok()) return kv.status();
    mo.kv_dtype = *kv;
  }
  if (!mo.scheme.empty() && !absl::StartsWith(absl::GetFlag(FLAGS_model), "random:")) {
    return absl::InvalidArgumentError(absl::StrCat("--scheme=", mo.scheme, " generates random weights; a folder's ",
                                                   "weights are as its config.json's quantization_config says"));
  }
  // Loaded to run on the CPU VM, the host must also hold the packed weights (the prefill pass's images too, unless
  // prefill is off) and the KV cache; on the GPU both live there (the weights are packed and uploaded a window at a
  // time: GpuDecoder::Create).
  const bool on_host = absl::GetFlag(FLAGS_backend) == "cpu";
  mo.packed_copies = weights && on_host ? (!options.has_prefill() || options.prefill() ? 2 : 1) : 0;
  return mo;
}

absl::StatusOr<graph::Model> ModelFromFlags(bool weights, const scheduler::CompileOptions& options, int request = 0) {
  absl::StatusOr<graph::ModelOptions> mo = ModelOptionsFromFlags(weights, options, request);
  if (!mo.ok()) return mo.status();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<graph::Model> model = graph::LoadModel(absl::GetFlag(FLAGS_model), *mo);
  if (!model.ok()) return model;
  for (const std::string& note : model->notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  const graph::DecoderConfig& c = model->config;
  if (c.family == "onnx") {
    uint64_t bytes = 0;
    for (const auto& [name, t] : model->weights) bytes += t.bytes();
    std::fprintf(stderr, "%s: ONNX graph '%s', %d ops%s\n", absl::GetFlag(FLAGS_model).c_str(),
                 model->graph.def().name().c_str(), model->graph.def().ops_size(),
                 weights ? absl::StrFormat(", %zu weights (%.1f MB)", model->weights.size(), bytes / 1e6).c_str() : "");
    return model;
  }
  if (c.family == "gated-conv") {  // no attention: no heads
    double params = 0;
    for (const graph::TensorDef* t : model->graph.TensorsOfKind(graph::WEIGHT)) params += graph::NumElements(*t);
    std::fprintf(stderr, "%s: gated depthwise-conv LM, %.1fM parameters, %d layers, hidden %d, intermediate %d\n",
                 absl::GetFlag(FLAGS_model).c_str(), params / 1e6, c.num_layers, c.hidden_size, c.intermediate_size);
    return model;
  }
  std::fprintf(stderr, "%s: %s, %.2fB parameters, %d layers, hidden %d, %d/%d heads of %d%s\n",
               absl::GetFlag(FLAGS_model).c_str(), c.family.c_str(), c.Parameters() / 1e9, c.num_layers,
               c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
               weights ? absl::StrFormat(" (loaded in %.1f s)", std::chrono::duration<double>(
                                                                     std::chrono::steady_clock::now() - start)
                                                                     .count())
                             .c_str()
                       : "");
  return model;
}

// compile --prefill_rows: the pass verified unless --verify=false (then the time is the lowering's alone, as
// `loom run` lowers a pass).
scheduler::PrefillOptions PassOptions() {
  scheduler::PrefillOptions o;
  o.verify = absl::GetFlag(FLAGS_verify);
  return o;
}

int CompileCommand() {
  if (absl::GetFlag(FLAGS_out).empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  absl::StatusOr<scheduler::CompileOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<graph::Model> model = ModelFromFlags(false, *options);
  if (!model.ok()) return Fail(model.status());
  std::vector<double> ms;
  absl::StatusOr<scheduler::Schedule> schedule;
  const int32_t prefill_rows = absl::GetFlag(FLAGS_prefill_rows);
  if (prefill_rows < 0) return Fail(absl::InvalidArgumentError("--prefill_rows must be 0 (off) or positive"));
  if (prefill_rows == 0 && !absl::GetFlag(FLAGS_verify)) {
    return Fail(
        absl::InvalidArgumentError("--verify=false needs --prefill_rows: a decode schedule is always verified"));
  }
  absl::StatusOr<scheduler::Schedule> decode;
  if (prefill_rows > 0) {
    decode = scheduler::Compile(model->graph, absl::GetFlag(FLAGS_model), *options);
    if (!decode.ok()) return Fail(decode.status());
  }
  // A pass is lowered as a Session lowers one (into a protobuf Arena), the last run's pass kept for --out; the
  // previous runs' are freed outside the timing (a Session keeps its passes).
  std::unique_ptr<google::protobuf::Arena> kept;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeat)); ++i) {
    auto arena = std::make_unique<google::protobuf::Arena>();
    scheduler::Schedule* pass = google::protobuf::Arena::Create<scheduler::Schedule>(arena.get());
    const auto start = std::chrono::steady_clock::now();
    if (prefill_rows > 0) {
      if (absl::Status s = scheduler::LowerPrefillInto(model->graph, *decode, prefill_rows, PassOptions(), pass);
          !s.ok()) {
        return Fail(s);
      }
    } else {
      schedule = scheduler::Compile(model->graph, absl::GetFlag(FLAGS_model), *options);
    }
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (prefill_rows == 0 && !schedule.ok()) return Fail(schedule.status());
    if (prefill_rows > 0) {
      if (i + 1 == std::max(1, absl::GetFlag(FLAGS_repeat))) schedule = *pass;
      kept = std::move(arena);
    }
  }
  std::sort(ms.begin(), ms.end());
  if (absl::Status s = WriteProtoFile(absl::GetFlag(FLAGS_out), *schedule); !s.ok()) return Fail(s);
  int instructions = 0;
  for (const scheduler::SmQueue& q : schedule->queues()) instructions += q.instructions_size();
  std::printf("compiled %s: %d instructions on %u SMs, %d barriers -> %s\n", absl::GetFlag(FLAGS_model).c_str(),
              instructions, schedule->num_sms(), schedule->barriers_size(), absl::GetFlag(FLAGS_out).c_str());
  std::printf("%s: median %.1f ms over %zu runs (min %.1f, max %.1f)\n",
              absl::GetFlag(FLAGS_verify) ? "compile + verify" : "lowering", ms[ms.size() / 2], ms.size(), ms.front(),
              ms.back());
  return 0;
}

int InspectCommand(const std::string& path) {
  absl::StatusOr<scheduler::Schedule> s = scheduler::LoadSchedule(path);
  if (!s.ok()) return Fail(s.status());
  absl::StatusOr<std::string> summary = scheduler::ScheduleSummary(*s, path, absl::GetFlag(FLAGS_instructions));
  if (!summary.ok()) return Fail(summary.status());
  std::fputs(summary->c_str(), stdout);
  return 0;
}

absl::StatusOr<std::vector<int32_t>> ParsePrompt() {
  std::vector<int32_t> prompt;
  const std::string flag = absl::GetFlag(FLAGS_prompt);
  const std::vector<absl::string_view> ids = absl::StrSplit(flag, ',');
  for (size_t i = 0; i < ids.size(); ++i) {
    const absl::string_view t = ids[i];
    // Every element is a token id: "1,2," is a mistake (a token left out?), not the prompt 1, 2.
    if (t.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt: token ", i + 1, " is empty (",
          i + 1 == ids.size() && i > 0 ? "a trailing comma" : i == 0 && ids.size() > 1 ? "a leading comma"
                                                                                         : "two commas in a row", "?)"));
    }
    int32_t id;
    if (!absl::SimpleAtoi(t, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt: '", std::string(t), "' is not a token id"));
    }
    prompt.push_back(id);
  }
  if (prompt.empty()) return absl::InvalidArgumentError("--prompt needs at least one token id");
  return prompt;
}

std::string Join(const std::vector<int32_t>& v, size_t from) {
  std::string out;
  for (size_t i = from; i < v.size(); ++i) absl::StrAppend(&out, i > from ? " " : "", v[i]);
  return out;
}

// The flags named on the command line (main fills it from argv: "--name", "--name=value", "--noname"), whatever
// their values: a flag given with its default value is given all the same.
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}
bool Given(const std::string& name) { return GivenFlags().contains(name) || GivenFlags().contains("no" + name); }

// The model is a general graph (ONNX): one pass over its inputs, no tokens. LoadModel's rule, on the spec alone.
bool IsGeneralGraph(const std::string& spec) {
  return absl::EndsWith(spec, ".onnx") && !std::filesystem::is_directory(spec);
}

// Flags of `loom run` that only some runs read, refused where given to a run that would ignore them: a flag
// silently ignored reads as if it had had its effect (a trace that is never written, a --repeat that timed
// nothing, --tokens on a graph that generates none).
absl::Status CheckRunFlagsApply(bool general_graph, const std::string& backend) {
  struct Rule {
    const char* flag;
    bool applies;
    const char* why;
  };
  const bool logits_out = !absl::GetFlag(FLAGS_logits_out).empty();
  const Rule rules[] = {
      {"trace", backend == "gpu", "traces time the GPU kernel: add --backend=gpu"},
      {"trace", general_graph || !logits_out, "a decoder run with --logits_out is not traced"},
      {"steps_per_launch", backend == "gpu" && !general_graph, "launches are of the GPU decoder: add --backend=gpu"},
      {"repeat", general_graph, "repeats a general graph's pass (ONNX); a decoder run times every decode step"},
      {"input", general_graph, "inputs are a general graph's (ONNX); a decoder reads --prompt"},
      {"out", general_graph, "a general graph's outputs go there; a decoder's logits go to --logits_out"},
      {"tokens", !general_graph, "a general graph (ONNX) runs one pass and generates no tokens"},
      {"prompt", !general_graph, "a general graph (ONNX) reads --input, not a prompt"},
      {"prefill", !general_graph, "a general graph (ONNX) has no prompt to prefill"},
      {"prefill_buckets", !general_graph, "a general graph (ONNX) has no prompt to prefill"},
      {"prefill_chunk", !general_graph, "a general graph (ONNX) has no prompt to prefill"},
      {"logits_out", !general_graph, "a general graph (ONNX) writes its outputs to --out"},
  };
  for (const Rule& r : rules) {
    if (!r.applies && Given(r.flag)) {
      return absl::InvalidArgumentError(absl::StrCat("--", r.flag, " has no effect here: ", r.why));
    }
  }
  return absl::OkStatus();
}

// On the GPU, unless --prefill (or the options file's `prefill`) is given: a decoder whose prefill pass's operand images (bf16 whatever its weights'
// scheme: 141 GB for a Llama-3.1-70B) do not fit the GPU beside its decode weights, where those alone do, runs its
// prompt token by token (a note says so) instead of stopping at GpuDecoder::Create after minutes of loading. Decided
// from the config and a compile, before any weight is read; what still does not fit is refused there, by name.
void FitPrefillToGpu(scheduler::CompileOptions* options, int request) {
  if (Given("prefill") || options->has_prefill()) return;  // (an options file's `prefill:` is as explicit)
  absl::StatusOr<graph::ModelOptions> mo = ModelOptionsFromFlags(false, *options, request);
  if (!mo.ok()) return;  // (the load that follows says why)
  absl::StatusOr<graph::Model> model = graph::LoadModel(absl::GetFlag(FLAGS_model), *mo);
  if (!model.ok()) return;
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model->graph, absl::GetFlag(FLAGS_model), *options);
  if (!s.ok() || s->has_graph()) return;
  const uint64_t prefill = scheduler::PrefillWeightBytes(*s);
  if (prefill == 0 || runtime::CheckDeviceMemory(s->weight_bytes(), s->arena_bytes(), prefill).ok() ||
      !runtime::CheckDeviceMemory(s->weight_bytes() - prefill, s->arena_bytes(), 0).ok()) {
    return;
  }
  options->set_prefill(false);
  std::fprintf(stderr,
               "note: the prefill pass's weights (%.1f GB of bf16 operand images) do not fit the GPU beside the "
               "decode weights (%.1f GB): the prompt runs token by token (--prefill=true insists)\n",
               prefill / 1e9, (s->weight_bytes() - prefill) / 1e9);
}

int RunCommand() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cpu" && backend != "gpu") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--backend: unknown backend '", backend, "'")));
  }
  if (absl::Status s = CheckRunFlagsApply(IsGeneralGraph(absl::GetFlag(FLAGS_model)), backend); !s.ok()) return Fail(s);
  // No GPU: said at once, before the model is loaded.
  if (std::string why; backend == "gpu" && !runtime::GpuAvailable(&why)) {
    return Fail(absl::UnavailableError(absl::StrCat("--backend=gpu: ", why)));
  }
  absl::StatusOr<scheduler::CompileOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  if (!absl::GetFlag(FLAGS_prefill)) options->set_prefill(false);  // nor pack the prefill pass's weights
  absl::StatusOr<std::vector<int32_t>> prompt = ParsePrompt();
  if (!prompt.ok()) return Fail(prompt.status());
  const int new_tokens = absl::GetFlag(FLAGS_tokens);
  if (new_tokens < 1) return Fail(absl::InvalidArgumentError("--tokens must be >= 1"));
  if (absl::GetFlag(FLAGS_prefill_chunk) < 0) {
    return Fail(absl::InvalidArgumentError("--prefill_chunk must be >= 0 (0: the prompt in one pass)"));
  }
  // Without --max_seq the KV cache holds the request: the prompt, the new tokens and the slot past them.
  const int request = static_cast<int>(std::min<size_t>(prompt->size() + new_tokens + 1, 1 << 30));
  if (backend == "gpu" && !IsGeneralGraph(absl::GetFlag(FLAGS_model))) FitPrefillToGpu(&*options, request);
  std::fprintf(stderr, "loading %s...\n", absl::GetFlag(FLAGS_model).c_str());
  absl::StatusOr<graph::Model> model = ModelFromFlags(true, *options, request);
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<scheduler::Schedule> schedule =
      scheduler::Compile(model->graph, absl::GetFlag(FLAGS_model), *options);
  if (!schedule.ok()) return Fail(schedule.status());
  if (schedule->has_graph()) {  // a general graph: one pass over its inputs
    tools::GraphRunFlags flags;
    flags.backend = backend;
    flags.input = absl::GetFlag(FLAGS_input);
    flags.out = absl::GetFlag(FLAGS_out);
    flags.trace = absl::GetFlag(FLAGS_trace);
    flags.check = absl::GetFlag(FLAGS_check);
    flags.repeat = absl::GetFlag(FLAGS_repeat);
    flags.seed = absl::GetFlag(FLAGS_seed);
    return tools::RunGraph(*model, *schedule, flags);
  }
  const int steps = static_cast<int>(prompt->size()) - 1 + new_tokens;
  if (steps >= static_cast<int>(schedule->max_seq())) {
    return Fail(absl::OutOfRangeError(
        absl::StrCat("prompt + tokens (", steps + 1, ") exceed the KV cache of ", schedule->max_seq(),
                     Given("max_seq") ? "; raise --max_seq"
                                      : absl::StrCat(" (the model's max_position_embeddings, ",
                                                     model->config.max_position_embeddings, ")"))));
  }
  // A decoder runs through runtime::Session, as Python's loom.Session does: the prompt (one prefill pass, lowered
  // for its bucket and in chunks unless --prefill_buckets / --prefill_chunk say otherwise, or token by token), then the
  // other new tokens as decode steps.
  absl::StatusOr<std::unique_ptr<runtime::Session>> session = runtime::Session::Create(
      model->graph, *schedule, model->weights, backend == "gpu" ? runtime::Backend::kGpu : runtime::Backend::kCpu);
  if (!session.ok()) return Fail(session.status());
  runtime::Session& run = **session;
  const std::string logits_out = absl::GetFlag(FLAGS_logits_out);
  runtime::StartOptions start;
  start.prefill = absl::GetFlag(FLAGS_prefill);
  start.keep_logits = !logits_out.empty();  // the pass then computes every prompt row's logits (the LM head per row)
  start.verify = absl::GetFlag(FLAGS_check);
  start.buckets = absl::GetFlag(FLAGS_prefill_buckets);
  start.chunk_rows = static_cast<uint32_t>(absl::GetFlag(FLAGS_prefill_chunk));
  if (absl::Status s = run.Start(*prompt, start); !s.ok()) return Fail(s);
  if (run.used_prefill()) {
    std::fprintf(stderr, "prefill pass of %zu tokens: %d instructions, lowered in %.1f ms\n", prompt->size(),
                 run.pass_instructions(), run.pass_lower_ms());
  } else if (start.prefill) {
    std::fprintf(stderr, "note: no prefill pass (%s); the prompt runs token by token\n", run.prefill_note().c_str());
  }
  const int decode_steps = new_tokens - 1;
  double decode_ms = 0;
  const std::string trace = absl::GetFlag(FLAGS_trace);
  const int per_launch = absl::GetFlag(FLAGS_steps_per_launch);
  if (!trace.empty() && decode_steps > 0) {
    absl::StatusOr<std::string> summary = run.TraceSteps(decode_steps, trace, per_launch);
    if (!summary.ok()) return Fail(summary.status());
    decode_ms = run.step_ms();
    std::printf("%s", summary->c_str());
  } else if (!trace.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--trace records the decode steps after the first new token: it needs --tokens=2 or more"));
  } else {
    // Launches of --steps_per_launch steps on the GPU (all in one by default); on the CPU, progress every 8 steps.
    const int chunk = backend == "cpu" ? 8 : per_launch > 0 ? per_launch : std::max(decode_steps, 1);
    for (int done = 0; done < decode_steps; done += chunk) {
      if (absl::Status s = run.Step(std::min(chunk, decode_steps - done)); !s.ok()) return Fail(s);
      decode_ms += run.step_ms();
      if (backend == "cpu") std::fprintf(stderr, "\r  step %d/%d", std::min(done + chunk, decode_steps), decode_steps);
    }
    if (backend == "cpu" && decode_steps > 0) std::fprintf(stderr, "\n");
  }
  absl::StatusOr<std::vector<int32_t>> generated = run.tokens();
  if (!generated.ok()) return Fail(generated.status());
  const std::vector<int32_t>& tokens = *generated;
  // Start and Step refuse non-finite logits (runtime::CheckLogitsFinite): argmax-of-NaN tokens are not printed.
  if (!logits_out.empty()) {
    const std::vector<float>& all = run.kept_logits();
    const std::string bytes(reinterpret_cast<const char*>(all.data()), all.size() * sizeof(float));
    if (absl::Status s = WriteFileAtomically(logits_out, bytes); !s.ok()) return Fail(s);
  }
  std::printf("tokens: %s\n", Join(tokens, prompt->size()).c_str());
  const double ms_per_token = decode_steps > 0 ? decode_ms / decode_steps : 0;
  if (run.used_prefill()) {
    std::printf("%s backend: prefill of %zu tokens %.3f ms, then %.3f ms/token over %d decode steps\n",
                backend.c_str(), prompt->size(), run.prompt_ms(), ms_per_token, decode_steps);
    std::printf("time to first token: %.3f ms wall clock, lowering the pass %.1f ms of it\n", run.ttft_ms(),
                run.pass_lower_ms());
  } else {
    std::printf("%s backend: %.3f ms/token over %d steps\n", backend.c_str(), (run.prompt_ms() + decode_ms) / steps,
                steps);
  }
  if (absl::GetFlag(FLAGS_check)) {
    absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*model, *prompt, new_tokens);
    if (!oracle.ok()) return Fail(oracle.status());
    if (oracle->tokens != tokens) {
      std::printf("oracle: %s\nMISMATCH against the op-by-op oracle\n", Join(oracle->tokens, prompt->size()).c_str());
      // Where the tokens part, how far apart the oracle's own logits put the two (random weights give near ties that
      // a last-bit difference in the pass's bf16 operands or a bf16 KV cache tips).
      size_t i = 0;
      while (i < tokens.size() && i < oracle->tokens.size() && tokens[i] == oracle->tokens[i]) ++i;
      if (i > 0 && i < tokens.size() && i < oracle->tokens.size() && i - 1 < oracle->logits.size()) {
        const std::vector<float>& l = oracle->logits[i - 1];
        const int32_t want = oracle->tokens[i], got = tokens[i];
        if (want >= 0 && got >= 0 && static_cast<size_t>(std::max(want, got)) < l.size()) {
          float scale = 0;
          for (float v : l) scale = std::max(scale, std::fabs(v));
          const float margin = l[want] - l[got];
          std::printf("first difference at position %zu: token %d (oracle) against %d, which the oracle's logits put "
                      "behind by %.3g (%.2g of the largest logit)\n",
                      i, want, got, margin, scale > 0 ? margin / scale : 0.0f);
        }
      }
      return 1;
    }
    std::printf("identical to the op-by-op oracle\n");
  }
  return 0;
}

int ExportCommand() {
  if (absl::GetFlag(FLAGS_out).empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  if (IsGeneralGraph(absl::GetFlag(FLAGS_model))) {
    return Fail(absl::InvalidArgumentError("export writes decoders (random:<preset>, random:<config.json>, a model "
                                           "folder); an ONNX file is already a file"));
  }
  graph::ModelOptions mo;
  mo.seed = absl::GetFlag(FLAGS_seed);
  mo.widen_quantized = absl::GetFlag(FLAGS_widen_quantized);  // FP8 weights are written as f32 otherwise
  absl::StatusOr<graph::Model> model = graph::LoadModel(absl::GetFlag(FLAGS_model), mo);
  if (!model.ok()) return Fail(model.status());
  if (absl::Status s = graph::ExportModel(*model, absl::GetFlag(FLAGS_out)); !s.ok()) return Fail(s);
  std::printf("exported %s to %s (config.json, model.safetensors)\n", absl::GetFlag(FLAGS_model).c_str(),
              absl::GetFlag(FLAGS_out).c_str());
  return 0;
}

// Round-to-nearest quantization of a decoder into a compressed-tensors folder (graph/quantize.h).
int QuantizeCommand() {
  if (absl::GetFlag(FLAGS_out).empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  graph::QuantizeOptions qo;
  qo.scheme = absl::GetFlag(FLAGS_scheme);
  qo.group_size = absl::GetFlag(FLAGS_group_size);
  if (qo.scheme != "FP8" && qo.scheme != "W4A16" && qo.scheme != "W8A16") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--scheme=", qo.scheme, ": one of FP8, W4A16, W8A16")));
  }
  if (loom::Given("group_size") && qo.scheme != "W4A16") {
    return Fail(absl::InvalidArgumentError("--group_size is a W4A16 setting (FP8 and W8A16 take a scale per row)"));
  }
  graph::ModelOptions mo;
  mo.seed = absl::GetFlag(FLAGS_seed);
  // Streamed: each weight quantized and written as it is read (a 70B folder never held whole).
  std::vector<std::string> notes;
  const absl::Status s = graph::QuantizeCheckpoint(absl::GetFlag(FLAGS_model), mo, qo, absl::GetFlag(FLAGS_out), &notes);
  for (const std::string& note : notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  if (!s.ok()) return Fail(s);
  std::printf("quantized %s to %s as %s (config.json with its quantization_config, model.safetensors)\n",
              absl::GetFlag(FLAGS_model).c_str(), absl::GetFlag(FLAGS_out).c_str(), qo.scheme.c_str());
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  using loom::Commands;
  const loom::Command* command = nullptr;
  if (argc >= 2) {
    for (const loom::Command& c : Commands()) {
      if (argv[1] == std::string(c.name)) command = &c;
    }
  }
  std::vector<char*> args = {argv[0]};
  bool help = argc < 2;
  for (int i = command ? 2 : 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "--helpfull") help = true;
    else args.push_back(argv[i]);
  }
  for (size_t i = 1; i < args.size() && std::string(args[i]) != "--"; ++i) {
    const std::string a = args[i];
    const size_t begin = a.find_first_not_of('-');
    if (a[0] == '-' && begin != std::string::npos) loom::GivenFlags().insert(a.substr(begin, a.find('=') - begin));
  }
  if (help) {
    loom::PrintHelp(command);
    return 0;
  }
  if (command == nullptr) {
    std::fprintf(stderr, "loom: unknown command '%s'; try loom --help\n", argv[1]);
    return 1;
  }
  std::vector<char*> positional;
  for (char* p : absl::ParseCommandLine(static_cast<int>(args.size()), args.data())) positional.push_back(p);
  positional.erase(positional.begin());
  for (char* p : positional) {
    if (command->name != std::string("inspect")) {
      std::fprintf(stderr, "loom: unexpected argument '%s'\n", p);
      return 1;
    }
  }
  // A flag of another command does nothing here: refused, not silently ignored.
  for (const loom::Command& c : Commands()) {
    for (const char* flag : c.flags) {
      if (loom::Given(flag) && std::find_if(command->flags.begin(), command->flags.end(), [&](const char* f) {
                                 return std::string(f) == flag;
                               }) == command->flags.end()) {
        std::fprintf(stderr, "loom: --%s is not a flag of loom %s (loom %s --help lists them)\n", flag, command->name,
                     command->name);
        return 1;
      }
    }
  }
  const std::string name = command->name;
  if (name == "compile") return loom::CompileCommand();
  if (name == "inspect") {
    if (positional.size() != 1) {
      std::fprintf(stderr, "loom: inspect takes one schedule file\n");
      return 1;
    }
    return loom::InspectCommand(positional[0]);
  }
  if (name == "run") return loom::RunCommand();
  if (name == "quantize") return loom::QuantizeCommand();
  return loom::ExportCommand();
}
