#include "scheduler/options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "graph/proto_file.h"

namespace loom::scheduler {
namespace {

constexpr uint32_t kDefaultSms = 132;            // H100 SXM
constexpr uint32_t kDefaultPageBytes = 16384;
constexpr uint32_t kDefaultPages = 11;
constexpr uint32_t kDefaultActivationBytes = 47104;  // what 11 pages of 16 KB leave
// 1 measured fastest on the H100 (2: +2%, 4: +2.5% ms/token; docs/history/performance_log.md).
constexpr uint32_t kDefaultActivationSlots = 1;
constexpr uint32_t kDefaultElementwiseChunk = 2048;
constexpr double kDefaultHbmGbps = 3100;
constexpr double kDefaultSmGflops = 256;         // 128 FMA/clk at ~1 GHz effective
constexpr double kDefaultOverheadNs = 300;
constexpr double kDefaultBarrierLatencyNs = 570;  // measured on H100, DESIGN.md section 4
// A 16 KB bulk copy under a decode step's load: 1.5 pages at 23.5 GB/s per SM -> 2 in flight, the best of the
// 1..11 swept on four model shapes (docs/history/performance_log.md).
constexpr double kDefaultHbmLatencyNs = 1000;
constexpr uint32_t kDefaultContext = 1024;
// A decode attention split of up to 16 positions costs about what one of 4 does (latency: its rows arrive in one
// round trip), while the fused reduce pays a round trip per 16 splits it merges (8 with four elements a thread).
// Measured on the H100 at context 128 (docs/history/performance_log.md): TinyLlama's 32 splits of 8 heads
// 0.969 -> 0.929 ms/token with 16 (32: 0.930), Llama-3.2-1B and 3B within noise with 16 (3B +12% with 85: its
// rows no longer fit the slot).
constexpr uint32_t kDefaultAttentionMinSplitPositions = 16;

}  // namespace

FusionOptions AllFusionsOff() {
  FusionOptions f;
  f.set_norm_into_matvec(false);
  f.set_qkv_rope_kv_append(false);
  f.set_residual_add(false);
  f.set_silu_mul(false);
  f.set_lm_head_argmax(false);
  f.set_next_embedding(false);
  return f;
}

CompileOptions ResolveOptions(const CompileOptions& in) {
  CompileOptions o = in;
  if (o.num_sms() == 0) o.set_num_sms(kDefaultSms);
  if (o.policy() == POLICY_UNSPECIFIED) o.set_policy(CRITICAL_PATH);
  if (o.barrier_granularity() == GRANULARITY_UNSPECIFIED) o.set_barrier_granularity(PER_CHUNK);
  FusionOptions* f = o.mutable_fusion();
  if (!f->has_norm_into_matvec()) f->set_norm_into_matvec(true);
  if (!f->has_qkv_rope_kv_append()) f->set_qkv_rope_kv_append(true);
  if (!f->has_residual_add()) f->set_residual_add(true);
  if (!f->has_silu_mul()) f->set_silu_mul(true);
  if (!f->has_lm_head_argmax()) f->set_lm_head_argmax(true);
  if (!f->has_next_embedding()) f->set_next_embedding(true);
  if (!o.has_data_waits()) o.set_data_waits(true);
  // Observed in the data, the reduce finds the splits' partials a round trip after they land; polled, its barrier
  // hop cost more than the fused reduce's arrival counter (docs/history/performance_log.md).
  if (!o.has_separate_attention_reduce()) o.set_separate_attention_reduce(o.data_waits());
  if (o.matvec_tiles_per_sm() == 0) o.set_matvec_tiles_per_sm(1);
  if (o.elementwise_chunk() == 0) o.set_elementwise_chunk(kDefaultElementwiseChunk);
  if (o.attention_min_split_positions() == 0) o.set_attention_min_split_positions(kDefaultAttentionMinSplitPositions);
  SmemConfig* s = o.mutable_smem();
  if (s->page_bytes() == 0) s->set_page_bytes(kDefaultPageBytes);
  if (s->num_pages() == 0) s->set_num_pages(kDefaultPages);
  if (s->activation_bytes() == 0) s->set_activation_bytes(kDefaultActivationBytes);
  if (s->activation_slots() == 0) s->set_activation_slots(kDefaultActivationSlots);
  CostModel* c = o.mutable_cost();
  if (c->hbm_gbps() <= 0) c->set_hbm_gbps(kDefaultHbmGbps);
  if (c->sm_gbps() <= 0) c->set_sm_gbps(c->hbm_gbps() / o.num_sms());
  if (c->sm_gflops() <= 0) c->set_sm_gflops(kDefaultSmGflops);
  // ~475 TFLOP/s measured for the GEMM opcode on 132 SMs (docs/history/performance_log.md).
  if (c->sm_tensor_gflops() <= 0) c->set_sm_tensor_gflops(3600);
  if (c->instruction_overhead_ns() <= 0) c->set_instruction_overhead_ns(kDefaultOverheadNs);
  if (c->barrier_latency_ns() <= 0) c->set_barrier_latency_ns(kDefaultBarrierLatencyNs);
  if (c->context_length() == 0) c->set_context_length(kDefaultContext);
  if (c->hbm_latency_ns() <= 0) c->set_hbm_latency_ns(kDefaultHbmLatencyNs);
  if (s->matvec_pages_in_flight() == 0) {  // latency x bandwidth: the pages that keep an SM's share streaming
    const double bytes = c->hbm_latency_ns() * c->sm_gbps();  // ns x GB/s = bytes
    const double pages = std::ceil(bytes / std::max<uint32_t>(s->page_bytes(), 1));
    s->set_matvec_pages_in_flight(static_cast<uint32_t>(std::clamp(pages, 1.0, static_cast<double>(s->num_pages()))));
  }
  return o;
}

void FitActivationRing(uint64_t needed, const CompileOptions& requested, CompileOptions* resolved) {
  SmemConfig* s = resolved->mutable_smem();
  if (needed <= s->activation_bytes() || requested.smem().activation_bytes() != 0 ||
      requested.smem().num_pages() != 0) {
    return;
  }
  constexpr uint64_t kGranule = 1024;
  s->set_activation_bytes(static_cast<uint32_t>((needed + kGranule - 1) / kGranule * kGranule));
  while (s->num_pages() > 2 && SmemTotalBytes(*s) > kMaxSmemBytes) s->set_num_pages(s->num_pages() - 1);
  s->set_matvec_pages_in_flight(std::min(s->matvec_pages_in_flight(), s->num_pages()));
}

absl::Status ValidateOptions(const CompileOptions& o) {
  auto bad = [](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("options: ", why)); };
  if (o.num_sms() > 4096) return bad(absl::StrCat("num_sms ", o.num_sms(), " is more than any GPU has"));
  if (o.smem().page_bytes() % 256 != 0 || o.smem().page_bytes() < 1024) {
    return bad("smem.page_bytes must be a multiple of 256, at least 1024");
  }
  if (o.smem().activation_bytes() % 16 != 0) return bad("smem.activation_bytes must be a multiple of 16");
  if (o.smem().activation_slots() > kMaxActivationSlots) {
    return bad(absl::StrCat("smem.activation_slots must be 1..", kMaxActivationSlots));
  }
  const uint64_t total = SmemTotalBytes(o.smem());
  if (total > kMaxSmemBytes) {
    return bad(absl::StrCat("pages (", o.smem().num_pages(), " x ", o.smem().page_bytes(), ") + activation ring (",
                            o.smem().activation_bytes(), ") need ", total, " bytes of shared memory; an SM has ",
                            kMaxSmemBytes));
  }
  if (o.smem().num_pages() < 2) return bad("smem.num_pages must be at least 2");
  if (o.smem().matvec_pages_in_flight() > o.smem().num_pages()) {
    return bad(absl::StrCat("smem.matvec_pages_in_flight ", o.smem().matvec_pages_in_flight(), " is more than the ",
                            o.smem().num_pages(), " pages of the ring"));
  }
  if (o.matvec_tiles_per_sm() > 64) return bad("matvec_tiles_per_sm above 64 makes no sense");
  if (o.attention_reduce_heads() > 256) return bad("attention_reduce_heads above 256 makes no sense");
  if (o.max_seq() > (1u << 20)) return bad("max_seq above 2^20");
  return absl::OkStatus();
}

absl::StatusOr<CompileOptions> LoadOptions(const std::string& path) {
  CompileOptions options;
  if (absl::Status s = ReadProtoFile(path, &options); !s.ok()) return s;
  if (absl::Status s = ValidateOptions(ResolveOptions(options)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return options;
}

absl::StatusOr<CompileOptions> OptionsFromSettings(const OptionSettings& in, absl::string_view prefix) {
  auto bad = [&](absl::string_view name, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, name, why));
  };
  CompileOptions o;
  if (!in.options_file.empty()) {
    absl::StatusOr<CompileOptions> loaded = LoadOptions(in.options_file);
    if (!loaded.ok()) return loaded.status();
    o = *std::move(loaded);
  }
  if (in.num_sms < 0 || in.num_sms > 4096) return bad("num_sms", absl::StrCat(" must be in [0, 4096], not ", in.num_sms));
  if (in.num_sms > 0) o.set_num_sms(static_cast<uint32_t>(in.num_sms));
  if (in.max_seq < 0 || in.max_seq > (int64_t{1} << 20)) {
    return bad("max_seq", absl::StrCat(" must be in [0, 2^20], not ", in.max_seq));
  }
  if (in.max_seq > 0) o.set_max_seq(static_cast<uint32_t>(in.max_seq));
  if (in.policy == "round-robin") o.set_policy(ROUND_ROBIN);
  else if (in.policy == "lpt") o.set_policy(LPT);
  else if (in.policy == "critical-path") o.set_policy(CRITICAL_PATH);
  else if (!in.policy.empty()) {
    return bad("policy", absl::StrCat(": unknown policy '", in.policy, "' (round-robin, lpt or critical-path)"));
  }
  if (in.granularity == "op") o.set_barrier_granularity(PER_OP);
  else if (in.granularity == "chunk") o.set_barrier_granularity(PER_CHUNK);
  else if (!in.granularity.empty()) {
    return bad("granularity", absl::StrCat(": unknown granularity '", in.granularity, "' (op or chunk)"));
  }
  for (const std::string& f : in.unfuse) {
    FusionOptions* fusion = o.mutable_fusion();
    if (f == "norm") fusion->set_norm_into_matvec(false);
    else if (f == "qkv") fusion->set_qkv_rope_kv_append(false);
    else if (f == "residual") fusion->set_residual_add(false);
    else if (f == "silu") fusion->set_silu_mul(false);
    else if (f == "argmax") fusion->set_lm_head_argmax(false);
    else if (f == "embed") fusion->set_next_embedding(false);
    else {
      return bad("unfuse",
                 absl::StrCat(": unknown fusion '", f, "' (norm, qkv, residual, silu, argmax or embed)"));
    }
  }
  if (in.prefill.has_value()) o.set_prefill(*in.prefill);
  if (absl::Status s = ValidateOptions(ResolveOptions(o)); !s.ok()) return s;
  return o;
}

}  // namespace loom::scheduler
