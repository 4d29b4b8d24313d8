// Two forms of the KV cache and the prefill pass on the CPU reference VM: the cache in bf16 (ModelOptions::kv_dtype)
// against the oracle over the same bf16 caches, and a bucket's pass (scheduler::PrefillBucketRows) run for fewer of
// its rows against the prompt's own pass and the oracle.
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/decode_oracle.h"
#include "graph/model.h"
#include "gtest/gtest.h"
#include "runtime/reference_vm.h"
#include "scheduler/compiler.h"
#include "scheduler/options.h"
#include "scheduler/prefill.h"
#include "tests/relative_error.h"

namespace loom {
namespace {

constexpr int kNewTokens = 32;

// 70 tokens: a prefill pass of two 64-key tiles.
const std::vector<int32_t>& VmOracleKvPrompt() {
  static const std::vector<int32_t> prompt = [] {
    std::vector<int32_t> p;
    for (int i = 0; i < 70; ++i) p.push_back((i * 7919 + 3) % 1000);
    return p;
  }();
  return prompt;
}

// A bf16 KV cache (ModelOptions::kv_dtype): K and V rounded to bf16 as the fused QKV matvec's epilogue, ROPE_KV_APPEND
// (every fusion off) and the prefill pass's QKV GEMM append them, and read widened by ATTN_PARTIAL and FLASH_ATTN;
// against the oracle over the same bf16 caches (1e-4, identical tokens), the prompt by decode steps and by a prefill
// pass of 70 rows (two key tiles). The caches take half the arena, and the rounding shows in the logits (the oracle
// with f32 caches differs).
TEST(VmOracleKv, Bf16KvCacheDecodeAndPrefillMatchTheOracle) {
  // A K or V value whose f32 sum differs from the oracle's in its last bits may round to the neighbouring bf16 (2^-8
  // relative on that value): measured 2.6e-5 (tiny-qwen3), 1.5e-6 (tiny).
  constexpr double kBf16KvLogitTolerance = 1e-4;
  for (const char* spec : {"random:tiny", "random:tiny-qwen3"}) {
    SCOPED_TRACE(spec);
    graph::ModelOptions mo;
    mo.max_seq = 128;
    mo.kv_dtype = graph::BF16;
    absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    int bf16_caches = 0;
    for (const graph::TensorDef* t : m->graph.TensorsOfKind(graph::STATE)) bf16_caches += t->dtype() == graph::BF16;
    EXPECT_EQ(bf16_caches, 2 * m->config.num_layers);
    absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, VmOracleKvPrompt(), kNewTokens);
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    mo.kv_dtype = graph::F32;
    absl::StatusOr<graph::Model> f32 = graph::LoadModel(spec, mo);
    ASSERT_TRUE(f32.ok()) << f32.status();
    absl::StatusOr<graph::OracleDecode> f32_oracle = graph::DecodeWithOracle(*f32, VmOracleKvPrompt(), 1);
    ASSERT_TRUE(f32_oracle.ok()) << f32_oracle.status();
    EXPECT_GT(RelativeError(f32_oracle->logits.back(), oracle->logits[f32_oracle->logits.size() - 1]), 1e-6);

    for (bool fused : {true, false}) {
      scheduler::CompileOptions o;
      o.set_num_sms(6);
      if (!fused) *o.mutable_fusion() = scheduler::AllFusionsOff();
      absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, o);
      ASSERT_TRUE(s.ok()) << s.status();
      for (const scheduler::Tensor& t : s->tensors()) {
        if (!absl::EndsWith(t.name(), "_cache")) continue;
        EXPECT_EQ(t.dtype(), graph::BF16) << t.name();
        EXPECT_EQ(t.bytes(), 2ull * m->config.num_kv_heads * mo.max_seq * m->config.head_dim) << t.name();
      }
      absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, m->weights);
      ASSERT_TRUE(vm.ok()) << vm.status();
      ASSERT_TRUE((*vm)->Reset(VmOracleKvPrompt()).ok());
      const int steps = static_cast<int>(VmOracleKvPrompt().size()) - 1 + kNewTokens;
      for (int step = 0; step < steps; ++step) {
        ASSERT_TRUE((*vm)->Run(1).ok());
        ASSERT_LE(RelativeError((*vm)->logits(), oracle->logits[step]), kBf16KvLogitTolerance)
            << (fused ? "fused" : "unfused") << " step " << step;
      }
      EXPECT_EQ((*vm)->tokens(), oracle->tokens) << (fused ? "fused" : "unfused");
      if (!fused) continue;
      absl::StatusOr<scheduler::Schedule> pass =
          scheduler::LowerPrefill(m->graph, *s, static_cast<int>(VmOracleKvPrompt().size()));
      ASSERT_TRUE(pass.ok()) << pass.status();
      absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> prefilled = runtime::ReferenceVm::Create(*s, m->weights);
      ASSERT_TRUE(prefilled.ok()) << prefilled.status();
      ASSERT_TRUE((*prefilled)->Reset(VmOracleKvPrompt()).ok());
      ASSERT_TRUE((*prefilled)->Prefill(*pass).ok());
      ASSERT_TRUE((*prefilled)->Run(kNewTokens - 1).ok());
      EXPECT_EQ((*prefilled)->tokens(), oracle->tokens) << "after a prefill pass";
    }
  }
}

// A bucket's pass (scheduler::PrefillBucketRows: 16, 32, 64, 128, then every 128 rows) run for a prompt of fewer rows: the
// KV rows and logits of the pass of the prompt's own length within the prefill tolerance (a pass plans its K splits
// for its rows: the sums' order, and so their bf16 operands, may differ), and the oracle's tokens after it. The
// padding rows are never read. Rows that do not end in the pass's last tile, and every row's logits, are refused.
TEST(VmPrefill, ABucketsPassRunsEveryLengthOfItsLastTile) {
  constexpr double kPrefillLogitTolerance = 2e-2;  // as PrefillThenDecodeMatchesTheOracle's
  for (const char* spec : {"random:tiny", "random:tiny-qwen3"}) {
    graph::ModelOptions mo;
    mo.max_seq = 300;
    absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    scheduler::CompileOptions o;
    o.set_num_sms(8);
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(m->graph, m->spec, o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(scheduler::PrefillInBuckets(m->graph));
    for (const auto& [rows, want] : std::vector<std::pair<uint32_t, uint32_t>>{
             {2, 16}, {20, 32}, {70, 128}, {128, 128}, {129, 256}, {200, 256}}) {
      const uint32_t bucket = scheduler::PrefillBucketRows(rows, s->max_seq() - 1);
      EXPECT_EQ(bucket, want) << rows;
      const std::string what = absl::StrCat(spec, ": ", rows, " rows in the pass of ", bucket);
      std::vector<int32_t> prompt;
      for (uint32_t i = 0; i < rows; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 3) % 1000));
      absl::StatusOr<graph::OracleDecode> oracle = graph::DecodeWithOracle(*m, prompt, 8);
      ASSERT_TRUE(oracle.ok()) << oracle.status();
      absl::StatusOr<scheduler::Schedule> exact = scheduler::LowerPrefill(m->graph, *s, rows);
      absl::StatusOr<scheduler::Schedule> padded = scheduler::LowerPrefill(m->graph, *s, bucket);
      ASSERT_TRUE(exact.ok() && padded.ok()) << what;
      std::vector<std::unique_ptr<runtime::ReferenceVm>> vms;
      for (const scheduler::Schedule* pass : {&*exact, &*padded}) {
        absl::StatusOr<std::unique_ptr<runtime::ReferenceVm>> vm = runtime::ReferenceVm::Create(*s, m->weights);
        ASSERT_TRUE(vm.ok()) << vm.status();
        ASSERT_TRUE((*vm)->Reset(prompt).ok());
        ASSERT_TRUE((*vm)->Prefill(*pass, rows).ok()) << what;
        EXPECT_EQ((*vm)->position(), static_cast<int32_t>(rows)) << what;
        vms.push_back(*std::move(vm));
      }
      EXPECT_LE(RelativeError(vms[1]->logits(), vms[0]->logits()), kPrefillLogitTolerance) << what << ": logits";
      EXPECT_LE(RelativeError(vms[1]->logits(), oracle->logits[rows - 1]), kPrefillLogitTolerance) << what;
      for (const scheduler::Tensor& t : s->tensors()) {
        if (!absl::EndsWith(t.name(), "_cache")) continue;  // positions [0, rows) of each KV head (padding after)
        const uint64_t head_bytes = t.bytes() / t.shape(0), position_bytes = head_bytes / s->max_seq();
        for (int64_t h = 0; h < t.shape(0); ++h) {
          std::vector<float> got(rows * position_bytes / 4), want(got.size());
          std::memcpy(got.data(), vms[1]->ReadArena(t.offset() + h * head_bytes, rows * position_bytes).data(),
                      rows * position_bytes);
          std::memcpy(want.data(), vms[0]->ReadArena(t.offset() + h * head_bytes, rows * position_bytes).data(),
                      rows * position_bytes);
          EXPECT_LE(RelativeError(got, want), kPrefillLogitTolerance) << what << ": " << t.name() << " head " << h;
        }
      }
      ASSERT_TRUE(vms[1]->Run(7).ok());
      EXPECT_EQ(vms[1]->tokens(), oracle->tokens) << what << ": decode after the pass";
    }
    absl::StatusOr<scheduler::Schedule> pass = scheduler::LowerPrefill(m->graph, *s, 256);
    ASSERT_TRUE(pass.ok());
    EXPECT_FALSE(scheduler::PrefillLastRowFor(*pass, 128).ok()) << "rows ending in the tile before the last";
    EXPECT_FALSE(scheduler::PrefillLastRowFor(*pass, 257).ok());
    scheduler::PrefillOptions all;
    all.all_logits = true;
    pass = scheduler::LowerPrefill(m->graph, *s, 256, all);
    ASSERT_TRUE(pass.ok());
    EXPECT_FALSE(scheduler::PrefillLastRowFor(*pass, 200).ok()) << "every row's logits";
  }
}

}  // namespace
}  // namespace loom
