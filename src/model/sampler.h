// The samplers of the two architectures (algorithms.md sections 3 and 4): per-step commit schedules,
// the per-row token proposal and confidence, and the choice of the positions to commit. Everything
// here is a pure function of logits, settings and a counter-based random stream, so the generation
// loop (generate.h) and the tests drive it directly.
//
// Pinned rules: ties between positions go to the lowest position (R1); ties between tokens to the
// lowest id (R2); probabilities, confidences and entropies are computed in double from f32 logits
// (R3); at temperature T > 0 the proposal is argmax_v (l_v + T * g_v) with g = -ln(-ln u) drawn in
// double (R4); LLaDA's threshold commits the scheduled top-k plus every candidate at or above it (R5);
// Dream's per-step counts follow the float32 recipe of 4.2 (R6).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/arch.h"

namespace dllm::model {

// --remasking: LLaDA's low_confidence / random, Dream's entropy / maskgit_plus / topk_margin.
enum class Remasking { LowConfidence, Random, Entropy, MaskgitPlus, TopkMargin };

const char* remasking_name(Remasking r);
std::optional<Remasking> parse_remasking(const std::string& name);
Remasking default_remasking(Arch arch);           // low_confidence for LLaDA, entropy for Dream
bool remasking_valid_for(Arch arch, Remasking r);  // LLaDA: low_confidence|random; Dream: the other three
const char* remasking_choices(Arch arch);          // "low_confidence or random", for messages

// --- the random stream -------------------------------------------------------------------------
// Counter-based: every draw is a function of (seed, purpose, global step, canvas position, index),
// so results depend neither on the thread count nor on the order rows are processed in.
enum class RandomPurpose : uint64_t { Gumbel = 1, RemaskRandom = 2 };

class RowRandom {
 public:
  RowRandom(uint64_t seed, RandomPurpose purpose, uint64_t step, uint64_t position);
  // Uniform double in [0, 1) with 53 random bits (never 1).
  double uniform(uint64_t index) const;

 private:
  uint64_t key_;
};

// --- per-row proposal and confidence -------------------------------------------------------------
struct Proposal {
  int32_t token = 0;       // x0: the proposed token
  double confidence = 0;   // the score positions are ranked by (higher = committed first)
};

// argmax_v logits[v], lowest id on ties (R2). NaN entries are never chosen.
int32_t argmax_token(const float* logits, int64_t n_vocab);
// argmax_v (logits[v] + T * g_v), g_v = -ln(-ln u_v), u_v = rng.uniform(v), all in double (R4).
int32_t gumbel_argmax_token(const float* logits, int64_t n_vocab, double temperature, const RowRandom& rng);

// softmax(logits / T)[token] in double (T = 1 for the untempered softmax).
double softmax_prob(const float* logits, int64_t n_vocab, int32_t token, double temperature = 1.0);

// LLaDA (3.4, 3.5): low_confidence scores the proposal's untempered softmax probability; random scores
// a uniform draw per position and step. `step` is the global step index (seeds the stream).
Proposal llada_propose(const float* logits, int64_t n_vocab, double temperature, Remasking remasking,
                       uint64_t seed, uint64_t step, int64_t position);

// Dream (4.3, 4.4) on the raw row that predicts the position (row j-1 for position j): probabilities
// of softmax(l / T) (T = 0: untempered); maskgit_plus scores probs[x0], topk_margin p(1) - p(2),
// entropy sum_v p_v ln(p_v + 1e-10) (minus the entropy: higher = more certain).
Proposal dream_propose(const float* logits, int64_t n_vocab, double temperature, Remasking remasking,
                       uint64_t seed, uint64_t step, int64_t position);

// --- schedules ---------------------------------------------------------------------------------------
// LLaDA (3.2): tokens committed at each of `steps` steps of a block with `masked` masked positions:
// masked / steps each, the remainder going to the first steps.
std::vector<int64_t> llada_block_schedule(int64_t masked, int64_t steps);
// The same for one step i (no allocation, for any number of steps).
int64_t llada_step_count(int64_t masked, int64_t steps, int64_t i);

// Dream (4.2, R6): how many of `masked` positions step i of `steps` commits, with timesteps
// linspace(1, eps, steps + 1) as PyTorch's CUDA linspace computes them in float32 (fmaf), and
// trunc(masked * (1 - t[i+1] / t[i])) in float32; the last step takes every masked position.
class DreamSchedule {
 public:
  explicit DreamSchedule(int64_t steps, float eps = 1e-3f);
  int64_t steps() const { return steps_; }
  int64_t count(int64_t step, int64_t masked) const;
  float timestep(int64_t m) const;  // t[m], m = 0 .. steps

 private:
  int64_t steps_;
  float end_, delta_;
};
// The whole schedule for a canvas of `gen_length` masks when every step commits exactly its count.
std::vector<int64_t> dream_schedule(int64_t steps, int64_t gen_length);

// --- choosing positions ------------------------------------------------------------------------------
struct Candidate {
  int64_t position = 0;
  Proposal proposal;
};

// Indices into `c` of the first min(k, |c|) candidates ordered by (confidence desc, position asc) (R1),
// plus, when threshold > 0, every candidate whose confidence is >= threshold (R5). Returned in
// ascending position order. NaN confidences rank last.
std::vector<size_t> select_candidates(std::span<const Candidate> c, int64_t k, double threshold = 0.0);

}  // namespace dllm::model
