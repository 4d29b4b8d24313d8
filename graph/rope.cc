#include "graph/rope.h"

#include <cmath>
#include <numbers>

namespace loom::graph {

std::vector<float> RopeInvFreq(const RopeAttrs& attrs) {
  const int half = attrs.head_dim() / 2;
  std::vector<float> inv_freq(half);
  for (int j = 0; j < half; ++j) {
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(attrs.head_dim());
    inv_freq[j] = 1.0f / std::pow(attrs.theta(), exponent);
  }
  if (!attrs.has_llama3_scaling()) return inv_freq;

  const RopeScaling& s = attrs.llama3_scaling();
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
  return inv_freq;
}

void ApplyRopeToHead(float* head, int head_dim, int position, const float* inv_freq) {
  const int half = head_dim / 2;
  for (int j = 0; j < half; ++j) {
    const float angle = static_cast<float>(position) * inv_freq[j];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = head[j], b = head[j + half];
    head[j] = a * c - b * s;
    head[j + half] = b * c + a * s;
  }
}

}  // namespace loom::graph
