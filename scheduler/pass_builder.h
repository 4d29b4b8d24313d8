// Building blocks of run-once passes (a prefill pass, a general graph's pass): packed WEIGHTS tensors and a
// builder of nodes, stages (barriers) and scratch tensors. Internal to scheduler/.
#pragma once

#include <algorithm>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "instructions/isa.h"
#include "scheduler/options.h"
#include "scheduler/program.h"
#include "scheduler/schedule.pb.h"

namespace loom::scheduler {

inline constexpr uint64_t kAlign = 256;

// Adds a packed WEIGHTS tensor unless one of that name exists.
inline void AddPacked(Program* p, const std::string& name, const std::vector<std::string>& sources, RowOrder order,
               uint64_t rows, uint64_t cols, bool image, uint32_t head_dim = 0, uint32_t kv_heads = 0,
                      graph::DType dtype = graph::BF16) {
  for (const Tensor& t : p->tensors) {
    if (t.name() == name) return;
  }
  Tensor t;
  t.set_name(name);
  t.set_dtype(dtype);
  t.set_region(WEIGHTS);
  const uint64_t elements = image ? isa::GemmImageBytes(static_cast<uint32_t>(rows), static_cast<uint32_t>(cols)) / 2
                                  : rows * cols;
  if (image) {
    t.add_shape(static_cast<int64_t>(elements));
  } else {
    t.add_shape(static_cast<int64_t>(rows));
    t.add_shape(static_cast<int64_t>(cols));
  }
  t.set_bytes(elements * graph::DTypeSize(dtype));
  t.set_offset((p->weight_bytes + kAlign - 1) / kAlign * kAlign);
  p->weight_bytes = t.offset() + t.bytes();
  p->tensors.push_back(t);
  PackedWeight w;
  w.set_tensor(name);
  for (const std::string& s : sources) w.add_sources(s);
  w.set_order(order);
  w.set_cols(cols);
  w.set_row_stride(cols);
  w.set_head_dim(head_dim);
  w.set_num_kv_heads(kv_heads);
  w.set_tile_rows(image ? isa::kGemmTileM : 0);
  if (dtype != graph::BF16) w.set_dtype(dtype);
  p->packing.push_back(w);
}

// Builds a run-once pass: nodes with one barrier per stage, scratch tensors past the arena.
// A stage's barriers: first + m for the instructions of 128-row tile m when tiled, else first for all.
struct StageRef {
  uint32_t first = 0;
  bool tiled = false;
  uint32_t Of(uint32_t tile) const { return tiled ? first + tile : first; }
};

class PassBuilder {
 public:
  PassBuilder() = default;
  // A pass over `decode`'s weights and arena: its tensors first, scratch past its arena.
  explicit PassBuilder(const Schedule& decode) {
    for (int i = 0; i < decode.tensors_size(); ++i) {
      p_.tensors.push_back(decode.tensors(i));
      ids_[decode.tensors(i).name()] = static_cast<uint32_t>(i);
    }
    p_.weight_bytes = decode.weight_bytes();
    p_.arena_bytes = decode.arena_bytes();
  }

  // The same over a decode program still being compiled (its tensors so far).
  explicit PassBuilder(const Program& decode) {
    for (size_t i = 0; i < decode.tensors.size(); ++i) {
      p_.tensors.push_back(decode.tensors[i]);
      ids_[decode.tensors[i].name()] = static_cast<uint32_t>(i);
    }
    p_.weight_bytes = decode.weight_bytes;
    p_.arena_bytes = decode.arena_bytes;
  }

  absl::StatusOr<uint32_t> Find(const std::string& name) const {
    auto it = ids_.find(name);
    if (it == ids_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "prefill: the schedule has no tensor '", name,
          "' (compiled without the prefill weights: CompileOptions.prefill, or from another model)"));
    }
    return it->second;
  }
  uint32_t Scratch(const std::string& name, graph::DType dtype, std::vector<int64_t> shape,
                   const std::string& view_of = "", uint64_t view_offset = 0) {
    Tensor t;
    t.set_name(name);
    t.set_dtype(dtype);
    t.set_region(ARENA);
    uint64_t elements = 1;
    for (int64_t d : shape) t.add_shape(d), elements *= d;
    t.set_bytes(elements * graph::DTypeSize(dtype));
    if (view_of.empty()) {
      t.set_offset((p_.arena_bytes + kAlign - 1) / kAlign * kAlign);
      p_.arena_bytes = t.offset() + t.bytes();
    } else {
      t.set_offset(p_.tensors[ids_.at(view_of)].offset() + view_offset);
      t.set_view_of(view_of);
    }
    p_.tensors.push_back(t);
    ids_[name] = static_cast<uint32_t>(p_.tensors.size() - 1);
    return ids_[name];
  }
  uint32_t Stage(const std::string& name) {
    Barrier b;
    b.set_name(name);
    p_.barriers.push_back(b);
    p_.groups.push_back(name);
    return static_cast<uint32_t>(p_.barriers.size() - 1);
  }
  // A stage with one barrier per 128-row tile when `tiled` (the next stage's work on those rows waits for them
  // alone, not for the whole stage), or one barrier.
  StageRef Stages(const std::string& name, uint32_t tiles, bool tiled) {
    const uint32_t first = Stage(tiled && tiles > 1 ? absl::StrCat(name, "/m0") : name);
    for (uint32_t i = 1; tiled && i < tiles; ++i) Stage(absl::StrCat(name, "/m", i));
    return {first, tiled};
  }
  template <typename Args>
  void Emit(isa::Opcode op, const Args& args, uint32_t stage, std::optional<uint32_t> after, const std::string& name) {
    isa::Instruction inst{};
    inst.opcode = static_cast<uint8_t>(op);
    inst.as<Args>() = args;
    if (after) {
      inst.num_waits = 1;
      inst.waits[0] = {*after, 0};
    }
    EmitRaw(inst, stage, name);
  }
  // An instruction with its waits already set (counts filled in when the pass is complete).
  void EmitRaw(const isa::Instruction& inst, uint32_t stage, const std::string& name) {
    Node node;
    node.inst = inst;
    node.inst.signal = stage;
    node.op = name;
    node.group = static_cast<int>(stage);
    p_.barriers[stage].set_signals_per_step(p_.barriers[stage].signals_per_step() + 1);
    p_.nodes.push_back(std::move(node));
  }
  // A packed WEIGHTS tensor (AddPacked), added once per name.
  // With `source_row_begin`: the rows [source_row_begin, +rows) of the one source (a convolution group's). With
  // `column_group` = {run, padded}: a source row's columns in runs of `run`, each padded with zeros to `padded`.
  uint32_t Packed(const std::string& name, const std::vector<std::string>& sources, RowOrder order, uint64_t rows,
                  uint64_t cols, bool image, graph::DType dtype = graph::BF16,
                  std::optional<uint64_t> source_row_begin = std::nullopt,
                  std::optional<std::pair<uint32_t, uint32_t>> column_group = std::nullopt) {
    if (auto it = ids_.find(name); it != ids_.end()) return it->second;
    AddPacked(&p_, name, sources, order, rows, cols, image, 0, 0, dtype);
    if (source_row_begin) {
      p_.packing.back().set_source_row_begin(*source_row_begin);
      p_.packing.back().set_source_rows(rows);
    }
    if (column_group) {
      p_.packing.back().set_column_group(column_group->first);
      p_.packing.back().set_column_group_padded(column_group->second);
    }
    ids_[name] = static_cast<uint32_t>(p_.tensors.size() - 1);
    return ids_[name];
  }
  // A packed WEIGHTS tensor of rows in q / k / v head groups (ROWS_QKV_GROUPED), added once per name.
  uint32_t PackedGrouped(const std::string& name, const std::vector<std::string>& sources, uint64_t rows,
                         uint64_t cols, bool image, uint32_t head_dim, uint32_t kv_heads) {
    if (auto it = ids_.find(name); it != ids_.end()) return it->second;
    AddPacked(&p_, name, sources, ROWS_QKV_GROUPED, rows, cols, image, head_dim, kv_heads);
    ids_[name] = static_cast<uint32_t>(p_.tensors.size() - 1);
    return ids_[name];
  }
  // A WEIGHTS tensor of values known at compile time (a Constant: f32, or i32 of integral values), once per name.
  uint32_t ConstantTensor(const std::string& name, graph::DType dtype, const std::vector<float>& values) {
    if (auto it = ids_.find(name); it != ids_.end()) return it->second;
    Tensor t;
    t.set_name(name);
    t.set_dtype(dtype);
    t.set_region(WEIGHTS);
    t.add_shape(static_cast<int64_t>(values.size()));
    t.set_bytes(4 * values.size());
    t.set_offset((p_.weight_bytes + kAlign - 1) / kAlign * kAlign);
    p_.weight_bytes = t.offset() + t.bytes();
    p_.tensors.push_back(t);
    Constant c;
    c.set_tensor(name);
    c.mutable_values()->Add(values.begin(), values.end());
    p_.constants.push_back(std::move(c));
    ids_[name] = static_cast<uint32_t>(p_.tensors.size() - 1);
    return ids_[name];
  }
  // Every wait counts all of its barrier's signals (call once the pass is complete).
  void FinishWaits() {
    for (Node& node : p_.nodes) {
      for (int i = 0; i < node.inst.num_waits; ++i) {
        isa::Wait& wait = node.inst.waits[i];
        const uint32_t signals = p_.barriers[wait.barrier()].signals_per_step();
        wait.count_and_stride = signals | (signals << 16);
      }
    }
  }
  Program& program() { return p_; }

 private:
  Program p_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
};

// Every output tile of a GEMM (m-tiles inside n-tiles: concurrent SMs share W tiles in L2), each split over K
// into `splits` slab ranges: emit(args, m_tile) per instruction. Split, split s stores its part into parts[s]
// (kGemmPartialF32; SplitParts), which SUM_SPLITS then adds in part order.
template <typename EmitFn>
void ForEachGemmTile(isa::GemmArgs g, uint32_t splits, EmitFn emit, const std::vector<uint32_t>& parts = {}) {
  const uint32_t slabs = isa::GemmSlabs(g.k);
  for (uint32_t n = 0; n < isa::GemmColumnTiles(g.n, g.wide); ++n) {
    for (uint32_t m = 0; m < isa::GemmTiles(g.m); ++m) {
      for (uint32_t s = 0; s < splits; ++s) {
        g.tile = isa::GemmTileOf(m, n);
        if (splits > 1) {
          const uint32_t begin = slabs * s / splits;
          g.slabs = isa::GemmPackSlabs(begin, slabs * (s + 1) / splits - begin);
          g.out = parts.at(s);
        }
        emit(g, m);
      }
    }
  }
}

// The parts of a product of `elements` f32 split `splits` ways over K: one tensor [splits, elements] (`name`, kept
// for every product of that name, size and split) and a view of each part, which the split's tiles store.
struct SplitParts {
  uint32_t all;
  std::vector<uint32_t> parts;
};
inline SplitParts AddSplitParts(PassBuilder& b, const std::string& name, uint64_t elements, uint32_t splits) {
  const std::string all = absl::StrCat(name, ".", splits, "x", elements);
  if (absl::StatusOr<uint32_t> found = b.Find(all); found.ok()) {
    SplitParts p{*found, {}};
    for (uint32_t s = 0; s < splits; ++s) p.parts.push_back(*b.Find(absl::StrCat(all, ".", s)));
    return p;
  }
  SplitParts p{b.Scratch(all, graph::F32, {static_cast<int64_t>(splits), static_cast<int64_t>(elements)}), {}};
  for (uint32_t s = 0; s < splits; ++s) {
    p.parts.push_back(b.Scratch(absl::StrCat(all, ".", s), graph::F32, {static_cast<int64_t>(elements)}, all,
                                s * elements * 4));
  }
  return p;
}

// SUM_SPLITS instructions adding `parts` over the elements [begin, end) of a product of `elements` (f32) into
// `out` (from `base`, or kNoTensor), in chunks of `chunk` elements (a multiple of 4), each waiting on `after`.
inline void EmitSumSplits(PassBuilder& b, const SplitParts& parts, uint32_t base, uint32_t out, uint64_t elements,
                          uint64_t begin, uint64_t end, uint64_t chunk, uint32_t flags, uint32_t stage,
                          std::optional<uint32_t> after, const std::string& name) {
  for (uint64_t i = begin; i < end; i += chunk) {
    const isa::SumSplitsArgs a{parts.all, base, out, static_cast<uint32_t>(elements),
                               static_cast<uint32_t>(parts.parts.size()), static_cast<uint32_t>(i),
                               static_cast<uint32_t>(std::min(chunk, end - i)), flags};
    b.Emit(isa::Opcode::SUM_SPLITS, a, stage, after, name);
  }
}
// Elements per SUM_SPLITS instruction: `total` elements over about `instructions` of them, at least
// kMinSumElements (below that an instruction's fixed cost outweighs its bytes), a multiple of 4 (16-byte chunks).
inline constexpr uint64_t kMinSumElements = 1024;
inline uint64_t SumChunk(uint64_t total, uint64_t instructions) {
  const uint64_t per = (total + std::max<uint64_t>(instructions, 1) - 1) / std::max<uint64_t>(instructions, 1);
  return (std::max(per, kMinSumElements) + 3) / 4 * 4;
}

inline constexpr uint32_t kMaxPagesPerSm = 32;  // the megakernel's page mbarriers
inline constexpr uint32_t kMinWidePages = 4;    // 32 KB pages, fewest worth taking over 16 KB ones

// A pass's shared memory: one activation slot as large as its largest instruction needs, and as many pages of
// `page_bytes` as fit beside it; page_bytes 0: 32 KB pages (two GEMM slabs each) where at least kMinWidePages
// fit, else 16 KB.
inline void FitPassSmem(const Program& p, uint32_t page_bytes, SmemConfig* smem) {
  uint32_t activation = 0;
  for (const Node& node : p.nodes) activation = std::max(activation, isa::ActivationBytes(node.inst));
  smem->set_activation_bytes(activation);
  smem->set_activation_slots(1);
  auto fit_pages = [&](uint32_t bytes) {
    smem->set_page_bytes(bytes);
    smem->set_num_pages(kMaxPagesPerSm);
    while (smem->num_pages() > 2 && SmemTotalBytes(*smem) > kMaxSmemBytes) smem->set_num_pages(smem->num_pages() - 1);
    return smem->num_pages();
  };
  if (page_bytes != 0) {
    fit_pages(page_bytes);
  } else if (fit_pages(2 * isa::kGemmSlabBytes) < kMinWidePages) {
    fit_pages(isa::kGemmSlabBytes);
  }
  // (A pass's MATVEC pages, if any, stay held back as the decode schedule's are, within its ring.)
  smem->set_matvec_pages_in_flight(std::min(smem->matvec_pages_in_flight(), smem->num_pages()));
}

}  // namespace loom::scheduler
