#include "graph/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace loom::graph {
namespace {

// Llama-3: low frequencies divided by factor, high ones kept, the band between interpolated.
void ApplyLlama3(const RopeScaling& s, std::vector<float>& inv_freq) {
  const double old_len = s.original_max_position();
  const double low_freq_wavelen = old_len / s.low_freq_factor();
  const double high_freq_wavelen = old_len / s.high_freq_factor();
  for (float& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = static_cast<float>(f / s.factor());
    } else if (wavelen >= high_freq_wavelen) {  // medium band: interpolate
      const double smooth = (old_len / wavelen - s.low_freq_factor()) / (s.high_freq_factor() - s.low_freq_factor());
      f = static_cast<float>((1.0 - smooth) * f / s.factor() + smooth * f);
    }
  }
}

// YaRN, as transformers' _compute_yarn_parameters: dimensions below `low` keep
// their frequency (extrapolation), those above `high` are divided by factor
// (interpolation), a linear ramp in between.
void ApplyYarn(const YarnScaling& y, int head_dim, double theta, std::vector<float>& inv_freq) {
  const double dim = head_dim;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(y.original_max_position() / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = correction_dim(y.beta_fast()), high = correction_dim(y.beta_slow());
  if (y.truncate()) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // as transformers: no zero-width ramp
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const float ramp = std::clamp(static_cast<float>((static_cast<double>(j) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;
    const float interpolated = inv_freq[j] / y.factor();
    inv_freq[j] = interpolated * (1.0f - extrapolation) + inv_freq[j] * extrapolation;
  }
}

}  // namespace

std::vector<float> RopeInvFreq(const RopeAttrs& attrs) {
  const int half = attrs.head_dim() / 2;
  std::vector<float> inv_freq(half);
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(attrs.head_dim());
    inv_freq[j] = 1.0f / std::pow(attrs.theta(), exponent);
  }
  if (attrs.has_llama3_scaling()) ApplyLlama3(attrs.llama3_scaling(), inv_freq);
  if (attrs.linear_factor() > 0) {
    for (float& f : inv_freq) f /= attrs.linear_factor();
  }
  if (attrs.has_yarn()) ApplyYarn(attrs.yarn(), attrs.head_dim(), attrs.theta(), inv_freq);
  return inv_freq;
}

float RopeAttentionFactor(const RopeAttrs& attrs) {
  return attrs.has_yarn() && attrs.yarn().attention_factor() > 0 ? attrs.yarn().attention_factor() : 1.0f;
}

std::vector<float> RopeTable(const RopeAttrs& attrs) {
  std::vector<float> table = RopeInvFreq(attrs);
  table.push_back(RopeAttentionFactor(attrs));
  return table;
}

void ApplyRopeToHead(float* head, int head_dim, int position, const float* table) {
  const int half = head_dim / 2;
  const float factor = table[half];
  for (int j = 0; j < half; ++j) {
    const float angle = static_cast<float>(position) * table[j];
    const float c = std::cos(angle) * factor, s = std::sin(angle) * factor;
    const float a = head[j], b = head[j + half];
    head[j] = a * c - b * s;
    head[j + half] = b * c + a * s;
  }
}

}  // namespace loom::graph
