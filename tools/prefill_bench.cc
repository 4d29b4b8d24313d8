// prefill_bench: time to first token with the one-pass prefill, and a long prompt + generation end to end,
// against Loom's own token-by-token prefill, on one GPU in one process (weights resident, as a server keeps them).
//   1. TTFT per prompt length P (--prompts): wall clock from the prompt's token ids to the first new token on
//      the host: loading the prompt, uploading the pass, the kernel, reading the token back; the pass for P rows
//      lowered beforehand (its lowering time is printed beside: add it for a length seen the first time). Median
//      of --repeats after a warm-up, fresh random prompts; the kernel's own time (CUDA events) beside it.
//      --buckets / --chunk_rows=N: the same prompt in its bucket's pass and in chunks, a line each.
//   2. --e2e_prompt tokens then --e2e_tokens generated: prefill pass + decode in one launch, against the prompt
//      consumed by decode steps (one launch for prompt and generation). Wall clock, median of --repeats.
//   3. --session: TTFT as a runtime::Session's caller feels it (Session::ttft_ms, its default StartOptions: buckets,
//      chunks), each length's first Start ("cold": its pass lowered ahead with --lower_ahead, else lowered then, and
//      uploaded then) and the median of --repeats later ones ("warm").
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "graph/model.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/session.h"
#include "runtime/trace.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"

ABSL_FLAG(std::string, model, "random:llama-3.2-1b", "model: random:<preset> or a Hugging Face folder");
ABSL_FLAG(std::string, prompts, "128,512,2048", "comma-separated prompt lengths for time to first token");
ABSL_FLAG(int32_t, repeats, 5, "timed runs per measurement (median reported)");
ABSL_FLAG(int32_t, max_seq, 4096, "KV-cache capacity");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "decoders' KV cache: f32, or bf16 (half its memory and of what decode attention reads; K and V rounded to "
          "bf16 as they are appended)");
ABSL_FLAG(std::string, scheme, "", "random models: FP8 generates the projections as FP8 (decode reads them so; the pass "
          "widened to bf16)");
ABSL_FLAG(int32_t, e2e_prompt, 1024, "end to end: prompt tokens (0: skip)");
ABSL_FLAG(int32_t, e2e_tokens, 128, "end to end: tokens generated");
ABSL_FLAG(std::string, row_tile_barriers, "auto",
          "on: one barrier per 128-row tile and stage; off: one per stage; auto: on for up to 8 row tiles");
ABSL_FLAG(int32_t, fold_rows, 0,
          "prompt rows per PACK_ROWS that adds a split projection's parts (PrefillOptions.fold_rows; 0: auto)");
ABSL_FLAG(bool, slice_folds, true,
          "spread a fold over the SMs by column slices, its norm deferred to the next GEMM (PrefillOptions.slice_folds)");
ABSL_FLAG(int32_t, max_splits, 0,
          "most ways a residual projection is split over K (PrefillOptions.max_splits; 0: auto)");
ABSL_FLAG(int32_t, page_kb, 0,
          "ring page size of the pass in KB: 48 (128 x 256 GEMM tiles), 32, 16, or 0 (auto: 48 from 1024 rows where 3 "
          "pages fit, else 32 where 4 fit, else 16)");
ABSL_FLAG(std::string, trace, "", "write a Chrome trace of the last prompt length's pass here, and print its summary");
ABSL_FLAG(bool, buckets, false,
          "also time each prompt in its bucket's pass (scheduler::PrefillBucketRows: up to its 128-row tile), as "
          "loom run --prefill_buckets runs it");
ABSL_FLAG(bool, session, true, "also time each prompt length through a runtime::Session, cold and warm");
ABSL_FLAG(bool, lower_ahead, true, "--session: Session::LowerAhead before the first prompt (timed)");
ABSL_FLAG(int32_t, chunk_rows, 0,
          "also time each prompt longer than this in passes of this many rows (loom run --prefill_chunk; 0: no)");

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;
// As `loom run` lowers a pass (the tests verify passes of every shape they run).
scheduler::PrefillOptions NoVerify() {
  scheduler::PrefillOptions o;
  o.verify = false;
  const std::string t = absl::GetFlag(FLAGS_row_tile_barriers);
  using R = scheduler::PrefillOptions::RowTileBarriers;
  o.row_tile_barriers = t == "on" ? R::kOn : t == "off" ? R::kOff : R::kAuto;
  o.page_bytes = static_cast<uint32_t>(absl::GetFlag(FLAGS_page_kb)) * 1024;
  o.fold_rows = static_cast<uint32_t>(absl::GetFlag(FLAGS_fold_rows));
  o.max_splits = static_cast<uint32_t>(absl::GetFlag(FLAGS_max_splits));
  o.slice_folds = absl::GetFlag(FLAGS_slice_folds);
  return o;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "prefill_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Section 3: each --prompts length's first Start on a Session and the median of `repeats` more.
int SessionTtft(const graph::Model& model, const scheduler::Schedule& s, int repeats,
                const std::function<std::vector<int32_t>(int)>& random_prompt) {
  absl::StatusOr<std::unique_ptr<runtime::Session>> session =
      runtime::Session::Create(model.graph, s, model.weights, runtime::Backend::kGpu);
  if (!session.ok()) return Fail(session.status());
  runtime::Session& run = **session;
  const runtime::StartOptions start;  // the defaults: buckets, chunks
  std::printf("\nend to end through a Session (buckets, chunks of %u rows", start.chunk_rows);
  if (absl::GetFlag(FLAGS_lower_ahead)) {
    const auto t0 = Clock::now();
    if (absl::Status st = run.LowerAhead(start); !st.ok()) return Fail(st);
    const int passes = run.WaitLoweredAhead();
    std::printf("; %d passes lowered ahead in %.1f ms", passes, Ms(t0, Clock::now()));
  }
  std::printf("):\n%8s %14s %14s %14s %14s %12s\n", "prompt", "cold TTFT ms", "(lowering ms)", "(upload ms)",
              "warm TTFT ms", "kernel ms");
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_prompts), ',', absl::SkipEmpty())) {
    int p = 0;
    if (!absl::SimpleAtoi(text, &p)) return Fail(absl::InvalidArgumentError("--prompts"));
    std::vector<double> warm, kernel;
    double cold = 0, lower = 0, upload = 0;
    for (int r = 0; r < repeats + 1; ++r) {
      if (absl::Status st = run.Start(random_prompt(p)); !st.ok()) return Fail(st);
      if (r == 0) {
        cold = run.ttft_ms(), lower = run.pass_lower_ms(), upload = run.pass_upload_ms();
        continue;
      }
      warm.push_back(run.ttft_ms());
      kernel.push_back(run.prompt_ms());
    }
    std::printf("%8d %14.3f %14.3f %14.3f %14.3f %12.3f%s\n", p, cold, lower, upload, Median(warm), Median(kernel),
                run.used_prefill() ? "" : " (token by token)");
  }
  return 0;
}

int Main() {
  if (const std::string t = absl::GetFlag(FLAGS_row_tile_barriers); t != "on" && t != "off" && t != "auto") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--row_tile_barriers: '", t, "' is not on, off or auto")));
  }
  if (absl::GetFlag(FLAGS_repeats) < 1) return Fail(absl::InvalidArgumentError("--repeats must be at least 1"));
  if (absl::GetFlag(FLAGS_e2e_prompt) > 0 && absl::GetFlag(FLAGS_e2e_tokens) < 1) {
    return Fail(absl::InvalidArgumentError("--e2e_tokens must be at least 1 (or --e2e_prompt=0 to skip)"));
  }
  std::string why;
  if (!runtime::GpuAvailable(&why)) return Fail(absl::UnavailableError(why));
  graph::ModelOptions mo;
  mo.max_seq = absl::GetFlag(FLAGS_max_seq);
  mo.scheme = absl::GetFlag(FLAGS_scheme);
  {
    absl::StatusOr<graph::DType> kv = graph::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
    if (!kv.ok()) return Fail(kv.status());
    mo.kv_dtype = *kv;
  }
  std::fprintf(stderr, "loading %s...\n", absl::GetFlag(FLAGS_model).c_str());
  absl::StatusOr<graph::Model> model = graph::LoadModel(absl::GetFlag(FLAGS_model), mo);
  if (!model.ok()) return Fail(model.status());
  scheduler::CompileOptions options;
  options.set_max_seq(absl::GetFlag(FLAGS_max_seq));
  absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model->graph, absl::GetFlag(FLAGS_model), options);
  if (!s.ok()) return Fail(s.status());
  if (!scheduler::HasPrefillWeights(*s)) return Fail(scheduler::PrefillSupported(model->graph));
  absl::StatusOr<std::unique_ptr<runtime::GpuDecoder>> decoder = runtime::GpuDecoder::Create(*s, model->weights);
  if (!decoder.ok()) return Fail(decoder.status());
  runtime::GpuDecoder& d = **decoder;
  std::mt19937 rng(11);
  auto random_prompt = [&](int n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % s->vocab_size());
    return p;
  };
  const int repeats = absl::GetFlag(FLAGS_repeats);
  int last_pass = 1;

  std::printf("model %s, %u SMs\n\ntime to first token (weights resident):\n", absl::GetFlag(FLAGS_model).c_str(),
              s->num_sms());
  std::printf("%8s %12s %12s %12s %14s %16s\n", "prompt", "TTFT ms", "kernel ms", "+lower ms", "instructions",
              "TFLOP/s");
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_prompts), ',', absl::SkipEmpty())) {
    int p;
    if (!absl::SimpleAtoi(text, &p) || p < 1 || p >= absl::GetFlag(FLAGS_max_seq)) {
      return Fail(absl::InvalidArgumentError("--prompts: each length must be in [1, max_seq)"));
    }
    // A form of the prompt: passes (each lowered once, timed on its own, as a server keeps them) run one after
    // another for their rows: the pass of P rows; with --buckets, its bucket's; with --chunk_rows, chunks.
    struct Form {
      std::string name;
      std::vector<std::pair<uint32_t, uint32_t>> runs;  // (rows lowered, rows run)
    };
    std::vector<Form> forms = {{"", {{static_cast<uint32_t>(p), static_cast<uint32_t>(p)}}}};
    const uint32_t room = static_cast<uint32_t>(absl::GetFlag(FLAGS_max_seq)) - 1;
    if (absl::GetFlag(FLAGS_buckets)) {
      const uint32_t b = scheduler::PrefillBucketRows(p, room);
      if (b != static_cast<uint32_t>(p)) forms.push_back({absl::StrCat(" (in ", b, ")"), {{b, static_cast<uint32_t>(p)}}});
    }
    if (const uint32_t chunk = static_cast<uint32_t>(absl::GetFlag(FLAGS_chunk_rows));
        chunk > 0 && chunk < static_cast<uint32_t>(p)) {
      Form f{absl::StrCat(" (chunks of ", chunk, ")"), {}};
      for (uint32_t begin = 0; begin < static_cast<uint32_t>(p); begin += chunk) {
        const uint32_t rows = std::min<uint32_t>(chunk, p - begin);
        f.runs.push_back({absl::GetFlag(FLAGS_buckets) ? scheduler::PrefillBucketRows(rows, room - begin) : rows, rows});
      }
      forms.push_back(f);
    }
    for (const Form& form : forms) {
      std::map<uint32_t, scheduler::Schedule> passes;  // by rows lowered
      std::vector<double> ttft, kernel, lower;
      int instructions = 0;
      for (const auto& [lowered_rows, rows] : form.runs) {
        if (passes.count(lowered_rows)) continue;
        std::vector<double> times;
        for (int r = 0; r < repeats + 1; ++r) {
          const auto t0 = Clock::now();
          absl::StatusOr<scheduler::Schedule> lowered =
              scheduler::LowerPrefill(model->graph, *s, lowered_rows, NoVerify());
          if (!lowered.ok()) return Fail(lowered.status());
          if (r > 0) times.push_back(Ms(t0, Clock::now()));
          passes[lowered_rows] = *std::move(lowered);
        }
        lower.push_back(Median(times));
        for (const scheduler::SmQueue& q : passes[lowered_rows].queues()) instructions += q.instructions_size();
      }
      for (int r = 0; r < repeats + 1; ++r) {  // the first is a warm-up
        const std::vector<int32_t> prompt = random_prompt(p);
        const auto t1 = Clock::now();
        if (absl::Status st = d.Reset(prompt); !st.ok()) return Fail(st);
        double ms_sum = 0;
        for (const auto& [lowered_rows, rows] : form.runs) {
          absl::StatusOr<float> ms = d.Prefill(passes[lowered_rows], false, rows);
          if (!ms.ok()) return Fail(ms.status());
          ms_sum += *ms;
        }
        absl::StatusOr<std::vector<int32_t>> tokens = d.tokens();
        if (!tokens.ok()) return Fail(tokens.status());
        const auto t2 = Clock::now();
        if (static_cast<int>(tokens->size()) != p + 1) return Fail(absl::InternalError("no first token"));
        if (r == 0) continue;
        ttft.push_back(Ms(t1, t2));
        kernel.push_back(ms_sum);
      }
      double lower_ms = 0;
      for (double l : lower) lower_ms += l;
      // 2 flops per parameter per row (embeddings aside) + causal attention: 2 * 2 * P^2 / 2 * hd * heads per layer.
      const graph::DecoderConfig& c = model->config;
      const double linear = 2.0 * (c.Parameters() - double(c.vocab_size) * c.hidden_size) * p;
      const double attention = 2.0 * double(p) * p * c.head_dim * c.num_heads * c.num_layers;
      std::printf("%8d %12.3f %12.3f %12.3f %14d %16.1f%s\n", p, Median(ttft), Median(kernel), lower_ms, instructions,
                  (linear + attention) / (Median(kernel) * 1e-3) / 1e12, form.name.c_str());
    }
    last_pass = p;
  }
  if (!absl::GetFlag(FLAGS_trace).empty()) {
    absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(model->graph, *s, last_pass, NoVerify());
    if (!pass.ok()) return Fail(pass.status());
    if (absl::Status st = d.Reset(random_prompt(last_pass)); !st.ok()) return Fail(st);
    if (absl::StatusOr<float> ms = d.Prefill(*pass, true); !ms.ok()) return Fail(ms.status());
    absl::StatusOr<runtime::GpuProgram> program = runtime::ProgramFromSchedule(*pass);
    if (!program.ok()) return Fail(program.status());
    const std::vector<std::vector<std::string>> ops = runtime::OpNames(*pass);
    runtime::TraceInput in{&*program, &d.machine().queue_begin_other(), &d.machine().trace(), 1, 0, &ops};
    if (absl::Status st = runtime::WriteChromeTrace(absl::GetFlag(FLAGS_trace), in); !st.ok()) return Fail(st);
    std::printf("\nprefill of %d tokens, traced:\n%s", last_pass, runtime::TraceSummary(in).c_str());
    // Per stage (graph op, layers folded together): instructions, SM time busy and waiting, and the stage's span
    // (first start to last end, summed over layers): what each stage adds to the pass.
    struct Stage {
      int count = 0;
      double busy = 0, wait = 0, span = 0;
      std::map<std::string, std::pair<uint64_t, uint64_t>> per_layer;  // first start, last end
    };
    std::map<std::string, Stage> stages;
    const std::vector<megakernel::TraceEvent>& ev = d.machine().trace();
    const std::vector<uint32_t>& begin = d.machine().queue_begin_other();
    for (int sm = 0; sm < pass->queues_size(); ++sm) {
      for (int i = 0; i < pass->queues(sm).instructions_size(); ++i) {
        const std::string& op = pass->queues(sm).instructions(i).op();
        const size_t dot = op.rfind('.');
        const std::string name = dot == std::string::npos ? op : op.substr(dot + 1);
        const megakernel::TraceEvent& e = ev[begin[sm] + i];
        Stage& st = stages[name];
        ++st.count;
        st.busy += static_cast<double>(e.end - e.ready);
        st.wait += static_cast<double>(e.ready - e.start);
        auto [it, fresh] = st.per_layer.try_emplace(op, e.start, e.end);
        if (!fresh) it->second = {std::min(it->second.first, e.start), std::max(it->second.second, e.end)};
      }
    }
    std::printf("\n  %-12s %8s %14s %14s %14s\n", "stage", "count", "busy SM-us", "waiting SM-us", "span us");
    for (auto& [name, st] : stages) {
      for (const auto& [op, range] : st.per_layer) st.span += static_cast<double>(range.second - range.first);
      std::printf("  %-12s %8d %14.0f %14.0f %14.1f\n", name.c_str(), st.count, st.busy / 1e3, st.wait / 1e3,
                  st.span / 1e3);
    }
  }

  const int e2e_prompt = absl::GetFlag(FLAGS_e2e_prompt), e2e_tokens = absl::GetFlag(FLAGS_e2e_tokens);
  if (e2e_prompt > 0) {
    if (e2e_prompt + e2e_tokens >= absl::GetFlag(FLAGS_max_seq)) {
      return Fail(absl::OutOfRangeError("--e2e_prompt + --e2e_tokens exceed --max_seq"));
    }
    std::vector<double> with_prefill, token_by_token;
    std::vector<int32_t> first, second;
    for (int r = 0; r < repeats + 1; ++r) {
      const std::vector<int32_t> prompt = random_prompt(e2e_prompt);
      auto t0 = Clock::now();
      absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(model->graph, *s, e2e_prompt, NoVerify());
      if (!pass.ok()) return Fail(pass.status());
      if (absl::Status st = d.Reset(prompt); !st.ok()) return Fail(st);
      if (absl::StatusOr<float> ms = d.Prefill(*pass); !ms.ok()) return Fail(ms.status());
      if (absl::StatusOr<float> ms = d.Run(e2e_tokens - 1); !ms.ok()) return Fail(ms.status());
      absl::StatusOr<std::vector<int32_t>> a = d.tokens();
      if (!a.ok()) return Fail(a.status());
      auto t1 = Clock::now();
      if (absl::Status st = d.Reset(prompt); !st.ok()) return Fail(st);
      if (absl::StatusOr<float> ms = d.Run(e2e_prompt - 1 + e2e_tokens); !ms.ok()) return Fail(ms.status());
      absl::StatusOr<std::vector<int32_t>> b = d.tokens();
      if (!b.ok()) return Fail(b.status());
      auto t2 = Clock::now();
      if (r == 0) continue;
      with_prefill.push_back(Ms(t0, t1));
      token_by_token.push_back(Ms(t1, t2));
      first = *a, second = *b;
    }
    int same = 0;
    for (int i = e2e_prompt; i < e2e_prompt + e2e_tokens; ++i) same += first[i] == second[i];
    std::printf("\n%d-token prompt + %d generated tokens, end to end (wall clock, median of %d):\n", e2e_prompt,
                e2e_tokens, repeats);
    std::printf("  prefill pass + decode:        %10.2f ms\n", Median(with_prefill));
    std::printf("  token-by-token prefill:       %10.2f ms  (%.1fx)\n", Median(token_by_token),
                Median(token_by_token) / Median(with_prefill));
    std::printf("  generated tokens identical in both (last run): %d/%d\n", same, e2e_tokens);
  }
  if (absl::GetFlag(FLAGS_session)) {
    decoder->reset();  // (the Session uploads the weights again)
    return SessionTtft(*model, *s, repeats, random_prompt);
  }
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::Main();
}
