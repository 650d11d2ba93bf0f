// DiffusionGemma's entropy-bound sampler (sampler.h; diffusion-gemma-sampler.md): the temperature schedule, the
// acceptance of the lowest-entropy positions under the bound, uniform noise tokens and the adaptive stop. The
// per-position sample, argmax and entropy (eb_position) live with the other proposals in sampler_common.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/sampler.h"

namespace dllm::model {

double eb_temperature(const EntropyBoundDefaults& p, int64_t cur_step) {
  const double n = static_cast<double>(std::max<int64_t>(p.max_steps, 1));
  return p.t_min + (p.t_max - p.t_min) * static_cast<double>(cur_step) / n;
}

std::vector<uint8_t> eb_accept(std::span<const double> entropy, double bound) {
  std::vector<size_t> order(entropy.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double ha = entropy[a], hb = entropy[b];
    const bool na = ha != ha, nb = hb != hb;  // NaN last
    if (na != nb) return nb;
    return !na && ha < hb;
  });
  std::vector<uint8_t> accepted(entropy.size(), 0);
  double before = 0;  // the entropies ranked before the current position
  for (size_t i = 0; i < order.size(); ++i) {
    const double h = entropy[order[i]];
    if (i > 0 && !(before <= bound)) break;
    accepted[order[i]] = 1;
    before += h;
  }
  return accepted;
}

int32_t eb_random_token(uint64_t seed, RandomPurpose purpose, uint64_t counter, int64_t position, int64_t n_vocab) {
  const double u = RowRandom(seed, purpose, counter, static_cast<uint64_t>(position)).uniform(0);
  return static_cast<int32_t>(std::min<int64_t>(n_vocab - 1, static_cast<int64_t>(u * static_cast<double>(n_vocab))));
}

bool EntropyBoundStop::update(std::span<const int32_t> argmax, double mean_entropy) {
  const bool same = !prev_.empty() && std::equal(argmax.begin(), argmax.end(), prev_.begin(), prev_.end());
  held_ = same ? held_ + 1 : 0;
  prev_.assign(argmax.begin(), argmax.end());
  return held_ >= stability_ && mean_entropy < confidence_;
}

}  // namespace dllm::model
