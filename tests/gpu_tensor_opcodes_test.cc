// GPU tests (ctest label gpu, binary gpu_test) of the tensor-core opcodes on the megakernel against their
// float32 CPU references: GEMM tiles (128 x 128, wide, split over K), CONV_GEMM, POOL, NHWC_BF16, PACK_ROWS,
// the GEMM's RoPE append, FLASH_ATTN and a prefill MLP block.
#include "tests/gpu_op_bench.h"

namespace loom::megakernel {
namespace {

using namespace gpu_bench;  // NOLINT: the bench's helpers and tolerances


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
          g.tile = isa::GemmTileOf(mt, nt);
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
      if (form == kSiluImage) {
        g.epilogue = isa::kGemmSiluMulToImage;
        g.out = b.Output(isa::GemmImageBytes(c.m, c.n / 2) / 2, graph::BF16);
      }
      const uint32_t slabs = isa::GemmSlabs(c.k), splits = form == kSplitK ? std::min(3u, slabs) : 1;
      const uint32_t sum_out = g.out;  // split: the parts' sum goes here, onto the residual it holds
      std::pair<uint32_t, std::vector<uint32_t>> parts;
      if (splits > 1) {
        parts = b.SplitParts(splits, uint64_t{c.m} * c.n);
        g.epilogue = isa::kGemmPartialF32;
      }
      std::vector<isa::Instruction> queue;
      for (uint32_t mt = 0; mt < isa::GemmTiles(c.m); ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmColumnTiles(c.n, wide); ++nt) {
          for (uint32_t s = 0; s < splits; ++s) {
            g.tile = isa::GemmTileOf(mt, nt);
            const uint32_t begin = slabs * s / splits;
            if (splits > 1) {
              g.slabs = isa::GemmPackSlabs(begin, slabs * (s + 1) / splits - begin);
              g.out = parts.second[s];
            }
            queue.push_back(Make(isa::Opcode::GEMM, g));
          }
        }
      }
      if (splits > 1) AppendSums(queue, parts.first, sum_out, sum_out, c.m * c.n, splits, 1000);
      b.RunAndCompare(queue,
                      absl::StrCat(wide ? "wide" : "128-column", " GEMM M ", c.m, " N ", c.n, " K ", c.k, " form ",
                                   form, " seed ", seed),
                      form == kSiluImage ? kBf16OutputTolerance : kTolerance, isa::kGemmWideStepBytes);
    }
  }
}

// An opcode the running kernel variant does not compile is reported by the device, naming it, not skipped: a GEMM
// forced into the decode variant fails its launch; the next launch (a variant that has it) runs clean.
TEST(GpuOpcodes, AnOpcodeItsVariantLacksFailsTheLaunch) {
  SKIP_WITHOUT_GPU();
  OpBench b(Seed());
  const isa::Instruction gemm = Make(isa::Opcode::GEMM, b.RandomGemm(64, 128, 128));
  const absl::Status lacking = b.RunInVariant({gemm}, 16384, isa::kDecodeKernel);
  EXPECT_NE(lacking.message().find("SM 0 queue index 0: GEMM is not compiled into the decode kernel variant"),
            std::string::npos)
      << lacking;
  EXPECT_TRUE(b.RunInVariant({gemm}, 16384, isa::kTensorKernel).ok());
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

// Split-K: each output tile as 3 instructions over uneven K slab ranges, each storing its part (the bias in the
// first) into its view of one parts tensor, then SUM_SPLITS adding the parts onto the residual the output holds (in
// place, as a short prompt's O- and down-projections run), from nothing, or from another base with its ReLU and the
// sum's (a split convolution's epilogue), in chunks that are and are not multiples of 4.
TEST(GpuOpcodes, GemmSplitKPartsSumInOrder) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, n, k; };
  for (const Case& c : {Case{7, 100, 1000}, Case{129, 256, 8192}, Case{128, 130, 200}, Case{3, 33, 640}}) {
    for (uint32_t form = 0; form < 3; ++form) {  // 0: onto out in place; 1: from nothing; 2: from a base, ReLUs
      const uint32_t seed = Seed();
      OpBench b(seed);
      isa::GemmArgs g = b.RandomGemm(c.m, c.n, c.k);
      const uint32_t out = g.out, elements = c.m * c.n;
      uint32_t base = isa::kNoTensor;
      if (form == 0) base = out, b.FillRandom(out);  // the residual stream it adds to
      if (form == 2) base = b.Arena(elements), b.FillRandom(base);
      g.bias = b.Weight(c.n);
      b.FillRandom(g.bias);
      g.epilogue = isa::kGemmPartialF32;
      const uint32_t slabs = isa::GemmSlabs(c.k);
      std::vector<uint32_t> begins, counts;
      for (uint32_t s = 0; s < 3; ++s) {
        const uint32_t begin = slabs * s * s / 9, count = slabs * (s + 1) * (s + 1) / 9 - begin;  // uneven
        if (count > 0) begins.push_back(begin), counts.push_back(count);
      }
      const uint32_t splits = static_cast<uint32_t>(begins.size());
      const auto parts = b.SplitParts(splits, elements);
      std::vector<isa::Instruction> queue;
      for (uint32_t mt = 0; mt < isa::GemmTiles(c.m); ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmTiles(c.n); ++nt) {
          for (uint32_t s = 0; s < splits; ++s) {
            g.tile = isa::GemmTileOf(mt, nt);
            g.slabs = isa::GemmPackSlabs(begins[s], counts[s]);
            g.out = parts.second[s];
            queue.push_back(Make(isa::Opcode::GEMM, g));
          }
        }
      }
      const uint32_t flags = form == 2 ? isa::kSumReluBase | isa::kSumReluOut : 0;
      AppendSums(queue, parts.first, base, out, elements, splits, form == 1 ? 258 : 1024, flags);
      b.RunAndCompare(queue, absl::StrCat("GEMM split-K M ", c.m, " N ", c.n, " K ", c.k, " form ", form, " seed ",
                                          seed));
    }
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
          b.FillRandom(g.out);  // the residual stream the split's sum adds to
          g.bias = b.Weight(c.oc);
          b.FillRandom(g.bias);
          g.epilogue = isa::kGemmPartialF32;
        }
        const uint32_t slabs = isa::GemmSlabs(k), splits = form % 3 == 2 ? std::min(3u, slabs) : 1;
        const uint32_t sum_out = g.out;
        std::pair<uint32_t, std::vector<uint32_t>> parts;
        if (splits > 1) parts = b.SplitParts(splits, uint64_t{m} * c.oc);
        std::vector<isa::Instruction> queue;
        for (uint32_t mt = 0; mt < isa::GemmTiles(m); ++mt) {
          for (uint32_t nt = 0; nt < isa::GemmTiles(c.oc); ++nt) {
            for (uint32_t sp = 0; sp < splits; ++sp) {
              g.m_tile = mt, g.n_tile = nt;
              if (form % 3 == 2) {
                const uint32_t begin = slabs * sp / splits, count = slabs * (sp + 1) / splits - begin;
                g.slabs = count << 16 | begin;
              }
              if (splits > 1) g.out = parts.second[sp];
              queue.push_back(Make(isa::Opcode::CONV_GEMM, g));
            }
          }
        }
        if (splits > 1) AppendSums(queue, parts.first, sum_out, sum_out, m * c.oc, splits, 4096, isa::kSumReluOut);
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
// waiting on the packing's barrier: the prefill building block of norm -> projection. Ragged M and K. With parts
// (a split product's, 3 or 5 of them, added into the rows first: the input is an output too), k a multiple of 4 or
// not. Forms 4 and 5 defer the norm to the GEMM (k whole slabs): the prompt rows packed by column slices of 64 or
// 192 columns (PackRowsArgs::row_norm, with parts and without), the padding rows whole, the GEMM scaling its rows
// (form 5 in 128 x 256 tiles, 48 KB pages: the wide variant's copy of the slots).
TEST(GpuOpcodes, PackRowsThenGemm) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t m, n, k; };
  for (const Case& c : {Case{1, 128, 64}, Case{7, 100, 100}, Case{129, 256, 576}, Case{300, 128, 2048},
                        Case{33, 128, 99}}) {
    for (uint32_t form = 0; form < 6; ++form) {  // norm or not x parts or not; deferred norm with parts or not
      const bool sliced = form >= 4, norm = form % 2 == 1 || sliced, parts = form == 2 || form == 3 || form == 4;
      if (sliced && c.k % isa::kGemmSlabK != 0) continue;
      const uint32_t seed = Seed();
      OpBench b(seed);
      isa::PackRowsArgs p{};
      p.input = parts ? b.Output(uint64_t{c.m} * c.k) : b.Arena(uint64_t{c.m} * c.k);
      b.FillRandom(p.input, -2.0f, 2.0f);
      if (parts) {
        p.splits = c.m % 2 == 0 ? 3 : 5;
        p.parts = b.Arena(uint64_t{p.splits} * c.m * c.k);
        b.FillRandom(p.parts);
      }
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
      uint32_t row_norm = isa::kNoTensor;
      if (sliced) {  // the prompt rows in slices, 3 rows an instruction (ragged)
        row_norm = b.Arena(uint64_t{c.m} * isa::kRowNormSlots);
        b.FillRandom(row_norm);  // stale: every slot a GEMM reads is written
        isa::PackRowsArgs s = p;
        s.row_norm = row_norm;
        s.cols = c.k >= 1024 ? 192 : 64;
        for (uint32_t r = 0; r < c.m; r += 3) {
          for (s.col_begin = 0; s.col_begin < c.k; s.col_begin += s.cols) {
            s.row_begin = r;
            s.rows = std::min(3u, c.m - r);
            isa::Instruction inst = Make(isa::Opcode::PACK_ROWS, s);
            inst.signal = 0;
            queue.push_back(inst);
          }
        }
      }
      for (uint32_t r = sliced ? c.m : 0; r < m_tiles * isa::kGemmTileM; r += 40) {  // 40 rows, ragged end
        p.row_begin = r;
        p.rows = std::min(40u, m_tiles * isa::kGemmTileM - r);
        isa::PackRowsArgs whole = p;
        if (sliced) whole.splits = 0, whole.parts = isa::kNoTensor;  // padding rows: zeros
        isa::Instruction inst = Make(isa::Opcode::PACK_ROWS, whole);
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
      g.row_norm = row_norm;
      g.wide = form == 5 ? 1 : 0;
      for (uint32_t mt = 0; mt < m_tiles; ++mt) {
        for (uint32_t nt = 0; nt < isa::GemmColumnTiles(c.n, g.wide); ++nt) {
          g.tile = isa::GemmTileOf(mt, nt);
          isa::Instruction inst = Make(isa::Opcode::GEMM, g);
          inst.num_waits = 1;
          inst.waits[0] = {0, packs | (packs << 16)};  // every packing of this step
          queue.push_back(inst);
        }
      }
      b.RunAndCompare(queue,
                      absl::StrCat("PACK_ROWS", norm ? " (RMSNorm)" : "", sliced ? " (deferred, slices)" : "",
                                   parts ? " (parts)" : "", g.wide ? " + wide GEMM" : " + GEMM", ", M ", c.m, " N ", c.n,
                                   " K ", c.k, " seed ", seed),
                      kBf16ChainTolerance, g.wide ? isa::kGemmWideStepBytes : 16384);
    }
  }
}

// The QKV projection of a prefill on the tensor cores: GEMM over the grouped q|k|v rows with the RoPE +
// KV-append epilogue (token row r at position state + r), with and without q/k/v biases, and with Qwen3's
// per-head q/k RMSNorm (head_dim 64: two heads per 128-column tile; 128: one), into f32 and bf16 KV caches (bf16:
// compared at a bf16 value's tolerance, a sum that differs in its last f32 bits may round to the next bf16).
TEST(GpuOpcodes, GemmRopeKvAppendForPromptRows) {
  SKIP_WITHOUT_GPU();
  for (uint32_t m : {7u, 200u}) {
    for (uint32_t variant = 0; variant < 4; ++variant) {
      const bool biased = variant % 2 == 1, normed = variant >= 2;
      const graph::DType kv_dtype = (variant / 2 + (m == 200 ? 1 : 0)) % 2 == 1 ? graph::BF16 : graph::F32;
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
      g.k_cache = b.Output(kKv * kSeq * kDim, kv_dtype);
      g.v_cache = b.Output(kKv * kSeq * kDim, kv_dtype);
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
          g.tile = isa::GemmTileOf(mt, nt);
          queue.push_back(Make(isa::Opcode::GEMM, g));
        }
      }
      b.RunAndCompare(queue,
                      absl::StrCat("GEMM RoPE + KV append, ", m, " tokens", biased ? ", biases" : "",
                                   normed ? ", head norms" : "", ", head_dim ", kDim, ", KV ",
                                   graph::DType_Name(kv_dtype), " seed ", seed),
                      kv_dtype == graph::BF16 ? kBf16OutputTolerance : kTolerance);
    }
  }
}

// FLASH_ATTN: causal prefill attention on the tensor cores against the f32 reference (which rounds q, K and V
// to bf16 as the tensor cores read them; P is bf16 on the device only, hence the looser tolerance), every
// (row tile, head) of a prompt of P rows after `start` cached positions, GQA groups 1 / 4 / 8, head_dim 64 and
// 128, over f32 and bf16 KV caches (the cases with an odd index in bf16). Cache rows past the prompt are NaN: a key
// tile reaching past the last position must not read them.
TEST(GpuOpcodes, FlashAttentionPrefill) {
  SKIP_WITHOUT_GPU();
  struct Case { uint32_t rows, head_dim, group, kv_heads, start; };
  // Several key tiles per warpgroup (128 / 64 start 64 / 256): the loop-carried softmax state across tiles.
  const std::vector<Case> cases = {{1, 64, 1, 2, 0},    {17, 128, 4, 2, 0},  {64, 64, 8, 1, 0},  {128, 64, 1, 1, 0},
                                   {64, 64, 1, 1, 64},  {256, 128, 1, 1, 0},
                                   {129, 128, 1, 3, 40}, {1000, 128, 4, 2, 0}, {300, 64, 8, 1, 700},
                                   {2048, 64, 1, 2, 0},  {2048, 128, 8, 1, 0}};
  for (size_t index = 0; index < cases.size(); ++index) {
    const Case& c = cases[index];
    const graph::DType kv_dtype = index % 2 == 1 ? graph::BF16 : graph::F32;
    const uint32_t seed = Seed();
    OpBench b(seed);
    const uint32_t heads = c.group * c.kv_heads, hd = c.head_dim;
    const uint32_t max_seq = c.start + c.rows + 37;  // not a multiple of the 64-key tile
    isa::FlashAttnArgs a{};
    a.q = b.Arena(uint64_t{c.rows} * heads * hd);
    b.FillRandom(a.q, -2.0f, 2.0f);
    a.k_cache = b.Arena(uint64_t{c.kv_heads} * max_seq * hd, kv_dtype);
    a.v_cache = b.Arena(uint64_t{c.kv_heads} * max_seq * hd, kv_dtype);
    b.FillRandom(a.k_cache, -2.0f, 2.0f);
    b.FillRandom(a.v_cache);
    for (uint32_t g = 0; g < c.kv_heads; ++g) {
      for (uint64_t i = (uint64_t{g} * max_seq + c.start + c.rows) * hd; i < uint64_t{g + 1} * max_seq * hd; ++i) {
        if (kv_dtype == graph::BF16) {
          b.Data<uint16_t>(a.k_cache)[i] = b.Data<uint16_t>(a.v_cache)[i] = 0x7fc0;  // a bf16 NaN
        } else {
          b.Data<float>(a.k_cache)[i] = b.Data<float>(a.v_cache)[i] = NAN;
        }
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
                                        c.start, " KV ", graph::DType_Name(kv_dtype), " seed ", seed),
                    kBf16OutputTolerance);
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
      up.tile = isa::GemmTileOf(t / isa::GemmTiles(up.n), t % isa::GemmTiles(up.n));
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
      down.tile = isa::GemmTileOf(t / isa::GemmTiles(c.hidden), t % isa::GemmTiles(c.hidden));
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

}  // namespace
}  // namespace loom::megakernel
