// The GPU opcode tests' bench: a one-SM program's tensors in host memory, run once on the megakernel and
// once through the float32 CPU references, every output compared (poisoned with NaN first, fresh random
// inputs every run). Shared by the gpu_test sources; without a Hopper GPU every test skips, saying why.
#pragma once

#include <bit>
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
#include "runtime/gpu_backend.h"
#include "runtime/gpu_machine.h"
#include "runtime/reference_vm.h"
#include "scheduler/compiler.h"
#include "scheduler/prefill.h"
#include "tests/relative_error.h"
#include "scheduler/options.h"

namespace loom::megakernel::gpu_bench {

// The runtime the benches drive (runtime/).
using runtime::GpuAvailable;
using runtime::GpuMachine;
using runtime::GpuProgram;
using runtime::ReferenceVm;


// bf16 operands, float32 arithmetic in a different order than the reference.
inline constexpr double kTolerance = 1e-4;
// Chains with bf16 intermediates (measured up to 1.4e-4 from rounding alone at M = 200).
inline constexpr double kBf16ChainTolerance = 1e-3;
// Outputs that are bf16 themselves (FLASH_ATTN's operand image): one bf16 ulp is 2^-8 = 3.9e-3 relative, and the
// device's exp2 / reciprocal put some elements on the other side of a rounding boundary (measured 4-6e-3 on every
// case; a wrong tile measured 0.4-0.9).
inline constexpr double kBf16OutputTolerance = 1e-2;
// A whole prefill pass against the VM: bf16 images and attention outputs through every layer (measured 1.3e-3).
inline constexpr double kPrefillTolerance = 5e-3;
// Large enough for the biggest tiles below (160 rows at k = 8192), still fitting beside 10 pages.
inline constexpr uint32_t kActivationBytes = 48 * 1024;
inline constexpr uint32_t kPageBudget = 212 * 1024;  // shared memory for pages and the activation ring

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
  // The parts of a product of `elements` split `splits` ways over K, as the lowerings lay them out: one poisoned
  // output [splits, elements] (every part is compared too) and a view of each part, which split s stores.
  std::pair<uint32_t, std::vector<uint32_t>> SplitParts(uint32_t splits, uint64_t elements) {
    const uint32_t all = Output(splits * elements);
    std::vector<uint32_t> views;
    for (uint32_t s = 0; s < splits; ++s) {
      isa::TensorDesc d = table_[all];
      d.offset += s * elements * 4;
      d.bytes = elements * 4;
      table_.push_back(d);
      views.push_back(static_cast<uint32_t>(table_.size() - 1));
    }
    return {all, views};
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
    program.activation_bytes = activation_bytes_;
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
  // Runs `queue` once in kernel variant `variant` (forced: the program is not checked against it); the launch's
  // status.
  absl::Status RunInVariant(const std::vector<isa::Instruction>& queue, uint32_t page_bytes,
                            isa::KernelVariant variant) const {
    GpuProgram program = Program(queue, page_bytes);
    program.kernel_variant = variant;
    absl::StatusOr<std::unique_ptr<GpuMachine>> m = GpuMachine::Create(program, weights_);
    if (!m.ok()) return m.status();
    return (*m)->Run(1, false).status();
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
    } else if (table_[id].dtype == graph::F8E4M3) {  // the nearest e4m3 values (subnormals and zeros among them)
      for (uint64_t i = 0; i < table_[id].bytes; ++i) Data<uint8_t>(id)[i] = graph::FloatToE4m3(d(rng_));
    } else if (table_[id].dtype == graph::I4) {  // any byte is two 4-bit values
      for (uint64_t i = 0; i < table_[id].bytes; ++i) Data<uint8_t>(id)[i] = static_cast<uint8_t>(rng_() & 0xff);
    } else {
      for (uint64_t i = 0; i < table_[id].bytes / 4; ++i) Data<float>(id)[i] = d(rng_);
    }
  }
  // A MATVEC_W4 meta tensor for `rows` rows of `groups` groups (isa::MatvecW4Args::meta): scales uniform in [lo, hi)
  // rounded to bf16 or to float16 (each group either, as checkpoints store them), zero points random (0..15) or 8
  // (symmetric).
  uint32_t RandomW4Meta(uint32_t rows, uint32_t groups, bool zero_points, float lo = 0.01f, float hi = 0.1f) {
    const uint32_t id = Weight(uint64_t{rows} * groups, graph::I32);
    std::uniform_real_distribution<float> d(lo, hi);
    for (uint64_t i = 0; i < uint64_t{rows} * groups; ++i) {
      const uint32_t zero = zero_points ? rng_() % 16 : 8;
      const float s = d(rng_);
      const uint32_t scale = (rng_() & 1) ? uint32_t{graph::FloatToBf16(s)} << 16 : std::bit_cast<uint32_t>(graph::RoundToHalf(s));
      Data<uint32_t>(id)[i] = isa::MatvecW4MetaWord(scale, zero);
    }
    return id;
  }
  std::mt19937& rng() { return rng_; }
  // What a run starts from (read-only: the CPU-side checks validate against the table and run the references on
  // copies of the regions): the tensor table, the two regions' bytes, and the ids of the poisoned outputs.
  const std::vector<isa::TensorDesc>& tensors() const { return table_; }
  const std::vector<uint8_t>& weights() const { return weights_; }
  const std::vector<uint8_t>& arena() const { return arena_; }
  const std::vector<uint32_t>& outputs() const { return outputs_; }
  // bf16 outputs rounded from f32 sums: elements one bf16 step apart count as equal.
  void AllowBf16Steps() { bf16_steps_ = true; }
  // The activation ring's bytes (kActivationBytes unless set), raised to what the queue's largest instruction needs.
  void SetActivationBytes(uint32_t bytes) { activation_bytes_ = bytes; }
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
  uint32_t activation_bytes_ = kActivationBytes;
  std::mt19937 rng_;
  std::vector<uint8_t> weights_, arena_;
  std::vector<isa::TensorDesc> table_;
  std::vector<uint32_t> outputs_;
  std::map<uint32_t, uint32_t> argmax_values_;  // argmax-partials output -> the values it ranks
};

template <typename Args>
inline isa::Instruction Make(isa::Opcode op, const Args& args) {
  isa::Instruction inst{};
  inst.opcode = static_cast<uint8_t>(op);
  inst.signal = isa::kNoBarrier;
  inst.as<Args>() = args;
  return inst;
}

// SUM_SPLITS instructions adding a split product's parts (`parts`, [splits, elements]) to `base` (kNoTensor: none)
// into `out`, `chunk` elements an instruction, appended to a one-SM queue after the splits (which they follow).
inline void AppendSums(std::vector<isa::Instruction>& queue, uint32_t parts, uint32_t base, uint32_t out,
                       uint32_t elements, uint32_t splits, uint32_t chunk, uint32_t flags = 0) {
  for (uint32_t i = 0; i < elements; i += chunk) {
    queue.push_back(Make(isa::Opcode::SUM_SPLITS,
                         isa::SumSplitsArgs{parts, base, out, elements, splits, i, std::min(chunk, elements - i), flags}));
  }
}

inline uint32_t Seed() { return std::random_device{}(); }

}  // namespace loom::megakernel::gpu_bench
