// Every opcode of the table (LOOM_OPCODE_LIST), one small random instance each, as a table of builders: on the CPU
// (everywhere, CI included) each instance passes validation against the bench's tensor table, has a cost, is
// compiled by its kernel variant and runs through its float32 reference to finite outputs; on a Hopper GPU each runs
// on the megakernel against that reference (the GPU half skips without one, saying why). The builders are the
// smallest setups of tests/gpu_decode_opcodes_test.cc and gpu_tensor_opcodes_test.cc (and, for the general-graph
// opcodes, of scheduler/graph_lowering*.cc); those tests sweep the shapes, this one guarantees no opcode is missed.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <vector>

#include "tests/gpu_op_bench.h"

namespace loom::megakernel {
namespace {

using namespace gpu_bench;  // NOLINT: the bench's helpers and tolerances
using Op = isa::Opcode;
using Queue = std::vector<isa::Instruction>;
using isa::kNoTensor;

// How an entry's instance is run and checked.
struct Settings {
  double tolerance = kTolerance;   // GPU against the reference (gpu_op_bench.h says which when)
  uint32_t page_bytes = 16384;     // the ring's pages (16 KB: a GEMM slab each)
  // Outputs the instance writes only in part (a KV cache's position, a token); every other output must be written
  // whole.
  std::vector<uint32_t> partial;
};

// One builder per opcode: fills `queue` with one small valid instance of its opcode (after the producers it needs,
// if any) on fresh random tensors of `b`, and says how to run it.
using Builder = Settings (*)(OpBench& b, Queue& queue);
#define LOOM_DECLARE_BUILDER(name, args) Settings Build_##name(OpBench& b, Queue& queue);
LOOM_OPCODE_LIST(LOOM_DECLARE_BUILDER)
#undef LOOM_DECLARE_BUILDER

struct Entry {
  Op op;
  const char* name;
  Builder build;
};
// Expanded from the opcode table: an opcode added to LOOM_OPCODE_LIST without a Build_<NAME> below fails to link.
constexpr Entry kEntries[] = {
#define LOOM_ENTRY(name, args) {Op::name, #name, &Build_##name},
    LOOM_OPCODE_LIST(LOOM_ENTRY)
#undef LOOM_ENTRY
};

// The context length the cost model assumes for attention (known only at run time).
constexpr uint32_t kCostContext = 64;
// Opcodes that only move data (a row copy, a layout change): their footprint has bytes but no flops.
bool MovesOnly(Op op) { return op == Op::EMBED || op == Op::NHWC_BF16; }

template <typename Args>
void Push(Queue& queue, Op op, const Args& args) {
  queue.push_back(Make(op, args));
}
uint32_t RandomArena(OpBench& b, uint64_t elements, float lo = -1.0f, float hi = 1.0f) {
  const uint32_t id = b.Arena(elements);
  b.FillRandom(id, lo, hi);
  return id;
}
uint32_t RandomWeight(OpBench& b, uint64_t elements, graph::DType dtype = graph::BF16, float lo = -1.0f,
                      float hi = 1.0f) {
  const uint32_t id = b.Weight(elements, dtype);
  b.FillRandom(id, lo, hi);
  return id;
}
uint32_t StepState(OpBench& b, int32_t position, int32_t prompt_length) {
  const uint32_t id = b.Arena(isa::kStepStateWords, graph::I32);
  b.SetState(id, position, prompt_length);
  return id;
}

// ---- The decode opcodes (vector, matvec, attention families).

Settings Build_EMBED(OpBench& b, Queue& queue) {
  constexpr uint32_t kVocab = 50, kHidden = 256, kStride = 512, kSeq = 16;  // rows padded as a tied LM head's are
  const uint32_t table = RandomWeight(b, kVocab * kStride);
  const uint32_t tokens = b.Arena(kSeq + 1, graph::I32);
  for (uint32_t i = 0; i <= kSeq; ++i) b.Data<int32_t>(tokens)[i] = static_cast<int32_t>(b.rng()() % kVocab);
  const uint32_t state = StepState(b, 3, 5);
  // Two prompt rows (a prefill pass's form) from position 3.
  Push(queue, Op::EMBED, isa::EmbedArgs{table, tokens, state, b.Output(2 * kHidden), kHidden, kVocab, kStride, 0, 2});
  return {};
}

Settings Build_RMS_NORM(OpBench& b, Queue& queue) {
  constexpr uint32_t kN = 1000;
  Push(queue, Op::RMS_NORM,
       isa::RmsNormArgs{RandomArena(b, kN), RandomWeight(b, kN, graph::BF16, 0.5f, 1.5f), b.Output(kN), kN, 1e-5f});
  return {};
}

// A tile of 24 rows (from row 2) with the RMSNorm prologue, a bias and the residual epilogue.
Settings Build_MATVEC(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = 24, kK = 512, kTotal = kRows + 2;
  isa::MatvecArgs a{};
  a.weight = RandomWeight(b, uint64_t{kTotal} * isa::MatvecRowStride(kK));
  a.row_begin = 2;
  a.rows = kRows;
  a.k = kK;
  a.input = RandomArena(b, kK);
  a.prologue = isa::kPrologueRmsNorm;
  a.norm_weight = RandomWeight(b, kK, graph::BF16, 0.5f, 1.5f);
  a.norm_eps = 1e-5f;
  a.epilogue = isa::kEpilogueResidualAdd;
  a.out = b.Output(kTotal);
  a.residual = RandomArena(b, kTotal);
  a.bias = RandomWeight(b, kTotal);
  a.k_cache = a.v_cache = a.step_state = a.rope_table = a.partials = kNoTensor;
  Push(queue, Op::MATVEC, a);
  // Rows 0 and 1 are not the tile's: the output's first two elements stay poisoned.
  return {.partial = {a.out}};
}

// The same over an FP8 weight of 1536 columns (x read from shared memory, 512-column slots), the SiLU-mul epilogue.
Settings Build_MATVEC_FP8(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = 24, kK = 1536, kTotal = kRows + 2;
  isa::MatvecFp8Args a{};
  a.weight = RandomWeight(b, uint64_t{kTotal} * isa::MatvecFp8RowStride(kK), graph::F8E4M3);
  a.scales = RandomWeight(b, kTotal, graph::F32, 0.01f, 0.1f);
  a.row_begin = 2;
  a.rows = kRows;
  a.k = kK;
  a.input = RandomArena(b, kK);
  a.prologue = isa::kPrologueRmsNorm;
  a.norm_weight = RandomWeight(b, kK, graph::BF16, 0.5f, 1.5f);
  a.norm_eps = 1e-5f;
  a.epilogue = isa::kEpilogueSiluMul;
  a.out = b.Output(kTotal / 2);
  a.bias = RandomWeight(b, kTotal);
  a.residual = a.k_cache = a.v_cache = a.step_state = a.rope_table = kNoTensor;
  Push(queue, Op::MATVEC_FP8, a);
  return {.partial = {a.out}};  // the first pair is not the tile's
}

// The same over an int4 weight: rows 16 .. 47 of 48 (whole bands), 1600 columns (a 64-column slot a chunk: 1600 is
// no multiple of 256) in groups of 32 with zero points, the RMSNorm prologue, a bias.
Settings Build_MATVEC_W4(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = 32, kK = 1600, kTotal = kRows + 16, kShift = 5;
  isa::MatvecW4Args a{};
  a.weight = RandomWeight(b, uint64_t{kTotal} * isa::MatvecW4RowStride(kK) / 2, graph::I4);
  a.meta = b.RandomW4Meta(kTotal, isa::MatvecW4Groups(kK, kShift), true);
  a.group_shift = kShift;
  a.row_begin = 16;
  a.rows = kRows;
  a.k = kK;
  a.input = RandomArena(b, kK);
  a.prologue = isa::kPrologueRmsNorm;
  a.norm_weight = RandomWeight(b, kK, graph::BF16, 0.5f, 1.5f);
  a.norm_eps = 1e-5f;
  a.epilogue = isa::kEpilogueStore;
  a.out = b.Output(kTotal);
  a.bias = RandomWeight(b, kTotal);
  a.residual = a.k_cache = a.v_cache = a.step_state = a.rope_table = kNoTensor;
  Push(queue, Op::MATVEC_W4, a);
  return {.partial = {a.out}};  // the first band is not the tile's
}

// 4 query heads on 2 KV heads of 32 with Qwen3's per-head norms, appended at position 5 of 8.
Settings Build_ROPE_KV_APPEND(OpBench& b, Queue& queue) {
  constexpr uint32_t kHeads = 4, kKv = 2, kDim = 32, kSeq = 8;
  const uint32_t k_cache = b.Output(kKv * kSeq * kDim), v_cache = b.Output(kKv * kSeq * kDim);
  Push(queue, Op::ROPE_KV_APPEND,
       isa::RopeAppendArgs{RandomArena(b, kHeads * kDim), RandomArena(b, kKv * kDim), RandomArena(b, kKv * kDim),
                           b.Output(kHeads * kDim), k_cache, v_cache, StepState(b, 5, 1),
                           RandomWeight(b, kDim / 2 + 1, graph::F32, 0.01f, 1.0f), kHeads, kKv, kDim, kSeq,
                           RandomWeight(b, kDim), RandomWeight(b, kDim), 1e-6f});
  return {.partial = {k_cache, v_cache}};
}

// Both splits of a 10-position context (position 9) for a group of 4 query heads on one KV head of 64.
Settings Build_ATTN_PARTIAL(OpBench& b, Queue& queue) {
  constexpr uint32_t kHeads = 4, kDim = 64, kSeq = 16, kSplits = 2;
  const uint32_t q = RandomArena(b, kHeads * kDim), k_cache = RandomArena(b, kSeq * kDim);
  const uint32_t v_cache = RandomArena(b, kSeq * kDim), state = StepState(b, 9, 1);
  const uint32_t po = b.Output(kSplits * kHeads * kDim), pml = b.Output(kSplits * kHeads * 2);
  for (uint32_t s = 0; s < kSplits; ++s) {
    Push(queue, Op::ATTN_PARTIAL,
         isa::AttnPartialArgs{q, k_cache, v_cache, state, po, pml, 0, s, kSplits, kHeads, 1, kDim, kSeq, 0.125f,
                              kNoTensor, kNoTensor, 0});
  }
  return {};
}

// 3 splits' partials of 4 heads of 64 merged (head_count * head_dim = kAttnThreads: the decode variant's form).
Settings Build_ATTN_REDUCE(OpBench& b, Queue& queue) {
  constexpr uint32_t kHeads = 4, kDim = 64, kSplits = 3;
  const uint32_t po = RandomArena(b, kSplits * kHeads * kDim);
  const uint32_t pml = RandomArena(b, kSplits * kHeads * 2, 0.5f, 2.0f);  // (max, sum) pairs: sums positive
  Push(queue, Op::ATTN_REDUCE,
       isa::AttnReduceArgs{po, pml, b.Output(kHeads * kDim), 0, kHeads, kSplits, kHeads, kDim});
  return {};
}

Settings Build_SILU_MUL(OpBench& b, Queue& queue) {
  constexpr uint32_t kN = 1000;
  Push(queue, Op::SILU_MUL, isa::SiluMulArgs{RandomArena(b, kN, -4.0f, 4.0f), RandomArena(b, kN), b.Output(kN), 0, kN});
  return {};
}

Settings Build_ADD(OpBench& b, Queue& queue) {
  constexpr uint32_t kN = 1000;
  Push(queue, Op::ADD, isa::AddArgs{RandomArena(b, kN), RandomArena(b, kN), b.Output(kN), 0, kN});
  return {};
}

Settings Build_ARGMAX_PARTIAL(OpBench& b, Queue& queue) {
  constexpr uint32_t kN = 1000, kTiles = 2;
  const uint32_t logits = RandomArena(b, kN), partials = b.ArgmaxPartials(kTiles, logits);
  for (uint32_t t = 0; t < kTiles; ++t) {
    Push(queue, Op::ARGMAX_PARTIAL, isa::ArgmaxPartialArgs{logits, t * kN / kTiles, kN / kTiles, partials, t});
  }
  return {};
}

// Picks the best of 3 (value, row) partials as the token at position 5 (past the prompt) and advances the state;
// the tokens and the state are outputs (compared), written in part.
Settings Build_ARGMAX_REDUCE(OpBench& b, Queue& queue) {
  constexpr uint32_t kPartials = 3, kSeq = 16, kRows = 100;
  const uint32_t partials = b.Arena(2 * kPartials);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (uint32_t t = 0; t < kPartials; ++t) {
    b.Data<float>(partials)[2 * t] = value(b.rng());
    b.Data<float>(partials)[2 * t + 1] = static_cast<float>(t * kRows + b.rng()() % kRows);
  }
  const uint32_t state = b.Output(isa::kStepStateWords, graph::I32);
  b.SetState(state, 4, 2);
  const uint32_t tokens = b.Output(kSeq + 1, graph::I32);
  Push(queue, Op::ARGMAX_REDUCE, isa::ArgmaxReduceArgs{partials, kPartials, state, tokens, kSeq});
  return {.partial = {state, tokens}};
}

// ---- The tensor-core opcodes (GEMM family, FLASH_ATTN).

// One 128 x 128 tile covering a ragged 40 x 72 product over K 100, with bias and residual.
Settings Build_GEMM(OpBench& b, Queue& queue) {
  constexpr uint32_t kM = 40, kN = 72, kK = 100;
  isa::GemmArgs g = b.RandomGemm(kM, kN, kK);
  g.bias = RandomWeight(b, kN);
  g.residual = RandomArena(b, uint64_t{kM} * kN);
  g.tile = isa::GemmTileOf(0, 0);
  Push(queue, Op::GEMM, g);
  return {};
}

// 20 RMS-normed rows of K 100 into a GEMM's A image, the padding rows and columns (zeros) of its tile included; the
// image is bf16 rounded from f32 sums, so one bf16 step apart counts as equal.
Settings Build_PACK_ROWS(OpBench& b, Queue& queue) {
  constexpr uint32_t kM = 20, kK = 100;
  isa::PackRowsArgs p{};
  p.input = RandomArena(b, uint64_t{kM} * kK, -2.0f, 2.0f);
  p.out = b.Output(isa::GemmImageBytes(kM, kK) / 2, graph::BF16);
  p.m = kM;
  p.k = kK;
  p.row_begin = 0;
  p.rows = isa::GemmTiles(kM) * isa::kGemmTileM;
  p.norm_weight = RandomWeight(b, kK, graph::BF16, 0.5f, 1.5f);
  p.norm_eps = 1e-5f;
  p.parts = kNoTensor;
  Push(queue, Op::PACK_ROWS, p);
  b.AllowBf16Steps();
  return {.tolerance = kBf16OutputTolerance};
}

// A whole 128-row tile of a 128-row prompt (every row of the image written) for both query heads of 64 on one KV
// head; the output is the bf16 operand image.
Settings Build_FLASH_ATTN(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = isa::kFlashRows, kHeads = 2, kDim = 64, kSeq = kRows + 37;
  isa::FlashAttnArgs a{};
  a.q = RandomArena(b, uint64_t{kRows} * kHeads * kDim, -2.0f, 2.0f);
  a.k_cache = RandomArena(b, kSeq * kDim, -2.0f, 2.0f);
  a.v_cache = RandomArena(b, kSeq * kDim);
  a.step_state = StepState(b, 0, kRows);
  a.out = b.Output(isa::GemmImageBytes(kRows, kHeads * kDim) / 2, graph::BF16);
  a.rows = kRows;
  a.num_heads = kHeads;
  a.num_kv_heads = 1;
  a.head_dim = kDim;
  a.max_seq = kSeq;
  a.scale = 0.125f;
  for (a.head = 0; a.head < kHeads; ++a.head) Push(queue, Op::FLASH_ATTN, a);
  return {.tolerance = kBf16OutputTolerance};
}

// The parts of a product split 3 ways added onto a ReLU'd base, the sum ReLU'd (a split convolution's epilogue).
Settings Build_SUM_SPLITS(OpBench& b, Queue& queue) {
  constexpr uint32_t kN = 1000, kSplits = 3;
  Push(queue, Op::SUM_SPLITS,
       isa::SumSplitsArgs{RandomArena(b, kSplits * kN), RandomArena(b, kN), b.Output(kN), kN, kSplits, 0, kN,
                          isa::kSumReluBase | isa::kSumReluOut});
  return {};
}

// ---- The general-graph opcodes (conv and elementwise families).

// The geometry of a 3x3 convolution, stride 1, padding 1, over an NHWC input [1, 6, 5, c].
isa::ImToColArgs SmallConv(uint32_t c, uint32_t c_begin, uint32_t group_c) {
  isa::ImToColArgs a{};
  a.n = 1, a.h = 6, a.w = 5, a.c = c, a.oh = 6, a.ow = 5, a.kh = 3, a.kw = 3;
  a.stride_h = a.stride_w = a.pad_top = a.pad_left = a.dilation_h = a.dilation_w = 1;
  a.c_begin = c_begin;
  a.group_c = group_c;
  return a;
}

// The second group's (8 of 16 channels) patches with the input's ReLU, every row of the image's tile.
Settings Build_IM2COL(OpBench& b, Queue& queue) {
  isa::ImToColArgs a = SmallConv(16, 8, 8);
  const uint32_t m = isa::ImToColRows(a), k = isa::ImToColK(a);
  a.input = RandomArena(b, uint64_t{a.n} * a.h * a.w * a.c);
  a.out = b.Output(isa::GemmImageBytes(m, k) / 2, graph::BF16);
  a.row_begin = 0;
  a.rows = isa::GemmTiles(m) * isa::kGemmTileM;
  a.relu = 1;
  Push(queue, Op::IM2COL, a);
  return {};
}

// The same convolution's implicit GEMM, 16 channels to 24, f32 input, bias and the ReLU epilogue: one tile.
Settings Build_CONV_GEMM(OpBench& b, Queue& queue) {
  const isa::ImToColArgs c = SmallConv(16, 0, 16);
  constexpr uint32_t kOut = 24;
  isa::ConvGemmArgs g{};
  g.batch = c.n, g.c = c.c, g.c_begin = c.c_begin, g.group_c = c.group_c;
  g.hw = isa::Pack16(c.h, c.w), g.ohw = isa::Pack16(c.oh, c.ow), g.kernel = isa::Pack16(c.kh, c.kw);
  g.stride = isa::Pack16(c.stride_h, c.stride_w), g.pad = isa::Pack16(c.pad_top, c.pad_left);
  g.dilation = isa::Pack16(c.dilation_h, c.dilation_w);
  g.n = kOut;
  g.input = RandomArena(b, uint64_t{c.n} * c.h * c.w * c.c);
  g.weight = b.RandomOperandImage(isa::kWeightRegion, kOut, isa::ConvGemmK(g), 0.25f);
  g.out = b.Output(uint64_t{isa::ConvGemmRows(g)} * kOut);
  g.out_bf16 = g.residual = kNoTensor;
  g.bias = RandomWeight(b, kOut);
  g.epilogue = isa::kGemmStoreF32Relu;
  Push(queue, Op::CONV_GEMM, g);
  b.AllowBf16Steps();
  return {};
}

// A 3x3 average pool, stride 2, padding 1, over [1, 7, 6, 8] (four channels a thread, staged).
Settings Build_POOL(OpBench& b, Queue& queue) {
  isa::PoolArgs p{};
  p.n = 1, p.h = 7, p.w = 6, p.c = 8, p.kh = 3, p.kw = 3, p.stride_h = p.stride_w = 2;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  p.dilation_h = p.dilation_w = 1;
  p.mode = isa::kPoolAvg;
  p.oh = (p.h + 2 - p.kh) / p.stride_h + 1;
  p.ow = (p.w + 2 - p.kw) / p.stride_w + 1;
  p.input = RandomArena(b, uint64_t{p.n} * p.h * p.w * p.c, -2.0f, 2.0f);
  p.count = p.n * p.oh * p.ow * p.c;
  p.out = b.Output(p.count);
  p.out_bf16 = kNoTensor;
  Push(queue, Op::POOL, p);
  return {};
}

// A 3-channel NCHW image [2, 5, 7] read through its transpose's strides into bf16 NHWC padded to 8 channels.
Settings Build_NHWC_BF16(OpBench& b, Queue& queue) {
  isa::NhwcBf16Args a{};
  a.n = 2, a.h = 5, a.w = 7, a.c = 3, a.c_pad = 8;
  a.input = RandomArena(b, uint64_t{a.n} * a.c * a.h * a.w, -2.0f, 2.0f);
  a.stride_n = a.c * a.h * a.w, a.stride_h = a.w, a.stride_w = 1, a.stride_c = a.h * a.w;
  a.count = a.n * a.h * a.w;
  a.out = b.Output(uint64_t{a.count} * a.c_pad, graph::BF16);
  Push(queue, Op::NHWC_BF16, a);
  return {};
}

// A depthwise 3x3 convolution, channel multiplier 2 (4 channels to 8), with a bias and a HardSwish as it stores.
Settings Build_DWCONV(OpBench& b, Queue& queue) {
  const isa::ImToColArgs c = SmallConv(4, 0, 1);
  isa::DwConvArgs d{};
  d.n = c.n, d.h = c.h, d.w = c.w, d.c = c.c, d.oh = c.oh, d.ow = c.ow, d.oc = 2 * c.c, d.kh = c.kh, d.kw = c.kw;
  d.stride_h = c.stride_h, d.stride_w = c.stride_w, d.pad_top = c.pad_top, d.pad_left = c.pad_left;
  d.dilation_h = c.dilation_h, d.dilation_w = c.dilation_w;
  d.input = RandomArena(b, uint64_t{d.n} * d.h * d.w * d.c);
  d.weight = RandomWeight(b, uint64_t{d.oc} * d.kh * d.kw, graph::F32);
  d.bias = RandomWeight(b, d.oc, graph::F32);
  d.count = d.n * d.oh * d.ow * d.oc;
  d.out = b.Output(d.count);
  d.out_func = isa::kEwHardSwish;
  Push(queue, Op::DWCONV, d);
  return {};
}

// Three rows of a depthwise causal convolution (k 4) over 16 channels, its state carried: the state is an input and
// an output (random, then compared).
Settings Build_CONV1D(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = 3, kChannels = 16, kK = 4;
  const uint32_t state = b.Output(kChannels * (kK - 1));
  b.FillRandom(state);
  Push(queue, Op::CONV1D,
       isa::Conv1dArgs{RandomArena(b, kRows * kChannels), RandomWeight(b, kChannels * kK, graph::F32), state,
                       RandomWeight(b, kChannels, graph::F32), b.Output(kRows * kChannels), kRows, kChannels, kK, 0,
                       kChannels});
  return {};
}

// a [6, 40] times b [40] broadcast over the rows, stored transposed ([40, 6]).
Settings Build_ELEMENTWISE(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = 6, kCols = 40;
  isa::ElementwiseArgs e{};
  e.func = isa::kEwMul;
  e.a = RandomArena(b, kRows * kCols);
  e.b = RandomArena(b, kCols);
  e.out = b.Output(kRows * kCols);
  e.count = kRows * kCols;
  e.size[0] = e.size[1] = 1;
  e.size[2] = kRows, e.size[3] = kCols;
  e.a_stride[2] = kCols, e.a_stride[3] = 1;
  e.b_stride[3] = 1;
  e.o_stride[2] = 1, e.o_stride[3] = kRows;
  Push(queue, Op::ELEMENTWISE, e);
  return {};
}

// Softmax along the middle axis of [3, 10, 4] (rows strided by the inner size).
Settings Build_SOFTMAX(OpBench& b, Queue& queue) {
  constexpr uint32_t kOuter = 3, kLen = 10, kInner = 4;
  Push(queue, Op::SOFTMAX,
       isa::SoftmaxArgs{RandomArena(b, kOuter * kLen * kInner, -3.0f, 3.0f), b.Output(kOuter * kLen * kInner), kOuter,
                        kLen, kInner, 0, kOuter * kInner});
  return {};
}

// LayerNorm (scale and shift) of 6 rows of 48.
Settings Build_NORM_ROWS(OpBench& b, Queue& queue) {
  constexpr uint32_t kRows = 6, kLen = 48;
  Push(queue, Op::NORM_ROWS,
       isa::NormRowsArgs{RandomArena(b, kRows * kLen, -2.0f, 2.0f), b.Output(kRows * kLen),
                         RandomWeight(b, kLen, graph::F32, 0.5f, 1.5f), RandomWeight(b, kLen, graph::F32), kRows, kLen,
                         isa::kNormLayer, 1e-5f, 0, kRows});
  return {};
}

// ---- The checks.

std::vector<isa::TensorInfo> TensorInfos(const OpBench& b) {
  std::vector<isa::TensorInfo> infos;
  for (size_t id = 0; id < b.tensors().size(); ++id) {
    const auto dtype = static_cast<graph::DType>(b.tensors()[id].dtype);
    infos.push_back({absl::StrCat("tensor ", id), dtype, b.tensors()[id].bytes / graph::DTypeSize(dtype)});
  }
  return infos;
}

// An output's elements as the reference left them: still the poison (all bits set: OpBench::Output), and written
// but not finite (f32 and bf16; an i32 element is any value).
struct Written {
  uint64_t elements = 0, poisoned = 0, not_finite = 0;
};
Written Inspect(const isa::TensorDesc& d, const uint8_t* bytes) {
  Written w;
  const auto dtype = static_cast<graph::DType>(d.dtype);
  const uint32_t size = graph::DTypeSize(dtype);
  w.elements = d.bytes / size;
  for (uint64_t i = 0; i < w.elements; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, bytes + i * size, size);
    if (bits == (size == 2 ? 0xffffu : 0xffffffffu)) {
      ++w.poisoned;
      continue;
    }
    float v = 0.0f;
    if (dtype == graph::BF16) {
      v = graph::Bf16ToFloat(static_cast<uint16_t>(bits));
    } else if (dtype == graph::F32) {
      std::memcpy(&v, &bits, 4);
    }
    w.not_finite += std::isfinite(v) ? 0 : 1;
  }
  return w;
}

// The table holds each opcode once, under its own name, and each builder's queue has an instance of its opcode.
TEST(EveryOpcode, EachOpcodeHasOneEntryWhoseQueueRunsIt) {
  EXPECT_EQ(std::size(kEntries), static_cast<size_t>(isa::kNumOpcodes));
  std::vector<int> entries(isa::kNumOpcodes, 0);
  for (const Entry& e : kEntries) {
    ASSERT_LT(static_cast<int>(e.op), isa::kNumOpcodes) << e.name;
    ++entries[static_cast<int>(e.op)];
    EXPECT_STREQ(isa::OpcodeName(e.op), e.name);
    OpBench b(Seed());
    Queue queue;
    e.build(b, queue);
    EXPECT_TRUE(std::any_of(queue.begin(), queue.end(), [&](const isa::Instruction& i) { return i.op() == e.op; }))
        << e.name << ": the builder's queue has no " << e.name;
  }
  for (int op = 0; op < isa::kNumOpcodes; ++op) {
    EXPECT_EQ(entries[op], 1) << isa::OpcodeName(static_cast<Op>(op)) << " has " << entries[op] << " entries";
  }
}

// Each instance on the CPU: every instruction valid against the bench's tensor table and its pages, compiled (and
// run as written) by its kernel variant; the entry's own instructions move bytes (and compute, unless they only
// move data); the references over the queue leave every output written (whole unless listed partial) and finite.
TEST(EveryOpcode, ValidatesCostsAndRunsItsReferenceOnTheCpu) {
  for (const Entry& e : kEntries) {
    const uint32_t seed = Seed();
    SCOPED_TRACE(absl::StrCat(e.name, ", seed ", seed));
    OpBench b(seed);
    Queue queue;
    const Settings settings = e.build(b, queue);
    const std::vector<isa::TensorInfo> infos = TensorInfos(b);
    bool valid = true;
    for (size_t i = 0; i < queue.size(); ++i) {
      const isa::Instruction& inst = queue[i];
      const absl::Status status = isa::ValidateInstruction(inst, infos);
      EXPECT_TRUE(status.ok()) << "instruction " << i << ": " << status;
      const absl::Status pages = isa::CheckPageBytes(inst, settings.page_bytes);
      EXPECT_TRUE(pages.ok()) << "instruction " << i << ": " << pages;
      valid &= status.ok() && pages.ok();
      const isa::KernelVariant variant = isa::KernelVariantOf(inst);
      EXPECT_TRUE(isa::VariantCompiles(variant, inst.op())) << "instruction " << i << ", variant " << variant;
      EXPECT_TRUE(isa::VariantRuns(variant, inst)) << "instruction " << i << ", variant " << variant;
      if (inst.op() != e.op) continue;
      const isa::Footprint f = isa::InstructionFootprint(inst, kCostContext);
      EXPECT_GT(f.weight_bytes + f.activation_bytes, 0u) << "instruction " << i << " moves no bytes";
      if (!MovesOnly(e.op)) EXPECT_GT(f.flops, 0u) << "instruction " << i << " has no flops";
    }
    if (!valid) continue;  // the references trust what validation checks

    std::vector<uint8_t> weights = b.weights(), arena = b.arena();
    const isa::MachineView host{{weights.data(), arena.data()}, b.tensors().data(),
                                static_cast<uint32_t>(b.tensors().size())};
    for (const isa::Instruction& inst : queue) isa::ExecuteReference(inst, host);
    ASSERT_FALSE(b.outputs().empty()) << "an entry with no output checks nothing";
    for (uint32_t id : b.outputs()) {
      const isa::TensorDesc& d = b.tensors()[id];
      const uint8_t* bytes = (d.region == isa::kWeightRegion ? weights.data() : arena.data()) + d.offset;
      const Written w = Inspect(d, bytes);
      const bool partial =
          std::find(settings.partial.begin(), settings.partial.end(), id) != settings.partial.end();
      EXPECT_EQ(w.not_finite, 0u) << "output tensor " << id << ": written elements that are not finite";
      EXPECT_LT(w.poisoned, w.elements) << "output tensor " << id << ": nothing written";
      if (!partial) EXPECT_EQ(w.poisoned, 0u) << "output tensor " << id << ": elements left unwritten";
    }
  }
}

// Each instance on the megakernel (one SM) against the float32 reference, on fresh random data.
TEST(EveryOpcode, RunsOnTheGpuAsItsReferenceDoes) {
  SKIP_WITHOUT_GPU();
  for (const Entry& e : kEntries) {
    SCOPED_TRACE(e.name);
    const uint32_t seed = Seed();
    OpBench b(seed);
    Queue queue;
    const Settings settings = e.build(b, queue);
    b.RunAndCompare(queue, absl::StrCat(e.name, ", seed ", seed), settings.tolerance, settings.page_bytes);
  }
}

}  // namespace
}  // namespace loom::megakernel
