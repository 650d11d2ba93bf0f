// LLaDA's sampler (algorithms.md section 3, after ML-GSAI/LLaDA generate.py): the per-block schedule of
// commit counts, and the per-position proposal (argmax, or Gumbel-max in double at T > 0) with its
// confidence (the untempered softmax probability of the proposal, or a uniform draw for `random`).
// The block loop itself, threshold and dual cache live in generate.cpp.
#include <cmath>
#include <limits>

#include "common/error.h"
#include "model/sampler.h"

namespace dllm::model {

int64_t llada_block_count(int64_t max_tokens, int64_t block_length) {
  if (max_tokens < 1 || block_length < 1) throw Error("internal error: LLaDA blocks of an empty canvas or block");
  return (max_tokens - 1) / block_length + 1;
}

LladaBlock llada_block(int64_t max_tokens, int64_t block_length, int64_t steps, int64_t b) {
  const int64_t nb = llada_block_count(max_tokens, block_length);
  if (b < 0 || b >= nb || steps < 1) throw Error("internal error: LLaDA block " + std::to_string(b) + " out of range");
  // The step boundary of token boundary t: floor(N t / L), in 128 bits (N is unbounded here).
  auto step_at = [&](int64_t t) {
    return static_cast<int64_t>(static_cast<__int128>(steps) * t / max_tokens);
  };
  LladaBlock k;
  k.begin = b * block_length;
  k.end = b == nb - 1 ? max_tokens : k.begin + block_length;
  k.first_step = step_at(k.begin);
  k.steps = step_at(k.end) - k.first_step;
  return k;
}

std::vector<int64_t> llada_block_schedule(int64_t masked, int64_t steps) {
  if (steps <= 0) throw Error("internal error: LLaDA block schedule with " + std::to_string(steps) + " steps");
  std::vector<int64_t> k(static_cast<size_t>(steps), masked / steps);
  const int64_t rem = masked % steps;
  for (int64_t i = 0; i < rem; ++i) ++k[static_cast<size_t>(i)];
  return k;
}

int64_t llada_step_count(int64_t masked, int64_t steps, int64_t i) {
  if (steps <= 0 || i < 0 || i >= steps) throw Error("internal error: LLaDA step " + std::to_string(i) + " out of range");
  return masked / steps + (i < masked % steps ? 1 : 0);
}

Proposal llada_propose(const float* logits, int64_t n_vocab, double temperature, Remasking remasking,
                       uint64_t seed, uint64_t step, int64_t position) {
  Proposal p;
  const uint64_t pos = static_cast<uint64_t>(position);
  if (temperature > 0) {
    p.token = gumbel_argmax_token(logits, n_vocab, temperature, RowRandom(seed, RandomPurpose::Gumbel, step, pos));
  } else {
    p.token = argmax_token(logits, n_vocab);
  }
  if (remasking == Remasking::Random) {
    p.confidence = RowRandom(seed, RandomPurpose::RemaskRandom, step, pos).uniform(0);
  } else {
    // low_confidence: the proposal's probability under the untempered softmax (3.5).
    p.confidence = softmax_prob(logits, n_vocab, p.token, 1.0);
  }
  return p;
}

}  // namespace dllm::model
