// shape_fuzz: random decoder shapes across the envelope of every family Loom reads (hidden, heads, KV heads,
// head_dim, intermediate, vocab, layers, biases, tied embeddings, sliding windows) x prompt lengths from 1 to the
// KV capacity x every prompt row's logits or the last x the prefill pass or token by token x decode steps per
// launch. Each case is either refused at compile time (one line naming what and why: counted, listed) or run on
// the GPU and on the CPU VM over the same schedule, where the tokens must be identical and the logits within the
// prefill tolerance. A GPU error, a lowering that fails after compiling, or a disagreement is a failure; the tool
// exits non-zero on any. Reproduce one case with --seed and --first=N --cases=1.
//   shape_fuzz --cases=300 [--seed=1] [--first=0] [--seconds=0] [--report=FILE] [--compile_only]
//              [--scheme=FP8|W4A16] [--kv_dtype=f32|bf16|mixed] [--buckets]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "graph/model.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/reference_vm.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"

ABSL_FLAG(int32_t, cases, 300, "cases to run");
ABSL_FLAG(int32_t, first, 0, "index of the first case (a case is a function of --seed and its index)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the case generator");
ABSL_FLAG(double, seconds, 0, "stop starting cases after this many seconds (0: run them all)");
ABSL_FLAG(std::string, report, "", "write one line per case here");
ABSL_FLAG(std::string, dir, "/tmp", "where each case's config.json is written");
ABSL_FLAG(std::string, scheme, "",
          "FP8: every case's projections FP8 (MATVEC_FP8 in decode), W4A16: int4 in the largest group of 128 / 64 / 32 "
          "that divides them (MATVEC_W4); the cases are the same");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "every case's KV cache: f32, bf16, or mixed (the odd-numbered cases bf16); the cases are the same");
ABSL_FLAG(bool, buckets, false,
          "run each prefill pass (not every row's logits) as its bucket's (scheduler::PrefillBucketRows), the prompt's "
          "rows of it; the cases are the same");
ABSL_FLAG(bool, compile_only, false, "compile each case and lower its pass, no GPU or VM (the case mix, the refusals)");

namespace loom {
namespace {

// Logits of the GPU against the VM over the same schedule (relative L2): the pass rounds its GEMM operands to bf16,
// and a value within f32 noise of a rounding boundary (the two sides sum in other orders) rounds either way, which
// the layers after it carry on: measured up to 8e-3 (hidden 4096, every row's logits). A wrong result is O(1).
constexpr double kTolerance = 2e-2;

struct Case {
  int index = 0;
  std::string family;
  uint32_t hidden, heads, kv_heads, head_dim, intermediate, vocab, layers, max_seq;
  bool bias, tied, window;
  uint32_t prompt, steps, steps_per_launch;
  bool prefill, all_logits;
  uint32_t num_sms;
  std::string Describe() const {
    return absl::StrCat(family, " hidden ", hidden, " heads ", heads, "/", kv_heads, " of ", head_dim, " inter ",
                        intermediate, " vocab ", vocab, " layers ", layers, bias ? " bias" : "", tied ? " tied" : "",
                        window ? " window" : "", " max_seq ", max_seq, " | prompt ", prompt, " +", steps,
                        " steps, ", steps_per_launch == 0 ? "one launch" : absl::StrCat(steps_per_launch, " a launch"),
                        prefill ? ", prefill" : ", token by token", all_logits ? ", every row's logits" : "", ", ",
                        num_sms, " SMs");
  }
};

template <typename T>
T Pick(std::mt19937_64& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

Case Generate(uint64_t seed, int index) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(index));
  Case c;
  c.index = index;
  c.family = Pick<std::string>(rng, {"llama", "llama", "mistral", "qwen2", "qwen3"});
  // Mostly shapes Loom runs, some it must refuse (head_dim 96 / 256, widths not a multiple of 4 or 64).
  c.head_dim = Pick<uint32_t>(rng, {64, 64, 64, 128, 128, 128, 32, 256, 96});
  c.kv_heads = Pick<uint32_t>(rng, {1, 2, 4, 8});
  c.heads = c.kv_heads * Pick<uint32_t>(rng, {1, 2, 2, 3, 4, 4, 7, 8, 9});
  c.hidden = Pick<uint32_t>(rng, {c.heads * c.head_dim, c.heads * c.head_dim, 64u * Pick<uint32_t>(rng, {3, 8, 9, 12, 16, 24}),
                                  Pick<uint32_t>(rng, {192, 576, 896, 960, 100, 1000, 1536})});
  c.hidden = std::min(c.hidden, 2048u);
  // The CPU VM runs every case too: widths of small models (a case takes about a second, not twenty).
  while (c.heads * c.head_dim > 2048 && c.heads > c.kv_heads) c.heads -= c.kv_heads;
  if (c.heads * c.head_dim > 2048) c.kv_heads = c.heads = 2048 / c.head_dim;
  c.intermediate = Pick<uint32_t>(rng, {c.hidden * 2, c.hidden * 3, c.hidden * 4, c.hidden * 8 / 3 / 64 * 64 + 64,
                                        Pick<uint32_t>(rng, {1000, 1408, 2816, 4096, 100})});
  c.intermediate = std::min(c.intermediate, 6144u);
  c.vocab = Pick<uint32_t>(rng, {256, 1000, 4096, 32000, 50257, 151936 / 4});
  c.layers = Pick<uint32_t>(rng, {1, 2, 3});
  c.bias = c.family == "qwen2" || Pick<int>(rng, {0, 0, 1}) == 1;
  c.tied = Pick<int>(rng, {0, 1}) == 1;
  c.window = (c.family == "mistral" || c.family == "qwen2") && Pick<int>(rng, {0, 1}) == 1;
  c.max_seq = Pick<uint32_t>(rng, {64, 256, 512, 200, 300});
  c.steps = Pick<uint32_t>(rng, {1, 2, 4, 6});
  const uint32_t longest = c.max_seq - c.steps - 1;
  // Lengths at row-tile edges, short, anywhere, and the longest that fits.
  c.prompt = std::min(longest, Pick<uint32_t>(rng, {1, 2, 7, 64, 127, 128, 129, 255, 256, 257, 300, 450,
                                                    std::uniform_int_distribution<uint32_t>(1, longest)(rng), longest}));
  c.steps_per_launch = Pick<uint32_t>(rng, {0, 0, 1, 3});
  c.prefill = Pick<int>(rng, {1, 1, 1, 0}) == 1;
  c.all_logits = c.prefill && Pick<int>(rng, {0, 0, 1}) == 1;
  c.num_sms = Pick<uint32_t>(rng, {132, 132, 132, 8, 37});
  return c;
}

std::string ConfigJson(const Case& c) {
  std::string j = absl::StrCat(R"({"model_type": ")", c.family, R"(", "hidden_size": )", c.hidden,
                               R"(, "num_attention_heads": )", c.heads, R"(, "num_key_value_heads": )", c.kv_heads,
                               R"(, "head_dim": )", c.head_dim, R"(, "intermediate_size": )", c.intermediate,
                               R"(, "vocab_size": )", c.vocab, R"(, "num_hidden_layers": )", c.layers,
                               R"(, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0)",
                               R"(, "tie_word_embeddings": )", c.tied ? "true" : "false");
  if (c.family == "llama") absl::StrAppend(&j, R"(, "attention_bias": )", c.bias ? "true" : "false");
  if (c.family == "qwen3") absl::StrAppend(&j, R"(, "attention_bias": )", c.bias ? "true" : "false");
  // A window shorter than the KV cache is refused (no sliding-window attention); one past it is full attention.
  const char* window = c.max_seq % 128 == 0 ? "48" : "8192";
  if (c.family == "mistral") absl::StrAppend(&j, R"(, "sliding_window": )", c.window ? window : "null");
  if (c.family == "qwen2") {
    absl::StrAppend(&j, R"(, "use_sliding_window": )", c.window ? "true" : "false", R"(, "sliding_window": )", window,
                    R"(, "max_window_layers": 1)");
  }
  return j + "}";
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The largest minus the second-largest logit, relative to the largest magnitude: a near tie may pick either.
double TopGap(const std::vector<float>& l) {
  float a = -INFINITY, b = -INFINITY, scale = 0;
  for (float v : l) {
    if (v > a) b = a, a = v;
    else if (v > b) b = v;
    scale = std::max(scale, std::fabs(v));
  }
  return scale > 0 ? (a - b) / scale : 0;
}

// kTie: agreed up to the pass's token, a near tie both backends pick within their measured difference (each one's
// pick is within the largest logit difference of the other's in both): bf16 GEMM operands against the VM's f32
// cannot order logits closer than that.
enum class Outcome { kAgree, kTie, kRefused, kFailed };

// The pass's first token differs, both picks within the logits' largest difference of each other on both sides.
bool WithinTheirDifference(const std::vector<float>& gpu, const std::vector<float>& vm) {
  if (gpu.size() != vm.size() || gpu.empty()) return false;
  const size_t g = std::max_element(gpu.begin(), gpu.end()) - gpu.begin();
  const size_t v = std::max_element(vm.begin(), vm.end()) - vm.begin();
  float most = 0;
  for (size_t i = 0; i < gpu.size(); ++i) most = std::max(most, std::fabs(gpu[i] - vm[i]));
  return vm[v] - vm[g] <= most && gpu[g] - gpu[v] <= most;
}

// One case: compile (a refusal ends it), then the VM and the GPU over the same schedule and pass.
Outcome RunCase(const Case& c, const std::string& dir, std::string* detail) {
  const std::string path = absl::StrCat(dir, "/shape_fuzz_config.json");
  std::ofstream(path) << ConfigJson(c);
  graph::ModelOptions mo;
  mo.max_seq = static_cast<int>(c.max_seq);
  mo.scheme = absl::GetFlag(FLAGS_scheme);
  const std::string kv = absl::GetFlag(FLAGS_kv_dtype);
  mo.kv_dtype = kv == "bf16" || (kv == "mixed" && c.index % 2 == 1) ? graph::BF16 : graph::F32;
  // W4A16: the largest group of 128, 64 and 32 that divides every projection's columns (the case's shapes are
  // checkpoints'; a group none divides is refused by LoadModel, naming the weight).
  for (uint32_t group : {128u, 64u, 32u}) {
    mo.group_size = static_cast<int>(group);
    if (c.hidden % group == 0 && c.intermediate % group == 0 && c.heads * c.head_dim % group == 0) break;
  }
  absl::StatusOr<graph::Model> model = graph::LoadModel("random:" + path, mo);
  if (!model.ok()) {
    *detail = std::string(model.status().message());
    return Outcome::kRefused;
  }
  scheduler::CompileOptions o;
  o.set_num_sms(c.num_sms);
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model->graph, model->spec, o);
  if (!s.ok()) {
    *detail = std::string(s.status().message());
    return Outcome::kRefused;
  }
  std::vector<int32_t> prompt;
  std::mt19937 rng(c.prompt * 31 + c.vocab);
  for (uint32_t i = 0; i < c.prompt; ++i) prompt.push_back(static_cast<int32_t>(rng() % c.vocab));
  std::optional<scheduler::Schedule> pass;
  if (c.prefill && scheduler::HasPrefillWeights(*s)) {
    scheduler::PrefillOptions po;
    po.all_logits = c.all_logits;
    po.verify = true;
    const uint32_t rows = absl::GetFlag(FLAGS_buckets) && !c.all_logits
                              ? scheduler::PrefillBucketRows(c.prompt, static_cast<uint32_t>(s->max_seq()) - 1)
                              : c.prompt;
    absl::StatusOr<scheduler::Schedule> p = scheduler::LowerPrefill(model->graph, *s, rows, po);
    if (!p.ok()) {  // refused at compile time too (the prompt, not the model): named, before any launch
      *detail = absl::StrCat("prefill: ", p.status().message());
      return Outcome::kRefused;
    }
    pass = *std::move(p);
  }
  const int steps = static_cast<int>(c.steps) + (pass ? 0 : static_cast<int>(c.prompt) - 1);
  if (absl::GetFlag(FLAGS_compile_only)) {
    *detail = "compiled";
    return Outcome::kAgree;
  }

  absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, model->weights);
  absl::StatusOr<std::unique_ptr<runtime::GpuDecoder>> gpu = runtime::GpuDecoder::Create(*s, model->weights);
  if (!vm.ok() || !gpu.ok()) {
    *detail = absl::StrCat("compiled, then not created: ", (vm.ok() ? gpu.status() : vm.status()).message());
    return Outcome::kFailed;
  }
  absl::Status st = (*vm)->Reset(prompt);
  if (st.ok()) st = (*gpu)->Reset(prompt);
  std::vector<float> vm_pass_logits, gpu_pass_logits;
  if (st.ok() && pass) {
    st = (*vm)->Prefill(*pass, c.prompt);
    if (st.ok()) vm_pass_logits = (*vm)->logits();
    absl::StatusOr<float> ms = (*gpu)->Prefill(*pass, false, c.prompt);
    if (!ms.ok()) st = ms.status();
    if (st.ok()) {
      absl::StatusOr<std::vector<float>> l = (*gpu)->logits();
      if (l.ok()) gpu_pass_logits = *l;
      else st = l.status();
    }
  }
  if (st.ok()) st = (*vm)->Run(steps);
  for (int done = 0; st.ok() && done < steps;) {
    const int n = c.steps_per_launch == 0 ? steps - done : std::min<int>(steps - done, c.steps_per_launch);
    absl::StatusOr<float> ms = (*gpu)->Run(n);
    if (!ms.ok()) st = ms.status();
    done += n;
  }
  if (!st.ok()) {
    *detail = absl::StrCat("compiled, then failed at run time: ", st.message());
    return Outcome::kFailed;
  }
  absl::StatusOr<std::vector<int32_t>> tokens = (*gpu)->tokens();
  absl::StatusOr<std::vector<float>> logits = (*gpu)->logits();
  if (!tokens.ok() || !logits.ok()) {
    *detail = absl::StrCat("reading back: ", (tokens.ok() ? logits.status() : tokens.status()).message());
    return Outcome::kFailed;
  }
  const double pass_err = pass ? RelativeError(gpu_pass_logits, vm_pass_logits) : 0;
  const double err = RelativeError(*logits, (*vm)->logits());
  *detail = absl::StrCat("logits error ", pass ? absl::StrCat(pass_err, " (pass), ") : "", err, " (last step)");
  if (*tokens != (*vm)->tokens()) {
    size_t at = 0;
    while (at < tokens->size() && at < (*vm)->tokens().size() && (*tokens)[at] == (*vm)->tokens()[at]) ++at;
    absl::StrAppend(detail, "; tokens differ from position ", at,
                    pass ? absl::StrCat(" (the pass's top-2 gap ", TopGap(vm_pass_logits), ")") : "");
    const bool tie = pass && at == prompt.size() && pass_err <= kTolerance &&
                     WithinTheirDifference(gpu_pass_logits, vm_pass_logits);
    if (tie) absl::StrAppend(detail, ": a near tie within the logits' difference");
    return tie ? Outcome::kTie : Outcome::kFailed;
  }
  if (pass_err > kTolerance || err > kTolerance) return Outcome::kFailed;
  return Outcome::kAgree;
}

int Main() {
  if (const std::string kv = absl::GetFlag(FLAGS_kv_dtype); kv != "f32" && kv != "bf16" && kv != "mixed") {
    std::fprintf(stderr, "shape_fuzz: --kv_dtype '%s': f32, bf16 or mixed\n", kv.c_str());
    return 2;
  }
  std::string why;
  if (!absl::GetFlag(FLAGS_compile_only) && !runtime::GpuAvailable(&why)) {
    std::fprintf(stderr, "shape_fuzz: %s\n", why.c_str());
    return 2;
  }
  const int cases = absl::GetFlag(FLAGS_cases), first = absl::GetFlag(FLAGS_first);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const double budget = absl::GetFlag(FLAGS_seconds);
  std::FILE* report = nullptr;
  if (!absl::GetFlag(FLAGS_report).empty()) report = std::fopen(absl::GetFlag(FLAGS_report).c_str(), "w");
  const auto start = std::chrono::steady_clock::now();
  int ran = 0, agreed = 0, ties = 0, refused = 0, failed = 0;
  for (int i = first; i < first + cases; ++i) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (budget > 0 && elapsed > budget) break;
    const Case c = Generate(seed, i);
    std::string detail;
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = RunCase(c, absl::GetFlag(FLAGS_dir), &detail);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++ran;
    const char* tag = o == Outcome::kAgree  ? "ok     "
                      : o == Outcome::kTie  ? "tie    "
                      : o == Outcome::kRefused ? "refused"
                                               : "FAILED ";
    agreed += o == Outcome::kAgree, ties += o == Outcome::kTie, refused += o == Outcome::kRefused;
    failed += o == Outcome::kFailed;
    const std::string line = absl::StrCat(tag, " case ", i, " (", absl::StrFormat("%.1f", s), " s) ", c.Describe(),
                                          ": ", absl::StrReplaceAll(detail, {{"\n", " "}}));
    if (o != Outcome::kAgree || report == nullptr) std::printf("%s\n", line.c_str());
    if (report != nullptr) std::fprintf(report, "%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (report != nullptr) std::fclose(report);
  std::printf("shape_fuzz seed %llu cases %d..%d: %d %s, %d up to a near tie, %d refused at compile time, %d failed\n",
              static_cast<unsigned long long>(seed), first, first + ran - 1, agreed,
              absl::GetFlag(FLAGS_compile_only) ? "compiled" : "ran on the GPU and agreed with the VM", ties, refused,
              failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::Main();
}
