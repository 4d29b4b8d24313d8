#include "scheduler/graph_lowering.h"

#include "scheduler/compiler.h"
#include "scheduler/graph_lowering_internal.h"
#include "scheduler/schedule_verifier.h"

namespace loom::scheduler {
namespace graph_lowering_internal {

absl::StatusOr<Schedule> NnLowering::Run(const std::string& model) {
  GraphIo io;
  for (const TensorDef* t : g_.TensorsOfKind(graph::INPUT)) {
    if (t->dtype() != graph::F32 && t->dtype() != graph::I32) {
      return absl::UnimplementedError(absl::StrCat("input '", t->name(), "': ", graph::DTypeName(t->dtype()),
                                                   " inputs are not lowered (f32, and i32 embedding ids)"));
    }
    IoTensor* in = io.add_inputs();
    in->set_name(t->name());
    in->set_tensor(Arena(t->name()));
    input_backed_.insert(t->name());
    if (t->dtype() == graph::I32) {
      // i32 inputs are ids: every reader an EMBEDDING (its row count bounds them; the runtime checks each value,
      // as EMBED reads an id outside the table as 0).
      uint64_t limit = 0;
      for (const OpDef& op : g_.def().ops()) {
        for (int i = 0; i < op.inputs_size(); ++i) {
          if (op.inputs(i) != t->name()) continue;
          if (op.type() != graph::EMBEDDING || i != 1) {
            return Unsupported(op, absl::StrCat("reads i32 input '", t->name(), "' (i32 inputs are embedding ids)"));
          }
          const uint64_t rows = static_cast<uint64_t>(g_.tensor(op.inputs(0)).shape(0));
          limit = limit == 0 ? rows : std::min(limit, rows);
        }
      }
      in->set_id_limit(limit);
    }
  }
  for (int index : g_.topological_order()) {
    const OpDef& op = g_.def().ops(index);
    if (consumed_.contains(op.name())) continue;
    if (absl::Status s = Lower(op); !s.ok()) return s;
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

absl::Status NnLowering::Lower(const OpDef& op) {
  switch (op.type()) {
    case graph::EMBEDDING:
      return LowerEmbedding(op);
    case graph::ARGMAX:
      return LowerArgmax(op);
    case graph::CONV2D:
      return LowerConv(op);
    case graph::LINEAR:
    case graph::MATMUL:
      return LowerMatmul(op);
    case graph::RELU:
    case graph::SIGMOID:
    case graph::GELU:
    case graph::ERF:
    case graph::TANH:
    case graph::EXP:
    case graph::SQRT:
    case graph::LOG:
    case graph::HARD_SIGMOID:
    case graph::HARD_SWISH:
    case graph::RELU6:
    case graph::EXPAND:
    case graph::MAXIMUM:
    case graph::MINIMUM:
    case graph::GREATER:
    case graph::LESS:
    case graph::EQUAL:
    case graph::GREATER_EQUAL:
    case graph::LESS_EQUAL:
    case graph::KEEP:
    case graph::ADD:
    case graph::SUB:
    case graph::MUL:
    case graph::DIV:
    case graph::SILU_MUL:
    case graph::TRANSPOSE:
      return LowerElementwise(op);
    case graph::LAYER_NORM:
    case graph::RMS_NORM:
      return LowerNorm(op);
    case graph::CONV1D:
      return LowerConv1d(op);
    case graph::MAX_POOL:
    case graph::AVG_POOL:
    case graph::GLOBAL_AVG_POOL:
      return LowerPool(op);
    case graph::RESHAPE:
      return LowerReshape(op);
    case graph::SOFTMAX:
      return LowerSoftmax(op);
    case graph::CONCAT:
      return LowerConcat(op);
    case graph::SLICE:
      return LowerSlice(op);
    case graph::PAD:
      return LowerPad(op);
    default:
      return Unsupported(op, "no lowering for this op in a graph pass yet (the oracle evaluates it)");
  }
}

// A copy of `name` (input-backed) in a tensor of its own, by an ELEMENTWISE copy.
uint32_t NnLowering::CopyOut(const std::string& name) {
  const std::vector<uint64_t> shape = ShapeOf(T(name));
  const uint32_t out =
      Scratch(absl::StrCat("output:", name), graph::F32, std::vector<int64_t>(shape.begin(), shape.end()));
  EmitMap(isa::kEwCopy, arena_.at(name), out, Product(shape), ReadyOf({name}), absl::StrCat("output:", name));
  return out;
}

// The same without applying a pending ReLU (a reader that applies it itself).
absl::StatusOr<uint32_t> NnLowering::Operand(const OpDef& op, const std::string& name) {
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

// ELEMENTWISE instructions over a contiguous f32 tensor of `elements`, out = f(a) elementwise, signalling
// `stage` (a new one unless given); returns the stage.
uint32_t NnLowering::EmitMap(uint32_t func, uint32_t a, uint32_t out, uint64_t elements,
                             const std::vector<uint32_t>& after, const std::string& name,
                             std::optional<uint32_t> into) {
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

// ELEMENTWISE instructions over `dims` (strides: each operand's, then out's) into `out`, signalling `stage`.
absl::Status NnLowering::EmitStrided(const OpDef& op, uint32_t func, const std::vector<uint32_t>& operands,
                                     uint32_t out, const StridedDims& dims, uint32_t stage,
                                     const std::vector<uint32_t>& after) {
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

absl::Status NnLowering::LowerElementwise(const OpDef& op) {
  const std::string& out = op.outputs(0);
  const std::vector<uint64_t> ys = ShapeOf(T(out));
  // A transpose only a channel-padding convolution reads (an NCHW image's): its NHWC_BF16 copy reads through it.
  const std::vector<const OpDef*> readers = g_.consumers(out);
  if (op.type() == graph::TRANSPOSE && ys.size() == 4 && !T(out).is_output() && readers.size() == 1 &&
      readers[0]->type() == graph::CONV2D && readers[0]->inputs(0) == out && readers[0]->inputs(1) != out &&
      (readers[0]->inputs_size() < 3 || readers[0]->inputs(2) != out) && PaddedChannels(*readers[0]) > 0 &&
      T(op.inputs(0)).dtype() == graph::F32) {
    const std::vector<uint64_t> contiguous = ContiguousStrides(ShapeOf(T(op.inputs(0))));
    std::vector<uint64_t> strides;
    for (int p : op.transpose().perm()) strides.push_back(contiguous[p]);
    deferred_transposes_[out] = {op.inputs(0), strides};
    return absl::OkStatus();
  }
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

// A static slice: an ELEMENTWISE copy from a view of the input that starts at the slice's first element, its
// strides the input's times the steps.
absl::Status NnLowering::LowerSlice(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::string& y = op.outputs(0);
  if (T(x).kind() == graph::WEIGHT) return Unsupported(op, "a slice of a weight (the importer folds those)");
  absl::StatusOr<uint32_t> input = Operand(op, x);
  if (!input.ok()) return input.status();
  const std::vector<uint64_t> xs = ShapeOf(T(x)), contiguous = ContiguousStrides(xs);
  uint64_t first = 0;
  std::vector<uint64_t> strides;
  for (size_t d = 0; d < xs.size(); ++d) {
    first += static_cast<uint64_t>(op.slice().starts(d)) * contiguous[d];
    strides.push_back(contiguous[d] * static_cast<uint64_t>(op.slice().steps(d)));
  }
  const uint32_t from = first == 0 ? *input
                                   : Scratch(absl::StrCat(x, "[slice ", y, "]"), graph::F32,
                                             {static_cast<int64_t>(Product(xs) - first)}, x, first * 4);
  StridedDims dims;
  dims.size = ShapeOf(T(y));
  dims.strides = {strides, ContiguousStrides(dims.size)};
  const uint32_t stage = b_.Stage(op.name());
  if (absl::Status s = EmitStrided(op, isa::kEwCopy, {from}, Arena(y), dims, stage, ReadyOf({x})); !s.ok()) return s;
  stage_[y] = stage;
  return absl::OkStatus();
}

// A constant padding: the value copied everywhere (a [1] weight read with zero strides), then the input into its
// place, a view of the output from its first element, its strides the output's times the interior steps (two
// stages).
absl::Status NnLowering::LowerPad(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::string& y = op.outputs(0);
  absl::StatusOr<uint32_t> input = Operand(op, x);
  if (!input.ok()) return input.status();
  absl::StatusOr<uint32_t> value = Operand(op, op.inputs(1));
  if (!value.ok()) return value.status();
  const std::vector<uint64_t> xs = ShapeOf(T(x)), ys = ShapeOf(T(y)), y_strides = ContiguousStrides(ys);
  const uint32_t out = Arena(y);
  const uint32_t fill = b_.Stage(absl::StrCat(op.name(), "/fill"));
  StridedDims everywhere;
  everywhere.size = ys;
  everywhere.strides = {std::vector<uint64_t>(ys.size(), 0), y_strides};
  if (absl::Status s = EmitStrided(op, isa::kEwCopy, {*value}, out, everywhere, fill, {}); !s.ok()) return s;
  uint64_t first = 0;
  for (size_t d = 0; d < ys.size(); ++d) first += static_cast<uint64_t>(op.pad().begin(d)) * y_strides[d];
  const uint32_t inside = first == 0 ? out
                                     : Scratch(absl::StrCat(y, "[inside]"), graph::F32,
                                               {static_cast<int64_t>(Product(ys) - first)}, y, first * 4);
  StridedDims copy;
  copy.size = xs;
  copy.strides = {ContiguousStrides(xs), y_strides};
  for (int d = 0; d < op.pad().interior_size(); ++d) copy.strides[1][d] *= static_cast<uint64_t>(op.pad().interior(d));
  std::vector<uint32_t> after = ReadyOf({x});
  after.push_back(fill);
  const uint32_t stage = b_.Stage(op.name());
  if (absl::Status s = EmitStrided(op, isa::kEwCopy, {*input}, inside, copy, stage, after); !s.ok()) return s;
  stage_[y] = stage;
  return absl::OkStatus();
}

// Each input copied into its slice of the output (a view of it from the slice's first element), strided.
absl::Status NnLowering::LowerConcat(const OpDef& op) {
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
    const uint32_t slice =
        Scratch(absl::StrCat(y, "[", i, "]"), graph::F32, {static_cast<int64_t>(total - first)}, y, first * 4);
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

absl::Status NnLowering::LowerPool(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::vector<uint64_t> xs = ShapeOf(T(x)), ys = ShapeOf(T(op.outputs(0)));
  absl::StatusOr<uint32_t> input = Operand(op, x);
  if (!input.ok()) return input.status();
  isa::PoolArgs p{};
  p.input = *input;
  p.out = Arena(op.outputs(0));
  // Convolutions that gather it as bf16 read a copy it stores too.
  p.out_bf16 = kNone;
  const std::vector<const OpDef*> readers = g_.consumers(op.outputs(0));
  if (!prefill() && std::any_of(readers.begin(), readers.end(),
                                [&](const OpDef* r) { return ReadsBf16(*r, op.outputs(0)); })) {
    p.out_bf16 = Scratch(absl::StrCat("bf16:", op.outputs(0)), graph::BF16, std::vector<int64_t>(ys.begin(), ys.end()));
    bf16_[op.outputs(0)] = p.out_bf16;
  }
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
    p.mode = op.type() == graph::MAX_POOL ? isa::kPoolMax
             : a.count_include_pad()      ? isa::kPoolAvgIncludePad
                                          : isa::kPoolAvg;
  }
  const uint32_t stage = b_.Stage(op.name());
  const std::vector<uint32_t> after = ReadyOf({x});
  // Chunked by work (outputs x window): a global pool's few outputs each sum a whole map. Windows of more than
  // isa::kPoolGatherPositions are summed by 8 threads an output: kPoolWideOutputs outputs fill an instruction.
  const uint64_t window = uint64_t{p.kh} * p.kw, outputs = Product(ys);
  std::vector<std::pair<uint64_t, uint64_t>> chunks;
  if (window > isa::kPoolGatherPositions) {
    const uint64_t per = std::max<uint64_t>(
        isa::kPoolWideOutputs, (outputs + 2 * o_.num_sms() - 1) / (2 * o_.num_sms()) / isa::kPoolWideOutputs *
                                   isa::kPoolWideOutputs);
    for (uint64_t b = 0; b < outputs; b += per) chunks.emplace_back(b, std::min(outputs, b + per));
  } else {
    chunks = WindowChunks(outputs, window);
  }
  for (const auto& [begin, end] : chunks) {
    p.begin = static_cast<uint32_t>(begin);
    p.count = static_cast<uint32_t>(end - begin);
    Emit(Make(isa::Opcode::POOL, p), stage, after, op.name());
  }
  stage_[op.outputs(0)] = stage;
  return absl::OkStatus();
}

absl::Status NnLowering::LowerSoftmax(const OpDef& op) {
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

absl::Status NnLowering::LowerNorm(const OpDef& op) {
  const std::string& x = op.inputs(0);
  // An RMSNorm over whole rows read only by LINEARs (a decoder's pre-norms): PACK_ROWS applies it.
  if (op.type() == graph::RMS_NORM && op.norm().group_size() == 0 && !T(op.outputs(0)).is_output() &&
      T(op.inputs(1)).kind() == graph::WEIGHT) {
    bool all_linear = true;
    for (const OpDef* c : g_.consumers(op.outputs(0))) {
      all_linear &=
          c->type() == graph::LINEAR && c->inputs(0) == op.outputs(0) && T(c->inputs(1)).kind() == graph::WEIGHT;
    }
    if (all_linear) {
      deferred_norms_[op.outputs(0)] = {x, op.inputs(1), op.norm().eps()};
      return absl::OkStatus();
    }
  }
  const std::vector<uint64_t> xs = ShapeOf(T(x));
  const bool layer = op.type() == graph::LAYER_NORM;
  isa::NormRowsArgs a{};
  a.len = static_cast<uint32_t>(op.norm().group_size() > 0 ? op.norm().group_size() : xs.back());
  const uint64_t rows = Product(xs) / a.len;
  if (rows * a.len >= (uint64_t{1} << 32)) return Unsupported(op, "input of 2^32 elements or more");
  absl::StatusOr<uint32_t> input = Operand(op, x);
  if (!input.ok()) return input.status();
  absl::StatusOr<uint32_t> scale = Operand(op, op.inputs(1));
  if (!scale.ok()) return scale.status();
  a.input = *input;
  a.scale = *scale;
  a.shift = kNone;
  if (layer) {
    absl::StatusOr<uint32_t> shift = Operand(op, op.inputs(2));
    if (!shift.ok()) return shift.status();
    a.shift = *shift;
  }
  a.out = Arena(op.outputs(0));
  a.rows = static_cast<uint32_t>(rows);
  a.mode = layer ? isa::kNormLayer : isa::kNormRms;
  a.eps = op.norm().eps();
  const uint32_t stage = b_.Stage(op.name());
  const std::vector<uint32_t> after = ReadyOf({op.inputs().begin(), op.inputs().end()});
  for (const auto& [begin, end] : Chunks(rows * a.len, a.len)) {
    a.begin = static_cast<uint32_t>(begin / a.len);
    a.count = static_cast<uint32_t>((end - begin) / a.len);
    Emit(Make(isa::Opcode::NORM_ROWS, a), stage, after, op.name());
  }
  stage_[op.outputs(0)] = stage;
  return absl::OkStatus();
}

absl::Status NnLowering::LowerConv1d(const OpDef& op) {
  const std::string& x = op.inputs(0);
  const std::vector<uint64_t> xs = ShapeOf(T(x)), ws = ShapeOf(T(op.inputs(1)));
  isa::Conv1dArgs a{};
  a.rows = static_cast<uint32_t>(xs[0]);
  a.channels = static_cast<uint32_t>(xs[1]);
  a.k = static_cast<uint32_t>(ws[1]);
  absl::StatusOr<uint32_t> input = Operand(op, x);
  if (!input.ok()) return input.status();
  absl::StatusOr<uint32_t> weight = Operand(op, op.inputs(1));
  if (!weight.ok()) return weight.status();
  a.input = *input;
  a.weight = *weight;
  a.state = kNone;
  if (a.k > 1) {
    const std::string& state = op.inputs(2);
    if (T(state).kind() != graph::STATE || T(state).dtype() != graph::F32) {
      return Unsupported(op, absl::StrCat("the state '", state, "' must be an f32 STATE tensor"));
    }
    a.state = Arena(state);
  }
  a.bias = kNone;
  if (op.inputs_size() > 3) {
    absl::StatusOr<uint32_t> bias = Operand(op, op.inputs(3));
    if (!bias.ok()) return bias.status();
    a.bias = *bias;
  }
  a.out = Arena(op.outputs(0));
  // Channel ranges of 32: about two instructions per SM, at least kMinElementsPerInstruction outputs each.
  uint64_t per = std::max<uint64_t>((a.channels + 2 * o_.num_sms() - 1) / (2 * o_.num_sms()),
                                    (kMinElementsPerInstruction + a.rows - 1) / a.rows);
  per = std::min<uint64_t>((per + 31) / 32 * 32, a.channels);
  const uint32_t stage = b_.Stage(op.name());
  std::vector<std::string> reads = {op.inputs().begin(), op.inputs().end()};
  const std::vector<uint32_t> after = ReadyOf(reads);
  for (uint64_t c = 0; c < a.channels; c += per) {
    a.c_begin = static_cast<uint32_t>(c);
    a.c_count = static_cast<uint32_t>(std::min<uint64_t>(per, a.channels - c));
    Emit(Make(isa::Opcode::CONV1D, a), stage, after, op.name());
  }
  stage_[op.outputs(0)] = stage;
  if (a.k > 1) stage_[op.inputs(2)] = stage;
  return absl::OkStatus();
}

// The same f32 elements under the output's shape: a view of the input's arena tensor.
absl::Status NnLowering::LowerReshape(const OpDef& op) {
  // A reshaped weight: a view of its f32 copy in the arena.
  absl::StatusOr<std::pair<std::string, std::vector<uint32_t>>> copy = ArenaCopy(op, op.inputs(0));
  if (!copy.ok()) return copy.status();
  const std::string& x = copy->first;
  const std::vector<uint64_t> ys = ShapeOf(T(op.outputs(0)));
  arena_[op.outputs(0)] = Scratch(op.outputs(0), graph::F32, std::vector<int64_t>(ys.begin(), ys.end()), x, 0);
  if (auto it = stage_.find(x); it != stage_.end()) stage_[op.outputs(0)] = it->second;
  if (input_backed_.contains(x)) input_backed_.insert(op.outputs(0));
  return absl::OkStatus();
}

}  // namespace graph_lowering_internal

bool IsDecoderGraph(const graph::Graph& graph) {
  bool embeds = false, argmax = false;
  for (const graph::OpDef& op : graph.def().ops()) {
    if (op.type() == graph::ATTENTION) return true;
    embeds = embeds || op.type() == graph::EMBEDDING;
    argmax = argmax || op.type() == graph::ARGMAX;
  }
  return embeds && argmax;  // (a general graph may look rows up too: an encoder's embeddings)
}

absl::StatusOr<Schedule> CompileGraphPass(const graph::Graph& graph, const std::string& model,
                                          const CompileOptions& options) {
  return graph_lowering_internal::NnLowering(graph, options).Run(model);
}

}  // namespace loom::scheduler
