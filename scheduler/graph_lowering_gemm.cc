// The general-graph lowering's GEMM side: LINEAR / MATMUL (PACK_ROWS + GEMM), the GEMM epilogue's fusions,
// split-K and the ReLU it leaves to its readers (convolutions: graph_lowering_conv.cc).
#include "scheduler/graph_lowering_internal.h"

namespace loom::scheduler::graph_lowering_internal {

NnLowering::Epilogue NnLowering::FuseEpilogue(const OpDef& op) {
  Epilogue e;
  e.out = op.outputs(0);
  e.ops = op.name();
  auto only_reader = [&](const std::string& t, graph::OpType type) -> const OpDef* {
    if (T(t).is_output()) return nullptr;
    const std::vector<const OpDef*> readers = g_.consumers(t);
    return readers.size() == 1 && readers[0]->type() == type ? readers[0] : nullptr;
  };
  if (const OpDef* add = only_reader(e.out, graph::ADD)) {
    const std::string& other = add->inputs(0) == e.out ? add->inputs(1) : add->inputs(0);
    const bool ready = T(other).kind() == graph::INPUT || arena_.contains(other);
    if (other != e.out && ready && T(other).kind() != graph::WEIGHT && T(other).dtype() == graph::F32 &&
        ShapeOf(T(other)) == ShapeOf(T(e.out)) && ShapeOf(T(add->outputs(0))) == ShapeOf(T(e.out))) {
      e.residual = Arena(other);
      e.residual_names = {other};
      e.out = add->outputs(0);
      e.ops = absl::StrCat(e.ops, ",", add->name());
      consumed_.insert(add->name());
    }
  }
  if (const OpDef* relu = only_reader(e.out, graph::RELU)) {
    e.relu = true;
    e.out = relu->outputs(0);
    e.ops = absl::StrCat(e.ops, ",", relu->name());
    consumed_.insert(relu->name());
  }
  return e;
}

// C = A·Wᵀ (+ bias) into the epilogue's output: every output tile, m-tiles inside n-tiles (concurrent SMs share
// W tiles in L2), waiting for A and the residual. A GEMM of fewer tiles than half the SMs is split over K as well:
// each split stores its part (the first one with the bias), and a SUM_SPLITS stage adds the residual (or nothing)
// and the parts in part order, then the ReLU, so the output is the same every run.
void NnLowering::EmitGemm(const Epilogue& e, const GemmA& a, uint32_t weight, uint32_t bias, uint32_t m, uint32_t n,
                          uint32_t k, std::optional<uint32_t> into, uint32_t siblings) {
  isa::GemmArgs g{};
  g.a = a.image;
  g.weight = weight;
  g.out = arena_.contains(e.out) ? arena_.at(e.out) : Arena(e.out);
  g.m = m;
  g.n = n;
  g.k = k;
  g.bias = bias;
  g.residual = e.residual;
  g.epilogue = e.relu ? isa::kGemmStoreF32Relu : isa::kGemmStoreF32;
  g.k_cache = g.v_cache = g.step_state = g.rope_table = g.qk_norm = kNone;
  const uint32_t tiles = isa::GemmTiles(m) * isa::GemmTiles(n), slabs = isa::GemmSlabs(k);
  const uint32_t splits = KSplits(tiles, slabs, siblings);
  const bool split = splits > 1;
  std::vector<uint32_t> after = a.ready;
  if (!split) {
    for (uint32_t r : ReadyOf(e.residual_names)) {
      if (std::find(after.begin(), after.end(), r) == after.end()) after.push_back(r);
    }
  }
  // Split, the tiles signal a stage of their own and the sums the output's.
  const uint32_t stage = split || !into ? b_.Stage(split ? absl::StrCat(e.ops, "/parts") : e.ops) : *into;
  SplitParts parts;
  if (split) {
    parts = AddSplitParts(b_, absl::StrCat(prefix_, "parts:", e.out), uint64_t{m} * n, splits);
    g.epilogue = isa::kGemmPartialF32;
    g.residual = kNone;
  }
  // A convolution's output other convolutions gather as bf16: stored so too, whole (split over K, NHWC_BF16 copies
  // the sum, below).
  uint32_t bf16_out = kNone;
  if (a.conv && e.bf16 && !split) {
    const std::vector<uint64_t> shape = ShapeOf(T(e.out));
    bf16_out = Scratch(absl::StrCat("bf16:", e.out), graph::BF16, std::vector<int64_t>(shape.begin(), shape.end()));
  }
  // A 64-channel convolution with a bf16 input whose 128 x 128 tiles would take more than one wave: tall tiles
  // (isa::kConvTall), half as many.
  bool tall = a.conv && (a.conv->flags & isa::kConvBf16Input) && !split && n <= isa::kConvTallCols &&
              isa::GemmTiles(m) > o_.num_sms();
  if (tall) {  // and its store epilogue goes through the slot (as a tall tile's must)
    isa::ConvGemmArgs probe = *a.conv;
    probe.n = n, probe.out_bf16 = bf16_out;
    tall = isa::ConvStagesOutput(probe);
  }
  ForEachGemmTile(
      g, splits,
      [&](const isa::GemmArgs& tile, uint32_t) {
        if (!a.conv) {
          Emit(Make(isa::Opcode::GEMM, tile), stage, after, e.ops);
          return;
        }
        if (tall && isa::GemmMTile(tile) % 2 != 0) return;
        isa::ConvGemmArgs c = *a.conv;
        c.weight = tile.weight, c.out = tile.out, c.bias = tile.bias, c.residual = tile.residual;
        c.epilogue = tile.epilogue, c.n = tile.n, c.m_tile = isa::GemmMTile(tile), c.n_tile = isa::GemmNTile(tile);
        c.slabs = tile.slabs;
        if (tall) c.m_tile /= 2, c.flags |= isa::kConvTall;
        c.out_bf16 = kNone;
        if (bf16_out != kNone) {
          c.out_bf16 = bf16_out;
          if (!e.f32) c.out = kNone;
        }
        Emit(Make(isa::Opcode::CONV_GEMM, c), stage, after, e.ops);
      },
      parts.parts);
  stage_[e.out] = stage;
  if (bf16_out != kNone) bf16_[e.out] = bf16_out;
  if (!split) return;
  const uint32_t sum = into ? *into : b_.Stage(e.ops);
  std::vector<uint32_t> sum_after = {stage};
  for (uint32_t r : ReadyOf(e.residual_names)) {
    if (std::find(sum_after.begin(), sum_after.end(), r) == sum_after.end()) sum_after.push_back(r);
  }
  const uint64_t elements = uint64_t{m} * n;
  for (const auto& [begin, end] : Chunks(elements, 4)) {
    const isa::SumSplitsArgs s{parts.all, e.residual, g.out, static_cast<uint32_t>(elements), splits,
                               static_cast<uint32_t>(begin), static_cast<uint32_t>(end - begin),
                               e.relu ? isa::kSumReluOut : 0u};
    Emit(Make(isa::Opcode::SUM_SPLITS, s), sum, sum_after, absl::StrCat(e.ops, "/sum"));
  }
  stage_[e.out] = sum;
  // Its bf16 copy for the convolutions that gather it, when that pays: NHWC_BF16's, a stage of its own. (The tile's
  // last split rounding the sum itself put a read-back on every split's path: not kept.)
  if (a.conv && e.bf16 && ShapeOf(T(e.out)).size() == 4 && Bf16CopyPays(e.out)) {
    const std::vector<uint64_t> shape = ShapeOf(T(e.out));
    isa::NhwcBf16Args c{};
    c.input = g.out;
    c.out = Scratch(absl::StrCat("bf16:", e.out), graph::BF16, std::vector<int64_t>(shape.begin(), shape.end()));
    c.n = static_cast<uint32_t>(shape[0]), c.h = static_cast<uint32_t>(shape[1]), c.w = static_cast<uint32_t>(shape[2]);
    c.c = c.c_pad = static_cast<uint32_t>(shape[3]);
    c.stride_n = c.h * c.w * c.c, c.stride_h = c.w * c.c, c.stride_w = c.c, c.stride_c = 1;
    c.relu = 0;  // (the sum applied it)
    bf16_stage_[e.out] = EmitNhwcBf16(c, {sum}, absl::StrCat(e.ops, "/bf16"));
    bf16_[e.out] = c.out;
  }
}

uint32_t NnLowering::KSplits(uint32_t tiles, uint32_t slabs, uint32_t siblings) const {
  if (2 * tiles * siblings > o_.num_sms() || slabs < 2 * kMinSlabsPerSplit) return 1;
  // As many ways as keep every instruction in one wave (rounding up left some SMs two tiles' worth).
  const uint32_t bound = o_.max_k_splits() != 0 ? o_.max_k_splits() : kMaxKSplits;
  return std::max(1u, std::min({o_.num_sms() / (tiles * siblings), slabs / kMinSlabsPerSplit, bound}));
}

bool NnLowering::Bf16CopyPays(const std::string& name) const {
  for (const OpDef* r : g_.consumers(name)) {
    if (!ReadsBf16(*r, name)) continue;
    const isa::ImToColArgs c = ConvGeometry(*r);
    const uint32_t m = isa::ImToColRows(c), n = static_cast<uint32_t>(ShapeOf(T(r->inputs(1)))[0]);
    const uint32_t slabs = isa::GemmSlabs(isa::ImToColK(c));
    if (slabs / KSplits(isa::GemmTiles(m) * isa::GemmTiles(n), slabs, 1) >= kMinSlabsForBf16Copy) return true;
  }
  return false;
}

// Rows of an operand image per IM2COL / PACK_ROWS instruction: about two instructions per SM, at least
// `granule` rows (PACK_ROWS: a warp per row).
uint32_t NnLowering::RowsPerInstruction(uint32_t m, uint32_t granule) const {
  const uint32_t padded = isa::GemmTiles(m) * isa::kGemmTileM;
  const uint32_t per = (padded + 2 * o_.num_sms() - 1) / (2 * o_.num_sms());
  return std::clamp((per + granule - 1) / granule * granule, granule, isa::kGemmTileM);
}

// `op` as the gate or the up projection of SILU_MUL(gate, up): both LINEARs of one input without biases, each read
// only by the SILU_MUL, whose output only LINEARs read (as their input); the intermediate a multiple of 64 (the
// image epilogue's pairs).
std::optional<NnLowering::GateUp> NnLowering::FindGateUp(const OpDef& op) const {
  const std::vector<const OpDef*> readers = g_.consumers(op.outputs(0));
  if (readers.size() != 1 || readers[0]->type() != graph::SILU_MUL || T(op.outputs(0)).is_output()) {
    return std::nullopt;
  }
  const OpDef* silu = readers[0];
  const OpDef* gate = g_.producer(silu->inputs(0));
  const OpDef* up = g_.producer(silu->inputs(1));
  if (gate == nullptr || up == nullptr || gate == up || gate->type() != graph::LINEAR || up->type() != graph::LINEAR ||
      gate->inputs(0) != up->inputs(0) || gate->inputs_size() != 2 || up->inputs_size() != 2 ||
      g_.consumers(gate->outputs(0)).size() != 1 || g_.consumers(up->outputs(0)).size() != 1 ||
      T(gate->inputs(1)).kind() != graph::WEIGHT || T(up->inputs(1)).kind() != graph::WEIGHT ||
      ShapeOf(T(gate->inputs(1))) != ShapeOf(T(up->inputs(1))) || T(gate->inputs(1)).shape(0) % 64 != 0 ||
      T(silu->outputs(0)).is_output()) {
    return std::nullopt;
  }
  for (const OpDef* c : g_.consumers(silu->outputs(0))) {
    if (c->type() != graph::LINEAR || c->inputs(0) != silu->outputs(0)) return std::nullopt;
  }
  return GateUp{gate, up, silu};
}

// LINEAR (x [..., K], w [N, K] [, bias]) and MATMUL (a [..., M, K], a constant b [K, N]): the rows of x packed
// into an operand image, then a GEMM.
absl::Status NnLowering::LowerMatmul(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::string& w = op.inputs(1);
  const std::vector<uint64_t> xs = ShapeOf(T(x)), ws = ShapeOf(T(w));
  const bool linear = op.type() == graph::LINEAR;
  if (linear && T(w).kind() != graph::WEIGHT) return Unsupported(op, "a LINEAR weight computed at run time");
  if (!linear && (T(w).kind() != graph::WEIGHT || ws.size() != 2)) return LowerBatchedMatmul(op);
  if (op.inputs_size() > 2 && T(op.inputs(2)).kind() != graph::WEIGHT) {
    return Unsupported(op, "a bias computed at run time is not lowered");
  }
  const std::optional<GateUp> gate_up = linear ? FindGateUp(op) : std::nullopt;
  const uint32_t k = static_cast<uint32_t>(xs.back()), n = static_cast<uint32_t>(linear ? ws[0] : ws[1]);
  const uint64_t rows = Product(xs) / k;
  if (rows >= (uint64_t{1} << 31)) return Unsupported(op, "too many rows");
  const uint32_t m = static_cast<uint32_t>(rows);
  // One operand image per input, shared by every matmul reading it (a layer's u / gate projections, gate / up);
  // a deferred RMSNorm is applied as the rows are packed.
  if (!images_.contains(x)) {
    auto norm = deferred_norms_.find(x);
    const std::string& source = norm != deferred_norms_.end() ? norm->second.x : x;
    absl::StatusOr<uint32_t> input = Operand(op, source);
    if (!input.ok()) return input.status();
    uint32_t norm_weight = kNone;
    float eps = 0.0f;
    if (norm != deferred_norms_.end()) {
      norm_weight = b_.Packed(absl::StrCat("bf16:", norm->second.weight), {norm->second.weight}, ROWS_IDENTITY, k, 1,
                              false);
      eps = norm->second.eps;
    }
    const uint32_t image =
        Scratch(absl::StrCat("rows:", x), graph::BF16, {static_cast<int64_t>(isa::GemmImageBytes(m, k) / 2)});
    const uint32_t pack_stage = b_.Stage(absl::StrCat(x, "/pack"));
    const std::vector<uint32_t> after = ReadyOf({source});
    const uint32_t per = RowsPerInstruction(m, kPackRows), padded = isa::GemmTiles(m) * isa::kGemmTileM;
    for (uint32_t r = 0; r < padded; r += per) {
      const isa::PackRowsArgs a{*input, image, m, k, r, std::min(per, padded - r), norm_weight, eps};
      Emit(Make(isa::Opcode::PACK_ROWS, a), pack_stage, after, absl::StrCat(x, "/pack"));
    }
    images_[x] = {image, pack_stage};
  }
  const auto [image, pack_stage] = images_.at(x);
  if (gate_up) {
    // One GEMM over interleaved (gate, up) rows whose epilogue writes silu(gate) * up as the bf16 operand image of
    // the matmuls that read it (no f32 tensor, no pack).
    const uint32_t inter = n, both = 2 * n;
    const uint32_t out = Scratch(absl::StrCat("rows:", gate_up->silu->outputs(0)), graph::BF16,
                                 {static_cast<int64_t>(isa::GemmImageBytes(m, inter) / 2)});
    isa::GemmArgs g{};
    g.a = image;
    g.weight = b_.Packed(absl::StrCat("image:", gate_up->gate->inputs(1), "+", gate_up->up->inputs(1)),
                         {gate_up->gate->inputs(1), gate_up->up->inputs(1)}, ROWS_INTERLEAVE_PAIRS, both, k, true);
    g.out = out;
    g.m = m, g.n = both, g.k = k;
    g.bias = g.residual = g.k_cache = g.v_cache = g.step_state = g.rope_table = g.qk_norm = kNone;
    g.epilogue = isa::kGemmSiluMulToImage;
    const std::string name = absl::StrCat(gate_up->gate->name(), ",", gate_up->up->name(), ",", gate_up->silu->name());
    const uint32_t stage = b_.Stage(name);
    ForEachGemmTile(g, 1, [&](const isa::GemmArgs& tile, uint32_t) {
      Emit(Make(isa::Opcode::GEMM, tile), stage, {pack_stage}, name);
    });
    consumed_.insert(gate_up->gate->name());
    consumed_.insert(gate_up->up->name());
    consumed_.insert(gate_up->silu->name());
    images_[gate_up->silu->outputs(0)] = {out, stage};
    return absl::OkStatus();
  }
  const uint32_t weight = linear ? b_.Packed(absl::StrCat("image:", w), {w}, ROWS_IDENTITY, n, k, true)
                                 : b_.Packed(absl::StrCat("imageT:", w), {w}, ROWS_TRANSPOSED, n, k, true);
  const uint32_t bias = op.inputs_size() > 2
                            ? b_.Packed(absl::StrCat("bias:", op.inputs(2)), {op.inputs(2)}, ROWS_IDENTITY, n, 1, false)
                            : kNone;
  EmitGemm(FuseEpilogue(op), {image, {pack_stage}, std::nullopt}, weight, bias, m, n, k);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, std::vector<uint32_t>>> NnLowering::ArenaCopy(const OpDef& op,
                                                                                     const std::string& name) {
  absl::StatusOr<uint32_t> id = Operand(op, name);
  if (!id.ok()) return id.status();
  if (T(name).kind() != graph::WEIGHT) return std::make_pair(name, ReadyOf({name}));
  const std::string copy = absl::StrCat("copy:", name);
  if (!arena_.contains(copy)) {
    const std::vector<uint64_t> shape = ShapeOf(T(name));
    arena_[copy] = Scratch(copy, graph::F32, std::vector<int64_t>(shape.begin(), shape.end()));
    stage_[copy] = EmitMap(isa::kEwCopy, *id, arena_[copy], Product(shape), {}, copy);
  }
  return std::make_pair(copy, std::vector<uint32_t>{stage_.at(copy)});
}

absl::Status NnLowering::LowerBatchedMatmul(const OpDef& op) {
  std::vector<uint64_t> as = ShapeOf(T(op.inputs(0))), bs = ShapeOf(T(op.inputs(1)));
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const uint64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const std::vector<uint64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  const std::vector<uint64_t> ys = ShapeOf(T(op.outputs(0)));
  const std::vector<uint64_t> batch(ys.begin(), ys.begin() + std::max(a_batch.size(), b_batch.size()));
  const uint64_t batches = Product(batch), a_count = Product(a_batch), b_count = Product(b_batch);
  if (m * k >= (uint64_t{1} << 31) || n * k >= (uint64_t{1} << 31) || batches * m * n >= (uint64_t{1} << 32)) {
    return Unsupported(op, "operands of 2^31 elements or more");
  }
  absl::StatusOr<std::pair<std::string, std::vector<uint32_t>>> a = ArenaCopy(op, op.inputs(0));
  if (!a.ok()) return a.status();
  absl::StatusOr<uint32_t> b = Operand(op, op.inputs(1));
  if (!b.ok()) return b.status();
  // Bᵀ: [b_count, n, k] from b [b_count, k, n].
  const std::string bt = absl::StrCat("bT:", op.name());
  Arena(op.outputs(0));
  arena_[bt] = Scratch(bt, graph::F32, {static_cast<int64_t>(b_count), static_cast<int64_t>(n),
                                           static_cast<int64_t>(k)});
  const uint32_t transpose_stage = b_.Stage(bt);
  StridedDims dims;
  dims.size = {b_count, n, k};
  dims.strides = {{k * n, 1, n}, {n * k, k, 1}};
  if (absl::Status s = EmitStrided(op, isa::kEwCopy, {*b}, arena_[bt], dims, transpose_stage, ReadyOf({op.inputs(1)}));
      !s.ok()) {
    return s;
  }
  // Operand images: every batch of A ([m, k] rows) and of Bᵀ ([n, k] rows), all in one stage.
  const uint32_t pack_stage = b_.Stage(absl::StrCat(op.name(), "/pack"));
  auto pack = [&](const std::string& source, uint64_t index, uint64_t rows, std::vector<uint32_t> after) {
    const std::string tag = absl::StrCat(source, "[", index, "]");
    const uint32_t view = Scratch(absl::StrCat(tag, "@", op.name()), graph::F32,
                                     {static_cast<int64_t>(rows * k)}, source, index * rows * k * 4);
    const uint32_t image = Scratch(absl::StrCat("rows:", op.name(), ":", tag), graph::BF16,
                                      {static_cast<int64_t>(isa::GemmImageBytes(static_cast<uint32_t>(rows),
                                                                                static_cast<uint32_t>(k)) / 2)});
    const uint32_t r32 = static_cast<uint32_t>(rows), k32 = static_cast<uint32_t>(k);
    const uint32_t per = RowsPerInstruction(r32, kPackRows), padded = isa::GemmTiles(r32) * isa::kGemmTileM;
    for (uint32_t r = 0; r < padded; r += per) {
      const isa::PackRowsArgs p{view, image, r32, k32, r, std::min(per, padded - r), kNone, 0.0f};
      Emit(Make(isa::Opcode::PACK_ROWS, p), pack_stage, after, absl::StrCat(op.name(), "/pack"));
    }
    return image;
  };
  std::vector<uint32_t> a_images, b_images;
  for (uint64_t i = 0; i < a_count; ++i) a_images.push_back(pack(a->first, i, m, a->second));
  for (uint64_t i = 0; i < b_count; ++i) b_images.push_back(pack(bt, i, n, {transpose_stage}));
  // A GEMM per output batch q into rows [q * m, +m) of the output, from the batches of A and B it broadcasts.
  const std::vector<uint64_t> out_strides = ContiguousStrides(batch);
  auto index_of = [&](const std::vector<uint64_t>& in, uint64_t q) {
    const std::vector<uint64_t> in_strides = BroadcastStrides(in, batch);
    uint64_t index = 0;
    for (size_t d = 0; d < batch.size(); ++d) index += q / out_strides[d] % batch[d] * in_strides[d];
    return index;
  };
  const uint32_t stage = b_.Stage(op.name());
  for (uint64_t q = 0; q < batches; ++q) {
    Epilogue e;
    e.out = batches == 1 ? op.outputs(0) : absl::StrCat(op.outputs(0), "[", q, "]");
    e.ops = op.name();
    if (batches > 1) {
      arena_[e.out] = Scratch(e.out, graph::F32, {static_cast<int64_t>(m), static_cast<int64_t>(n)},
                                 op.outputs(0), q * m * n * 4);
    }
    EmitGemm(e, {a_images[index_of(a_batch, q)], {pack_stage}, std::nullopt}, b_images[index_of(b_batch, q)], kNone,
             static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(k), stage,
             static_cast<uint32_t>(batches));
  }
  stage_[op.outputs(0)] = stage;
  return absl::OkStatus();
}

}  // namespace loom::scheduler::graph_lowering_internal
