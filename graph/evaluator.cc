#include "graph/evaluator.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "graph/nn_ops.h"
#include "graph/rope.h"

namespace loom::graph {
namespace {

absl::Status OpError(const OpDef& op, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("op '", op.name(), "': ", why));
}

// sum_k x[k] * w[w_offset + k], widening w whatever its storage.
float Dot(const float* x, const HostTensor& w, int64_t w_offset, int64_t k) {
  float acc = 0.0f;
  if (w.dtype == BF16) {
    const uint16_t* row = w.bf16.data() + w_offset;
    for (int64_t i = 0; i < k; ++i) acc += x[i] * Bf16ToFloat(row[i]);
  } else if (w.dtype == F8E4M3) {  // unscaled: the caller multiplies the row's sum by its scale
    const uint8_t* row = w.f8.data() + w_offset;
    for (int64_t i = 0; i < k; ++i) acc += x[i] * E4m3ToFloat(row[i]);
  } else if (w.dtype == I4) {  // each group's sum of (u - z) x, times its scale (in f32, as FP8's row scale)
    const int64_t cols = w.shape[1], groups = static_cast<int64_t>(w.bf16.size()) / w.shape[0];
    const int64_t group = cols / groups;
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t e = w_offset + i;
      const int64_t g = e / cols * groups + e % cols / group;
      sum += x[i] * static_cast<float>(((w.f8[e / 2] >> (4 * (e & 1))) & 15) - w.i32[g]);
      if (i + 1 == k || (e + 1) % cols % group == 0) {
        acc += sum * w.Int4Scale(g);
        sum = 0.0f;
      }
    }
  } else {
    const float* row = w.f32.data() + w_offset;
    for (int64_t i = 0; i < k; ++i) acc += x[i] * row[i];
  }
  return acc;
}

}  // namespace

Evaluator::Evaluator(const Graph& graph, const WeightStore& weights) : graph_(graph), weights_(weights) {
  for (const TensorDef* t : graph.TensorsOfKind(STATE)) values_[t->name()] = HostTensor::Zeros(*t);
}

const HostTensor& Evaluator::In(const OpDef& op, int i) const {
  const std::string& name = op.inputs(i);
  if (graph_.tensor(name).kind() == WEIGHT) return weights_.at(name);
  return values_.at(name);
}

absl::Status Evaluator::Run(const absl::flat_hash_map<std::string, HostTensor>& inputs) {
  for (const TensorDef* t : graph_.TensorsOfKind(INPUT)) {
    auto it = inputs.find(t->name());
    if (it == inputs.end()) return absl::InvalidArgumentError(absl::StrCat("input '", t->name(), "' not given"));
    // Integers for an f32 input (an ONNX integer input read in arithmetic) are its float values, as the runtime's.
    const bool widen = t->dtype() == F32 && it->second.dtype == I32;
    if ((it->second.dtype != t->dtype() && !widen) || it->second.size() != NumElements(*t)) {
      return absl::InvalidArgumentError(absl::StrCat("input '", t->name(), "' must be ", DTypeName(t->dtype()),
                                                     ShapeString(*t)));
    }
    values_[t->name()] =
        widen ? HostTensor::FromF32(it->second.shape, std::vector<float>(it->second.i32.begin(), it->second.i32.end()))
              : it->second;
  }
  for (const TensorDef* t : graph_.TensorsOfKind(WEIGHT)) {
    auto it = weights_.find(t->name());
    if (it == weights_.end()) return absl::NotFoundError(absl::StrCat("weight '", t->name(), "' missing"));
    if (it->second.size() != NumElements(*t)) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", t->name(), "' has ", it->second.size(),
                                                     " elements, graph says ", ShapeString(*t)));
    }
  }
  for (int index : graph_.topological_order()) {
    const OpDef& op = graph_.def().ops(index);
    for (const std::string& out : op.outputs()) values_[out] = HostTensor::Zeros(graph_.tensor(out));
    if (absl::Status s = RunOp(op); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Evaluator::RunOp(const OpDef& op) {
  HostTensor& out = values_.at(op.outputs(0));
  if (IsNnOp(op.type())) {  // graph/nn_ops: the general tensor ops
    std::vector<const HostTensor*> inputs;
    for (int i = 0; i < op.inputs_size(); ++i) inputs.push_back(&In(op, i));
    if (absl::Status s = EvalNnOp(op, inputs, &out); !s.ok()) return OpError(op, std::string(s.message()));
    return absl::OkStatus();
  }
  switch (op.type()) {
    case EMBEDDING: {
      const HostTensor& table = In(op, 0);
      const HostTensor& ids = In(op, 1);
      const int64_t vocab = table.shape[0], d = table.shape[1];
      for (int64_t t = 0; t < ids.size(); ++t) {
        const int32_t id = ids.i32[t];
        if (id < 0 || id >= vocab) return OpError(op, absl::StrCat("token id ", id, " outside vocab ", vocab));
        for (int64_t j = 0; j < d; ++j) out.f32[t * d + j] = table.Get(id * d + j);
      }
      return absl::OkStatus();
    }
    case RMS_NORM:
    case LAYER_NORM: {
      const HostTensor& x = In(op, 0);
      const HostTensor& w = In(op, 1);
      // Rows of d elements, or (per-head norm) runs of group_size elements sharing one weight.
      const int64_t d = op.norm().group_size() > 0 ? op.norm().group_size() : x.shape[1];
      const float eps = op.norm().eps();
      for (int64_t t = 0; t < x.size() / d; ++t) {
        const float* row = x.f32.data() + t * d;
        float mean = 0.0f;
        if (op.type() == LAYER_NORM) {
          for (int64_t j = 0; j < d; ++j) mean += row[j];
          mean /= static_cast<float>(d);
        }
        float sum_sq = 0.0f;
        for (int64_t j = 0; j < d; ++j) sum_sq += (row[j] - mean) * (row[j] - mean);
        const float scale = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
        for (int64_t j = 0; j < d; ++j) {
          float v = (row[j] - mean) * scale * w.Get(j);
          if (op.type() == LAYER_NORM) v += In(op, 2).Get(j);
          out.f32[t * d + j] = v;
        }
      }
      return absl::OkStatus();
    }
    case LINEAR: {
      const HostTensor& x = In(op, 0);
      const HostTensor& w = In(op, 1);
      const int64_t tokens = x.shape[0], k = x.shape[1], n = w.shape[0];
      // An FP8 weight: each row's sum times the row's scale (in f32), as the device's MATVEC_FP8.
      const float* scale = w.dtype == F8E4M3 ? w.f32.data() : nullptr;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t r = 0; r < n; ++r) {
          float v = Dot(x.f32.data() + t * k, w, r * k, k);
          if (scale != nullptr) v *= scale[r];
          if (op.inputs_size() == 3) v += In(op, 2).Get(r);
          out.f32[t * n + r] = v;
        }
      }
      return absl::OkStatus();
    }
    case ROPE: {
      const HostTensor& x = In(op, 0);
      const int32_t pos = In(op, 1).i32[0];
      const std::vector<float> table = RopeTable(op.rope());
      const int head_dim = op.rope().head_dim();
      out.f32 = x.f32;
      const int64_t width = x.shape[1];
      for (int64_t t = 0; t < x.shape[0]; ++t) {
        for (int64_t h = 0; h < width / head_dim; ++h) {
          ApplyRopeToHead(out.f32.data() + t * width + h * head_dim, head_dim, pos + static_cast<int>(t),
                          table.data());
        }
      }
      return absl::OkStatus();
    }
    case ATTENTION: {
      const AttentionAttrs& a = op.attention();
      const HostTensor& q = In(op, 0);
      const HostTensor& k = In(op, 1);
      const HostTensor& v = In(op, 2);
      HostTensor& k_cache = values_.at(op.inputs(3));
      HostTensor& v_cache = values_.at(op.inputs(4));
      const int32_t pos = In(op, 5).i32[0];
      const int64_t tokens = q.shape[0], h = a.num_heads(), kv = a.num_kv_heads(), dh = a.head_dim();
      const int64_t capacity = k_cache.shape[1];
      if (pos < 0 || pos + tokens > capacity) {
        return OpError(op, absl::StrCat("positions ", pos, "..", pos + tokens - 1, " outside the KV cache of ",
                                        capacity));
      }
      // A bf16 cache holds K and V rounded to nearest even (the instructions' KvStore); its values are read widened.
      auto set = [](HostTensor& cache, int64_t i, float x) {
        if (cache.dtype == BF16) {
          cache.bf16[i] = FloatToBf16(x);
        } else {
          cache.f32[i] = x;
        }
      };
      for (int64_t t = 0; t < tokens; ++t) {  // append
        for (int64_t g = 0; g < kv; ++g) {
          for (int64_t j = 0; j < dh; ++j) {
            const int64_t dst = (g * capacity + pos + t) * dh + j;
            set(k_cache, dst, k.f32[t * kv * dh + g * dh + j]);
            set(v_cache, dst, v.f32[t * kv * dh + g * dh + j]);
          }
        }
      }
      const float scale = a.scale() > 0 ? a.scale() : 1.0f / std::sqrt(static_cast<float>(dh));
      std::vector<float> scores;
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t visible = a.causal() ? pos + t + 1 : pos + tokens;
        scores.resize(visible);
        for (int64_t head = 0; head < h; ++head) {
          const int64_t g = head / (h / kv);
          const float* qh = q.f32.data() + t * h * dh + head * dh;
          float max_score = -std::numeric_limits<float>::infinity();
          for (int64_t p = 0; p < visible; ++p) {
            float s = 0.0f;
            const int64_t kp = (g * capacity + p) * dh;
            for (int64_t j = 0; j < dh; ++j) s += qh[j] * k_cache.Get(kp + j);
            scores[p] = s * scale;
            max_score = std::max(max_score, scores[p]);
          }
          float denom = 0.0f;
          for (int64_t p = 0; p < visible; ++p) denom += (scores[p] = std::exp(scores[p] - max_score));
          float* oh = out.f32.data() + t * h * dh + head * dh;
          for (int64_t p = 0; p < visible; ++p) {
            const int64_t vp = (g * capacity + p) * dh;
            const float weight = scores[p] / denom;
            for (int64_t j = 0; j < dh; ++j) oh[j] += weight * v_cache.Get(vp + j);
          }
        }
      }
      return absl::OkStatus();
    }
    case SILU_MUL: {
      const HostTensor& g = In(op, 0);
      const HostTensor& u = In(op, 1);
      for (int64_t i = 0; i < g.size(); ++i) out.f32[i] = g.f32[i] / (1.0f + std::exp(-g.f32[i])) * u.f32[i];
      return absl::OkStatus();
    }
    case CONV1D: {
      const HostTensor& x = In(op, 0);
      const HostTensor& w = In(op, 1);
      const int64_t tokens = x.shape[0], channels = x.shape[1], ksize = w.shape[1];
      HostTensor* state = ksize > 1 ? &values_.at(op.inputs(2)) : nullptr;
      std::vector<float> window(ksize - 1 + tokens);
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t j = 0; j < ksize - 1; ++j) window[j] = state->f32[c * (ksize - 1) + j];
        for (int64_t t = 0; t < tokens; ++t) window[ksize - 1 + t] = x.f32[t * channels + c];
        for (int64_t t = 0; t < tokens; ++t) {
          float acc = op.inputs_size() == 4 ? In(op, 3).Get(c) : 0.0f;
          for (int64_t j = 0; j < ksize; ++j) acc += w.Get(c * ksize + j) * window[t + j];
          out.f32[t * channels + c] = acc;
        }
        for (int64_t j = 0; j < ksize - 1; ++j) state->f32[c * (ksize - 1) + j] = window[tokens + j];
      }
      return absl::OkStatus();
    }
    case ARGMAX: {
      const HostTensor& x = In(op, 0);
      const int64_t n = x.shape[1];
      for (int64_t t = 0; t < x.shape[0]; ++t) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; ++i) {
          if (x.f32[t * n + i] > x.f32[t * n + best]) best = i;
        }
        out.i32[t] = static_cast<int32_t>(best);
      }
      return absl::OkStatus();
    }
    default:
      return OpError(op, "unknown op type");
  }
}

}  // namespace loom::graph
