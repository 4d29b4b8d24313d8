// The general-graph lowering's convolutions: CONV2D as CONV_GEMM (implicit GEMM, per group when grouped) or IM2COL +
// GEMM, depthwise as DWCONV, channels padded into a bf16 copy where CONV_GEMM needs multiples of 8 (the GEMM and its
// epilogue: graph_lowering_gemm.cc).
#include "graph/nn_ops.h"
#include "scheduler/graph_lowering_internal.h"

namespace loom::scheduler::graph_lowering_internal {

namespace {
// CONV_GEMM's packed geometry (two 16-bit fields to a word) holds this convolution, with its window positions in
// 32-bit signed arithmetic.
bool ConvGemmPackable(const isa::ImToColArgs& c) {
  constexpr uint64_t kField = uint64_t{1} << 16, kSpan = uint64_t{1} << 30;
  for (uint32_t v : {c.h, c.w, c.oh, c.ow, c.kh, c.kw, c.stride_h, c.stride_w, c.pad_top, c.pad_left, c.dilation_h,
                     c.dilation_w}) {
    if (v >= kField) return false;
  }
  return uint64_t{c.oh} * c.stride_h + uint64_t{c.kh} * c.dilation_h < kSpan &&
         uint64_t{c.ow} * c.stride_w + uint64_t{c.kw} * c.dilation_w < kSpan;
}

isa::ConvGemmArgs ConvGemmOf(const isa::ImToColArgs& c) {
  isa::ConvGemmArgs g{};
  g.input = c.input;
  g.batch = c.n;
  g.c = c.c;
  g.hw = isa::Pack16(c.h, c.w);
  g.ohw = isa::Pack16(c.oh, c.ow);
  g.kernel = isa::Pack16(c.kh, c.kw);
  g.stride = isa::Pack16(c.stride_h, c.stride_w);
  g.pad = isa::Pack16(c.pad_top, c.pad_left);
  g.dilation = isa::Pack16(c.dilation_h, c.dilation_w);
  g.c_begin = c.c_begin;
  g.group_c = c.group_c;
  g.flags = c.relu ? isa::kConvReluInput : 0;
  return g;
}
}  // namespace

// The convolution's geometry as IM2COL's arguments (x [N, H, W, C], w [OC, KH, KW, C / groups], y [N, OH, OW, OC]).
isa::ImToColArgs NnLowering::ConvGeometry(const OpDef& op) const {
  const std::vector<uint64_t> xs = ShapeOf(T(op.inputs(0))), ws = ShapeOf(T(op.inputs(1))),
                              ys = ShapeOf(T(op.outputs(0)));
  const graph::Conv2dAttrs& a = op.conv2d();
  isa::ImToColArgs c{};
  c.input = c.out = kNone;
  c.n = static_cast<uint32_t>(xs[0]), c.h = static_cast<uint32_t>(xs[1]), c.w = static_cast<uint32_t>(xs[2]);
  c.c = static_cast<uint32_t>(xs[3]);
  c.oh = static_cast<uint32_t>(ys[1]), c.ow = static_cast<uint32_t>(ys[2]);
  c.kh = static_cast<uint32_t>(ws[1]), c.kw = static_cast<uint32_t>(ws[2]);
  c.stride_h = std::max(1, a.stride_h()), c.stride_w = std::max(1, a.stride_w());
  c.pad_top = a.pad_h(), c.pad_left = a.pad_w();
  c.dilation_h = std::max(1, a.dilation_h()), c.dilation_w = std::max(1, a.dilation_w());
  c.group_c = static_cast<uint32_t>(ws[3]);
  return c;
}

bool NnLowering::ImplicitConv(const OpDef& op) const {
  const uint32_t groups = static_cast<uint32_t>(std::max(1, op.conv2d().groups()));
  const bool depthwise = groups > 1 && ShapeOf(T(op.inputs(1)))[3] == 1;
  return !depthwise && !o_.conv_im2col() && ConvGemmPackable(ConvGeometry(op));
}

bool NnLowering::ReadsBf16(const OpDef& reader, const std::string& name) const {
  if (reader.type() != graph::CONV2D || reader.inputs(0) != name || !ImplicitConv(reader)) return false;
  if (o_.has_conv_bf16_activations() && !o_.conv_bf16_activations()) return false;
  const isa::ImToColArgs c = ConvGeometry(reader);
  return isa::ConvBf16Readable(c.c, 0, c.group_c);  // (every group's first channel a multiple of group_c)
}

uint32_t NnLowering::PaddedChannels(const OpDef& conv) const {
  if (conv.type() != graph::CONV2D || prefill() || !ImplicitConv(conv) || std::max(1, conv.conv2d().groups()) != 1 ||
      T(conv.inputs(1)).kind() != graph::WEIGHT || (o_.has_conv_bf16_activations() && !o_.conv_bf16_activations())) {
    return 0;
  }
  const isa::ImToColArgs c = ConvGeometry(conv);
  if (c.group_c % 8 == 0 || ShapeOf(T(conv.inputs(0))).size() != 4) return 0;
  return (c.group_c + 7) / 8 * 8;
}

absl::StatusOr<std::pair<uint32_t, uint32_t>> NnLowering::PadChannels(const OpDef& op, uint32_t channels) {
  const std::string& x = op.inputs(0);
  const std::vector<uint64_t> xs = ShapeOf(T(x));
  isa::NhwcBf16Args a{};
  a.n = static_cast<uint32_t>(xs[0]), a.h = static_cast<uint32_t>(xs[1]), a.w = static_cast<uint32_t>(xs[2]);
  a.c = static_cast<uint32_t>(xs[3]), a.c_pad = channels;
  std::string source = x;
  std::vector<uint64_t> strides = ContiguousStrides(xs);
  if (auto it = deferred_transposes_.find(x); it != deferred_transposes_.end()) {
    source = it->second.first;
    strides = it->second.second;
  }
  absl::StatusOr<uint32_t> input = Operand(op, source);
  if (!input.ok()) return input.status();
  a.input = *input;
  a.relu = 0;
  a.stride_n = static_cast<uint32_t>(strides[0]), a.stride_h = static_cast<uint32_t>(strides[1]);
  a.stride_w = static_cast<uint32_t>(strides[2]), a.stride_c = static_cast<uint32_t>(strides[3]);
  const uint64_t pixels = uint64_t{a.n} * a.h * a.w;
  if (Product(xs) >= (uint64_t{1} << 32) || pixels * channels >= (uint64_t{1} << 32)) {
    return Unsupported(op, "an input of 2^32 elements or more is not padded to bf16");
  }
  a.out = Scratch(absl::StrCat("bf16pad:", x), graph::BF16,
                  {static_cast<int64_t>(xs[0]), static_cast<int64_t>(xs[1]), static_cast<int64_t>(xs[2]), channels});
  return std::make_pair(a.out, EmitNhwcBf16(a, ReadyOf({source}), absl::StrCat(op.name(), "/pad")));
}

uint32_t NnLowering::EmitNhwcBf16(isa::NhwcBf16Args a, const std::vector<uint32_t>& after, const std::string& name) {
  const uint32_t stage = b_.Stage(name);
  // About two instructions per SM by elements (a pixel is c_pad of them), at least kMinElementsPerInstruction.
  const uint64_t pixels = uint64_t{a.n} * a.h * a.w;
  const uint64_t per = std::max<uint64_t>((kMinElementsPerInstruction + a.c_pad - 1) / a.c_pad,
                                          (pixels + 2 * o_.num_sms() - 1) / (2 * o_.num_sms()));
  for (uint64_t begin = 0; begin < pixels; begin += per) {
    const uint64_t end = std::min(pixels, begin + per);
    a.begin = static_cast<uint32_t>(begin);
    a.count = static_cast<uint32_t>(end - begin);
    Emit(Make(isa::Opcode::NHWC_BF16, a), stage, after, name);
  }
  return stage;
}

void NnLowering::ChooseConvOutputs(Epilogue& e) const {
  if (prefill()) return;
  uint32_t bf16_readers = 0, readers = 0;
  for (const OpDef* r : g_.consumers(e.out)) {
    ++readers;
    bf16_readers += ReadsBf16(*r, e.out);
  }
  e.bf16 = bf16_readers > 0;
  e.f32 = bf16_readers < readers || T(e.out).is_output();
}

// Groups 1: one CONV_GEMM (with the epilogue fusions). Groups g: per group a CONV_GEMM over its input channels
// against its rows of the weight into a scratch [M, OC / g], and a strided copy into its columns of the output.
// With CompileOptions.conv_im2col (or a geometry CONV_GEMM cannot pack), IM2COL + GEMM instead. An input some
// CONV_GEMM epilogue stored as bf16 too is gathered so; channels not a multiple of 8 are padded into a bf16 copy
// (PaddedChannels).
absl::Status NnLowering::LowerConv(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::string& w = op.inputs(1);
  const std::vector<uint64_t> ws = ShapeOf(T(w));
  const uint32_t groups = static_cast<uint32_t>(std::max(1, op.conv2d().groups()));
  if (groups > 1 && ws[3] == 1) return LowerDepthwise(op);
  if (op.inputs_size() > 2 && T(op.inputs(2)).kind() != graph::WEIGHT) {
    return Unsupported(op, "a bias computed at run time is not lowered (constants only)");
  }
  // A weight computed at run time (or fed as an input) is packed into an operand image in the pass, once.
  std::optional<uint32_t> runtime_weight;
  if (T(w).kind() != graph::WEIGHT) {
    absl::StatusOr<uint32_t> wid = Operand(op, w);
    if (!wid.ok()) return wid.status();
    runtime_weight = *wid;
  }
  const bool implicit = ImplicitConv(op);
  const auto bf16 = bf16_.find(x);
  const uint32_t padded = PaddedChannels(op);
  std::optional<std::pair<uint32_t, uint32_t>> pad;  // the channel-padded bf16 copy and its stage
  if (padded > 0) {
    absl::StatusOr<std::pair<uint32_t, uint32_t>> copy = PadChannels(op, padded);
    if (!copy.ok()) return copy.status();
    pad = *copy;
  }
  const bool bf16_input = implicit && (pad || (bf16 != bf16_.end() && ReadsBf16(op, x)));
  absl::StatusOr<uint32_t> input = pad          ? absl::StatusOr<uint32_t>(pad->first)
                                   : bf16_input ? absl::StatusOr<uint32_t>(bf16->second)
                                                : Operand(op, x);
  if (!input.ok()) return input.status();
  isa::ImToColArgs c = ConvGeometry(op);
  const uint32_t channels = c.group_c;  // the weight's (unpadded)
  c.input = *input;
  c.relu = 0;
  if (pad) c.c = c.group_c = padded;
  const uint32_t m = isa::ImToColRows(c), k = isa::ImToColK(c), oc = static_cast<uint32_t>(ws[0]), n = oc / groups;
  const std::vector<uint32_t> after = pad ? std::vector<uint32_t>{pad->second}
                                      : bf16_input && bf16_stage_.contains(x) ? std::vector<uint32_t>{bf16_stage_.at(x)}
                                                                               : ReadyOf({x});
  // One stage each for every group's IM2COL (and run-time weight packing), GEMM and copy (a barrier per stage, not
  // per group).
  std::optional<uint32_t> pack_stage;
  if (!implicit || runtime_weight) pack_stage = b_.Stage(absl::StrCat(op.name(), implicit ? "/weight" : "/im2col"));
  const std::optional<uint32_t> gemm_stage =
      groups > 1 ? std::optional<uint32_t>(b_.Stage(absl::StrCat(op.name(), "/gemm"))) : std::nullopt;
  const uint32_t copy_stage = groups > 1 ? b_.Stage(op.name()) : 0;
  Arena(op.outputs(0));
  for (uint32_t gi = 0; gi < groups; ++gi) {
    const std::string tag = groups > 1 ? absl::StrCat("/g", gi) : "";
    c.c_begin = gi * c.group_c;
    GemmA operand;
    if (implicit) {
      operand.conv = ConvGemmOf(c);
      if (bf16_input) operand.conv->flags = isa::kConvBf16Input;  // (a bf16 copy has its ReLU applied)
      operand.ready = after;
      if (pack_stage) operand.ready.push_back(*pack_stage);
    } else {
      c.out = Scratch(absl::StrCat("im2col:", op.name(), tag), graph::BF16,
                      {static_cast<int64_t>(isa::GemmImageBytes(m, k) / 2)});
      const uint32_t per = RowsPerInstruction(
                         static_cast<uint32_t>(std::min<uint64_t>(uint64_t{m} * groups, 1u << 30)), kImToColRows),
                     padded = isa::GemmTiles(m) * isa::kGemmTileM;
      for (uint32_t r = 0; r < padded; r += per) {
        c.row_begin = r;
        c.rows = std::min(per, padded - r);
        Emit(Make(isa::Opcode::IM2COL, c), *pack_stage, after, absl::StrCat(op.name(), tag, "/im2col"));
      }
      operand.image = c.out;
      operand.ready = {*pack_stage};
    }
    uint32_t weight;
    if (runtime_weight) {
      const uint32_t view = Scratch(absl::StrCat(w, tag, "@", op.name()), graph::F32,
                                    {static_cast<int64_t>(uint64_t{n} * k)}, w, uint64_t{gi} * n * k * 4);
      weight = Scratch(absl::StrCat("wimage:", op.name(), tag), graph::BF16,
                       {static_cast<int64_t>(isa::GemmImageBytes(n, k) / 2)});
      const uint32_t per = RowsPerInstruction(n, kPackRows), padded = isa::GemmTiles(n) * isa::kGemmTileM;
      for (uint32_t r = 0; r < padded; r += per) {
        const isa::PackRowsArgs p{view, weight, n, k, r, std::min(per, padded - r), kNone, 0.0f};
        Emit(Make(isa::Opcode::PACK_ROWS, p), *pack_stage, ReadyOf({w}), absl::StrCat(op.name(), tag, "/weight"));
      }
    } else {
      weight = pad ? b_.Packed(absl::StrCat("image", padded, ":", w), {w}, ROWS_IDENTITY, n, k, true, graph::BF16,
                               std::nullopt, std::make_pair(channels, padded))
                   : b_.Packed(absl::StrCat("image:", w, tag), {w}, ROWS_IDENTITY, n, k, true, graph::BF16, gi * n);
    }
    const uint32_t bias = op.inputs_size() > 2 ? b_.Packed(absl::StrCat("bias:", op.inputs(2), tag), {op.inputs(2)},
                                                           ROWS_IDENTITY, n, 1, false, graph::BF16, gi * n)
                                               : kNone;
    if (groups == 1) {
      Epilogue e = FuseEpilogue(op);
      if (implicit) ChooseConvOutputs(e);
      EmitGemm(e, operand, weight, bias, m, n, k);
      break;
    }
    Epilogue e;
    e.out = absl::StrCat(op.outputs(0), tag);  // a scratch [M, OC / g]
    e.ops = absl::StrCat(op.name(), tag);
    arena_[e.out] = Scratch(e.out, graph::F32, {static_cast<int64_t>(m), static_cast<int64_t>(n)});
    EmitGemm(e, operand, weight, bias, m, n, k, gemm_stage, groups);
    const uint32_t slice = Scratch(absl::StrCat(op.outputs(0), "[", gi, "]"), graph::F32,
                                   {static_cast<int64_t>(uint64_t{m} * oc - gi * n)}, op.outputs(0), gi * n * 4ull);
    StridedDims dims;
    dims.size = {m, n};
    dims.strides = {{n, 1}, {oc, 1}};
    if (absl::Status s = EmitStrided(op, isa::kEwCopy, {arena_.at(e.out)}, slice, dims, copy_stage, {stage_.at(e.out)});
        !s.ok()) {
      return s;
    }
  }
  if (groups > 1) stage_[op.outputs(0)] = copy_stage;
  return absl::OkStatus();
}

// One input channel per group (depthwise, any channel multiplier): DWCONV, direct in f32, chunked by work.
absl::Status NnLowering::LowerDepthwise(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::vector<uint64_t> xs = ShapeOf(T(x)), ws = ShapeOf(T(op.inputs(1))), ys = ShapeOf(T(op.outputs(0)));
  const graph::Conv2dAttrs& a = op.conv2d();
  absl::StatusOr<uint32_t> input = Operand(op, x);
  if (!input.ok()) return input.status();
  absl::StatusOr<uint32_t> weight = Operand(op, op.inputs(1));
  if (!weight.ok()) return weight.status();
  isa::DwConvArgs d{};
  d.input = *input;
  d.weight = *weight;
  d.bias = kNone;
  if (op.inputs_size() > 2) {
    absl::StatusOr<uint32_t> bias = Operand(op, op.inputs(2));
    if (!bias.ok()) return bias.status();
    d.bias = *bias;
  }
  // The output's one reader, when a unary element-wise op of the same shape (a block's ReLU or HardSwish), is applied
  // to each output as it is stored (DwConvArgs::out_func): one pass over the output fewer.
  std::string out = op.outputs(0), ops = op.name();
  d.out_func = isa::kEwCopy;
  if (const std::vector<const OpDef*> readers = g_.consumers(out);
      !T(out).is_output() && readers.size() == 1 && graph::IsUnaryElementwise(readers[0]->type()) &&
      ShapeOf(T(readers[0]->outputs(0))) == ys) {
    d.out_func = FuncOf(*readers[0]);
    out = readers[0]->outputs(0);
    ops = absl::StrCat(ops, ",", readers[0]->name());
    consumed_.insert(readers[0]->name());
  }
  d.out = Arena(out);
  d.n = static_cast<uint32_t>(xs[0]), d.h = static_cast<uint32_t>(xs[1]), d.w = static_cast<uint32_t>(xs[2]);
  d.c = static_cast<uint32_t>(xs[3]);
  d.oh = static_cast<uint32_t>(ys[1]), d.ow = static_cast<uint32_t>(ys[2]), d.oc = static_cast<uint32_t>(ws[0]);
  d.kh = static_cast<uint32_t>(ws[1]), d.kw = static_cast<uint32_t>(ws[2]);
  d.stride_h = std::max(1, a.stride_h()), d.stride_w = std::max(1, a.stride_w());
  d.pad_top = a.pad_h(), d.pad_left = a.pad_w();
  d.dilation_h = std::max(1, a.dilation_h()), d.dilation_w = std::max(1, a.dilation_w());
  const uint32_t stage = b_.Stage(op.name());
  const std::vector<uint32_t> after = ReadyOf({op.inputs().begin(), op.inputs().end()});
  for (const auto& [begin, end] : WindowChunks(Product(ys), uint64_t{d.kh} * d.kw)) {
    d.begin = static_cast<uint32_t>(begin);
    d.count = static_cast<uint32_t>(end - begin);
    Emit(Make(isa::Opcode::DWCONV, d), stage, after, ops);
  }
  stage_[out] = stage;
  return absl::OkStatus();
}

}  // namespace loom::scheduler::graph_lowering_internal
