#include "scheduler/lowering_nn.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/compiler.h"
#include "scheduler/pass_builder.h"
#include "scheduler/schedule_verifier.h"

namespace loom::scheduler {
namespace {

using graph::OpDef;
using graph::TensorDef;

constexpr uint64_t kMinElementsPerInstruction = 1024;
constexpr uint32_t kPackRows = 16;    // PACK_ROWS rows per instruction, at least (a warp per row)
constexpr uint32_t kImToColRows = 4;  // IM2COL rows per instruction, at least (all threads share the rows' chunks)
constexpr uint32_t kNone = isa::kNoTensor;
constexpr uint32_t kMaxKSplits = 16;       // of a GEMM with few output tiles
constexpr uint32_t kMinSlabsPerSplit = 2;  // K slabs (of 64) each split multiplies, at least

std::vector<uint64_t> ShapeOf(const TensorDef& t) { return {t.shape().begin(), t.shape().end()}; }
uint64_t Product(const std::vector<uint64_t>& s, size_t from = 0) {
  uint64_t p = 1;
  for (size_t i = from; i < s.size(); ++i) p *= s[i];
  return p;
}
std::vector<uint64_t> ContiguousStrides(const std::vector<uint64_t>& shape) {
  std::vector<uint64_t> strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) strides[i] = Product(shape, i + 1);
  return strides;
}
// Element strides of an operand of shape `in` broadcast (numpy rules, aligned right) to `out`.
std::vector<uint64_t> BroadcastStrides(const std::vector<uint64_t>& in, const std::vector<uint64_t>& out) {
  const std::vector<uint64_t> contiguous = ContiguousStrides(in);
  std::vector<uint64_t> strides(out.size(), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t j = static_cast<int64_t>(i) - static_cast<int64_t>(out.size() - in.size());
    if (j >= 0 && !(in[j] == 1 && out[i] != 1)) strides[i] = contiguous[j];
  }
  return strides;
}

// An output shape walked with an element stride per operand (0: broadcast), outermost dimension first.
struct StridedDims {
  std::vector<uint64_t> size;
  std::vector<std::vector<uint64_t>> strides;  // [operand][dimension]
};
// Drops size-1 dimensions and merges neighbours every operand walks contiguously; nullopt if more than
// kElementwiseDims remain (otherwise padded to exactly that many).
std::optional<StridedDims> Collapse(const StridedDims& d) {
  StridedDims out;
  out.strides.resize(d.strides.size());
  for (size_t i = 0; i < d.size.size(); ++i) {
    if (d.size[i] == 1) continue;
    bool merge = !out.size.empty();
    for (size_t o = 0; merge && o < d.strides.size(); ++o) merge = out.strides[o].back() == d.strides[o][i] * d.size[i];
    if (merge) out.size.back() *= d.size[i];
    else out.size.push_back(d.size[i]);
    for (size_t o = 0; o < d.strides.size(); ++o) {
      if (merge) out.strides[o].back() = d.strides[o][i];
      else out.strides[o].push_back(d.strides[o][i]);
    }
  }
  if (out.size.size() > isa::kElementwiseDims) return std::nullopt;
  while (out.size.size() < isa::kElementwiseDims) {
    out.size.insert(out.size.begin(), 1);
    for (auto& s : out.strides) s.insert(s.begin(), 0);
  }
  return out;
}

class NnLowering {
 public:
  NnLowering(const graph::Graph& graph, const CompileOptions& options) : g_(graph), o_(options) {}

  absl::StatusOr<Schedule> Run(const std::string& model) {
    GraphIo io;
    for (const TensorDef* t : g_.TensorsOfKind(graph::INPUT)) {
      if (t->dtype() != graph::F32) {
        return absl::UnimplementedError(absl::StrCat("input '", t->name(), "': ", graph::DTypeName(t->dtype()),
                                                     " inputs are not lowered (f32 only)"));
      }
      IoTensor* in = io.add_inputs();
      in->set_name(t->name());
      in->set_tensor(Arena(t->name()));
      input_backed_.insert(t->name());
    }
    for (int index : g_.topological_order()) {
      const OpDef& op = g_.def().ops(index);
      if (consumed_.contains(op.name())) continue;
      if (absl::Status s = Lower(op); !s.ok()) return s;
    }
    for (const TensorDef& t : g_.def().tensors()) {
      if (t.is_output()) Materialize(t.name());
    }
    for (const TensorDef& t : g_.def().tensors()) {
      if (!t.is_output()) continue;
      auto it = arena_.find(t.name());
      if (it == arena_.end()) {
        return absl::UnimplementedError(absl::StrCat("output '", t.name(), "' is a weight: not lowered"));
      }
      IoTensor* out = io.add_outputs();
      out->set_name(t.name());
      // An output that is an input (or a view of one: a graph of reshapes) is copied out, so the caller's next
      // inputs cannot change it and the pass computes something.
      out->set_tensor(input_backed_.contains(t.name()) ? CopyOut(t.name()) : it->second);
    }
    if (io.outputs_size() == 0) return absl::InvalidArgumentError("the graph marks no tensor as its output");
    b_.FinishWaits();
    Program& p = b_.program();
    if (p.nodes.empty()) return absl::UnimplementedError("the graph has no op that computes anything");
    CompileOptions options = o_;
    FitPassSmem(p, 0, options.mutable_smem());
    Schedule s = AssembleSchedule(p, options, model);
    *s.mutable_graph() = std::move(io);
    if (absl::Status st = VerifySchedule(s); !st.ok()) {
      return absl::InternalError(absl::StrCat("graph pass failed verification: ", st.message()));
    }
    return s;
  }

 private:
  absl::Status Lower(const OpDef& op) {
    switch (op.type()) {
      case graph::CONV2D: return LowerConv(op);
      case graph::LINEAR:
      case graph::MATMUL: return LowerMatmul(op);
      case graph::RELU:
      case graph::SIGMOID:
      case graph::GELU:
      case graph::ERF:
      case graph::TANH:
      case graph::EXP:
      case graph::ADD:
      case graph::SUB:
      case graph::MUL:
      case graph::DIV:
      case graph::TRANSPOSE: return LowerElementwise(op);
      case graph::MAX_POOL:
      case graph::AVG_POOL:
      case graph::GLOBAL_AVG_POOL: return LowerPool(op);
      case graph::RESHAPE: return LowerReshape(op);
      case graph::SOFTMAX: return LowerSoftmax(op);
      case graph::CONCAT: return LowerConcat(op);
      default: return Unsupported(op, "no lowering for this op in a graph pass yet (the oracle evaluates it)");
    }
  }

  absl::Status Unsupported(const OpDef& op, const std::string& why) const {
    return absl::UnimplementedError(absl::StrCat("op '", op.name(), "' (", graph::OpType_Name(op.type()), "): ", why));
  }

  const TensorDef& T(const std::string& name) const { return g_.tensor(name); }

  // The f32 arena tensor of a graph tensor, created on first use in the graph's shape.
  uint32_t Arena(const std::string& name) {
    if (auto it = arena_.find(name); it != arena_.end()) return it->second;
    const std::vector<uint64_t> shape = ShapeOf(T(name));
    const uint32_t id = b_.Scratch(name, graph::F32, std::vector<int64_t>(shape.begin(), shape.end()));
    arena_[name] = id;
    return id;
  }

  // A copy of `name` (input-backed) in a tensor of its own, by an ELEMENTWISE copy.
  uint32_t CopyOut(const std::string& name) {
    const std::vector<uint64_t> shape = ShapeOf(T(name));
    const uint32_t out =
        b_.Scratch(absl::StrCat("output:", name), graph::F32, std::vector<int64_t>(shape.begin(), shape.end()));
    EmitMap(isa::kEwCopy, arena_.at(name), out, Product(shape), ReadyOf({name}), absl::StrCat("output:", name));
    return out;
  }

  // An f32 operand read as it is (a pending ReLU applied first): an activation's arena tensor, or a weight's exact
  // f32 copy.
  absl::StatusOr<uint32_t> Operand(const OpDef& op, const std::string& name) {
    Materialize(name);
    return OperandRaw(op, name);
  }
  // The same without applying a pending ReLU (a reader that applies it itself).
  absl::StatusOr<uint32_t> OperandRaw(const OpDef& op, const std::string& name) {
    const TensorDef& t = T(name);
    if (t.kind() == graph::WEIGHT) {
      // The packing plan's rows of a weight: its first dimension (rank >= 2), or one element each.
      const std::vector<uint64_t> shape = ShapeOf(t);
      const uint64_t elements = Product(shape), cols = shape.size() <= 1 ? 1 : elements / shape[0];
      return b_.Packed(absl::StrCat("f32:", name), {name}, ROWS_IDENTITY, elements / cols, cols, false, graph::F32);
    }
    if (t.dtype() != graph::F32) return Unsupported(op, absl::StrCat("'", name, "' is not f32"));
    if (t.kind() != graph::INPUT && !arena_.contains(name)) {
      return Unsupported(op, absl::StrCat("'", name, "' is read before it is computed"));
    }
    return Arena(name);
  }

  // The stages to wait for before reading `names` (inputs and weights: none).
  std::vector<uint32_t> ReadyOf(const std::vector<std::string>& names) const {
    std::vector<uint32_t> stages;
    for (const std::string& n : names) {
      auto it = stage_.find(n);
      if (it != stage_.end() && std::find(stages.begin(), stages.end(), it->second) == stages.end()) {
        stages.push_back(it->second);
      }
    }
    return stages;
  }

  void Emit(isa::Instruction inst, uint32_t stage, const std::vector<uint32_t>& after, const std::string& name) {
    inst.num_waits = static_cast<uint8_t>(after.size());
    for (size_t i = 0; i < after.size(); ++i) inst.waits[i] = {after[i], 0};
    b_.EmitRaw(inst, stage, name);
  }
  template <typename Args>
  static isa::Instruction Make(isa::Opcode op, const Args& args) {
    isa::Instruction inst{};
    inst.opcode = static_cast<uint8_t>(op);
    inst.as<Args>() = args;
    return inst;
  }

  // [begin, end) chunks of `total` elements: about two instructions per SM, none tiny.
  std::vector<std::pair<uint64_t, uint64_t>> Chunks(uint64_t total, uint64_t granule) const {
    uint64_t per = std::max<uint64_t>(kMinElementsPerInstruction, (total + 2 * o_.num_sms() - 1) / (2 * o_.num_sms()));
    per = (per + granule - 1) / granule * granule;
    std::vector<std::pair<uint64_t, uint64_t>> chunks;
    for (uint64_t b = 0; b < total; b += per) chunks.emplace_back(b, std::min(total, b + per));
    return chunks;
  }

  // What a GEMM computing `op`'s output writes: that output, or (taking over the ops as its epilogue) the output
  // of a following residual ADD and / or RELU that are the only readers of what they read.
  struct Epilogue {
    std::string out;
    uint32_t residual = kNone;
    std::vector<std::string> residual_names;
    bool relu = false;
    std::string ops;
  };
  Epilogue FuseEpilogue(const OpDef& op) {
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

  // ELEMENTWISE instructions over a contiguous f32 tensor of `elements`, out = f(a) elementwise, signalling
  // `stage` (a new one unless given); returns the stage.
  uint32_t EmitMap(uint32_t func, uint32_t a, uint32_t out, uint64_t elements, const std::vector<uint32_t>& after,
                   const std::string& name, std::optional<uint32_t> into = std::nullopt) {
    isa::ElementwiseArgs e{};
    e.func = func;
    e.a = a;
    e.b = kNone;
    e.out = out;
    for (uint32_t i = 0; i < isa::kElementwiseDims; ++i) e.size[i] = 1;
    e.size[isa::kElementwiseDims - 1] = static_cast<uint32_t>(elements);
    e.a_stride[isa::kElementwiseDims - 1] = e.o_stride[isa::kElementwiseDims - 1] = 1;
    const uint32_t stage = into ? *into : b_.Stage(name);
    for (const auto& [begin, end] : Chunks(elements, 256)) {
      e.begin = static_cast<uint32_t>(begin);
      e.count = static_cast<uint32_t>(end - begin);
      Emit(Make(isa::Opcode::ELEMENTWISE, e), stage, after, name);
    }
    return stage;
  }

  // C = A·Wᵀ (+ bias) into the epilogue's output: every output tile, m-tiles inside n-tiles (concurrent SMs share
  // W tiles in L2), waiting for A's stage and the residual's. A GEMM of fewer tiles than half the SMs is split
  // over K as well (each split adds its part into out atomically, the first one the bias): out starts as the
  // residual or zero, and a ReLU follows as its own stage.
  void EmitGemm(const Epilogue& e, uint32_t image, uint32_t image_stage, uint32_t weight, uint32_t bias, uint32_t m,
                uint32_t n, uint32_t k) {
    isa::GemmArgs g{};
    g.a = image;
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
    const bool split = 2 * tiles <= o_.num_sms() && slabs >= 2 * kMinSlabsPerSplit;
    // A residual whose ReLU is still pending: the split form's initial copy applies it; the fused epilogue reads
    // the tensor as it is, so the ReLU is applied first.
    const bool residual_relu = e.residual != kNone && pending_relu_.contains(e.residual_names[0]);
    if (residual_relu && !split) Materialize(e.residual_names[0]);
    std::vector<uint32_t> after = ReadyOf(e.residual_names);
    after.push_back(image_stage);
    uint32_t splits = 1;
    if (split) {
      splits = std::min({(o_.num_sms() + tiles - 1) / tiles, slabs / kMinSlabsPerSplit, kMaxKSplits});
      const uint64_t elements = uint64_t{m} * n;
      // Into A's stage: the GEMM waits for one barrier, not two.
      if (e.residual != kNone) {
        EmitMap(residual_relu ? isa::kEwRelu : isa::kEwCopy, e.residual, g.out, elements, ReadyOf(e.residual_names),
                absl::StrCat(e.ops, "/residual"), image_stage);
      } else {
        EmitMap(isa::kEwZero, g.out, g.out, elements, {}, absl::StrCat(e.ops, "/zero"), image_stage);
      }
      after = {image_stage};
      g.epilogue = isa::kGemmAccumulateF32;
      g.residual = kNone;
    }
    const uint32_t stage = b_.Stage(e.ops);
    for (uint32_t nt = 0; nt < isa::GemmTiles(n); ++nt) {
      for (uint32_t mt = 0; mt < isa::GemmTiles(m); ++mt) {
        for (uint32_t s = 0; s < splits; ++s) {
          g.m_tile = mt;
          g.n_tile = nt;
          if (splits > 1) {
            g.slab_begin = slabs * s / splits;
            g.slab_count = slabs * (s + 1) / splits - g.slab_begin;
          }
          Emit(Make(isa::Opcode::GEMM, g), stage, after, e.ops);
        }
      }
    }
    stage_[e.out] = stage;
    // Split over K, the sum is only complete at the stage's end: the ReLU is left to the readers (IM2COL and the
    // next split GEMM's residual copy apply it as they read), or applied in place by the first reader that cannot.
    if (splits > 1 && e.relu) pending_relu_[e.out] = {g.out, uint64_t{m} * n, e.ops};
  }

  // A pending ReLU of `name` applied in place, as its own stage (which then makes `name` ready).
  void Materialize(const std::string& name) {
    auto it = pending_relu_.find(name);
    if (it == pending_relu_.end()) return;
    const PendingRelu p = it->second;
    pending_relu_.erase(it);
    stage_[name] = EmitMap(isa::kEwRelu, p.tensor, p.tensor, p.elements, ReadyOf({name}), absl::StrCat(p.ops, "/relu"));
  }

  // Rows of an operand image per IM2COL / PACK_ROWS instruction: about two instructions per SM, at least
  // `granule` rows (PACK_ROWS: a warp per row).
  uint32_t RowsPerInstruction(uint32_t m, uint32_t granule) const {
    const uint32_t padded = isa::GemmTiles(m) * isa::kGemmTileM;
    const uint32_t per = (padded + 2 * o_.num_sms() - 1) / (2 * o_.num_sms());
    return std::clamp((per + granule - 1) / granule * granule, granule, isa::kGemmTileM);
  }

  // Groups 1: one IM2COL + GEMM (with the epilogue fusions). Groups g: per group an IM2COL of its input channels, a
  // GEMM against its rows of the weight into a scratch [M, OC / g], and a strided copy into its columns of the
  // output (depthwise convolutions run this way too, correct but with one-column GEMMs).
  absl::Status LowerConv(const OpDef& op) {
    const std::string& x = op.inputs(0);
    const std::string& w = op.inputs(1);
    const std::vector<uint64_t> xs = ShapeOf(T(x)), ws = ShapeOf(T(w)), ys = ShapeOf(T(op.outputs(0)));
    const graph::Conv2dAttrs& a = op.conv2d();
    const uint32_t groups = static_cast<uint32_t>(std::max(1, a.groups()));
    if (T(w).kind() != graph::WEIGHT || (op.inputs_size() > 2 && T(op.inputs(2)).kind() != graph::WEIGHT)) {
      return Unsupported(op, "weights and bias computed at run time are not lowered (constants only)");
    }
    absl::StatusOr<uint32_t> input = OperandRaw(op, x);
    if (!input.ok()) return input.status();
    isa::ImToColArgs c{};
    c.input = *input;
    c.relu = pending_relu_.contains(x) ? 1 : 0;
    c.n = static_cast<uint32_t>(xs[0]), c.h = static_cast<uint32_t>(xs[1]), c.w = static_cast<uint32_t>(xs[2]);
    c.c = static_cast<uint32_t>(xs[3]);
    c.oh = static_cast<uint32_t>(ys[1]), c.ow = static_cast<uint32_t>(ys[2]);
    c.kh = static_cast<uint32_t>(ws[1]), c.kw = static_cast<uint32_t>(ws[2]);
    c.stride_h = std::max(1, a.stride_h()), c.stride_w = std::max(1, a.stride_w());
    c.pad_top = a.pad_h(), c.pad_left = a.pad_w();
    c.dilation_h = std::max(1, a.dilation_h()), c.dilation_w = std::max(1, a.dilation_w());
    c.group_c = static_cast<uint32_t>(ws[3]);
    const uint32_t m = isa::ImToColRows(c), k = isa::ImToColK(c), oc = static_cast<uint32_t>(ws[0]), n = oc / groups;
    const std::vector<uint32_t> after = ReadyOf({x});
    const uint32_t copy_stage = groups > 1 ? b_.Stage(op.name()) : 0;
    const uint32_t y = Arena(op.outputs(0));
    for (uint32_t gi = 0; gi < groups; ++gi) {
      const std::string tag = groups > 1 ? absl::StrCat("/g", gi) : "";
      c.c_begin = gi * c.group_c;
      c.out = b_.Scratch(absl::StrCat("im2col:", op.name(), tag), graph::BF16,
                         {static_cast<int64_t>(isa::GemmImageBytes(m, k) / 2)});
      const uint32_t pack_stage = b_.Stage(absl::StrCat(op.name(), tag, "/im2col"));
      const uint32_t per = RowsPerInstruction(m, kImToColRows), padded = isa::GemmTiles(m) * isa::kGemmTileM;
      for (uint32_t r = 0; r < padded; r += per) {
        c.row_begin = r;
        c.rows = std::min(per, padded - r);
        Emit(Make(isa::Opcode::IM2COL, c), pack_stage, after, absl::StrCat(op.name(), tag, "/im2col"));
      }
      const uint32_t weight =
          b_.Packed(absl::StrCat("image:", w, tag), {w}, ROWS_IDENTITY, n, k, true, graph::BF16, gi * n);
      const uint32_t bias = op.inputs_size() > 2
                                ? b_.Packed(absl::StrCat("bias:", op.inputs(2), tag), {op.inputs(2)}, ROWS_IDENTITY, n,
                                            1, false, graph::BF16, gi * n)
                                : kNone;
      if (groups == 1) {
        EmitGemm(FuseEpilogue(op), c.out, pack_stage, weight, bias, m, n, k);
        break;
      }
      Epilogue e;
      e.out = absl::StrCat(op.outputs(0), tag);  // a scratch [M, OC / g]
      e.ops = absl::StrCat(op.name(), tag);
      arena_[e.out] = b_.Scratch(e.out, graph::F32, {static_cast<int64_t>(m), static_cast<int64_t>(n)});
      EmitGemm(e, c.out, pack_stage, weight, bias, m, n, k);
      const uint32_t slice = b_.Scratch(absl::StrCat(op.outputs(0), "[", gi, "]"), graph::F32,
                                        {static_cast<int64_t>(uint64_t{m} * oc - gi * n)}, op.outputs(0), gi * n * 4ull);
      StridedDims dims;
      dims.size = {m, n};
      dims.strides = {{n, 1}, {oc, 1}};
      if (absl::Status s = EmitStrided(op, isa::kEwCopy, {arena_.at(e.out)}, slice, dims, copy_stage,
                                       {stage_.at(e.out)});
          !s.ok()) {
        return s;
      }
    }
    if (groups > 1) stage_[op.outputs(0)] = copy_stage;
    (void)y;
    return absl::OkStatus();
  }

  // LINEAR (x [..., K], w [N, K] [, bias]) and MATMUL (a [..., M, K], a constant b [K, N]): the rows of x packed
  // into an operand image, then a GEMM.
  absl::Status LowerMatmul(const OpDef& op) {
    const std::string& x = op.inputs(0);
    const std::string& w = op.inputs(1);
    const std::vector<uint64_t> xs = ShapeOf(T(x)), ws = ShapeOf(T(w));
    const bool linear = op.type() == graph::LINEAR;
    if (T(w).kind() != graph::WEIGHT || ws.size() != 2) {
      return Unsupported(op, "only a constant 2-D right-hand side is lowered (a product of two activations is not)");
    }
    if (op.inputs_size() > 2 && T(op.inputs(2)).kind() != graph::WEIGHT) {
      return Unsupported(op, "a bias computed at run time is not lowered");
    }
    absl::StatusOr<uint32_t> input = Operand(op, x);
    if (!input.ok()) return input.status();
    const uint32_t k = static_cast<uint32_t>(xs.back()), n = static_cast<uint32_t>(linear ? ws[0] : ws[1]);
    const uint64_t rows = Product(xs) / k;
    if (rows >= (uint64_t{1} << 31)) return Unsupported(op, "too many rows");
    const uint32_t m = static_cast<uint32_t>(rows);
    const uint32_t image = b_.Scratch(absl::StrCat("rows:", op.name()), graph::BF16,
                                      {static_cast<int64_t>(isa::GemmImageBytes(m, k) / 2)});
    const uint32_t pack_stage = b_.Stage(absl::StrCat(op.name(), "/pack"));
    const std::vector<uint32_t> after = ReadyOf({x});
    const uint32_t per = RowsPerInstruction(m, kPackRows), padded = isa::GemmTiles(m) * isa::kGemmTileM;
    for (uint32_t r = 0; r < padded; r += per) {
      const isa::PackRowsArgs a{*input, image, m, k, r, std::min(per, padded - r), kNone, 0.0f};
      Emit(Make(isa::Opcode::PACK_ROWS, a), pack_stage, after, absl::StrCat(op.name(), "/pack"));
    }
    const uint32_t weight = linear ? b_.Packed(absl::StrCat("image:", w), {w}, ROWS_IDENTITY, n, k, true)
                                   : b_.Packed(absl::StrCat("imageT:", w), {w}, ROWS_TRANSPOSED, n, k, true);
    const uint32_t bias =
        op.inputs_size() > 2 ? b_.Packed(absl::StrCat("bias:", op.inputs(2)), {op.inputs(2)}, ROWS_IDENTITY, n, 1, false)
                             : kNone;
    EmitGemm(FuseEpilogue(op), image, pack_stage, weight, bias, m, n, k);
    return absl::OkStatus();
  }

  static uint32_t FuncOf(const OpDef& op) {
    switch (op.type()) {
      case graph::RELU: return isa::kEwRelu;
      case graph::SIGMOID: return isa::kEwSigmoid;
      case graph::GELU: return op.gelu().tanh() ? isa::kEwGeluTanh : isa::kEwGelu;
      case graph::ERF: return isa::kEwErf;
      case graph::TANH: return isa::kEwTanh;
      case graph::EXP: return isa::kEwExp;
      case graph::ADD: return isa::kEwAdd;
      case graph::SUB: return isa::kEwSub;
      case graph::MUL: return isa::kEwMul;
      case graph::DIV: return isa::kEwDiv;
      default: return isa::kEwCopy;  // TRANSPOSE
    }
  }

  absl::Status LowerElementwise(const OpDef& op) {
    const std::string& out = op.outputs(0);
    const std::vector<uint64_t> ys = ShapeOf(T(out));
    StridedDims dims;
    dims.size = ys;
    std::vector<uint32_t> operands;
    for (const std::string& in : op.inputs()) {
      absl::StatusOr<uint32_t> id = Operand(op, in);
      if (!id.ok()) return id.status();
      operands.push_back(*id);
      const std::vector<uint64_t> xs = ShapeOf(T(in));
      if (op.type() == graph::TRANSPOSE) {
        const std::vector<uint64_t> contiguous = ContiguousStrides(xs);
        std::vector<uint64_t> strides;
        for (int p : op.transpose().perm()) strides.push_back(contiguous[p]);
        dims.strides.push_back(strides);
      } else {
        dims.strides.push_back(BroadcastStrides(xs, ys));
      }
    }
    dims.strides.push_back(ContiguousStrides(ys));  // out
    const uint32_t stage = b_.Stage(op.name());
    if (absl::Status s = EmitStrided(op, FuncOf(op), operands, Arena(out), dims, stage,
                                     ReadyOf({op.inputs().begin(), op.inputs().end()}));
        !s.ok()) {
      return s;
    }
    stage_[out] = stage;
    return absl::OkStatus();
  }

  // ELEMENTWISE instructions over `dims` (strides: each operand's, then out's) into `out`, signalling `stage`.
  absl::Status EmitStrided(const OpDef& op, uint32_t func, const std::vector<uint32_t>& operands, uint32_t out,
                           const StridedDims& dims, uint32_t stage, const std::vector<uint32_t>& after) {
    const std::optional<StridedDims> d = Collapse(dims);
    if (!d) return Unsupported(op, absl::StrCat("more than ", isa::kElementwiseDims, " dimensions after merging"));
    isa::ElementwiseArgs e{};
    e.func = func;
    e.a = operands[0];
    e.b = operands.size() > 1 ? operands[1] : kNone;
    e.out = out;
    const std::vector<uint64_t>& o = d->strides.back();
    for (uint32_t i = 0; i < isa::kElementwiseDims; ++i) {
      e.size[i] = static_cast<uint32_t>(d->size[i]);
      e.a_stride[i] = static_cast<uint32_t>(d->strides[0][i]);
      e.b_stride[i] = operands.size() > 1 ? static_cast<uint32_t>(d->strides[1][i]) : 0;
      e.o_stride[i] = static_cast<uint32_t>(o[i]);
    }
    for (const auto& [begin, end] : Chunks(Product(d->size), 256)) {
      e.begin = static_cast<uint32_t>(begin);
      e.count = static_cast<uint32_t>(end - begin);
      Emit(Make(isa::Opcode::ELEMENTWISE, e), stage, after, op.name());
    }
    return absl::OkStatus();
  }

  // Each input copied into its slice of the output (a view of it from the slice's first element), strided.
  absl::Status LowerConcat(const OpDef& op) {
    const std::string& y = op.outputs(0);
    const std::vector<uint64_t> ys = ShapeOf(T(y));
    const int rank = static_cast<int>(ys.size());
    const int axis = op.axis().axis() < 0 ? op.axis().axis() + rank : op.axis().axis();
    const uint64_t inner = Product(ys, axis + 1), total = Product(ys);
    Arena(y);
    const uint32_t stage = b_.Stage(op.name());
    uint64_t offset = 0;  // along the axis
    for (int i = 0; i < op.inputs_size(); ++i) {
      const std::string& x = op.inputs(i);
      absl::StatusOr<uint32_t> input = Operand(op, x);
      if (!input.ok()) return input.status();
      const std::vector<uint64_t> xs = ShapeOf(T(x));
      const uint64_t first = offset * inner;
      offset += xs[axis];
      if (Product(xs) == 0) continue;
      const uint32_t slice = b_.Scratch(absl::StrCat(y, "[", i, "]"), graph::F32,
                                        {static_cast<int64_t>(total - first)}, y, first * 4);
      StridedDims dims;
      dims.size = xs;
      dims.strides = {ContiguousStrides(xs), ContiguousStrides(ys)};
      if (absl::Status s = EmitStrided(op, isa::kEwCopy, {*input}, slice, dims, stage, ReadyOf({x})); !s.ok()) {
        return s;
      }
    }
    stage_[y] = stage;
    return absl::OkStatus();
  }

  absl::Status LowerPool(const OpDef& op) {
    const std::string& x = op.inputs(0);
    const std::vector<uint64_t> xs = ShapeOf(T(x)), ys = ShapeOf(T(op.outputs(0)));
    absl::StatusOr<uint32_t> input = Operand(op, x);
    if (!input.ok()) return input.status();
    isa::PoolArgs p{};
    p.input = *input;
    p.out = Arena(op.outputs(0));
    p.n = static_cast<uint32_t>(xs[0]), p.h = static_cast<uint32_t>(xs[1]), p.w = static_cast<uint32_t>(xs[2]);
    p.c = static_cast<uint32_t>(xs[3]), p.oh = static_cast<uint32_t>(ys[1]), p.ow = static_cast<uint32_t>(ys[2]);
    p.stride_h = p.stride_w = p.dilation_h = p.dilation_w = 1;
    if (op.type() == graph::GLOBAL_AVG_POOL) {
      p.kh = p.h, p.kw = p.w, p.mode = isa::kPoolAvg;
    } else {
      const graph::PoolAttrs& a = op.pool();
      p.kh = a.kernel_h(), p.kw = a.kernel_w();
      p.stride_h = std::max(1, a.stride_h()), p.stride_w = std::max(1, a.stride_w());
      p.pad_top = a.pad_top(), p.pad_left = a.pad_left(), p.pad_bottom = a.pad_bottom(), p.pad_right = a.pad_right();
      p.dilation_h = std::max(1, a.dilation_h()), p.dilation_w = std::max(1, a.dilation_w());
      p.mode = op.type() == graph::MAX_POOL ? isa::kPoolMax : a.count_include_pad() ? isa::kPoolAvgIncludePad : isa::kPoolAvg;
    }
    const uint32_t stage = b_.Stage(op.name());
    const std::vector<uint32_t> after = ReadyOf({x});
    // Chunked by work (outputs x window): a global pool's few outputs each sum a whole map.
    const uint64_t outputs = Product(ys), window = uint64_t{p.kh} * p.kw;
    const uint64_t per = std::max<uint64_t>(
        64, (std::max<uint64_t>(kMinElementsPerInstruction * 4, outputs * window / (2 * o_.num_sms())) / window + 63) /
                64 * 64);
    for (uint64_t begin = 0; begin < outputs; begin += per) {
      p.begin = static_cast<uint32_t>(begin);
      p.count = static_cast<uint32_t>(std::min(outputs, begin + per) - begin);
      Emit(Make(isa::Opcode::POOL, p), stage, after, op.name());
    }
    stage_[op.outputs(0)] = stage;
    return absl::OkStatus();
  }

  absl::Status LowerSoftmax(const OpDef& op) {
    const std::string& x = op.inputs(0);
    const std::vector<uint64_t> xs = ShapeOf(T(x));
    absl::StatusOr<uint32_t> input = Operand(op, x);
    if (!input.ok()) return input.status();
    const int rank = static_cast<int>(xs.size());
    const int axis = op.axis().axis() < 0 ? op.axis().axis() + rank : op.axis().axis();
    isa::SoftmaxArgs a{};
    a.input = *input;
    a.out = Arena(op.outputs(0));
    a.len = static_cast<uint32_t>(xs[axis]);
    a.inner = static_cast<uint32_t>(Product(xs, axis + 1));
    a.outer = static_cast<uint32_t>(Product(xs) / (uint64_t{a.len} * a.inner));
    const uint32_t stage = b_.Stage(op.name());
    const std::vector<uint32_t> after = ReadyOf({x});
    // Rows per instruction: about two instructions per SM, at least kMinElementsPerInstruction elements each.
    const uint64_t rows = uint64_t{a.outer} * a.inner;
    for (const auto& [begin, end] : Chunks(rows * a.len, a.len)) {
      a.begin = static_cast<uint32_t>(begin / a.len);
      a.count = static_cast<uint32_t>((end - begin + a.len - 1) / a.len);
      Emit(Make(isa::Opcode::SOFTMAX, a), stage, after, op.name());
    }
    stage_[op.outputs(0)] = stage;
    return absl::OkStatus();
  }

  // The same f32 elements under the output's shape: a view of the input's arena tensor.
  absl::Status LowerReshape(const OpDef& op) {
    const std::string& x = op.inputs(0);
    absl::StatusOr<uint32_t> input = Operand(op, x);
    if (!input.ok()) return input.status();
    if (T(x).kind() == graph::WEIGHT) return Unsupported(op, "reshaping a weight is not lowered");
    const std::vector<uint64_t> ys = ShapeOf(T(op.outputs(0)));
    arena_[op.outputs(0)] =
        b_.Scratch(op.outputs(0), graph::F32, std::vector<int64_t>(ys.begin(), ys.end()), x, 0);
    if (auto it = stage_.find(x); it != stage_.end()) stage_[op.outputs(0)] = it->second;
    if (input_backed_.contains(x)) input_backed_.insert(op.outputs(0));
    return absl::OkStatus();
  }

  const graph::Graph& g_;
  const CompileOptions& o_;
  PassBuilder b_;
  absl::flat_hash_map<std::string, uint32_t> arena_;  // graph tensor -> its schedule tensor
  absl::flat_hash_map<std::string, uint32_t> stage_;  // graph tensor -> the stage that writes it
  absl::flat_hash_set<std::string> consumed_;         // ops a GEMM's epilogue took over
  absl::flat_hash_set<std::string> input_backed_;     // inputs and views of them
  struct PendingRelu {
    uint32_t tensor;
    uint64_t elements;
    std::string ops;
  };
  absl::flat_hash_map<std::string, PendingRelu> pending_relu_;  // split GEMM outputs whose ReLU is not applied
};

}  // namespace

bool IsDecoderGraph(const graph::Graph& graph) {
  for (const OpDef& op : graph.def().ops()) {
    if (op.type() == graph::EMBEDDING || op.type() == graph::ATTENTION) return true;
  }
  return false;
}

absl::StatusOr<Schedule> CompileGraphPass(const graph::Graph& graph, const std::string& model,
                                          const CompileOptions& options) {
  return NnLowering(graph, options).Run(model);
}

}  // namespace loom::scheduler
