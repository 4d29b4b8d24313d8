// gemm_bench: the GEMM opcode inside the persistent megakernel, C = A · Wᵀ in
// bf16 with f32 accumulation, every 128 x 128 output tile one instruction,
// tiles dealt to the SMs round-robin in row-major tile order. Per shape: the
// median kernel time of --repeats launches after a warm-up (CUDA events), the
// TFLOP/s, and a spot check of 64 random outputs against a float CPU product.
// --group_m picks the tile order (row-major, or Triton's grouped order).
// Compare with tools/torch_gemm_baseline.py (cuBLAS) run in the same call.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "graph/dtype.h"
#include "instructions/swizzle.h"
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"

ABSL_FLAG(std::string, shapes, "4096x4096x4096", "';'-separated MxNxK shapes");
ABSL_FLAG(int32_t, repeats, 10, "timed launches per shape (median reported)");
ABSL_FLAG(int32_t, num_sms, 132, "SMs to deal the tiles to");
ABSL_FLAG(int32_t, pages, 11, "pages in each SM's ring (the prefill pass has 7 to 11 of 16 KB)");
ABSL_FLAG(int32_t, page_kb, 16,
          "page size in KB: 16 (a K slab of A or W per page), 32 (A and W together) or 48 (--wide: A and two W slabs)");
ABSL_FLAG(bool, wide, false, "128 x 256 output tiles (isa::GemmArgs::wide; pages of 48 KB)");
ABSL_FLAG(bool, residual, false,
          "C += A·Wᵀ in place (the residual epilogue of the prefill's O- and down-projections), not C = A·Wᵀ");
ABSL_FLAG(bool, skip_loads, false,
          "diagnostic, --wide only: the loader copies no A or W pages (the consumers multiply whatever the pages "
          "hold), so the time is the consumers' alone; results are not checked");
ABSL_FLAG(int32_t, group_m, 8,
          "tile order: 0 = row-major; G = groups of G tile rows, column by column inside a group (so the tiles "
          "that run at the same time share A rows and W columns in L2)");

namespace loom {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "gemm_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

absl::Status Bench(uint32_t m, uint32_t n, uint32_t k) {
  std::mt19937 rng(m * 31 + n * 7 + k);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> a(uint64_t{m} * k), w(uint64_t{n} * k);
  for (uint16_t& v : a) v = graph::FloatToBf16(d(rng));
  for (uint16_t& v : w) v = graph::FloatToBf16(d(rng));
  const std::vector<uint16_t> a_image = isa::PackSwizzled(a.data(), m, k, isa::kGemmTileM, isa::Swizzle::k128B);
  const std::vector<uint16_t> w_image = isa::PackSwizzled(w.data(), n, k, isa::kGemmTileN, isa::Swizzle::k128B);

  runtime::GpuProgram p;
  auto align = [](uint64_t x) { return (x + 255) / 256 * 256; };
  const uint64_t c_offset = align(a_image.size() * 2);
  p.tensors = {{0, a_image.size() * 2, isa::kArenaRegion, graph::BF16},
               {0, w_image.size() * 2, isa::kWeightRegion, graph::BF16},
               {c_offset, uint64_t{m} * n * 4, isa::kArenaRegion, graph::F32}};
  p.arena_bytes = c_offset + uint64_t{m} * n * 4;
  const uint32_t sms = static_cast<uint32_t>(absl::GetFlag(FLAGS_num_sms));
  p.queues.resize(sms);
  p.num_pages = static_cast<uint32_t>(absl::GetFlag(FLAGS_pages));
  p.page_bytes = static_cast<uint32_t>(absl::GetFlag(FLAGS_page_kb)) * 1024;
  p.activation_bytes = 1024;  // GEMM without the RoPE epilogue takes no activation slot
  const bool wide = absl::GetFlag(FLAGS_wide);
  const uint32_t mtiles = isa::GemmTiles(m), ntiles = isa::GemmColumnTiles(n, wide);
  const bool grouped = absl::GetFlag(FLAGS_group_m) > 0;
  const uint32_t group = grouped ? static_cast<uint32_t>(absl::GetFlag(FLAGS_group_m)) : 1;
  for (uint32_t tile = 0; tile < mtiles * ntiles; ++tile) {
    uint32_t mt = tile / ntiles, nt = tile % ntiles;
    if (grouped) {  // Triton's GROUP_SIZE_M order
      const uint32_t first_m = tile / (group * ntiles) * group, rows = std::min(group, mtiles - first_m);
      const uint32_t in_group = tile - first_m * ntiles;
      mt = first_m + in_group % rows;
      nt = in_group / rows;
    }
    isa::Instruction inst{};
    inst.opcode = static_cast<uint8_t>(isa::Opcode::GEMM);
    inst.signal = isa::kNoBarrier;
    isa::GemmArgs& g = inst.as<isa::GemmArgs>();
    g = {0, 1, 2, m, n, k, isa::GemmTileOf(mt, nt), isa::kNoTensor, absl::GetFlag(FLAGS_residual) ? 2u : isa::kNoTensor};
    g.wide = wide ? 1 : 0;
    p.queues[tile % sms].push_back(inst);
  }
  std::vector<uint8_t> weights(w_image.size() * 2);
  std::memcpy(weights.data(), w_image.data(), weights.size());
  absl::StatusOr<std::unique_ptr<runtime::GpuMachine>> machine = runtime::GpuMachine::Create(p, weights);
  if (!machine.ok()) return machine.status();
  if (absl::Status s = (*machine)->WriteArena(0, a_image.data(), a_image.size() * 2); !s.ok()) return s;
  const bool skip_loads = absl::GetFlag(FLAGS_skip_loads);
  (*machine)->SetSkipWeightLoads(skip_loads);
  std::vector<float> ms;
  for (int r = 0; r <= absl::GetFlag(FLAGS_repeats); ++r) {
    absl::StatusOr<float> t = (*machine)->Run(1, false);
    if (!t.ok()) return t.status();
    if (r > 0) ms.push_back(*t);  // the first is a warm-up
  }
  std::sort(ms.begin(), ms.end());
  if (skip_loads) {
    const double median = ms[ms.size() / 2];
    std::printf("%6u x %6u x %6u  %9.3f ms  (min %.3f)  %7.1f TFLOP/s  (no loads: not checked)\n", m, n, k, median,
                ms.front(), 2.0 * m * n * k / (median * 1e-3) / 1e12);
    return absl::OkStatus();
  }
  std::vector<float> c(uint64_t{m} * n);
  if (absl::GetFlag(FLAGS_residual)) {  // C has accumulated every launch: check one product from zero
    if (absl::Status s = (*machine)->WriteArena(c_offset, c.data(), c.size() * 4); !s.ok()) return s;
    if (absl::StatusOr<float> t = (*machine)->Run(1, false); !t.ok()) return t.status();
  }
  if (absl::Status s = (*machine)->ReadArena(c_offset, c.data(), c.size() * 4); !s.ok()) return s;
  double worst = 0;
  for (int i = 0; i < 64; ++i) {
    const uint32_t r = rng() % m, col = rng() % n;
    double want = 0, scale = 0;
    for (uint32_t x = 0; x < k; ++x) {
      const double prod = double(graph::Bf16ToFloat(a[uint64_t{r} * k + x])) * graph::Bf16ToFloat(w[uint64_t{col} * k + x]);
      want += prod;
      scale += std::fabs(prod);
    }
    worst = std::max(worst, std::fabs(c[uint64_t{r} * n + col] - want) / std::max(scale, 1e-30));
  }
  const double median = ms[ms.size() / 2], tflops = 2.0 * m * n * k / (median * 1e-3) / 1e12;
  std::printf("%6u x %6u x %6u  %9.3f ms  (min %.3f)  %7.1f TFLOP/s  spot-check error %.1e%s\n", m, n, k, median,
              ms.front(), tflops, worst, worst < 1e-4 ? "" : "  WRONG");
  return worst < 1e-4 ? absl::OkStatus() : absl::InternalError("wrong results");
}

int Main() {
  if (absl::GetFlag(FLAGS_repeats) < 1) return Fail(absl::InvalidArgumentError("--repeats must be at least 1"));
  if (absl::GetFlag(FLAGS_num_sms) < 1) return Fail(absl::InvalidArgumentError("--num_sms must be at least 1"));
  std::string why;
  if (!runtime::GpuAvailable(&why)) return Fail(absl::UnavailableError(why));
  const int32_t page_kb = absl::GetFlag(FLAGS_page_kb);
  if (page_kb != 16 && page_kb != 32 && page_kb != 48) {
    return Fail(absl::InvalidArgumentError("--page_kb must be 16, 32 or 48"));
  }
  if (absl::GetFlag(FLAGS_skip_loads) && !absl::GetFlag(FLAGS_wide)) {
    return Fail(absl::InvalidArgumentError("--skip_loads takes --wide (the loader skips wide tiles' pages only)"));
  }
  if (absl::GetFlag(FLAGS_wide) != (page_kb == 48)) {
    return Fail(absl::InvalidArgumentError("--wide takes --page_kb=48, and 48 KB pages are for --wide"));
  }
  if (absl::GetFlag(FLAGS_pages) < 2 || absl::GetFlag(FLAGS_pages) * absl::GetFlag(FLAGS_page_kb) > 13 * 16) {
    return Fail(absl::InvalidArgumentError("--pages x --page_kb must fit 208 KB of an SM's shared memory"));
  }
  std::printf("GEMM opcode in the megakernel (128x%d tiles, bf16 -> f32%s, %d pages of %d KB), median of %d "
              "launches\n",
              absl::GetFlag(FLAGS_wide) ? 256 : 128, absl::GetFlag(FLAGS_residual) ? ", added in place" : "",
              absl::GetFlag(FLAGS_pages),
              absl::GetFlag(FLAGS_page_kb), absl::GetFlag(FLAGS_repeats));
  for (absl::string_view shape : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ';', absl::SkipEmpty())) {
    std::vector<std::string> dims = absl::StrSplit(shape, 'x');
    uint32_t v[3];
    if (dims.size() != 3 || !absl::SimpleAtoi(dims[0], &v[0]) || !absl::SimpleAtoi(dims[1], &v[1]) ||
        !absl::SimpleAtoi(dims[2], &v[2]) || v[0] == 0 || v[1] == 0 || v[2] == 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--shapes: '", shape, "' is not MxNxK")));
    }
    if (absl::Status s = Bench(v[0], v[1], v[2]); !s.ok()) return Fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::Main();
}
