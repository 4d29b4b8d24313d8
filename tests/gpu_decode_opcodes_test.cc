// GPU tests (ctest label gpu, binary gpu_test) of the decode opcodes on the megakernel against their float32
// CPU references: MATVEC's streaming forms, prologues and epilogues at every page size; split-KV attention and
// its reduce; the vector opcodes.
#include "tests/gpu_op_bench.h"

namespace loom::megakernel {
namespace {

using namespace gpu_bench;  // NOLINT: the bench's helpers and tolerances


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

// A bf16 KV cache's values are compared at a bf16 value's tolerance: a sum that differs from the VM's in its last
// f32 bits may round to the next bf16.
double KvTolerance(graph::DType kv_dtype) { return kv_dtype == graph::BF16 ? kBf16OutputTolerance : kTolerance; }

// The RoPE epilogue's layout for a matvec test (MatvecArgs, MatvecFp8Args or MatvecW4Args): 2 KV heads of dim 16
// with 3 query heads each (160 grouped q|k|v rows from row 0), a KV cache of 8 positions (f32 or bf16), position 5.
template <typename Args>
void SetRopeLayout(OpBench& b, Args& a, graph::DType kv_dtype) {
  a.head_dim = 16;
  a.heads_per_group = 3;
  a.num_kv_heads = 2;
  a.max_seq = 8;
  a.row_begin = 0;
  a.rows = 160;
  a.out = b.Output(3 * 2 * 16);
  a.k_cache = b.Output(2 * 8 * 16, kv_dtype);
  a.v_cache = b.Output(2 * 8 * 16, kv_dtype);
  a.step_state = b.Arena(4, graph::I32);
  b.SetState(a.step_state, 5, 1);
  a.rope_table = b.Weight(8 + 1, graph::F32);  // inverse frequencies, then the cos/sin factor
  b.FillRandom(a.rope_table, 0.001f, 1.0f);
}

// A quantized matvec case's input (k random floats), prologue, epilogue and outputs (MatvecFp8Args or MatvecW4Args):
// `total` output rows, or the RoPE layout's (then *total is its rows). Returns what to add to the case's name.
template <typename Args>
std::string SetMatvecCase(OpBench& b, Args& a, uint32_t k, uint32_t prologue, uint32_t epilogue, uint32_t* total,
                          graph::DType kv_dtype) {
  a.input = b.Arena(k);
  b.FillRandom(a.input);
  a.prologue = prologue;
  a.norm_weight = b.Weight(k);
  b.FillRandom(a.norm_weight, 0.5f, 1.5f);
  a.norm_eps = 1e-5f;
  a.epilogue = epilogue;
  a.residual = a.k_cache = a.v_cache = a.step_state = a.rope_table = isa::kNoTensor;
  if (epilogue == isa::kEpilogueRopeKvAppend) {
    SetRopeLayout(b, a, kv_dtype);
    *total = a.rows;
    return kv_dtype == graph::BF16 ? " (rope, bf16 KV)" : " (rope)";
  }
  if (epilogue == isa::kEpilogueSiluMul) {
    a.out = b.Output(*total / 2 + 1);
  } else {
    a.out = b.Output(*total);
    a.residual = b.Arena(*total);
    b.FillRandom(a.residual);
  }
  return "";
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
        // The RoPE epilogue appends into a bf16 KV cache after the RMSNorm prologue, into an f32 one without it.
        const graph::DType kv_dtype = epilogue == isa::kEpilogueRopeKvAppend && prologue == isa::kPrologueRmsNorm
                                          ? graph::BF16
                                          : graph::F32;
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
          SetRopeLayout(b, a, kv_dtype);
          a.weight = b.Weight(160ull * stride);
          b.FillRandom(a.weight);
          if (biased) {
            a.bias = b.Weight(160);
            b.FillRandom(a.bias);
          }
          what += kv_dtype == graph::BF16 ? " (rope, bf16 KV)" : " (rope)";
        } else if (epilogue == isa::kEpilogueSiluMul) {
          a.out = b.Output(total / 2 + 1);
        } else {
          a.out = b.Output(total);
          a.residual = b.Arena(total);
          b.FillRandom(a.residual);
          a.partials = b.ArgmaxPartials(4, a.out);
          a.tile_index = 3;
        }
        b.RunAndCompare({Make(isa::Opcode::MATVEC, a)}, what, KvTolerance(kv_dtype));
      }
    }
  }
}

// MATVEC_FP8's three streaming forms (x in registers: rows that tile a 16 KB page in 2048-column slots; x read per
// run with 2048- or 512-column slots), every prologue and epilogue, rows padded to 512 columns (k 600, 100: random
// bytes in the padding, so an input that is not zero-padded shows), tiles ending inside a page.
TEST(GpuOpcodes, MatvecFp8EveryFormPrologueAndEpilogue) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t rows, k, total_rows; };
  const std::vector<Case> cases = {{24, 2048, 60}, {64, 4096, 200}, {30, 8192, 64},  {9, 16384, 12}, {12, 1536, 40},
                                   {10, 6144, 30}, {5, 14336, 12},  {7, 600, 20},    {3, 100, 8},    {334, 1024, 1000}};
  for (const Case& c : cases) {
    for (uint32_t epilogue : {isa::kEpilogueStore, isa::kEpilogueResidualAdd, isa::kEpilogueSiluMul,
                              isa::kEpilogueRopeKvAppend}) {
      for (uint32_t prologue : {isa::kPrologueNone, isa::kPrologueRmsNorm}) {
        const uint32_t seed = Seed();
        OpBench b(seed);
        // The RoPE epilogue appends into a bf16 KV cache after the RMSNorm prologue, into an f32 one without it.
        const graph::DType kv_dtype = epilogue == isa::kEpilogueRopeKvAppend && prologue == isa::kPrologueRmsNorm
                                          ? graph::BF16
                                          : graph::F32;
        isa::MatvecFp8Args a{};
        a.rows = c.rows + (c.rows % 2);  // pairs for the RoPE and SiLU epilogues
        a.k = c.k;
        a.row_begin = 2;
        uint32_t total = c.total_rows + a.rows + 2;
        const uint64_t stride = isa::MatvecFp8RowStride(c.k);
        const bool biased = (epilogue + prologue + c.k / 4) % 2 == 1;  // every epilogue with and without
        std::string what = absl::StrCat("MATVEC_FP8 rows ", a.rows, " k ", c.k, " prologue ", prologue, " epilogue ",
                                        epilogue, biased ? " bias" : "", " seed ", seed);
        what += SetMatvecCase(b, a, c.k, prologue, epilogue, &total, kv_dtype);
        a.weight = b.Weight(uint64_t{total} * stride, graph::F8E4M3);
        b.FillRandom(a.weight);
        a.scales = b.Weight(total, graph::F32);
        b.FillRandom(a.scales, 0.001f, 0.1f);
        a.bias = biased ? b.Weight(total) : isa::kNoTensor;
        if (biased) b.FillRandom(a.bias);
        b.RunAndCompare({Make(isa::Opcode::MATVEC_FP8, a)}, what, KvTolerance(kv_dtype));
      }
    }
  }
}

// MATVEC_W4's forms: rows a multiple of 256 columns (a warp's four chunks of a page sum into one slot) and not (a
// slot a chunk: 1600, 96, 3072 + 64, 896), groups of 32 (two a chunk), 64, 128 and 256, with and without zero points,
// k = 96 padded to 128 (the padding's own group, random nibbles in it), tiles ending inside a page, rows of a
// multiple of 2048 columns (a warp's chunks summed over a band's pages), and every prologue and epilogue; row_begin
// a band past the weight's first. Each of the three slot layouts meets each fold (groups of 32: half a chunk; 64: a
// chunk; 128 and up: two chunks, or one where a slot is a chunk). Rows in pieces (isa::MatvecW4Pieces): 28672 (two of
// 14336), 18432 (10240 + 8192, groups of 32), 40960 (14336, 14336, 12288; groups of 4096 across the pieces' edges).
TEST(GpuOpcodes, MatvecW4EveryFormPrologueAndEpilogue) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t rows, k, extra_rows, group_shift; };
  const std::vector<Case> cases = {{16, 2048, 32, 7},  {64, 4096, 128, 7}, {32, 14336, 16, 7}, {48, 8192, 0, 6},
                                   {16, 1600, 16, 5},  {32, 96, 16, 5},    {208, 2048, 0, 7},  {16, 3136, 0, 6},
                                   {320, 1024, 64, 8}, {16, 16384, 0, 7}, {32, 896, 16, 7},  {16, 1536, 0, 5},
                                   {32, 2048, 16, 5},  {16, 768, 0, 6},    {16, 28672, 16, 7}, {32, 18432, 0, 5},
                                   {16, 40960, 0, 12}};
  int n = 0;
  for (const Case& c : cases) {
    for (uint32_t epilogue : {isa::kEpilogueStore, isa::kEpilogueResidualAdd, isa::kEpilogueSiluMul,
                              isa::kEpilogueRopeKvAppend}) {
      for (uint32_t prologue : {isa::kPrologueNone, isa::kPrologueRmsNorm}) {
        // (the RoPE layout's 160 rows of more than 8192 columns: a slot larger than an SM's shared memory)
        if (epilogue == isa::kEpilogueRopeKvAppend && c.k > 8192) continue;
        // (a row in pieces takes no prologue: isa::Validate refuses it)
        if (prologue == isa::kPrologueRmsNorm && isa::MatvecW4Pieces(isa::MatvecW4RowStride(c.k)) > 1) continue;
        const uint32_t seed = Seed();
        OpBench b(seed);
        // The RoPE epilogue appends into a bf16 KV cache after the RMSNorm prologue, into an f32 one without it.
        const graph::DType kv_dtype = epilogue == isa::kEpilogueRopeKvAppend && prologue == isa::kPrologueRmsNorm
                                          ? graph::BF16
                                          : graph::F32;
        isa::MatvecW4Args a{};
        a.rows = c.rows;
        a.k = c.k;
        a.row_begin = 16;
        a.group_shift = c.group_shift;
        uint32_t total = a.row_begin + a.rows + c.extra_rows;
        const bool biased = (epilogue + prologue + c.k / 4) % 2 == 1;
        const bool zero_points = ++n % 2 == 0;
        std::string what = absl::StrCat("MATVEC_W4 rows ", a.rows, " k ", c.k, " group ", 1u << c.group_shift,
                                        zero_points ? " zero points" : "", " prologue ", prologue, " epilogue ",
                                        epilogue, biased ? " bias" : "", " seed ", seed);
        what += SetMatvecCase(b, a, c.k, prologue, epilogue, &total, kv_dtype);
        a.weight = b.Weight(uint64_t{total} * isa::MatvecW4RowStride(c.k) / 2, graph::I4);
        b.FillRandom(a.weight);
        a.meta = b.RandomW4Meta(total, isa::MatvecW4Groups(c.k, c.group_shift), zero_points);
        a.bias = biased ? b.Weight(total) : isa::kNoTensor;
        if (biased) b.FillRandom(a.bias);
        b.RunAndCompare({Make(isa::Opcode::MATVEC_W4, a)}, what, KvTolerance(kv_dtype));
      }
    }
  }
}

// Split-KV decode attention, the reduce as ATTN_REDUCE instructions or folded into the last split of each KV head
// (an arrival counter per KV head, zero again afterwards: compared too), in activation slots of 48, 30 (what twelve
// 16 KB pages leave) and 18 KB (raised to what the split's scores need where that is more), over f32 caches and
// (1 and 16 splits) bf16 ones, whose rows fit the slot at twice the positions.
TEST(GpuOpcodes, AttentionPartialsAndReduceAtSeveralContextLengths) {
  SKIP_WITHOUT_GPU();
  // Groups of 4 heads of 64 (merged a thread per element), 8 of 64 (two elements a thread), 8 of 128 (four).
  struct Heads { uint32_t heads, kv, dim; };
  for (const Heads& shape : {Heads{8, 2, 64}, Heads{16, 2, 64}, Heads{16, 2, 128}}) {
    for (uint32_t position : {0u, 5u, 63u, 200u, 1000u}) {
      // 1 split at 200, 1 or 3 at 1000: K and V do not fit the slot; they come through it in chunks (5 to 63). In
      // the smaller slots more splits do (16 at 1000), in smaller chunks, or read K and V from the caches.
      for (uint32_t splits : {1u, 3u, 16u, 40u}) {
        for (uint32_t slot : {kActivationBytes, 30u * 1024, 18u * 1024}) {
          for (int form = 0; form < 4; ++form) {
            const bool fused = form % 2 == 1;
            const graph::DType kv_dtype = form >= 2 ? graph::BF16 : graph::F32;
            if (slot != kActivationBytes && fused) continue;  // (the fused reduce: the tensor variant, no chunks)
            if (kv_dtype == graph::BF16 && splits != 1 && splits != 16) continue;
            const uint32_t seed = Seed();
            OpBench b(seed);
            b.SetActivationBytes(slot);
            const uint32_t kHeads = shape.heads, kKv = shape.kv, kDim = shape.dim, kSeq = 1024;
            const uint32_t q = b.Arena(kHeads * kDim), kc = b.Arena(kKv * kSeq * kDim, kv_dtype),
                           vc = b.Arena(kKv * kSeq * kDim, kv_dtype);
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
                                         " splits ", splits, fused ? " reduce fused" : "", " slot ", slot,
                                         " KV ", graph::DType_Name(kv_dtype), " seed ", seed));
          }
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

// ROPE_KV_APPEND into bf16 KV caches (10 heads, 2 KV heads, dim 128, per-head norms; and 4 heads of 32 without),
// compared at a bf16 value's tolerance (KvTolerance).
TEST(GpuOpcodes, RopeKvAppendIntoBf16Caches) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = Seed();
  OpBench b(seed);
  constexpr uint32_t kSeq = 16;
  const uint32_t state = b.Arena(4, graph::I32);
  b.SetState(state, 9, 10);
  std::vector<isa::Instruction> queue;
  for (const bool normed : {false, true}) {
    const uint32_t heads = normed ? 10 : 4, hd = normed ? 128 : 32;
    const uint32_t qi = b.Arena(heads * hd), ki = b.Arena(2 * hd), vi = b.Arena(2 * hd);
    const uint32_t table = b.Weight(hd / 2 + 1, graph::F32);
    const uint32_t q_norm = normed ? b.Weight(hd) : isa::kNoTensor, k_norm = normed ? b.Weight(hd) : isa::kNoTensor;
    for (uint32_t t : {qi, ki, vi}) b.FillRandom(t);
    if (normed) b.FillRandom(q_norm, 0.5f, 1.5f), b.FillRandom(k_norm, 0.5f, 1.5f);
    b.FillRandom(table, 0.001f, 1.0f);
    queue.push_back(Make(isa::Opcode::ROPE_KV_APPEND,
                         isa::RopeAppendArgs{qi, ki, vi, b.Output(heads * hd), b.Output(2 * kSeq * hd, graph::BF16),
                                             b.Output(2 * kSeq * hd, graph::BF16), state, table, heads, 2, hd, kSeq,
                                             q_norm, k_norm, normed ? 1e-6f : 0.0f}));
  }
  b.RunAndCompare(queue, absl::StrCat("ROPE_KV_APPEND into bf16 caches, seed ", seed), KvTolerance(graph::BF16));
}

}  // namespace
}  // namespace loom::megakernel
