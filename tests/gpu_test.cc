// GPU tests (ctest label gpu). Each opcode on the megakernel against its
// float32 CPU reference: fresh random inputs every run, outputs poisoned (NaN)
// first, relative error <= kTolerance, sizes beyond the presets'. Then whole
// random:tiny schedules on the GPU against the CPU reference VM. Without a
// Hopper GPU every test skips, saying why.
#include <cmath>
#include <map>
#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graph/decode_oracle.h"
#include "graph/dtype.h"
#include "graph/model.h"
#include "gtest/gtest.h"
#include "instructions/swizzle.h"
#include "instructions/isa.h"
#include "megakernel/gpu_backend.h"
#include "megakernel/gpu_machine.h"
#include "megakernel/reference_vm.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"
#include "tests/relative_error.h"
#include "scheduler/options.h"

namespace loom::megakernel {
namespace {

// bf16 operands, float32 arithmetic in a different order than the reference.
constexpr double kTolerance = 1e-4;
// Chains with bf16 intermediates (measured up to 1.4e-4 from rounding alone at M = 200).
constexpr double kBf16ChainTolerance = 1e-3;
// Outputs that are bf16 themselves (FLASH_ATTN's operand image): one bf16 ulp is 2^-8 = 3.9e-3 relative, and the
// device's exp2 / reciprocal put some elements on the other side of a rounding boundary (measured 4-6e-3 on every
// case; a wrong tile measured 0.4-0.9).
constexpr double kBf16OutputTolerance = 1e-2;
// A whole prefill pass against the VM: bf16 images and attention outputs through every layer (measured 1.3e-3).
constexpr double kPrefillTolerance = 5e-3;
// Large enough for the biggest tiles below (160 rows at k = 8192), still fitting beside 10 pages.
constexpr uint32_t kActivationBytes = 48 * 1024;
constexpr uint32_t kPageBudget = 212 * 1024;  // shared memory for pages and the activation ring

#define SKIP_WITHOUT_GPU()                            \
  do {                                                \
    std::string why;                                  \
    if (!GpuAvailable(&why)) GTEST_SKIP() << why;     \
  } while (0)

// Builds the tensors of a one-SM program in host memory: what the GPU gets and
// what the CPU reference runs on.
class OpBench {
 public:
  explicit OpBench(uint32_t seed) : rng_(seed) {}

  uint32_t Weight(uint64_t elements, graph::DType dtype = graph::BF16) { return Add(isa::kWeightRegion, elements, dtype); }
  uint32_t Arena(uint64_t elements, graph::DType dtype = graph::F32) { return Add(isa::kArenaRegion, elements, dtype); }
  // Output tensors are poisoned with NaN and compared after the run.
  uint32_t Output(uint64_t elements, graph::DType dtype = graph::F32) {
    const uint32_t id = Arena(elements, dtype);
    std::memset(Bytes(id), 0xff, table_[id].bytes);
    outputs_.push_back(id);
    return id;
  }
  // An output of argmax partials ((max value, its row) pairs) over the values in `values`: on a near tie the two
  // sides may pick different rows, which is right when the rows' values agree within the tolerance.
  uint32_t ArgmaxPartials(uint32_t pairs, uint32_t values) {
    const uint32_t id = Output(2ull * pairs);
    argmax_values_[id] = values;
    return id;
  }
  // A GEMM of random bf16 operand images A [m, k] and W [n, k] into a poisoned f32 output [m, n], store epilogue,
  // no bias or residual; the caller sets the tile.
  isa::GemmArgs RandomGemm(uint32_t m, uint32_t n, uint32_t k) {
    isa::GemmArgs g{};
    g.a = RandomOperandImage(isa::kArenaRegion, m, k);
    g.weight = RandomOperandImage(isa::kWeightRegion, n, k);
    g.out = Output(uint64_t{m} * n);
    g.m = m;
    g.n = n;
    g.k = k;
    g.bias = g.residual = isa::kNoTensor;
    g.epilogue = isa::kGemmStoreF32;
    return g;
  }
  template <typename T>
  T* Data(uint32_t id) { return reinterpret_cast<T*>(Bytes(id)); }
  void SetState(uint32_t state, int32_t position, int32_t prompt_length) {
    Data<int32_t>(state)[isa::kStatePosition] = position;
    Data<int32_t>(state)[isa::kStatePromptLength] = prompt_length;
    Data<int32_t>(state)[isa::kStateOverflow] = 0;
  }

  // The one-SM program of `queue` over this bench's tensors, pages of `page_bytes`.
  GpuProgram Program(const std::vector<isa::Instruction>& queue, uint32_t page_bytes) const {
    GpuProgram program;
    program.queues = {queue};
    program.tensors = table_;
    program.arena_bytes = arena_.size();
    program.activation_bytes = kActivationBytes;
    program.page_bytes = page_bytes;
    for (const isa::Instruction& inst : queue) {  // FLASH_ATTN at head_dim 128 takes 97 KB
      program.activation_bytes = std::max(program.activation_bytes, isa::ActivationBytes(inst));
    }
    // As many pages as fit beside the ring (48 KB: 10 of 16 KB; 97 KB: 7; 68 KB: 4 of 32 KB).
    program.num_pages = std::min<uint32_t>(10, (kPageBudget - program.activation_bytes) / page_bytes);
    program.activation_slots = 4;  // instructions share the ring: allocation, wrap-around and release are exercised
    for (const isa::Instruction& inst : queue) {  // barriers the queue uses (one SM: they order its instructions)
      if (inst.signal != isa::kNoBarrier) program.num_barriers = std::max(program.num_barriers, inst.signal + 1);
    }
    return program;
  }
  // Whether the GPU machine takes `queue` (what it refuses before any launch).
  absl::Status CreateStatus(const std::vector<isa::Instruction>& queue, uint32_t page_bytes) const {
    return GpuMachine::Create(Program(queue, page_bytes), weights_).status();
  }

  // Runs `queue` once on the GPU and on the CPU; every output must agree.
  // `tolerance`: kTolerance, or looser where a chain rounds intermediates to bf16 (a value within float noise
  // of a bf16 rounding boundary may round either way on the two sides; a wrong result is off by O(1)).
  // `page_bytes`: 16 KB pages (a GEMM slab of A or W each) or 32 KB (both slabs of a K step in one page).
  void RunAndCompare(const std::vector<isa::Instruction>& queue, const std::string& what,
                     double tolerance = kTolerance, uint32_t page_bytes = 16384) {
    const GpuProgram program = Program(queue, page_bytes);
    std::vector<uint8_t> expected_arena = arena_, expected_weights = weights_;
    isa::MachineView host{{expected_weights.data(), expected_arena.data()}, table_.data(),
                          static_cast<uint32_t>(table_.size())};
    for (const isa::Instruction& inst : queue) isa::ExecuteReference(inst, host);

    absl::StatusOr<std::unique_ptr<GpuMachine>> m = GpuMachine::Create(program, weights_);
    ASSERT_TRUE(m.ok()) << what << ": " << m.status();
    ASSERT_TRUE((*m)->WriteArena(0, arena_.data(), arena_.size()).ok());
    absl::StatusOr<float> ms = (*m)->Run(1, false);
    ASSERT_TRUE(ms.ok()) << what << ": " << ms.status();
    std::vector<uint8_t> got(arena_.size());
    ASSERT_TRUE((*m)->ReadArena(0, got.data(), got.size()).ok());
    for (uint32_t id : outputs_) {
      std::vector<float> g(table_[id].bytes / 4), e(table_[id].bytes / 4);
      if (table_[id].dtype == graph::BF16) {  // bf16 outputs (operand images) compared as floats
        g.resize(table_[id].bytes / 2);
        e.resize(table_[id].bytes / 2);
        for (uint64_t i = 0; i < g.size(); ++i) {
          uint16_t gv, ev;
          std::memcpy(&gv, got.data() + table_[id].offset + 2 * i, 2);
          std::memcpy(&ev, expected_arena.data() + table_[id].offset + 2 * i, 2);
          g[i] = graph::Bf16ToFloat(gv);
          e[i] = graph::Bf16ToFloat(ev);
          // Rounded from f32 sums the two sides add in different orders: one bf16 step apart is the same value (a
          // sum of bf16 products often lies on a rounding midpoint, where an f32 ulp decides).
          if (bf16_steps_ && gv != ev && (gv ^ ev) < 0x8000u && (gv > ev ? gv - ev : ev - gv) == 1) g[i] = e[i];
        }
        if (bf16_steps_) {  // and values that cancel to near zero by the f32 noise of their terms (wrong is O(1))
          float scale = 0.0f;
          for (float v : e) scale = std::isnan(v) ? scale : std::max(scale, std::fabs(v));
          for (uint64_t i = 0; i < g.size(); ++i) {
            if (std::fabs(g[i] - e[i]) <= 1e-4f * scale) g[i] = e[i];
          }
        }
      } else {
        std::memcpy(g.data(), got.data() + table_[id].offset, g.size() * 4);
        std::memcpy(e.data(), expected_arena.data() + table_[id].offset, e.size() * 4);
      }
      if (auto it = argmax_values_.find(id); it != argmax_values_.end()) {
        // A different row is a near tie: the value the device chose must equal, within the tolerance, the
        // reference's value at that row.
        const float* values = reinterpret_cast<const float*>(expected_arena.data() + table_[it->second].offset);
        for (uint64_t i = 0; i + 1 < g.size(); i += 2) {
          if (std::isnan(e[i]) || g[i + 1] == e[i + 1]) continue;
          const uint32_t row = static_cast<uint32_t>(g[i + 1]);
          ASSERT_LT(row, table_[it->second].bytes / 4) << what << ": partial " << i / 2 << " names row " << row;
          EXPECT_LE(std::fabs(values[row] - e[i]), tolerance * std::max(1.0f, std::fabs(e[i])))
              << what << ": partial " << i / 2 << " chose row " << row << " (value " << values[row]
              << "), the reference row " << e[i + 1] << " (value " << e[i] << ")";
          g[i + 1] = e[i + 1];  // the values are compared below
        }
      }
      double num = 0, den = 0, worst = 0;
      uint64_t worst_at = 0;
      size_t nan = 0;
      size_t infinite_mismatch = 0;
      for (uint64_t i = 0; i < g.size(); ++i) {
        if (std::isnan(g[i]) != std::isnan(e[i])) ++nan;
        if (std::isnan(e[i]) || g[i] == e[i]) continue;  // NaN: left poisoned by both; equal: incl. -inf maxima
        if (std::isinf(e[i]) || std::isinf(g[i])) {
          ++infinite_mismatch;
          continue;
        }
        const double d = (g[i] - double(e[i])) * (g[i] - double(e[i]));
        if (d > worst) worst = d, worst_at = i;
        num += d;
        den += double(e[i]) * e[i];
      }
      EXPECT_EQ(nan, 0u) << what << ": output tensor " << id << " has elements one side wrote and the other did not";
      EXPECT_EQ(infinite_mismatch, 0u) << what << ": output tensor " << id << " differs in infinite elements";
      const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
      EXPECT_LE(err, tolerance)
          << what << ": output tensor " << id << " (largest difference at element " << worst_at << ": got "
          << g[worst_at] << ", expected " << e[worst_at] << ")";
    }
  }

  void FillRandom(uint32_t id, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    if (table_[id].dtype == graph::BF16) {
      for (uint64_t i = 0; i < table_[id].bytes / 2; ++i) Data<uint16_t>(id)[i] = graph::FloatToBf16(d(rng_));
    } else {
      for (uint64_t i = 0; i < table_[id].bytes / 4; ++i) Data<float>(id)[i] = d(rng_);
    }
  }
  std::mt19937& rng() { return rng_; }
  // bf16 outputs rounded from f32 sums: elements one bf16 step apart count as equal.
  void AllowBf16Steps() { bf16_steps_ = true; }
  // A random bf16 matrix [rows, cols] (uniform in +-scale) as a GEMM operand image (isa::PackSwizzled: 128-row
  // tiles of 128-byte swizzled K slabs), in the weights (W) or the arena (A). The references read the image.
  uint32_t RandomOperandImage(uint32_t region, uint32_t rows, uint32_t cols, float scale = 1.0f) {
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<uint16_t> m(uint64_t{rows} * cols);
    for (uint16_t& v : m) v = graph::FloatToBf16(d(rng_));
    const std::vector<uint16_t> image = isa::PackSwizzled(m.data(), rows, cols, isa::kGemmTileM, isa::Swizzle::k128B);
    const uint32_t id = Add(region, image.size(), graph::BF16);
    std::copy(image.begin(), image.end(), Data<uint16_t>(id));
    return id;
  }

 private:
  uint8_t* Bytes(uint32_t id) {
    return (table_[id].region == isa::kWeightRegion ? weights_.data() : arena_.data()) + table_[id].offset;
  }
  uint32_t Add(uint32_t region, uint64_t elements, graph::DType dtype) {
    std::vector<uint8_t>& r = region == isa::kWeightRegion ? weights_ : arena_;
    const uint64_t bytes = elements * graph::DTypeSize(dtype);
    table_.push_back({r.size(), bytes, region, static_cast<uint32_t>(dtype)});
    r.resize(r.size() + (bytes + 255) / 256 * 256);
    return static_cast<uint32_t>(table_.size() - 1);
  }

  bool bf16_steps_ = false;
  std::mt19937 rng_;
  std::vector<uint8_t> weights_, arena_;
  std::vector<isa::TensorDesc> table_;
  std::vector<uint32_t> outputs_;
  std::map<uint32_t, uint32_t> argmax_values_;  // argmax-partials output -> the values it ranks
};

template <typename Args>
isa::Instruction Make(isa::Opcode op, const Args& args) {
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(op);
  inst.signal = isa::kNoBarrier;
  inst.as<Args>() = args;
  return inst;
}

uint32_t Seed() { return std::random_device{}(); }

// Every streaming form of the matvec (x in registers with 1, 2, 3, 4, 8 or 12 segments a warp, x read per segment)
// at the page sizes that select them; rows whose 1024-column slots would span two warps' shares of a page are
// refused by name (before the refusal, two warps wrote one slot: wrong results with 8 KB pages).
TEST(GpuOpcodes, MatvecAtEveryPageSize) {
  SKIP_WITHOUT_GPU();
  for (uint32_t page_bytes : {4096u, 8192u, 12288u, 32768u, 49152u}) {
    for (uint32_t k : {256u, 768u, 1024u, 2048u, 3072u, 5632u}) {
      const uint32_t seed = Seed();
      OpBench b(seed);
      isa::MatvecArgs a{};
      a.rows = 24;
      a.k = k;
      a.row_begin = 1;
      a.weight = b.Weight(uint64_t{a.rows + 1} * isa::MatvecRowStride(k));
      b.FillRandom(a.weight);
      a.bias = isa::kNoTensor;
      a.input = b.Arena(k);
      b.FillRandom(a.input);
      a.out = b.Output(a.rows + 1);
      const std::string what = absl::StrCat("MATVEC k ", k, ", ", page_bytes, "-byte pages, seed ", seed);
      const isa::Instruction inst = Make(isa::Opcode::MATVEC, a);
      if (!isa::MatvecSlotsFitPages(k, page_bytes)) {
        const absl::Status st = b.CreateStatus({inst}, page_bytes);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
        EXPECT_NE(st.message().find("smem.page_bytes must be a multiple of 16384"), std::string::npos) << st;
        continue;
      }
      b.RunAndCompare({inst}, what, kTolerance, page_bytes);
    }
  }
}

TEST(GpuOpcodes, MatvecEveryPrologueAndEpilogueAtSeveralSizes) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t rows, k, total_rows; };
  // k not a multiple of 256 (576, 896, 960, 100) streams rows padded to 256 columns; the
  // padding holds random values here, so an input that is not zero-padded shows. 768, 3072 and 5632 do not tile a
  // page: x read per segment, with 256- and 1024-column partial-sum slots.
  const std::vector<Case> cases = {{1, 256, 4},      {7, 768, 20},   {64, 2048, 200}, {30, 8192, 64},
                                   {334, 1024, 1000}, {9, 576, 30},   {40, 896, 100},  {17, 960, 50},
                                   {5, 100, 8},      {12, 3072, 40}, {10, 5632, 30}};
  for (const Case& c : cases) {
    for (uint32_t epilogue = 0; epilogue < isa::kNumEpilogues; ++epilogue) {
      for (uint32_t prologue : {isa::kPrologueNone, isa::kPrologueRmsNorm}) {
        const uint32_t seed = Seed();
        OpBench b(seed);
        isa::MatvecArgs a{};
        a.rows = c.rows + (c.rows % 2);  // pairs for the RoPE and SiLU epilogues
        a.k = c.k;
        a.row_begin = 2;
        const uint32_t total = c.total_rows + a.rows + 2;
        const uint64_t stride = isa::MatvecRowStride(c.k);
        a.weight = b.Weight(uint64_t{total} * stride);
        b.FillRandom(a.weight);
        const bool biased = (epilogue + prologue + c.k / 4) % 2 == 1;  // every epilogue with and without
        a.bias = biased ? b.Weight(total) : isa::kNoTensor;
        if (biased) b.FillRandom(a.bias);
        a.input = b.Arena(c.k);
        b.FillRandom(a.input);
        a.prologue = prologue;
        a.norm_weight = b.Weight(c.k);
        b.FillRandom(a.norm_weight, 0.5f, 1.5f);
        a.norm_eps = 1e-5f;
        a.epilogue = epilogue;
        std::string what = absl::StrCat("MATVEC rows ", a.rows, " k ", c.k, " prologue ", prologue, " epilogue ",
                                        epilogue, biased ? " bias" : "", " seed ", seed);
        if (epilogue == isa::kEpilogueRopeKvAppend) {
          // A grouped q|k|v layout: 2 KV heads of dim 16 with 3 query heads each -> 160 rows.
          a.head_dim = 16;
          a.heads_per_group = 3;
          a.num_kv_heads = 2;
          a.max_seq = 8;
          a.row_begin = 0;
          a.rows = 160;
          a.weight = b.Weight(160ull * stride);
          b.FillRandom(a.weight);
          if (biased) {
            a.bias = b.Weight(160);
            b.FillRandom(a.bias);
          }
          a.out = b.Output(3 * 2 * 16);
          a.k_cache = b.Output(2 * 8 * 16);
          a.v_cache = b.Output(2 * 8 * 16);
          a.step_state = b.Arena(4, graph::I32);
          b.SetState(a.step_state, 5, 1);
          a.rope_table = b.Weight(8 + 1, graph::F32);  // inverse frequencies, then the cos/sin factor
          b.FillRandom(a.rope_table, 0.001f, 1.0f);
          what += " (rope)";
        } else if (epilogue == isa::kEpilogueSiluMul) {
          a.out = b.Output(total / 2 + 1);
        } else {
          a.out = b.Output(total);
          a.residual = b.Arena(total);
          b.FillRandom(a.residual);
          a.partials = b.ArgmaxPartials(4, a.out);
          a.tile_index = 3;
        }
        b.RunAndCompare({Make(isa::Opcode::MATVEC, a)}, what);
      }
    }
  }
}

// GEMM output tiles on wgmma, every tile of C at ragged M, N and K (zero padding in the swizzled images), with
// and without bias and residual, and with the residual being the output itself (added in place by reductions, as
// the prefill's O- and down-projections run; odd N takes the scalar path); the tiles of one C share an SM's page
// ring, so slabs of consecutive instructions follow each other through it.
TEST(GpuOpcodes, GemmTilesAtRaggedShapes) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, n, k; };
  const std::vector<Case> cases = {{1, 64, 64},   {7, 100, 100},   {64, 128, 256}, {129, 300, 1000},
                                   {200, 130, 64}, {128, 256, 640}, {33, 17, 8},   {1000, 200, 320}};
  enum Extras { kNone, kBiasAndResidual, kInPlace };
  for (const Case& c : cases) {
    for (Extras extras : {kNone, kBiasAndResidual, kInPlace}) {
      const uint32_t seed = Seed();
      OpBench b(seed);
      isa::GemmArgs g = b.RandomGemm(c.m, c.n, c.k);
      if (extras != kNone) {
        g.bias = b.Weight(c.n);
        b.FillRandom(g.bias);
      }
      if (extras == kBiasAndResidual) {
        g.residual = b.Arena(uint64_t{c.m} * c.n);
        b.FillRandom(g.residual);
      } else if (extras == kInPlace) {
        b.FillRandom(g.out);  // the residual stream it adds to
        g.residual = g.out;
      }
      std::vector<isa::Instruction> queue;
      for (uint32_t mt = 0; mt < isa::GemmTiles(c.m); ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmTiles(c.n); ++nt) {
          g.m_tile = mt;
          g.n_tile = nt;
          queue.push_back(Make(isa::Opcode::GEMM, g));
        }
      }
      b.RunAndCompare(queue, absl::StrCat("GEMM M ", c.m, " N ", c.n, " K ", c.k,
                                          extras == kBiasAndResidual ? " bias+residual"
                                          : extras == kInPlace       ? " bias+residual in place"
                                                                     : "",
                                          " seed ", seed));
    }
  }
}

// Wide tiles (isa::GemmArgs::wide: 128 x 256, the A slab and two W slabs of a K step in one 48 KB page) at ragged
// M, N and K: N with a missing second W tile (N <= 128 in a tile), every f32 epilogue, split-K, and the SiLU-mul
// image of the prefill's gate/up projection (a bf16 output: 4-6e-3 from elements on the other side of a rounding
// boundary, the same with 128-column tiles, which the last form runs for comparison).
TEST(GpuOpcodes, GemmWideTilesAtRaggedShapes) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, n, k; };
  const std::vector<Case> cases = {{1, 64, 64},     {7, 300, 100},   {129, 256, 1000}, {200, 520, 64},
                                   {1000, 384, 320}, {33, 17, 8},    {64, 640, 200}};
  enum Form { kPlain, kBiasAndResidual, kInPlace, kRelu, kSplitK, kSiluImage };
  for (const Case& c : cases) {
    for (int f = 0; f <= kSiluImage + 1; ++f) {  // the last: the SiLU image of 128-column tiles, for comparison
      const Form form = static_cast<Form>(std::min<int>(f, kSiluImage));
      const uint32_t wide = f <= kSiluImage ? 1 : 0;
      if (form == kSiluImage && c.n % (2 * isa::kGemmSlabK) != 0) continue;
      const uint32_t seed = Seed();
      OpBench b(seed);
      isa::GemmArgs g = b.RandomGemm(c.m, c.n, c.k);
      g.wide = wide;
      if (form != kPlain && form != kSiluImage) {
        g.bias = b.Weight(c.n);
        b.FillRandom(g.bias);
      }
      if (form == kBiasAndResidual || form == kRelu) {
        g.residual = b.Arena(uint64_t{c.m} * c.n);
        b.FillRandom(g.residual);
      } else if (form == kInPlace || form == kSplitK) {
        b.FillRandom(g.out);  // the residual stream it adds to
        if (form == kInPlace) g.residual = g.out;
      }
      if (form == kRelu) g.epilogue = isa::kGemmStoreF32Relu;
      if (form == kSplitK) g.epilogue = isa::kGemmAccumulateF32;
      if (form == kSiluImage) {
        g.epilogue = isa::kGemmSiluMulToImage;
        g.out = b.Output(isa::GemmImageBytes(c.m, c.n / 2) / 2, graph::BF16);
      }
      const uint32_t slabs = isa::GemmSlabs(c.k), splits = form == kSplitK ? std::min(3u, slabs) : 1;
      std::vector<isa::Instruction> queue;
      for (uint32_t mt = 0; mt < isa::GemmTiles(c.m); ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmColumnTiles(c.n, wide); ++nt) {
          for (uint32_t s = 0; s < splits; ++s) {
            g.m_tile = mt;
            g.n_tile = nt;
            const uint32_t begin = slabs * s / splits;
            if (splits > 1) g.slabs = isa::GemmPackSlabs(begin, slabs * (s + 1) / splits - begin);
            queue.push_back(Make(isa::Opcode::GEMM, g));
          }
        }
      }
      b.RunAndCompare(queue,
                      absl::StrCat(wide ? "wide" : "128-column", " GEMM M ", c.m, " N ", c.n, " K ", c.k, " form ",
                                   form, " seed ", seed),
                      form == kSiluImage ? kBf16OutputTolerance : kTolerance, isa::kGemmWideStepBytes);
    }
  }
}

// Wide tiles where they cannot run are refused before any launch: pages smaller than a wide K step, and a program
// with general-graph opcodes (their kernel variant has 128-column tiles only).
TEST(GpuOpcodes, WideTilesAreRefusedWhereTheyCannotRun) {
  SKIP_WITHOUT_GPU();
  OpBench b(Seed());
  isa::GemmArgs g = b.RandomGemm(64, 256, 128);
  g.wide = 1;
  const isa::Instruction wide = Make(isa::Opcode::GEMM, g);
  EXPECT_TRUE(b.CreateStatus({wide}, isa::kGemmWideStepBytes).ok());
  const absl::Status small_pages = b.CreateStatus({wide}, 32768);
  EXPECT_NE(small_pages.message().find("a wide tile's K step takes a page of 49152 bytes, a page is 32768"),
            std::string::npos)
      << small_pages;
  isa::Instruction graph_op{};  // refused for its variant before its arguments matter
  graph_op.opcode = static_cast<uint8_t>(isa::Opcode::ELEMENTWISE);
  graph_op.signal = isa::kNoBarrier;
  const absl::Status mixed = b.CreateStatus({graph_op, wide}, isa::kGemmWideStepBytes);
  EXPECT_NE(mixed.message().find("a wide GEMM tile in a program with general-graph opcodes"), std::string::npos)
      << mixed;
}

// Split-K: each output tile as 3 instructions over uneven K slab ranges, each adding its part (and the bias, from
// the first) into an output that already holds a residual, as a short prompt's O- and down-projections run.
TEST(GpuOpcodes, GemmSplitKAccumulates) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, n, k; };
  for (const Case& c : {Case{7, 100, 1000}, Case{129, 256, 8192}, Case{128, 130, 200}}) {
    const uint32_t seed = Seed();
    OpBench b(seed);
    isa::GemmArgs g = b.RandomGemm(c.m, c.n, c.k);
    b.FillRandom(g.out);  // the residual stream it adds to
    g.bias = b.Weight(c.n);
    b.FillRandom(g.bias);
    g.epilogue = isa::kGemmAccumulateF32;
    const uint32_t slabs = isa::GemmSlabs(c.k);
    std::vector<isa::Instruction> queue;
    for (uint32_t mt = 0; mt < isa::GemmTiles(c.m); ++mt) {
      for (uint32_t nt = 0; nt < isa::GemmTiles(c.n); ++nt) {
        for (uint32_t s = 0; s < 3; ++s) {
          g.m_tile = mt;
          g.n_tile = nt;
          const uint32_t begin = slabs * s * s / 9, count = slabs * (s + 1) * (s + 1) / 9 - begin;  // uneven
          if (count == 0) continue;
          g.slabs = isa::GemmPackSlabs(begin, count);
          queue.push_back(Make(isa::Opcode::GEMM, g));
        }
      }
    }
    b.RunAndCompare(queue, absl::StrCat("GEMM split-K M ", c.m, " N ", c.n, " K ", c.k, " seed ", seed));
  }
}

// CONV_GEMM (a convolution's implicit GEMM: patches gathered into the page by the consumers) at shapes that take
// every gather (f32: 32 channels of a tap per copy run, or column by column; bf16 wherever the channels allow it:
// straight into the page), ragged M, N and K, strides, padding, dilation, a group's channel range, a ReLU on the
// input, the epilogues (bias + residual + ReLU; split over K adding into a residual; with a bf16 input, the output
// as bf16 alone or beside f32), with 16 KB pages (A and W slabs in pages of their own) and 32 KB (one page per K
// step).
TEST(GpuOpcodes, ConvGemmTilesAtSeveralShapes) {
  SKIP_WITHOUT_GPU();
  struct Case {
    uint32_t batch, h, w, c, oc, kh, kw, stride, pad_top, pad_left, dilation, c_begin, group_c, relu;
    uint32_t oh() const { return (h + 2 * pad_top - dilation * (kh - 1) - 1) / stride + 1; }
    uint32_t ow() const { return (w + 2 * pad_left - dilation * (kw - 1) - 1) / stride + 1; }
  };
  const std::vector<Case> cases = {
      {2, 10, 10, 64, 64, 3, 3, 1, 1, 1, 1, 0, 64, 0},     // a ResNet block conv, M 200, K 576
      {1, 20, 18, 3, 64, 7, 7, 2, 3, 3, 1, 0, 3, 0},       // a stem: 3 channels, K 147, asymmetric spatial size
      {3, 9, 11, 32, 40, 3, 3, 2, 1, 0, 2, 16, 16, 1},     // second group of two, dilation 2, ReLU'd input, N 40
      {3, 15, 15, 128, 200, 1, 1, 2, 0, 0, 1, 0, 128, 0},  // a 1x1 stride-2 downsample, N over two tiles
      {1, 6, 6, 24, 136, 2, 2, 1, 1, 1, 1, 0, 24, 1},      // 24 channels: column by column, K 96 (a ragged slab)
      {2, 7, 9, 64, 72, 3, 3, 1, 1, 1, 1, 32, 32, 1},      // a 32-channel group: two taps per slab, K 288
  };
  for (uint32_t page_bytes : {16384u, 32768u}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      for (uint32_t form = 0; form < 6; ++form) {  // 0: plain store; 1: bias + residual + ReLU; 2: split over K;
        const bool bf16 = form >= 3;               // 3-5: the same from a bf16 input (0: into bf16 alone)
        if (bf16 && !isa::ConvBf16Readable(c.c, c.c_begin, c.group_c)) continue;
        const uint32_t seed = Seed();
        OpBench b(seed);
        b.AllowBf16Steps();
        isa::ConvGemmArgs g{};
        g.batch = c.batch, g.c = c.c, g.c_begin = c.c_begin, g.group_c = c.group_c;
        g.flags = bf16 ? isa::kConvBf16Input : c.relu ? isa::kConvReluInput : 0;
        g.hw = isa::Pack16(c.h, c.w), g.ohw = isa::Pack16(c.oh(), c.ow()), g.kernel = isa::Pack16(c.kh, c.kw);
        g.stride = isa::Pack16(c.stride, c.stride), g.pad = isa::Pack16(c.pad_top, c.pad_left);
        g.dilation = isa::Pack16(c.dilation, c.dilation);
        g.n = c.oc;
        const uint32_t m = isa::ConvGemmRows(g), k = isa::ConvGemmK(g);
        g.input = b.Arena(uint64_t{c.batch} * c.h * c.w * c.c, bf16 ? graph::BF16 : graph::F32);
        b.FillRandom(g.input);
        g.weight = b.RandomOperandImage(isa::kWeightRegion, c.oc, k, 0.25f);
        g.out = form == 3 ? isa::kNoTensor : b.Output(uint64_t{m} * c.oc);
        g.out_bf16 = form == 3 || form == 4 ? b.Output(uint64_t{m} * c.oc, graph::BF16) : isa::kNoTensor;
        g.bias = g.residual = isa::kNoTensor;
        g.epilogue = isa::kGemmStoreF32;
        if (form % 3 == 1) {
          g.bias = b.Weight(c.oc);
          b.FillRandom(g.bias);
          g.residual = b.Arena(uint64_t{m} * c.oc);
          b.FillRandom(g.residual);
          g.epilogue = isa::kGemmStoreF32Relu;
        } else if (form % 3 == 2) {
          b.FillRandom(g.out);  // the residual stream the splits add to
          g.bias = b.Weight(c.oc);
          b.FillRandom(g.bias);
          g.epilogue = isa::kGemmAccumulateF32;
        }
        const uint32_t slabs = isa::GemmSlabs(k), splits = form % 3 == 2 ? std::min(3u, slabs) : 1;
        std::vector<isa::Instruction> queue;
        for (uint32_t mt = 0; mt < isa::GemmTiles(m); ++mt) {
          for (uint32_t nt = 0; nt < isa::GemmTiles(c.oc); ++nt) {
            for (uint32_t sp = 0; sp < splits; ++sp) {
              g.m_tile = mt, g.n_tile = nt;
              if (form % 3 == 2) {
                const uint32_t begin = slabs * sp / splits, count = slabs * (sp + 1) / splits - begin;
                g.slabs = count << 16 | begin;
              }
              queue.push_back(Make(isa::Opcode::CONV_GEMM, g));
            }
          }
        }
        b.RunAndCompare(queue,
                        absl::StrCat("CONV_GEMM case ", ci, " form ", form, " (M ", m, " N ", c.oc, " K ", k, ", ",
                                     page_bytes / 1024, " KB pages) seed ", seed),
                        kTolerance, page_bytes);
      }
    }
  }
}

// POOL over NHWC f32: max, average and average counting the padding, strides, asymmetric padding, dilation, 3 to 64
// channels, chunks of any start and count, windows gathered with every load in flight (up to 16 positions; four
// channels a thread staged in shared memory up to 9) and windows larger than that (a global one, a 5x5 max, a 5x4
// average counting the padding: 8 threads an output), the outputs stored as bf16 too or not.
TEST(GpuOpcodes, PoolWindowsAtSeveralShapes) {
  SKIP_WITHOUT_GPU();
  struct Case {
    uint32_t n, h, w, c, kh, kw, stride, pad_top, pad_left, pad_bottom, pad_right, dilation, mode;
  };
  const std::vector<Case> cases = {
      {2, 13, 11, 64, 3, 3, 2, 1, 1, 1, 1, 1, isa::kPoolMax},      {2, 13, 11, 64, 3, 3, 2, 1, 0, 0, 1, 1, isa::kPoolAvg},
      {1, 10, 9, 16, 3, 2, 1, 1, 1, 1, 1, 1, isa::kPoolAvgIncludePad}, {1, 9, 9, 3, 3, 3, 1, 2, 2, 2, 2, 2, isa::kPoolMax},
      {1, 8, 8, 16, 2, 2, 2, 0, 0, 0, 0, 1, isa::kPoolAvg},        {2, 7, 7, 32, 7, 7, 1, 0, 0, 0, 0, 1, isa::kPoolAvg},
      // Windows of more than 16 positions (8 threads an output): max, and average counting the padding
      {1, 9, 9, 8, 5, 5, 1, 2, 2, 2, 2, 1, isa::kPoolMax},          {1, 12, 11, 4, 5, 4, 1, 1, 2, 2, 1, 1, isa::kPoolAvgIncludePad},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const uint32_t seed = Seed();
    OpBench b(seed);
    b.AllowBf16Steps();
    isa::PoolArgs p{};
    p.n = c.n, p.h = c.h, p.w = c.w, p.c = c.c, p.kh = c.kh, p.kw = c.kw, p.stride_h = p.stride_w = c.stride;
    p.pad_top = c.pad_top, p.pad_left = c.pad_left, p.pad_bottom = c.pad_bottom, p.pad_right = c.pad_right;
    p.dilation_h = p.dilation_w = c.dilation, p.mode = c.mode;
    p.oh = (c.h + c.pad_top + c.pad_bottom - c.dilation * (c.kh - 1) - 1) / c.stride + 1;
    p.ow = (c.w + c.pad_left + c.pad_right - c.dilation * (c.kw - 1) - 1) / c.stride + 1;
    p.input = b.Arena(uint64_t{c.n} * c.h * c.w * c.c);
    b.FillRandom(p.input, -2.0f, 2.0f);
    const uint32_t outputs = p.n * p.oh * p.ow * p.c;
    p.out = b.Output(outputs);
    // Odd cases store the outputs as bf16 too (what convolutions that read them gather).
    p.out_bf16 = ci % 2 == 1 ? b.Output(outputs, graph::BF16) : isa::kNoTensor;
    // Chunks of 192 outputs; the second split into 190 + 2 and the third into 1 + 191 (counts and starts not a
    // multiple of 4: the ends one element at a time, the fours between them four channels a thread).
    std::vector<std::pair<uint32_t, uint32_t>> chunks;
    for (uint32_t begin = 0; begin < outputs; begin += 192) chunks.emplace_back(begin, std::min(192u, outputs - begin));
    if (chunks.size() > 3) {
      chunks[1].second = 190;
      chunks.insert(chunks.begin() + 2, {chunks[1].first + 190, 2});
      chunks[3].second = 1;
      chunks.insert(chunks.begin() + 4, {chunks[3].first + 1, 191});
    }
    std::vector<isa::Instruction> queue;
    for (const auto& [begin, count] : chunks) {
      p.begin = begin;
      p.count = count;
      queue.push_back(Make(isa::Opcode::POOL, p));
    }
    b.RunAndCompare(queue, absl::StrCat("POOL case ", ci, " (", p.oh, " x ", p.ow, " x ", c.c, ", mode ", c.mode,
                                        ") seed ", seed));
  }
}

// NHWC_BF16: an NCHW f32 image of 3 channels read through its transpose's strides into bf16 NHWC padded to 8
// channels, an NHWC input of 12 channels padded to 16 with its ReLU applied, and 16 channels copied unpadded; pixel
// ranges of ragged starts and counts (the last a single pixel). The padding must come out zero (outputs are
// poisoned).
TEST(GpuOpcodes, NhwcBf16PadsChannelsThroughAnyStrides) {
  SKIP_WITHOUT_GPU();
  struct Case {
    uint32_t n, h, w, c, c_pad, relu;
    bool nchw;
  };
  for (const Case& c : {Case{2, 17, 19, 3, 8, 0, true}, Case{1, 9, 11, 12, 16, 1, false},
                        Case{3, 5, 7, 16, 16, 0, false}}) {
    const uint32_t seed = Seed();
    OpBench b(seed);
    isa::NhwcBf16Args a{};
    a.n = c.n, a.h = c.h, a.w = c.w, a.c = c.c, a.c_pad = c.c_pad, a.relu = c.relu;
    a.input = b.Arena(uint64_t{c.n} * c.h * c.w * c.c);
    b.FillRandom(a.input, -2.0f, 2.0f);
    if (c.nchw) {
      a.stride_n = c.c * c.h * c.w, a.stride_h = c.w, a.stride_w = 1, a.stride_c = c.h * c.w;
    } else {
      a.stride_n = c.h * c.w * c.c, a.stride_h = c.w * c.c, a.stride_w = c.c, a.stride_c = 1;
    }
    const uint32_t pixels = c.n * c.h * c.w;
    a.out = b.Output(uint64_t{pixels} * c.c_pad, graph::BF16);
    std::vector<isa::Instruction> queue;
    for (uint32_t begin = 0; begin < pixels;) {
      const uint32_t count = std::min(begin == 0 ? 37u : 301u, pixels - 1 - begin);
      a.begin = begin;
      a.count = count > 0 ? count : 1;
      begin += a.count;
      queue.push_back(Make(isa::Opcode::NHWC_BF16, a));
    }
    b.RunAndCompare(queue, absl::StrCat("NHWC_BF16 ", c.c, " -> ", c.c_pad, c.nchw ? " from NCHW" : "",
                                        c.relu ? " relu" : "", " seed ", seed));
  }
}

// PACK_ROWS (f32 rows, optionally RMS-normalised, to the GEMM's bf16 operand image) then GEMM on it, the GEMM
// waiting on the packing's barrier: the prefill building block of norm -> projection. Ragged M and K.
TEST(GpuOpcodes, PackRowsThenGemm) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, n, k; };
  for (const Case& c : {Case{1, 128, 64}, Case{7, 100, 100}, Case{129, 256, 576}, Case{300, 128, 2048}}) {
    for (bool norm : {false, true}) {
      const uint32_t seed = Seed();
      OpBench b(seed);
      isa::PackRowsArgs p{};
      p.input = b.Arena(uint64_t{c.m} * c.k);
      b.FillRandom(p.input, -2.0f, 2.0f);
      p.out = b.Arena(isa::GemmImageBytes(c.m, c.k) / 2, graph::BF16);
      b.FillRandom(p.out);  // stale bytes: the packing must write every element, padding included
      p.m = c.m;
      p.k = c.k;
      p.norm_weight = isa::kNoTensor;
      if (norm) {
        p.norm_weight = b.Weight(c.k);
        b.FillRandom(p.norm_weight, 0.5f, 1.5f);
        p.norm_eps = 1e-5f;
      }
      std::vector<isa::Instruction> queue;
      const uint32_t m_tiles = isa::GemmTiles(c.m);
      for (uint32_t r = 0; r < m_tiles * isa::kGemmTileM; r += 40) {  // 40 rows per instruction, ragged end
        p.row_begin = r;
        p.rows = std::min(40u, m_tiles * isa::kGemmTileM - r);
        isa::Instruction inst = Make(isa::Opcode::PACK_ROWS, p);
        inst.signal = 0;
        queue.push_back(inst);
      }
      const uint32_t packs = static_cast<uint32_t>(queue.size());
      isa::GemmArgs g{};
      g.a = p.out;
      g.weight = b.RandomOperandImage(isa::kWeightRegion, c.n, c.k);
      g.out = b.Output(uint64_t{c.m} * c.n);
      g.m = c.m;
      g.n = c.n;
      g.k = c.k;
      g.bias = g.residual = isa::kNoTensor;
      for (uint32_t mt = 0; mt < m_tiles; ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmTiles(c.n); ++nt) {
          g.m_tile = mt;
          g.n_tile = nt;
          isa::Instruction inst = Make(isa::Opcode::GEMM, g);
          inst.num_waits = 1;
          inst.waits[0] = {0, packs | (packs << 16)};  // every packing of this step
          queue.push_back(inst);
        }
      }
      b.RunAndCompare(queue, absl::StrCat("PACK_ROWS", norm ? " (RMSNorm)" : "", " + GEMM, M ", c.m, " N ", c.n,
                                          " K ", c.k, " seed ", seed),
                      kBf16ChainTolerance);
    }
  }
}

// The QKV projection of a prefill on the tensor cores: GEMM over the grouped q|k|v rows with the RoPE +
// KV-append epilogue (token row r at position state + r), with and without q/k/v biases, and with Qwen3's
// per-head q/k RMSNorm (head_dim 64: two heads per 128-column tile; 128: one).
TEST(GpuOpcodes, GemmRopeKvAppendForPromptRows) {
  SKIP_WITHOUT_GPU();
  for (uint32_t m : {7u, 200u}) {
    for (uint32_t variant = 0; variant < 4; ++variant) {
      const bool biased = variant % 2 == 1, normed = variant >= 2;
      const uint32_t seed = Seed();
      OpBench b(seed);
      const uint32_t kGroup = 4, kKv = 2, kDim = normed && biased ? 128 : 64, kHidden = 256, kSeq = 256;
      const uint32_t kN = (kGroup + 2) * kKv * kDim;
      isa::GemmArgs g{};
      g.a = b.RandomOperandImage(isa::kArenaRegion, m, kHidden);
      g.weight = b.RandomOperandImage(isa::kWeightRegion, kN, kHidden);
      g.out = b.Output(uint64_t{m} * kGroup * kKv * kDim);
      g.m = m;
      g.n = kN;
      g.k = kHidden;
      g.bias = biased ? b.Weight(kN) : isa::kNoTensor;
      if (biased) b.FillRandom(g.bias);
      g.residual = isa::kNoTensor;
      g.epilogue = isa::kGemmRopeKvAppend;
      g.k_cache = b.Output(kKv * kSeq * kDim);
      g.v_cache = b.Output(kKv * kSeq * kDim);
      g.step_state = b.Arena(4, graph::I32);
      b.SetState(g.step_state, 3, static_cast<int32_t>(m) + 3);
      g.rope_table = b.Weight(kDim / 2 + 1, graph::F32);
      b.FillRandom(g.rope_table, 0.001f, 1.0f);
      g.qk_norm = isa::kNoTensor;
      if (normed) {
        g.qk_norm = b.Weight(2 * kDim);
        b.FillRandom(g.qk_norm, 0.5f, 1.5f);
        g.norm_eps = 1e-6f;
      }
      g.num_kv_heads = kKv;
      g.head_dim = kDim;
      g.max_seq = kSeq;
      std::vector<isa::Instruction> queue;
      for (uint32_t mt = 0; mt < isa::GemmTiles(m); ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmTiles(kN); ++nt) {
          g.m_tile = mt;
          g.n_tile = nt;
          queue.push_back(Make(isa::Opcode::GEMM, g));
        }
      }
      b.RunAndCompare(queue, absl::StrCat("GEMM RoPE + KV append, ", m, " tokens", biased ? ", biases" : "",
                                          normed ? ", head norms" : "", ", head_dim ", kDim, " seed ", seed));
    }
  }
}

// FLASH_ATTN: causal prefill attention on the tensor cores against the f32 reference (which rounds q, K and V
// to bf16 as the tensor cores read them; P is bf16 on the device only, hence the looser tolerance), every
// (row tile, head) of a prompt of P rows after `start` cached positions, GQA groups 1 / 4 / 8, head_dim 64 and
// 128. Cache rows past the prompt are NaN: a key tile reaching past the last position must not read them.
TEST(GpuOpcodes, FlashAttentionPrefill) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t rows, head_dim, group, kv_heads, start; };
  // Several key tiles per warpgroup (128 / 64 start 64 / 256): the loop-carried softmax state across tiles.
  const std::vector<Case> cases = {{1, 64, 1, 2, 0},    {17, 128, 4, 2, 0},  {64, 64, 8, 1, 0},  {128, 64, 1, 1, 0},
                                   {64, 64, 1, 1, 64},  {256, 128, 1, 1, 0},
                                   {129, 128, 1, 3, 40}, {1000, 128, 4, 2, 0}, {300, 64, 8, 1, 700},
                                   {2048, 64, 1, 2, 0},  {2048, 128, 8, 1, 0}};
  for (const Case& c : cases) {
    const uint32_t seed = Seed();
    OpBench b(seed);
    const uint32_t heads = c.group * c.kv_heads, hd = c.head_dim;
    const uint32_t max_seq = c.start + c.rows + 37;  // not a multiple of the 64-key tile
    isa::FlashAttnArgs a{};
    a.q = b.Arena(uint64_t{c.rows} * heads * hd);
    b.FillRandom(a.q, -2.0f, 2.0f);
    a.k_cache = b.Arena(uint64_t{c.kv_heads} * max_seq * hd);
    a.v_cache = b.Arena(uint64_t{c.kv_heads} * max_seq * hd);
    b.FillRandom(a.k_cache, -2.0f, 2.0f);
    b.FillRandom(a.v_cache);
    for (uint32_t g = 0; g < c.kv_heads; ++g) {
      for (uint64_t i = (uint64_t{g} * max_seq + c.start + c.rows) * hd; i < uint64_t{g + 1} * max_seq * hd; ++i) {
        b.Data<float>(a.k_cache)[i] = NAN;
        b.Data<float>(a.v_cache)[i] = NAN;
      }
    }
    a.step_state = b.Arena(4, graph::I32);
    b.SetState(a.step_state, static_cast<int32_t>(c.start), static_cast<int32_t>(c.start + c.rows));
    a.out = b.Output(isa::GemmImageBytes(c.rows, heads * hd) / 2, graph::BF16);
    a.rows = c.rows;
    a.num_heads = heads;
    a.num_kv_heads = c.kv_heads;
    a.head_dim = hd;
    a.max_seq = max_seq;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<isa::Instruction> queue;
    for (uint32_t t = 0; t * isa::kFlashRows < c.rows; ++t) {
      for (uint32_t h = 0; h < heads; ++h) {
        a.row_tile = t;
        a.head = h;
        queue.push_back(Make(isa::Opcode::FLASH_ATTN, a));
      }
    }
    b.RunAndCompare(queue, absl::StrCat("FLASH_ATTN P ", c.rows, " head_dim ", hd, " group ", c.group, " start ",
                                        c.start, " seed ", seed), kBf16OutputTolerance);
  }
}

// A prefill MLP block on the tensor cores: PACK_ROWS (RMSNorm) -> GEMM over interleaved gate/up rows with the
// SiLU-mul epilogue writing the next GEMM's operand image -> GEMM down-proj + residual, each stage behind the
// previous one's barrier.
TEST(GpuOpcodes, PrefillMlpBlockOnTensorCores) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, hidden, inter; };
  for (const Case& c : {Case{7, 256, 512}, Case{200, 576, 1536}}) {
    const uint32_t seed = Seed();
    OpBench b(seed);
    const uint32_t x = b.Arena(uint64_t{c.m} * c.hidden);
    b.FillRandom(x);
    isa::PackRowsArgs p{x, b.Arena(isa::GemmImageBytes(c.m, c.hidden) / 2, graph::BF16), c.m, c.hidden, 0,
                        isa::GemmTiles(c.m) * isa::kGemmTileM, b.Weight(c.hidden), 1e-5f};
    b.FillRandom(p.norm_weight, 0.5f, 1.5f);
    std::vector<isa::Instruction> queue;
    isa::Instruction pack = Make(isa::Opcode::PACK_ROWS, p);
    pack.signal = 0;
    queue.push_back(pack);
    isa::GemmArgs up{};  // rows interleave (gate, up)
    up.a = p.out;
    up.weight = b.RandomOperandImage(isa::kWeightRegion, 2 * c.inter, c.hidden, 0.1f);
    up.out = b.Arena(isa::GemmImageBytes(c.m, c.inter) / 2, graph::BF16);
    up.m = c.m;
    up.n = 2 * c.inter;
    up.k = c.hidden;
    up.bias = up.residual = isa::kNoTensor;
    up.epilogue = isa::kGemmSiluMulToImage;
    const uint32_t up_tiles = isa::GemmTiles(c.m) * isa::GemmTiles(up.n);
    for (uint32_t t = 0; t < up_tiles; ++t) {
      up.m_tile = t / isa::GemmTiles(up.n);
      up.n_tile = t % isa::GemmTiles(up.n);
      isa::Instruction inst = Make(isa::Opcode::GEMM, up);
      inst.signal = 1;
      inst.num_waits = 1;
      inst.waits[0] = {0, 1u | (1u << 16)};
      queue.push_back(inst);
    }
    isa::GemmArgs down{};
    down.a = up.out;
    down.weight = b.RandomOperandImage(isa::kWeightRegion, c.hidden, c.inter, 0.1f);
    down.out = b.Output(uint64_t{c.m} * c.hidden);
    down.m = c.m;
    down.n = c.hidden;
    down.k = c.inter;
    down.bias = isa::kNoTensor;
    down.residual = x;
    for (uint32_t t = 0; t < isa::GemmTiles(c.m) * isa::GemmTiles(c.hidden); ++t) {
      down.m_tile = t / isa::GemmTiles(c.hidden);
      down.n_tile = t % isa::GemmTiles(c.hidden);
      isa::Instruction inst = Make(isa::Opcode::GEMM, down);
      inst.num_waits = 1;
      inst.waits[0] = {1, up_tiles | (up_tiles << 16)};
      queue.push_back(inst);
    }
    b.RunAndCompare(queue, absl::StrCat("MLP block M ", c.m, " hidden ", c.hidden, " intermediate ", c.inter,
                                        " seed ", seed),
                    kBf16ChainTolerance);
  }
}

// Split-KV decode attention, the reduce as ATTN_REDUCE instructions or folded into the last split of each KV head
// (an arrival counter per KV head, zero again afterwards: compared too).
TEST(GpuOpcodes, AttentionPartialsAndReduceAtSeveralContextLengths) {
  SKIP_WITHOUT_GPU();
  // Groups of 4 heads of 64 (merged a thread per element), 8 of 64 (two elements a thread), 8 of 128 (four).
  struct Heads { uint32_t heads, kv, dim; };
  for (const Heads& shape : {Heads{8, 2, 64}, Heads{16, 2, 64}, Heads{16, 2, 128}}) {
    for (uint32_t position : {0u, 5u, 63u, 200u, 1000u}) {
      // 1 split at 200, 1 or 3 at 1000: K and V do not fit the slot; they come through it in chunks (5 to 63).
      for (uint32_t splits : {1u, 3u, 16u, 40u}) {
        for (bool fused : {false, true}) {
          const uint32_t seed = Seed();
          OpBench b(seed);
          const uint32_t kHeads = shape.heads, kKv = shape.kv, kDim = shape.dim, kSeq = 1024;
          const uint32_t q = b.Arena(kHeads * kDim), kc = b.Arena(kKv * kSeq * kDim), vc = b.Arena(kKv * kSeq * kDim);
          b.FillRandom(q);
          b.FillRandom(kc);
          b.FillRandom(vc);
          const uint32_t state = b.Arena(4, graph::I32);
          b.SetState(state, static_cast<int32_t>(position), 1);
          const uint32_t po = b.Output(splits * kHeads * kDim), pml = b.Output(splits * kHeads * 2);
          const uint32_t out = b.Output(kHeads * kDim);
          const uint32_t arrivals = fused ? b.Output(kKv, graph::I32) : isa::kNoTensor;
          if (fused) std::memset(b.Data<uint8_t>(arrivals), 0, kKv * 4);
          std::vector<isa::Instruction> queue;
          for (uint32_t g = 0; g < kKv; ++g) {
            for (uint32_t s = 0; s < splits; ++s) {
              // With many splits, a few positions each at least: short contexts fill (and the fused reduce merges)
              // only the first few (26 of 40 at position 200: merged in one round trip with 8 heads of 64).
              const uint32_t min_positions = splits == 16 ? 16 : splits == 40 ? 8 : 0;
              queue.push_back(Make(isa::Opcode::ATTN_PARTIAL,
                                   isa::AttnPartialArgs{q, kc, vc, state, po, pml, g, s, splits, kHeads, kKv, kDim,
                                                        kSeq, 0.125f, fused ? out : isa::kNoTensor, arrivals,
                                                        min_positions}));
            }
          }
          for (uint32_t g = 0; g < kKv && !fused; ++g) {
            queue.push_back(Make(isa::Opcode::ATTN_REDUCE, isa::AttnReduceArgs{po, pml, out, g * kHeads / kKv,
                                                                               kHeads / kKv, splits, kHeads, kDim}));
          }
          b.RunAndCompare(queue,
                          absl::StrCat("attention ", kHeads, "/", kKv, " heads of ", kDim, " position ", position,
                                       " splits ", splits, fused ? " reduce fused" : "", " seed ", seed));
        }
      }
    }
  }
}

TEST(GpuOpcodes, VectorOpcodes) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = Seed();
  OpBench b(seed);
  constexpr uint32_t kN = 1000, kVocab = 50, kHidden = 384, kSeq = 16;
  std::vector<isa::Instruction> queue;
  // EMBED
  constexpr uint32_t kStride = 512;  // rows padded as a tied LM head's are
  const uint32_t table = b.Weight(kVocab * kStride);
  b.FillRandom(table);
  const uint32_t tokens = b.Arena(kSeq + 1, graph::I32);
  for (uint32_t i = 0; i <= kSeq; ++i) b.Data<int32_t>(tokens)[i] = static_cast<int32_t>(b.rng()() % kVocab);
  const uint32_t state = b.Arena(4, graph::I32);
  b.SetState(state, 3, 2);
  queue.push_back(Make(isa::Opcode::EMBED, isa::EmbedArgs{table, tokens, state, b.Output(kHidden), kHidden, kVocab, kStride, 0, 1}));
  // EMBED of several prompt rows (a prefill pass)
  queue.push_back(Make(isa::Opcode::EMBED, isa::EmbedArgs{table, tokens, state, b.Output(7 * kHidden), kHidden, kVocab, kStride, 2, 5}));
  // RMS_NORM
  const uint32_t x = b.Arena(kN), w = b.Weight(kN);
  b.FillRandom(x);
  b.FillRandom(w);
  queue.push_back(Make(isa::Opcode::RMS_NORM, isa::RmsNormArgs{x, w, b.Output(kN), kN, 1e-5f}));
  // SILU_MUL, ADD over part of the vectors
  const uint32_t y = b.Arena(kN);
  b.FillRandom(y, -4.0f, 4.0f);
  queue.push_back(Make(isa::Opcode::SILU_MUL, isa::SiluMulArgs{x, y, b.Output(kN), 100, 777}));
  queue.push_back(Make(isa::Opcode::ADD, isa::AddArgs{x, y, b.Output(kN), 0, kN}));
  // ROPE_KV_APPEND: 4 heads, 2 KV heads, dim 32; then 10 heads, 2 KV heads, dim 128 with per-head norms
  const uint32_t qi = b.Arena(4 * 32), ki = b.Arena(2 * 32), vi = b.Arena(2 * 32), freq = b.Weight(16 + 1, graph::F32);
  b.FillRandom(qi);
  b.FillRandom(ki);
  b.FillRandom(vi);
  b.FillRandom(freq, 0.01f, 1.0f);
  queue.push_back(Make(isa::Opcode::ROPE_KV_APPEND,
                       isa::RopeAppendArgs{qi, ki, vi, b.Output(4 * 32), b.Output(2 * kSeq * 32), b.Output(2 * kSeq * 32),
                                           state, freq, 4, 2, 32, kSeq, isa::kNoTensor, isa::kNoTensor, 0.0f}));
  const uint32_t qn = b.Arena(10 * 128), kn = b.Arena(2 * 128), vn = b.Arena(2 * 128), table128 = b.Weight(65, graph::F32);
  const uint32_t q_norm = b.Weight(128), k_norm = b.Weight(128);
  for (uint32_t t : {qn, kn, vn, q_norm, k_norm}) b.FillRandom(t);
  b.FillRandom(table128, 0.001f, 1.0f);
  queue.push_back(Make(isa::Opcode::ROPE_KV_APPEND,
                       isa::RopeAppendArgs{qn, kn, vn, b.Output(10 * 128), b.Output(2 * kSeq * 128),
                                           b.Output(2 * kSeq * 128), state, table128, 10, 2, 128, kSeq, q_norm, k_norm,
                                           1e-6f}));
  // ARGMAX_PARTIAL x 3, then ARGMAX_REDUCE (writes tokens and the state: compared as outputs too)
  const uint32_t partials = b.Output(2 * 3);
  for (uint32_t t = 0; t < 3; ++t) {
    queue.push_back(Make(isa::Opcode::ARGMAX_PARTIAL, isa::ArgmaxPartialArgs{y, t * 333, 333, partials, t}));
  }
  queue.push_back(Make(isa::Opcode::ARGMAX_REDUCE, isa::ArgmaxReduceArgs{partials, 3, state, tokens, kSeq}));
  b.RunAndCompare(queue, absl::StrCat("vector opcodes, seed ", seed));
}

// ---- whole schedules --------------------------------------------------------

class GpuSchedules : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!GpuAvailable(&why)) GTEST_SKIP() << why;
    Load("random:tiny");
  }
  void Load(const std::string& spec, int max_seq = 64) {
    graph::ModelOptions mo;
    mo.max_seq = max_seq;
    absl::StatusOr<graph::Model> m = graph::LoadModel(spec, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<graph::Model>(*std::move(m));
  }

  void Check(const scheduler::CompileOptions& options, int steps_per_launch, const std::string& what) {
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, model_->spec, options);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::vector<int32_t> prompt = {17, 923, 4, 512};
    const int steps = static_cast<int>(prompt.size()) - 1 + 32;
    absl::StatusOr<std::unique_ptr<ReferenceVm>> vm = ReferenceVm::Create(*s, model_->weights);
    ASSERT_TRUE(vm.ok());
    ASSERT_TRUE((*vm)->Reset(prompt).ok());
    ASSERT_TRUE((*vm)->Run(steps).ok());
    GpuRunOptions gpu;
    gpu.steps_per_launch = steps_per_launch;
    absl::StatusOr<GpuRunResult> r = RunOnGpu(*s, model_->weights, prompt, steps, gpu);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status();
    EXPECT_EQ(r->tokens, (*vm)->tokens()) << what;
    EXPECT_LE(RelativeError(r->logits, (*vm)->logits()), kTolerance) << what << ": last step's logits";
  }

  std::unique_ptr<graph::Model> model_;
};

TEST_F(GpuSchedules, EveryPolicyMatchesTheVmInOneLaunchAndStepByStep) {
  for (scheduler::SmPolicy policy : {scheduler::ROUND_ROBIN, scheduler::LPT, scheduler::CRITICAL_PATH}) {
    for (uint32_t sms : {132u, 8u}) {
      scheduler::CompileOptions o;
      o.set_policy(policy);
      o.set_num_sms(sms);
      const std::string what = absl::StrCat(scheduler::SmPolicy_Name(policy), " on ", sms, " SMs");
      Check(o, 0, what + ", one launch");
      Check(o, 1, what + ", one step per launch");
    }
  }
}

TEST_F(GpuSchedules, UnfusedAndPerOpSchedulesMatchTheVm) {
  scheduler::CompileOptions o;
  o.set_num_sms(16);
  o.set_barrier_granularity(scheduler::PER_OP);
  o.set_elementwise_chunk(100);
  *o.mutable_fusion() = scheduler::AllFusionsOff();
  Check(o, 0, "unfused, per-op barriers");
}

TEST_F(GpuSchedules, EveryActivationSlotCountMatchesTheVm) {
  for (uint32_t slots = 1; slots <= 4; ++slots) {
    scheduler::CompileOptions o;
    o.set_num_sms(8);  // several instructions per SM in flight through the activation ring
    o.mutable_smem()->set_activation_slots(slots);
    Check(o, 0, absl::StrCat(slots, " activation slots"));
  }
}

// One-pass prefill of random:tiny on the GPU against the same pass on the CPU VM: the KV caches it fills, the
// residual stream after the last layer and the logits of the last prompt row (bf16 operand images on both sides,
// the device's P·V in bf16: the looser chain tolerance), the first new token, and decode after it.
TEST_F(GpuSchedules, PrefillMatchesTheVm) {
  for (const char* spec : {"random:tiny", "random:tiny-qwen3"}) {  // tiny-qwen3: per-head q/k norms
  Load(spec, 512);
  for (uint32_t sms : {132u, 8u}) {
    scheduler::CompileOptions o;
    o.set_num_sms(sms);
    absl::StatusOr<scheduler::Schedule> s = scheduler::Compile(model_->graph, model_->spec, o);
    ASSERT_TRUE(s.ok()) << s.status();
    for (uint32_t rows : {1u, 20u, 129u, 299u}) {
    // On 132 SMs also with 48 KB pages: 128 x 256 GEMM tiles (the wide kernel variant).
    for (uint32_t wide : {0u, 1u}) {
      if (wide && sms == 8) continue;
      const std::string what =
          absl::StrCat(spec, ": prefill of ", rows, " rows on ", sms, " SMs", wide ? ", wide tiles" : "");
      std::vector<int32_t> prompt;
      for (uint32_t i = 0; i < rows; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % 1000));
      // On 8 SMs with one barrier per stage and 16 KB pages, on 132 with one per row tile and stage and 32 KB pages.
      scheduler::PrefillOptions po;
      po.row_tile_barriers = sms == 8 ? scheduler::PrefillOptions::RowTileBarriers::kOff
                                      : scheduler::PrefillOptions::RowTileBarriers::kOn;
      po.page_bytes = sms == 8 ? 16384 : wide ? isa::kGemmWideStepBytes : 32768;
      absl::StatusOr<scheduler::Schedule> pass = scheduler::CompilePrefill(model_->graph, *s, rows, po);
      ASSERT_TRUE(pass.ok()) << pass.status();
      absl::StatusOr<std::unique_ptr<ReferenceVm>> vm = ReferenceVm::Create(*s, model_->weights);
      ASSERT_TRUE(vm.ok());
      ASSERT_TRUE((*vm)->Reset(prompt).ok());
      ASSERT_TRUE((*vm)->Prefill(*pass).ok());
      absl::StatusOr<std::unique_ptr<GpuDecoder>> d = GpuDecoder::Create(*s, model_->weights);
      ASSERT_TRUE(d.ok()) << d.status();
      ASSERT_TRUE((*d)->Reset(prompt).ok());
      absl::StatusOr<float> ms = (*d)->Prefill(*pass);
      ASSERT_TRUE(ms.ok()) << what << ": " << ms.status();
      for (const scheduler::Tensor& t : pass->tensors()) {
        if (t.dtype() != graph::F32 || t.region() != scheduler::ARENA ||
            !(absl::StrContains(t.name(), "cache") || t.name() == "prefill.x")) {
          continue;
        }
        std::vector<float> got(t.bytes() / 4), want(t.bytes() / 4);
        ASSERT_TRUE((*d)->machine().ReadArena(t.offset(), got.data(), t.bytes()).ok());
        const std::vector<uint8_t> vm_bytes = (*vm)->ReadArena(t.offset(), t.bytes());
        std::memcpy(want.data(), vm_bytes.data(), t.bytes());
        EXPECT_LE(RelativeError(got, want), kPrefillTolerance) << what << ": " << t.name();
      }
      absl::StatusOr<std::vector<float>> logits = (*d)->logits();
      ASSERT_TRUE(logits.ok());
      EXPECT_LE(RelativeError(*logits, (*vm)->logits()), kPrefillTolerance) << what << ": logits";
      absl::StatusOr<std::vector<int32_t>> tokens = (*d)->tokens();
      ASSERT_TRUE(tokens.ok());
      EXPECT_EQ(*tokens, (*vm)->tokens()) << what << ": the first new token";
      ASSERT_TRUE((*vm)->Run(8).ok());
      ASSERT_TRUE((*d)->Run(8).ok());
      tokens = (*d)->tokens();
      ASSERT_TRUE(tokens.ok());
      EXPECT_EQ(*tokens, (*vm)->tokens()) << what << ": decode after the prefill";
    }
    }
  }
}
}

// Every family's tiny preset (padded rows, biases, 7 heads per KV head, YaRN,
// per-head q/k norms), fused and unfused.
TEST_F(GpuSchedules, EveryFamilyMatchesTheVm) {
  for (const char* spec : {"random:tiny-mistral", "random:tiny-qwen2", "random:tiny-qwen3"}) {
    Load(spec);
    for (bool fused : {true, false}) {
      scheduler::CompileOptions o;
      o.set_num_sms(16);
      if (!fused) *o.mutable_fusion() = scheduler::AllFusionsOff();
      Check(o, 0, absl::StrCat(spec, fused ? ", fused" : ", unfused"));
    }
  }
}

}  // namespace
}  // namespace loom::megakernel
