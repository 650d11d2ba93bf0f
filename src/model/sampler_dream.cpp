// Dream's sampler (algorithms.md section 4, after Dream-org generation_utils.py diffusion_generate):
// the timestep schedule in float32 exactly as PyTorch computes it (R6), and the per-position proposal
// with the confidence of each --remasking algorithm (maskgit_plus, topk_margin, entropy), computed on
// the tempered probabilities in double. The shift (position j reads raw row j-1) is applied by the
// generation loop, which hands this file the right row.
#include <cmath>
#include <limits>

#include "common/error.h"
#include "model/sampler.h"

namespace dllm::model {

DreamSchedule::DreamSchedule(int64_t steps, float eps) : steps_(steps), end_(eps) {
  if (steps <= 0) throw Error("internal error: Dream schedule with " + std::to_string(steps) + " steps");
  delta_ = (end_ - 1.0f) / static_cast<float>(steps);  // torch.linspace(1, eps, steps + 1): float32 step
}

float DreamSchedule::timestep(int64_t m) const {
  // The CUDA kernel's two-sided formula, with FMA: the first half counts from the start, the rest from the end.
  const int64_t half = (steps_ + 1) / 2;
  return m < half ? std::fmaf(delta_, static_cast<float>(m), 1.0f)
                  : std::fmaf(-delta_, static_cast<float>(steps_ - m), end_);
}

int64_t DreamSchedule::count(int64_t i, int64_t masked) const {
  if (i < 0 || i >= steps_) throw Error("internal error: Dream step " + std::to_string(i) + " out of range");
  if (i == steps_ - 1) return masked;  // the final step takes every leftover
  const float t = timestep(i), s = timestep(i + 1);
  const float ratio = s / t;
  const float frac = 1.0f - ratio;
  const float k = static_cast<float>(masked) * frac;
  return static_cast<int64_t>(k);  // truncation toward zero, as Python's int()
}

std::vector<int64_t> dream_schedule(int64_t steps, int64_t gen_length) {
  DreamSchedule sched(steps);
  std::vector<int64_t> k(static_cast<size_t>(steps));
  int64_t masked = gen_length;
  for (int64_t i = 0; i < steps; ++i) {
    k[static_cast<size_t>(i)] = sched.count(i, masked);
    masked -= k[static_cast<size_t>(i)];
  }
  return k;
}

Proposal dream_propose(const float* logits, int64_t n_vocab, double temperature, Remasking remasking,
                       uint64_t seed, uint64_t step, int64_t position) {
  Proposal p;
  const bool tempered = temperature > 0;
  auto scaled = [&](int64_t v) {
    const double l = static_cast<double>(logits[v]);
    return tempered ? l / temperature : l;
  };
  // softmax(l / T): max and normaliser in double.
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < n_vocab; ++v) mx = std::max(mx, scaled(v));
  double sum = 0;
  for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(scaled(v) - mx);
  auto prob = [&](int64_t v) { return std::exp(scaled(v) - mx) / sum; };

  p.token = tempered ? gumbel_argmax_token(logits, n_vocab, temperature,
                                           RowRandom(seed, RandomPurpose::Gumbel, step, static_cast<uint64_t>(position)))
                     : argmax_token(logits, n_vocab);
  if (!std::isfinite(mx)) {
    p.confidence = -std::numeric_limits<double>::infinity();
    return p;
  }
  switch (remasking) {
    case Remasking::TopkMargin: {
      double p1 = -1, p2 = 0;  // the two largest probabilities
      for (int64_t v = 0; v < n_vocab; ++v) {
        const double q = prob(v);
        if (q > p1) p2 = p1, p1 = q;
        else if (q > p2) p2 = q;
      }
      p.confidence = p1 - (p2 < 0 ? 0 : p2);
      break;
    }
    case Remasking::Entropy: {
      double s = 0;  // sum p ln(p + 1e-10): minus the entropy
      for (int64_t v = 0; v < n_vocab; ++v) {
        const double q = prob(v);
        if (q > 0) s += q * std::log(q + 1e-10);
      }
      p.confidence = s;
      break;
    }
    default:  // maskgit_plus: the proposal's probability
      p.confidence = prob(p.token);
      break;
  }
  return p;
}

}  // namespace dllm::model
