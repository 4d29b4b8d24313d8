#include "graph/layout_pass.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/nn_ops.h"

namespace loom::graph {
namespace {

class Rewriter {
 public:
  Rewriter(GraphDef* def, WeightStore* weights) : def_(def), weights_(weights) {
    for (const OpDef& op : def->ops()) ops_.push_back(op);
    alive_.assign(ops_.size(), true);
    for (const TensorDef& t : def->tensors()) tensors_[t.name()] = t;
  }

  int Run() {
    int removed = 0;
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < ops_.size(); ++i) {
        if (!alive_[i]) continue;
        const OpType type = ops_[i].type();
        if (IsUnaryElementwise(type)) {
          changed |= SinkThroughUnary(i);
        } else if (IsBinaryElementwise(type)) {
          changed |= SinkThroughBinary(i, &removed) || SinkPastConstant(i);
        } else if (type == CONCAT) {
          changed |= SinkThroughConcat(i, &removed);
        } else if (type == TRANSPOSE) {
          changed |= CancelPair(i, &removed) || MergeTwin(i, &removed);
        }
      }
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (alive_[i] && ops_[i].type() == TRANSPOSE && MovesOnlyUnitDims(ops_[i])) {
        ops_[i].set_type(RESHAPE);
        ops_[i].clear_transpose();
        ++removed;
      }
    }
    Write();
    return removed;
  }

 private:
  std::vector<int64_t> ShapeOf(const std::string& name) const {
    const TensorDef& t = tensors_.at(name);
    return {t.shape().begin(), t.shape().end()};
  }
  // The live op producing `name`, or -1.
  int Producer(const std::string& name) const {
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (alive_[i] && ops_[i].outputs(0) == name) return static_cast<int>(i);
    }
    return -1;
  }
  // How many inputs of live ops read `name` (graph outputs count too).
  int Uses(const std::string& name) const {
    int n = tensors_.at(name).is_output() ? 1 : 0;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!alive_[i]) continue;
      for (const std::string& in : ops_[i].inputs()) n += in == name;
    }
    return n;
  }
  // The TRANSPOSE op producing `name` when it is read once (by the op being rewritten), or -1.
  int SoleTranspose(const std::string& name) const {
    const int p = Producer(name);
    return p >= 0 && ops_[p].type() == TRANSPOSE && Uses(name) == 1 ? p : -1;
  }
  std::string Fresh(const std::string& base) const {
    std::string name = base;
    for (int k = 1; tensors_.contains(name); ++k) name = absl::StrCat(base, "#", k);
    return name;
  }
  void Declare(const std::string& name, const std::vector<int64_t>& shape, DType dtype) {
    TensorDef t;
    t.set_name(name);
    for (int64_t d : shape) t.add_shape(d);
    t.set_dtype(dtype);
    t.set_kind(ACTIVATION);
    tensors_[name] = t;
  }

  // Moves transpose op `t` below op `op`: `op` now writes a new tensor of `shape` (its result before the transpose),
  // which `t` transposes into `op`'s old output, whose name and shape stay. The caller rewires `op`'s inputs.
  void MoveBelow(size_t op, size_t t, const std::vector<int64_t>& shape) {
    const std::string out = ops_[op].outputs(0), moved = Fresh(out + "/pre_t");
    Declare(moved, shape, tensors_.at(out).dtype());
    ops_[op].set_outputs(0, moved);
    ops_[t].set_inputs(0, moved);
    ops_[t].set_outputs(0, out);
  }

  // U(T(x)) -> T(U(x)): the transpose op is reused after U, which keeps its output's name.
  bool SinkThroughUnary(size_t u) {
    const int t = SoleTranspose(ops_[u].inputs(0));
    if (t < 0) return false;
    const std::string x = ops_[t].inputs(0), dead = ops_[u].inputs(0);
    ops_[u].set_inputs(0, x);
    MoveBelow(u, t, ShapeOf(x));
    tensors_.erase(dead);
    return true;
  }

  // B(T(x), T(y)) -> T(B(x, y)) when both carry the same permutation and x, y have the same shape.
  bool SinkThroughBinary(size_t b, int* removed) {
    const std::string a_name = ops_[b].inputs(0), b_name = ops_[b].inputs(1);
    if (a_name == b_name) return false;
    const int ta = SoleTranspose(a_name), tb = SoleTranspose(b_name);
    if (ta < 0 || tb < 0) return false;
    const auto& pa = ops_[ta].transpose().perm();
    const auto& pb = ops_[tb].transpose().perm();
    if (std::vector<int>(pa.begin(), pa.end()) != std::vector<int>(pb.begin(), pb.end())) return false;
    const std::string x = ops_[ta].inputs(0), y = ops_[tb].inputs(0);
    if (ShapeOf(x) != ShapeOf(y)) return false;
    ops_[b].set_inputs(0, x);
    ops_[b].set_inputs(1, y);
    MoveBelow(b, ta, ShapeOf(x));
    alive_[tb] = false;
    tensors_.erase(a_name);
    tensors_.erase(b_name);
    ++*removed;
    return true;
  }

  // B(T_p(x), w) -> T_p(B(x, w')) for a weight w that broadcasts into T_p(x) without growing it (a bias, a scale):
  // w' is w padded to the full rank and permuted back, so it broadcasts into x the same way. Either operand order.
  bool SinkPastConstant(size_t b) {
    if (weights_ == nullptr) return false;
    for (int side = 0; side < 2; ++side) {
      const std::string tin = ops_[b].inputs(side), w = ops_[b].inputs(1 - side), out = ops_[b].outputs(0);
      const int t = SoleTranspose(tin);
      auto stored = weights_->find(w);
      if (t < 0 || tensors_.at(w).kind() != WEIGHT || stored == weights_->end() || stored->second.dtype != F32) {
        continue;
      }
      const std::vector<int64_t> xt = ShapeOf(tin), ws = ShapeOf(w);
      if (ws.size() > xt.size() || ShapeOf(out) != xt) continue;
      const auto& perm = ops_[t].transpose().perm();
      const size_t rank = xt.size();
      std::vector<int64_t> full(rank - ws.size(), 1);  // w's shape in T_p(x)'s coordinates
      full.insert(full.end(), ws.begin(), ws.end());
      std::vector<int64_t> back(rank);  // in x's coordinates: dim perm[i] of x is dim i of T_p(x)
      for (size_t i = 0; i < rank; ++i) back[perm[i]] = full[i];
      std::vector<int64_t> full_strides(rank, 1), back_strides(rank, 1);
      for (int i = static_cast<int>(rank) - 2; i >= 0; --i) {
        full_strides[i] = full_strides[i + 1] * full[i + 1];
        back_strides[i] = back_strides[i + 1] * back[i + 1];
      }
      const HostTensor& src = stored->second;
      std::vector<float> values(src.f32.size());
      for (int64_t e = 0; e < static_cast<int64_t>(values.size()); ++e) {
        int64_t at = 0;
        for (size_t i = 0; i < rank; ++i) at += ((e / full_strides[i]) % full[i]) * back_strides[perm[i]];
        values[at] = src.f32[e];
      }
      const std::string permuted = Fresh(w + "/nhwc");
      TensorDef def = tensors_.at(w);
      def.set_name(permuted);
      def.clear_shape();
      for (int64_t d : back) def.add_shape(d);
      tensors_[permuted] = def;
      (*weights_)[permuted] = HostTensor::FromF32(back, std::move(values));
      const std::string x = ops_[t].inputs(0);
      ops_[b].set_inputs(side, x);
      ops_[b].set_inputs(1 - side, permuted);
      MoveBelow(b, t, ShapeOf(x));
      tensors_.erase(tin);
      return true;
    }
    return false;
  }

  // CONCAT(T_p(x1), T_p(x2), ...; axis a) -> T_p(CONCAT(x1, x2, ...; axis p[a])): every input carries the same
  // transpose (a channel concat of NHWC maps stays NHWC).
  bool SinkThroughConcat(size_t c, int* removed) {
    std::vector<int> ts;
    std::set<std::string> names;
    for (const std::string& in : ops_[c].inputs()) {
      const int t = names.insert(in).second ? SoleTranspose(in) : -1;
      if (t < 0) return false;
      const auto& p0 = ops_[ts.empty() ? t : ts[0]].transpose().perm();
      const auto& p = ops_[t].transpose().perm();
      if (std::vector<int>(p.begin(), p.end()) != std::vector<int>(p0.begin(), p0.end())) return false;
      ts.push_back(t);
    }
    const auto& perm = ops_[ts[0]].transpose().perm();
    const int rank = perm.size();
    const int axis = ops_[c].axis().axis() < 0 ? ops_[c].axis().axis() + rank : ops_[c].axis().axis();
    if (axis < 0 || axis >= rank) return false;
    const std::string out = ops_[c].outputs(0);
    std::vector<int64_t> shape = ShapeOf(ops_[ts[0]].inputs(0));
    shape[perm[axis]] = 0;
    for (int t : ts) shape[perm[axis]] += ShapeOf(ops_[t].inputs(0))[perm[axis]];
    for (size_t k = 0; k < ts.size(); ++k) {
      tensors_.erase(ops_[c].inputs(static_cast<int>(k)));
      ops_[c].set_inputs(static_cast<int>(k), ops_[ts[k]].inputs(0));
      if (k > 0) alive_[ts[k]] = false, ++*removed;
    }
    ops_[c].mutable_axis()->set_axis(perm[axis]);
    MoveBelow(c, ts[0], shape);
    return true;
  }

  // Two transposes of the same tensor by the same permutation (one input read by two convolutions): readers of the
  // second read the first's result.
  bool MergeTwin(size_t q, int* removed) {
    const std::string out = ops_[q].outputs(0);
    if (tensors_.at(out).is_output()) return false;
    const auto& qp = ops_[q].transpose().perm();
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (i == q || !alive_[i] || ops_[i].type() != TRANSPOSE || ops_[i].inputs(0) != ops_[q].inputs(0)) continue;
      const auto& ip = ops_[i].transpose().perm();
      if (std::vector<int>(ip.begin(), ip.end()) != std::vector<int>(qp.begin(), qp.end())) continue;
      Redirect(out, ops_[i].outputs(0));
      alive_[q] = false;
      tensors_.erase(out);
      ++*removed;
      return true;
    }
    return false;
  }
  // Every live op reading `from` reads `to` instead.
  void Redirect(const std::string& from, const std::string& to) {
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!alive_[i]) continue;
      for (int k = 0; k < ops_[i].inputs_size(); ++k) {
        if (ops_[i].inputs(k) == from) ops_[i].set_inputs(k, to);
      }
    }
  }

  // T_q(T_p(x)) with q after p the identity: readers of the outer result read x.
  bool CancelPair(size_t q, int* removed) {
    const std::string mid = ops_[q].inputs(0), out = ops_[q].outputs(0);
    const int p = Producer(mid);
    if (p < 0 || ops_[p].type() != TRANSPOSE || tensors_.at(out).is_output()) return false;
    const auto& pp = ops_[p].transpose().perm();
    const auto& qp = ops_[q].transpose().perm();
    if (pp.size() != qp.size()) return false;
    for (int i = 0; i < qp.size(); ++i) {
      if (pp[qp[i]] != i) return false;
    }
    Redirect(out, ops_[p].inputs(0));
    alive_[q] = false;
    tensors_.erase(out);
    ++*removed;
    if (Uses(mid) == 0) {
      alive_[p] = false;
      tensors_.erase(mid);
      ++*removed;
    }
    return true;
  }

  // A transpose whose dimensions of size > 1 keep their order is a reshape.
  bool MovesOnlyUnitDims(const OpDef& op) const {
    const std::vector<int64_t> shape = ShapeOf(op.inputs(0));
    int last = -1;
    for (int d : op.transpose().perm()) {
      if (shape[d] == 1) continue;
      if (d < last) return false;
      last = d;
    }
    return true;
  }

  void Write() {
    std::set<std::string> used;
    def_->clear_ops();
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (!alive_[i]) continue;
      for (const std::string& in : ops_[i].inputs()) used.insert(in);
      for (const std::string& out : ops_[i].outputs()) used.insert(out);
      *def_->add_ops() = ops_[i];
    }
    // Tensors in their old order, new ones after; an activation nothing produces or reads any more is dropped.
    std::vector<TensorDef> kept;
    std::set<std::string> seen;
    for (const TensorDef& t : def_->tensors()) {
      auto it = tensors_.find(t.name());
      const bool unread = !used.contains(t.name()) && !t.is_output();
      if (it == tensors_.end() || (unread && (t.kind() == ACTIVATION || (t.kind() == WEIGHT && weights_ != nullptr)))) {
        continue;
      }
      kept.push_back(it->second);
      seen.insert(t.name());
    }
    for (const auto& [name, t] : tensors_) {
      if (!seen.contains(name) && used.contains(name)) kept.push_back(t);
    }
    def_->clear_tensors();
    for (TensorDef& t : kept) *def_->add_tensors() = std::move(t);
  }

  GraphDef* def_;
  WeightStore* weights_;
  std::vector<OpDef> ops_;
  std::vector<bool> alive_;
  std::map<std::string, TensorDef> tensors_;
};

}  // namespace

absl::StatusOr<int> CancelTransposes(GraphDef* def, WeightStore* weights) {
  for (const OpDef& op : def->ops()) {
    if (op.outputs_size() != 1) return absl::InvalidArgumentError(absl::StrCat("op '", op.name(), "': one output"));
  }
  const int removed = Rewriter(def, weights).Run();
  if (weights != nullptr) {  // weights no op reads any more (permuted copies replaced them)
    std::set<std::string> read;
    for (const OpDef& op : def->ops()) read.insert(op.inputs().begin(), op.inputs().end());
    for (auto it = weights->begin(); it != weights->end();) {
      if (read.contains(it->first)) {
        ++it;
      } else {
        weights->erase(it++);
      }
    }
  }
  return removed;
}

}  // namespace loom::graph
