// Instruction set: names, wait arithmetic, validation, and references that can
// be checked by hand.
#include "instructions/isa.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <tuple>

#include "graph/dtype.h"
#include "instructions/swizzle.h"
#include "gtest/gtest.h"

namespace loom::isa {
namespace {

TEST(Isa, EveryOpcodeHasANameThatRoundTrips) {
  for (int i = 0; i < kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    absl::StatusOr<Opcode> back = OpcodeFromName(OpcodeName(op));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, op);
    EXPECT_GT(ArgCount(op), 0);
    EXPECT_LE(ArgCount(op), kArgWords);
  }
  EXPECT_FALSE(OpcodeFromName("FLY").ok());
}

TEST(Isa, WaitTargetsAreEpochBasedAndWrapSafe) {
  Wait w{7, 3u | (5u << 16)};
  EXPECT_EQ(w.barrier(), 7u);
  EXPECT_EQ(w.target(0), 3u);
  EXPECT_EQ(w.target(4), 23u);
  Wait prev{7 | kWaitPreviousStep, 5u | (5u << 16)};
  EXPECT_TRUE(Reached(0, prev.target(0)));  // step 0 needs nothing of step -1
  EXPECT_EQ(prev.target(3), 15u);
  EXPECT_TRUE(Reached(5u, 0xfffffff0u));     // counter wrapped past the target
  EXPECT_FALSE(Reached(0xfffffff0u, 5u));
}

TEST(Isa, GroupedQkvLayoutIsAPermutationWithAdjacentRopePairs) {
  constexpr uint32_t kGroup = 3, kKv = 2, kDim = 8;
  std::set<std::tuple<uint32_t, uint32_t, uint32_t>> seen;
  for (uint32_t p = 0; p < (kGroup + 2) * kKv * kDim; ++p) {
    const QkvRow r = QkvGroupedRow(p, kGroup, kDim);
    seen.insert({r.kind, r.head, r.dim});
    if (r.kind != kQkvV && p % 2 == 1) {  // odd rows pair with the row before, half a head away
      const QkvRow prev = QkvGroupedRow(p - 1, kGroup, kDim);
      EXPECT_EQ(prev.head, r.head);
      EXPECT_EQ(prev.dim + kDim / 2, r.dim);
    }
  }
  EXPECT_EQ(seen.size(), (kGroup + 2u) * kKv * kDim);
  const QkvRow k1 = QkvGroupedRow((kGroup + 2) * kDim + kGroup * kDim + 1, kGroup, kDim);
  EXPECT_EQ(k1.kind, kQkvK);
  EXPECT_EQ(k1.head, 1u);
  EXPECT_EQ(k1.dim, kDim / 2);
}

// MATVEC_W4 rows wider than 16384 columns (multiples of 2048) go in pieces of whole pages, the last may be shorter;
// each piece's partial sums are slots of their own; such a row takes no prologue (an RMSNorm needs the whole row).
TEST(Isa, WideInt4RowsAreMultipliedInPieces) {
  EXPECT_EQ(MatvecW4Pieces(14336), 1u);
  EXPECT_EQ(MatvecW4Pieces(16384), 1u);
  EXPECT_EQ(MatvecW4PieceColumns(28672), 14336u);
  EXPECT_EQ(MatvecW4Pieces(28672), 2u);
  EXPECT_EQ(MatvecW4PieceColumns(18432), 10240u);  // 9 pages: 5 + 4
  EXPECT_EQ(MatvecW4Pieces(18432), 2u);
  EXPECT_EQ(MatvecW4PieceColumns(53248), 14336u);  // 26 pages: 7 + 7 + 7 + 5
  EXPECT_EQ(MatvecW4Pieces(53248), 4u);
  EXPECT_EQ(MatvecW4Pieces(29568), 1u);  // not whole pages a band: one piece (the whole image)
  EXPECT_EQ(MatvecW4RowSlots(28672), 16u);
  EXPECT_LT(MatvecW4ActivationBytes(16, 28672, 7), 6u * 14336 + 32 + 16 * 4 * (224 + 16) + 4 * 224 + 1);
  const uint32_t k = 28672, rows = 16, groups = MatvecW4Groups(k, 7);
  std::vector<TensorInfo> tensors = {{"w", graph::I4, uint64_t{rows} * k / 2},
                                     {"x", graph::F32, k},
                                     {"y", graph::F32, rows},
                                     {"meta", graph::I32, uint64_t{rows} * groups},
                                     {"norm", graph::BF16, k}};
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::MATVEC_W4);
  MatvecW4Args& a = inst.as<MatvecW4Args>();
  a = MatvecW4Args{};
  a.weight = 0, a.rows = rows, a.k = k, a.input = 1, a.out = 2, a.meta = 3, a.group_shift = 7, a.bias = kNoTensor;
  EXPECT_TRUE(ValidateInstruction(inst, tensors).ok()) << ValidateInstruction(inst, tensors);
  a.prologue = kPrologueRmsNorm;
  a.norm_weight = 4;
  a.norm_eps = 1e-5f;
  EXPECT_NE(ValidateInstruction(inst, tensors).message().find("pieces of 14336 columns, which take no prologue"),
            std::string::npos)
      << ValidateInstruction(inst, tensors);
}

TEST(Isa, ValidationNamesTheFieldAndTensor) {
  // Rows of 32 columns are padded to 256 in the packed weight.
  std::vector<TensorInfo> tensors = {{"w", graph::BF16, 64 * 256}, {"x", graph::F32, 32}, {"y", graph::F32, 64}};
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::MATVEC);
  MatvecArgs& a = inst.as<MatvecArgs>();
  a = MatvecArgs{};
  a.weight = 0;
  a.row_begin = 32;
  a.rows = 32;
  a.k = 32;
  a.input = 1;
  a.out = 2;
  a.bias = kNoTensor;
  EXPECT_TRUE(ValidateInstruction(inst, tensors).ok()) << ValidateInstruction(inst, tensors);
  a.rows = 33;
  absl::Status s = ValidateInstruction(inst, tensors);
  EXPECT_EQ(s.message(), "MATVEC: weight tensor 'w' has 16384 elements, instruction reaches 16640");
  a.rows = 32;
  a.bias = 1;
  EXPECT_EQ(ValidateInstruction(inst, tensors).message(), "MATVEC: bias tensor 'x' is F32, needs BF16");
  a.bias = kNoTensor;
  a.k = 30;
  EXPECT_EQ(ValidateInstruction(inst, tensors).message(), "MATVEC: k = 30 must be a multiple of 4");
  a.k = 32;
  a.rows = 32;
  a.out = 9;
  EXPECT_EQ(ValidateInstruction(inst, tensors).message(), "MATVEC: out names tensor 9, the table has 3");
  a.out = 0;
  EXPECT_EQ(ValidateInstruction(inst, tensors).message(), "MATVEC: out tensor 'w' is BF16, needs F32");
  a.out = 2;
  a.epilogue = 17;
  EXPECT_FALSE(ValidateInstruction(inst, tensors).ok());
  inst.opcode = 200;
  EXPECT_FALSE(ValidateInstruction(inst, tensors).ok());
}

// A tiny machine: one arena of floats/ints, one weight region of bf16.
struct TestMachine {
  std::vector<uint8_t> weights, arena;
  std::vector<TensorDesc> table;
  uint32_t Add(Region region, uint64_t bytes, graph::DType dtype) {
    std::vector<uint8_t>& r = region == kWeightRegion ? weights : arena;
    table.push_back({r.size(), bytes, region, static_cast<uint32_t>(dtype)});
    r.resize(r.size() + (bytes + 15) / 16 * 16);
    return static_cast<uint32_t>(table.size() - 1);
  }
  MachineView view() { return {{weights.data(), arena.data()}, table.data(), static_cast<uint32_t>(table.size())}; }
};

// A matvec slot is summed by one consumer warp: 1024-column slots need 16 KB multiples of page, 256-column ones 4 KB.
TEST(Isa, MatvecSlotsFitOneWarpsShareOfAPage) {
  EXPECT_TRUE(MatvecSlotsFitPages(2048, 16384));
  EXPECT_TRUE(MatvecSlotsFitPages(2048, 32768));
  EXPECT_TRUE(MatvecSlotsFitPages(8192, 49152));
  EXPECT_FALSE(MatvecSlotsFitPages(2048, 8192));
  EXPECT_FALSE(MatvecSlotsFitPages(1000, 12288));  // padded to 1024
  EXPECT_FALSE(MatvecSlotsFitPages(3072, 20480));
  EXPECT_TRUE(MatvecSlotsFitPages(5632, 8192));  // 256-column slots
  EXPECT_TRUE(MatvecSlotsFitPages(768, 4096));
  EXPECT_FALSE(MatvecSlotsFitPages(768, 2048));
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::MATVEC);
  inst.as<MatvecArgs>().k = 2048;
  const absl::Status st = CheckPageBytes(inst, 8192);
  EXPECT_NE(st.message().find("a warp's share of a 8192-byte page is 512 columns: smem.page_bytes must be a multiple "
                              "of 16384"),
            std::string::npos)
      << st;
  EXPECT_TRUE(CheckPageBytes(inst, 16384).ok());
}

// The chunked slot of a split whose rows do not fit (isa::AttnChunkLayout): the largest chunk that fits is what
// AttnChunkPositions returns, its regions do not overlap, and a slot too small for kAttnMinChunk positions has none.
TEST(Isa, AttentionChunkLayoutFitsTheSlot) {
  for (uint32_t kv_bytes : {4u, 2u}) {  // f32 and bf16 caches
    for (uint32_t group : {1u, 4u, 8u}) {
      for (uint32_t hd : {64u, 128u}) {
        for (uint64_t bytes : {4096ull, 30720ull, 47104ull, 59392ull}) {
          const uint32_t chunk = AttnChunkPositions(group, hd, bytes, kv_bytes);
          if (chunk == 0) {
            EXPECT_GT(AttnChunkLayout(group, hd, kAttnMinChunk, kv_bytes).bytes, bytes) << group << " " << hd;
            continue;
          }
          const AttnChunkSlot s = AttnChunkLayout(group, hd, chunk, kv_bytes);
          EXPECT_LE(s.bytes, bytes);
          EXPECT_GT(AttnChunkLayout(group, hd, chunk + 1, kv_bytes).bytes + 16, bytes);  // (16 bytes kept spare)
          EXPECT_GE(s.scores, s.q + 4ull * group * hd);
          EXPECT_GE(s.red, s.scores + 4ull * group * chunk);
          EXPECT_GE(s.alpha, s.red + 4ull * group * kAttnThreads);
          EXPECT_GE(s.k, s.alpha + 4ull * group);
          EXPECT_EQ(s.v - s.k, uint64_t{kv_bytes} * kAttnChunkBuffers * chunk * hd);
          EXPECT_EQ(s.k % 16, 0u);
          EXPECT_EQ(s.v % 16, 0u);
        }
      }
    }
  }
  // Llama-3.2-1B's split at context 4096 (4 heads of 64 a KV head, 256 positions) in the default 46 KB slot: its
  // rows come in chunks, of bf16 rows twice as many a chunk as of f32 ones, nearly.
  EXPECT_GT(AttnPartialLayout(4, 64, 256, true, 4).bytes, 47104u);
  EXPECT_GE(AttnChunkPositions(4, 64, 47104, 4), 32u);
  EXPECT_GT(AttnChunkPositions(4, 64, 47104, 2), 15 * AttnChunkPositions(4, 64, 47104, 4) / 8);
}

TEST(IsaReference, AttentionSplitsRecombineToTheFullSoftmax) {
  constexpr uint32_t kHeads = 4, kKv = 2, kDim = 8, kSeq = 16, kSplits = 3, kPos = 10;
  TestMachine tm;
  const uint32_t q = tm.Add(kArenaRegion, 4 * kHeads * kDim, graph::F32);
  const uint32_t kc = tm.Add(kArenaRegion, 4 * kKv * kSeq * kDim, graph::F32);
  const uint32_t vc = tm.Add(kArenaRegion, 4 * kKv * kSeq * kDim, graph::F32);
  const uint32_t state = tm.Add(kArenaRegion, 16, graph::I32);
  const uint32_t po = tm.Add(kArenaRegion, 4 * kSplits * kHeads * kDim, graph::F32);
  const uint32_t pml = tm.Add(kArenaRegion, 4 * kSplits * kHeads * 2, graph::F32);
  const uint32_t out = tm.Add(kArenaRegion, 4 * kHeads * kDim, graph::F32);
  MachineView m = tm.view();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1, 1);
  for (uint32_t i = 0; i < kHeads * kDim; ++i) m.ptr<float>(q)[i] = d(rng);
  for (uint32_t i = 0; i < kKv * kSeq * kDim; ++i) m.ptr<float>(kc)[i] = d(rng), m.ptr<float>(vc)[i] = d(rng);
  m.ptr<int32_t>(state)[kStatePosition] = kPos;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  // Splits of at least min_positions: 11 positions in 3 splits of 4 (0, 2), of 5 + 5 + 1 (5), all in the first (11).
  for (uint32_t min_positions : {0u, 2u, 5u, 11u}) {
    SCOPED_TRACE(min_positions);
    EXPECT_EQ(ActiveSplits(kPos + 1, kSplits, min_positions), min_positions == 11 ? 1u : 3u);
    for (uint32_t g = 0; g < kKv; ++g) {
      for (uint32_t s = 0; s < kSplits; ++s) {
        Instruction inst{};
        inst.opcode = static_cast<uint8_t>(Opcode::ATTN_PARTIAL);
        inst.as<AttnPartialArgs>() = {q, kc, vc, state, po, pml, g, s, kSplits, kHeads, kKv, kDim, kSeq, scale};
        inst.as<AttnPartialArgs>().min_positions = min_positions;
        ExecuteReference(inst, m);
      }
    }
    Instruction reduce{};
    reduce.opcode = static_cast<uint8_t>(Opcode::ATTN_REDUCE);
    reduce.as<AttnReduceArgs>() = {po, pml, out, 0, kHeads, kSplits, kHeads, kDim};
    ExecuteReference(reduce, m);
    for (uint32_t h = 0; h < kHeads; ++h) {
      const uint32_t g = h / (kHeads / kKv);
      std::vector<double> p(kPos + 1);
      double mx = -1e30, sum = 0;
      for (uint32_t t = 0; t <= kPos; ++t) {
        double s = 0;
        for (uint32_t j = 0; j < kDim; ++j)
          s += m.ptr<float>(q)[h * kDim + j] * m.ptr<float>(kc)[(g * kSeq + t) * kDim + j];
        p[t] = s * scale;
        mx = std::max(mx, p[t]);
      }
      for (double& v : p) sum += (v = std::exp(v - mx));
      for (uint32_t j = 0; j < kDim; ++j) {
        double o = 0;
        for (uint32_t t = 0; t <= kPos; ++t) o += p[t] / sum * m.ptr<float>(vc)[(g * kSeq + t) * kDim + j];
        EXPECT_NEAR(m.ptr<float>(out)[h * kDim + j], o, 1e-5);
      }
    }
  }
}

// ARGMAX_REDUCE with the next step's EMBED folded in: its table and row checked as the EMBED's are; the reference
// leaves the row to that EMBED (the VM runs it every step).
TEST(Isa, ArgmaxReduceChecksTheFoldedEmbedding) {
  std::vector<TensorInfo> tensors = {{"partials", graph::F32, 6}, {"state", graph::I32, kStepStateWords},
                                     {"tokens", graph::I32, 5},   {"table", graph::BF16, 10 * 256},
                                     {"x", graph::F32, 32},       {"small", graph::F32, 16}};
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::ARGMAX_REDUCE);
  ArgmaxReduceArgs& a = inst.as<ArgmaxReduceArgs>();
  a = {0, 3, 1, 2, 4};
  EXPECT_EQ(a.embed_out, kNoTensor);  // (none unless set)
  EXPECT_TRUE(ValidateInstruction(inst, tensors).ok());
  a.embed_table = 3, a.embed_out = 4, a.hidden = 32, a.vocab = 10, a.row_stride = 256;
  EXPECT_TRUE(ValidateInstruction(inst, tensors).ok()) << ValidateInstruction(inst, tensors);
  a.embed_out = 5;
  EXPECT_EQ(ValidateInstruction(inst, tensors).message(),
            "ARGMAX_REDUCE: embed_out tensor 'small' has 16 elements, instruction reaches 32");
  a.embed_out = 4, a.vocab = 11;
  EXPECT_EQ(ValidateInstruction(inst, tensors).message(),
            "ARGMAX_REDUCE: embed_table tensor 'table' has 2560 elements, instruction reaches 2816");
  a.vocab = 10, a.row_stride = 16;
  EXPECT_FALSE(ValidateInstruction(inst, tensors).ok());  // rows shorter than hidden
}

TEST(IsaReference, ArgmaxReduceForcesPromptThenGeneratesAndStopsAtCapacity) {
  TestMachine tm;
  const uint32_t partials = tm.Add(kArenaRegion, 4 * 6, graph::F32);
  const uint32_t state = tm.Add(kArenaRegion, 16, graph::I32);
  const uint32_t tokens = tm.Add(kArenaRegion, 4 * 5, graph::I32);
  MachineView m = tm.view();
  const float p[6] = {1.0f, 7.0f, 3.0f, 2.0f, 3.0f, 1.0f};  // tie at 3.0: index 1 beats 2
  std::copy(p, p + 6, m.ptr<float>(partials));
  int32_t* st = m.ptr<int32_t>(state);
  int32_t* tok = m.ptr<int32_t>(tokens);
  st[kStatePosition] = 0;
  st[kStatePromptLength] = 2;
  tok[0] = 5;
  tok[1] = 6;
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::ARGMAX_REDUCE);
  inst.as<ArgmaxReduceArgs>() = {partials, 3, state, tokens, 4};
  ExecuteReference(inst, m);
  EXPECT_EQ(st[kStatePosition], 1);
  EXPECT_EQ(tok[1], 6);  // still the prompt
  ExecuteReference(inst, m);
  EXPECT_EQ(tok[2], 1);
  ExecuteReference(inst, m);
  ExecuteReference(inst, m);
  EXPECT_EQ(st[kStatePosition], 3);
  EXPECT_EQ(st[kStateOverflow], 1);
}

// Every opcode of the table runs in the variant KernelVariantOf names for it (the device switch gates each case on
// VariantCompiles), and in no variant that lacks its code.
TEST(KernelVariants, EveryOpcodeIsCompiledWhereItsInstructionsRun) {
  for (int i = 0; i < kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    EXPECT_TRUE(VariantCompiles(KernelVariantOf(op), op)) << OpcodeName(op);
  }
  EXPECT_FALSE(VariantCompiles(kDecodeKernel, Opcode::GEMM));
  EXPECT_FALSE(VariantCompiles(kDecodeKernel, Opcode::PACK_ROWS));
  EXPECT_TRUE(VariantCompiles(kWideKernel, Opcode::FLASH_ATTN));
  EXPECT_TRUE(VariantCompiles(kGraphKernel, Opcode::GEMM));
  EXPECT_FALSE(VariantCompiles(kWideKernel, Opcode::CONV_GEMM));
  EXPECT_FALSE(VariantCompiles(kTensorKernel, Opcode::ELEMENTWISE));
  EXPECT_TRUE(VariantCompiles(kDecodeKernel, Opcode::CONV1D));

  Instruction wide{};
  wide.opcode = static_cast<uint8_t>(Opcode::GEMM);
  wide.as<GemmArgs>().wide = 1;
  EXPECT_TRUE(VariantRuns(kWideKernel, wide));
  EXPECT_FALSE(VariantRuns(kTensorKernel, wide)) << "a wide tile in the 128-column variant";
  Instruction fused{};
  fused.opcode = static_cast<uint8_t>(Opcode::ATTN_PARTIAL);
  fused.as<AttnPartialArgs>().out = 5;
  EXPECT_FALSE(VariantRuns(kDecodeKernel, fused)) << "the fused reduce is not in the decode variant";
  EXPECT_TRUE(VariantRuns(kTensorKernel, fused));
  EXPECT_TRUE(VariantRuns(kGraphKernel, fused));
}

}  // namespace
}  // namespace loom::isa

namespace loom::isa {
namespace {

std::vector<uint16_t> RandomBf16(std::mt19937& rng, uint64_t n) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = graph::FloatToBf16(d(rng));
  return v;
}

// The GEMM reference reads the swizzled images; it must equal a plain product of the matrices they hold
// (so the GPU test, which compares the device with this reference, compares it with the real product).
TEST(IsaReference, GemmOverImagesIsThePlainProduct) {
  constexpr uint32_t kM = 130, kN = 200, kK = 100;
  std::mt19937 rng(11);
  const std::vector<uint16_t> a = RandomBf16(rng, kM * kK), w = RandomBf16(rng, kN * kK), bias = RandomBf16(rng, kN);
  const std::vector<uint16_t> a_image = PackSwizzled(a.data(), kM, kK, kGemmTileM, Swizzle::k128B);
  const std::vector<uint16_t> w_image = PackSwizzled(w.data(), kN, kK, kGemmTileN, Swizzle::k128B);
  TestMachine tm;
  const uint32_t ta = tm.Add(kArenaRegion, a_image.size() * 2, graph::BF16);
  const uint32_t tw = tm.Add(kWeightRegion, w_image.size() * 2, graph::BF16);
  const uint32_t tb = tm.Add(kWeightRegion, kN * 2, graph::BF16);
  const uint32_t tr = tm.Add(kArenaRegion, kM * kN * 4, graph::F32);
  const uint32_t out = tm.Add(kArenaRegion, kM * kN * 4, graph::F32);
  MachineView m = tm.view();
  std::copy(a_image.begin(), a_image.end(), m.ptr<uint16_t>(ta));
  std::copy(w_image.begin(), w_image.end(), m.ptr<uint16_t>(tw));
  std::copy(bias.begin(), bias.end(), m.ptr<uint16_t>(tb));
  for (uint32_t i = 0; i < kM * kN; ++i) m.ptr<float>(tr)[i] = static_cast<float>(i % 7) - 3.0f;
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::GEMM);
  GemmArgs& g = inst.as<GemmArgs>();
  g = {ta, tw, out, kM, kN, kK, 0, tb, tr, kGemmStoreF32};
  std::vector<TensorInfo> infos;
  for (const TensorDesc& t : tm.table) infos.push_back({"t", static_cast<graph::DType>(t.dtype), t.bytes / (t.dtype == graph::BF16 ? 2 : 4)});
  for (uint32_t wide : {0u, 1u}) {  // 128-column tiles, then 256-column ones (one for 200 columns)
    std::fill(m.ptr<float>(out), m.ptr<float>(out) + kM * kN, -1e30f);
    g.wide = wide;
    for (uint32_t mt = 0; mt < GemmTiles(kM); ++mt) {
      for (uint32_t nt = 0; nt < GemmColumnTiles(kN, wide); ++nt) {
        g.tile = GemmTileOf(mt, nt);
        ASSERT_TRUE(ValidateInstruction(inst, infos).ok()) << ValidateInstruction(inst, infos);
        ExecuteReference(inst, m);
      }
    }
    for (uint32_t r = 0; r < kM; ++r) {
      for (uint32_t c = 0; c < kN; ++c) {
        float want = 0.0f;
        for (uint32_t x = 0; x < kK; ++x) want += graph::Bf16ToFloat(a[r * kK + x]) * graph::Bf16ToFloat(w[c * kK + x]);
        want += graph::Bf16ToFloat(bias[c]) + m.ptr<float>(tr)[r * kN + c];
        ASSERT_NEAR(m.ptr<float>(out)[r * kN + c], want, 1e-4) << r << "," << c << " wide " << wide;
      }
    }
  }
  g.tile = GemmTileOf(1, 1);  // one wide tile for 200 columns
  EXPECT_EQ(ValidateInstruction(inst, infos).message(),
            "GEMM: tile (1, 1) outside the 2 x 1 output tiles of 256 columns");
  g.tile = GemmTileOf(0, 0);
  g.epilogue = kGemmRopeKvAppend;
  EXPECT_NE(ValidateInstruction(inst, infos).message().find("the RoPE epilogue takes 128-column tiles only"),
            std::string::npos);
  g.epilogue = kGemmStoreF32;
  g.wide = 2;
  EXPECT_NE(ValidateInstruction(inst, infos).message().find("wide must be 0 or 1, not 2"), std::string::npos);
  g.wide = 0;
  g.tile = GemmTileOf(2, 1);  // only tiles 0..1 exist for 130 rows
  EXPECT_EQ(ValidateInstruction(inst, infos).message(), "GEMM: tile (2, 1) outside the 2 x 2 output tiles");
  g.tile = GemmTileOf(0, 1);
  g.epilogue = kGemmSiluMulToImage;  // 200 / 2 = 100 is not a whole slab: its image would need zero padding
  EXPECT_NE(ValidateInstruction(inst, infos).message().find("SiLU-mul pairs need n a multiple of 128"),
            std::string::npos);
}

// PACK_ROWS writes exactly the image PackSwizzled makes of the bf16 rows, padding zeroed over stale bytes.
TEST(IsaReference, PackRowsWritesThePackSwizzledImage) {
  constexpr uint32_t kM = 150, kK = 72;
  std::mt19937 rng(5);
  const std::vector<uint16_t> rows = RandomBf16(rng, kM * kK);  // exact in bf16: no rounding in the check
  TestMachine tm;
  const uint32_t in = tm.Add(kArenaRegion, kM * kK * 4, graph::F32);
  const uint64_t image_elems = GemmImageBytes(kM, kK) / 2;
  const uint32_t out = tm.Add(kArenaRegion, image_elems * 2, graph::BF16);
  MachineView m = tm.view();
  for (uint32_t i = 0; i < kM * kK; ++i) m.ptr<float>(in)[i] = graph::Bf16ToFloat(rows[i]);
  std::fill(m.ptr<uint16_t>(out), m.ptr<uint16_t>(out) + image_elems, uint16_t{0x7fc0});  // stale NaNs
  Instruction inst{};
  inst.opcode = static_cast<uint8_t>(Opcode::PACK_ROWS);
  inst.as<PackRowsArgs>() = {in, out, kM, kK, 0, GemmTiles(kM) * kGemmTileM, kNoTensor, 0.0f};
  ExecuteReference(inst, m);
  const std::vector<uint16_t> want = PackSwizzled(rows.data(), kM, kK, kGemmTileM, Swizzle::k128B);
  ASSERT_EQ(want.size(), image_elems);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), m.ptr<uint16_t>(out)));
}

// A norm deferred to the GEMM (PACK_ROWS by column slices with row_norm, GEMM scaling its rows) gives the product
// of the normed rows: x after the parts' fold bitwise the whole-row fold's, the product within bf16 rounding of the
// whole-row norm's (the image is rounded before the scale instead of after). And the slices' limits are refused.
TEST(IsaReference, DeferredNormMatchesTheWholeRowNorm) {
  constexpr uint32_t kM = 37, kK = 320, kN = 128, kSplits = 3, kCols = 128;  // slices of 128, 128 and 64
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  TestMachine tm;
  auto f32 = [&](uint64_t n) { return tm.Add(kArenaRegion, n * 4, graph::F32); };
  const uint32_t x[2] = {f32(uint64_t{kM} * kK), f32(uint64_t{kM} * kK)}, parts = f32(uint64_t{kSplits} * kM * kK);
  const uint32_t image[2] = {tm.Add(kArenaRegion, GemmImageBytes(kM, kK), graph::BF16),
                             tm.Add(kArenaRegion, GemmImageBytes(kM, kK), graph::BF16)};
  const uint32_t out[2] = {f32(uint64_t{kM} * kN), f32(uint64_t{kM} * kN)}, slots = f32(uint64_t{kM} * kRowNormSlots);
  const uint32_t norm = tm.Add(kWeightRegion, kK * 2, graph::BF16);
  const uint32_t w = tm.Add(kWeightRegion, GemmImageBytes(kN, kK), graph::BF16);
  MachineView m = tm.view();
  for (uint32_t i = 0; i < kM * kK; ++i) m.ptr<float>(x[0])[i] = m.ptr<float>(x[1])[i] = u(rng);
  for (uint32_t i = 0; i < kSplits * kM * kK; ++i) m.ptr<float>(parts)[i] = u(rng);
  std::fill(m.ptr<float>(slots), m.ptr<float>(slots) + kM * kRowNormSlots, 1e30f);  // stale
  for (uint32_t i = 0; i < kK; ++i) m.ptr<uint16_t>(norm)[i] = graph::FloatToBf16(0.5f + (u(rng) + 2.0f) / 4.0f);
  const std::vector<uint16_t> wr = RandomBf16(rng, kN * kK);
  const std::vector<uint16_t> wi = PackSwizzled(wr.data(), kN, kK, kGemmTileM, Swizzle::k128B);
  std::copy(wi.begin(), wi.end(), m.ptr<uint16_t>(w));
  std::vector<TensorInfo> infos;
  for (const TensorDesc& t : tm.table) {
    infos.push_back({"t", static_cast<graph::DType>(t.dtype), t.bytes / (t.dtype == graph::BF16 ? 2 : 4)});
  }
  auto run = [&](const Instruction& inst) {
    ASSERT_TRUE(ValidateInstruction(inst, infos).ok()) << ValidateInstruction(inst, infos);
    ExecuteReference(inst, m);
  };
  for (uint32_t form = 0; form < 2; ++form) {  // whole rows normed, then slices with the norm deferred
    Instruction pack{};
    pack.opcode = static_cast<uint8_t>(Opcode::PACK_ROWS);
    PackRowsArgs& a = pack.as<PackRowsArgs>();
    a = {x[form], image[form], kM, kK, 0, GemmTiles(kM) * kGemmTileM, norm, 1e-5f, parts, kSplits};
    if (form == 0) {
      run(pack);
    } else {
      for (uint32_t r = 0; r < kM; r += 5) {
        for (uint32_t c = 0; c < kK; c += kCols) {
          a = {x[1], image[1], kM, kK, r, std::min(5u, kM - r), norm, 1e-5f, parts, kSplits, slots, c, kCols};
          run(pack);
        }
      }
      a = {x[1], image[1], kM, kK, kM, GemmTiles(kM) * kGemmTileM - kM, norm, 1e-5f};  // the padding rows
      run(pack);
    }
    Instruction gemm{};
    gemm.opcode = static_cast<uint8_t>(Opcode::GEMM);
    GemmArgs& g = gemm.as<GemmArgs>();
    g = {image[form], w, out[form], kM, kN, kK, 0, kNoTensor, kNoTensor, kGemmStoreF32};
    g.row_norm = form == 1 ? slots : kNoTensor;
    run(gemm);
  }
  EXPECT_TRUE(std::equal(m.ptr<float>(x[0]), m.ptr<float>(x[0]) + kM * kK, m.ptr<float>(x[1])));
  double err = 0, norm2 = 0;  // bf16 rounding of products that cancel: the error relative to the whole output
  for (uint32_t r = 0; r < kM; ++r) {
    EXPECT_EQ(m.ptr<float>(slots)[r * kRowNormSlots + 3], 0.0f);  // past the 3 slices
    for (uint32_t c = 0; c < kN; ++c) {
      const double want = m.ptr<float>(out[0])[r * kN + c], got = m.ptr<float>(out[1])[r * kN + c];
      err += (got - want) * (got - want), norm2 += want * want;
    }
  }
  EXPECT_LT(std::sqrt(err / norm2), 5e-3);
  Instruction bad{};
  bad.opcode = static_cast<uint8_t>(Opcode::PACK_ROWS);
  bad.as<PackRowsArgs>() = {x[1], image[1], kM, kK, 0, 2, norm, 1e-5f, parts, kSplits, slots, 0, 96};
  EXPECT_NE(ValidateInstruction(bad, infos).message().find("slice [0, +96) of k 320"), std::string::npos);
  bad.as<PackRowsArgs>() = {x[1], image[1], kM, kK, 0, 2, norm, 1e-5f, parts, kSplits, slots, 0, 0};
  EXPECT_NE(ValidateInstruction(bad, infos).message().find("slice [0, +0)"), std::string::npos);
  bad.as<PackRowsArgs>() = {x[1], image[1], kM, kK, 35, 5, norm, 1e-5f, parts, kSplits, slots, 0, 64};
  EXPECT_NE(ValidateInstruction(bad, infos).message().find("must be rows of the input (m 37)"), std::string::npos);
  bad.as<PackRowsArgs>() = {x[1], image[1], kM, kK, 0, 30, norm, 1e-5f, parts, kSplits, slots, 0, 320};
  EXPECT_NE(ValidateInstruction(bad, infos).message().find("more than one staging round"), std::string::npos);
  bad.as<PackRowsArgs>() = {x[1], image[1], kM, kK, 0, 2, kNoTensor, 0.0f, parts, kSplits, slots, 0, 64};
  EXPECT_NE(ValidateInstruction(bad, infos).message().find("needs its norm_weight"), std::string::npos);
  bad.as<PackRowsArgs>() = {x[1], image[1], kM, kK, 0, 2, norm, 1e-5f, parts, kSplits, kNoTensor, 64, 64};
  EXPECT_NE(ValidateInstruction(bad, infos).message().find("column slices are for a deferred norm"), std::string::npos);
}

// The float argument words are known for printing: every field named *eps, and attention's scales.
TEST(Isa, FloatArgumentWordsAreMarked) {
  for (int op = 0; op < kNumOpcodes; ++op) {
    const Opcode o = static_cast<Opcode>(op);
    const char* const* names = ArgNames(o);
    for (int i = 0; i < ArgCount(o); ++i) {
      const std::string name = names[i];
      const bool eps = name.size() >= 3 && name.compare(name.size() - 3, 3, "eps") == 0;
      if (eps) EXPECT_TRUE(FloatWords(o) >> i & 1u) << OpcodeName(o) << "." << name;
    }
  }
  EXPECT_EQ(FloatWords(Opcode::ATTN_PARTIAL), FloatWord(offsetof(AttnPartialArgs, scale)));
  EXPECT_EQ(FloatWords(Opcode::FLASH_ATTN), FloatWord(offsetof(FlashAttnArgs, scale)));
  EXPECT_EQ(FloatWords(Opcode::NORM_ROWS), FloatWord(offsetof(NormRowsArgs, eps)));  // not its "scale" tensor
  EXPECT_EQ(FloatWords(Opcode::GEMM), 1u << 19);
}

// The GEMM loader copies each A slab's rows up to the tile's last row of A, rounded up to the 8-row swizzle atom:
// a prefix of the slab (the rows past it reach only accumulator rows no epilogue stores).
TEST(GemmSlabRows, LoadedRowsEndAtTheTilesLastRowOfA) {
  GemmArgs g{};
  g.m = 1;
  EXPECT_EQ(GemmSlabRowsLoaded(g), 8u);
  g.m = 64;
  EXPECT_EQ(GemmSlabRowsLoaded(g), 64u);
  g.m = 65;
  EXPECT_EQ(GemmSlabRowsLoaded(g), 72u);
  g.m = 300;  // tiles of 128, 128 and 44 rows
  EXPECT_EQ(GemmSlabRowsLoaded(g), 128u);
  g.tile = GemmTileOf(1, 0);
  EXPECT_EQ(GemmSlabRowsLoaded(g), 128u);
  g.tile = GemmTileOf(2, 0);
  EXPECT_EQ(GemmSlabRowsLoaded(g), 48u);
  for (uint32_t m = 1; m <= 3 * kGemmTileM; ++m) {
    g.m = m;
    for (uint32_t mt = 0; mt < GemmTiles(m); ++mt) {
      g.tile = GemmTileOf(mt, 0);
      const uint32_t rows = GemmSlabRowsLoaded(g), live = std::min(kGemmTileM, m - mt * kGemmTileM);
      EXPECT_TRUE(rows % 8 == 0 && rows >= live && rows < live + 8 && rows <= kGemmTileM) << m << " " << mt;
    }
  }
}

}  // namespace
}  // namespace loom::isa

