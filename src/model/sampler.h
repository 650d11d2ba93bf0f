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
enum class RandomPurpose : uint64_t { Gumbel = 1, RemaskRandom = 2, EbSample = 3, EbNoise = 4, EbInit = 5 };

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

// --- log-probabilities (OpenAI's logprobs / top_logprobs) ------------------------------------------
// The distribution a position is committed from is softmax(l / T) over the row l that proposed its token
// (LLaDA: row j; Dream: row j - 1), at the step that committed it, T the sampler's temperature (T = 0, greedy:
// T = 1, the plain softmax). At T > 0 the proposal is an exact sample of that distribution (R4).
inline constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;  // ln softmax(l / T)[token], in double (<= 0; -inf for a token of logit -inf)
};

// One generated position.
struct PositionLogprobs {
  TokenLogprob chosen;            // the committed token
  std::vector<TokenLogprob> top;  // the most probable tokens, most probable first, lowest id first on ties
  int64_t step = -1;              // the global step that committed it; -1: never committed (still masked)
};

// chosen = token's log-probability, top = the k (at most kMaxTopLogprobs) most probable tokens of the same
// distribution (NaN logits never listed), step left -1. ln softmax(l / T)[v] = l_v / T - m - ln sum_u
// e^(l_u / T - m), m = max_u l_u / T, in double: the sum as softmax_prob's. A row without a finite maximum
// gives -inf and no alternatives.
PositionLogprobs position_logprobs(const float* logits, int64_t n_vocab, int32_t token, double temperature, int k);

// --- schedules ---------------------------------------------------------------------------------------
// LLaDA's blocks (3.1) for any max_tokens L, block_length B and steps N: blocks of B positions in order,
// the last one shorter when B does not divide L (one block of L when B > L); the steps are shared out in
// proportion to the blocks' lengths, by scaling the blocks' token boundaries by N / L and rounding down:
// the block covering generated positions [s, e) runs the global steps [floor(N s / L), floor(N e / L)).
// The counts sum to N and each is its proportional share rounded up or down; with N at least the block
// count every block gets at least one step. When B divides L and the block count divides N, this is the
// authors' layout exactly: block b covers [b B, (b + 1) B) and runs steps [b S, (b + 1) S), S = N / nb.
struct LladaBlock {
  int64_t begin = 0, end = 0;  // generated positions [begin, end) (offsets after the prompt)
  int64_t first_step = 0;      // the global index of its first step
  int64_t steps = 0;           // steps it runs
};
int64_t llada_block_count(int64_t max_tokens, int64_t block_length);  // ceil(L / B)
LladaBlock llada_block(int64_t max_tokens, int64_t block_length, int64_t steps, int64_t b);

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

// --- DiffusionGemma's entropy-bound sampler (diffusion-gemma-sampler.md) -----------------------------------------
// Uniform-state diffusion: a block's canvas starts as uniform random tokens; each step samples every position
// from softmax(l / t) at the scheduled temperature, keeps the positions whose entropies fit under the bound
// (eb_accept), re-noises the others with fresh random tokens, and the block stops when the argmax canvas is
// stable and confident (EntropyBoundStop). The random stream is the counter-based one above, so a position's
// draws do not depend on the batch, the thread count or the order rows are processed in.

// The temperature of step cur_step, counted down from N = p.max_steps to 1: t_min + (t_max - t_min) * cur_step / N
// (the first step runs at t_max; t_min itself is never reached).
double eb_temperature(const EntropyBoundDefaults& p, int64_t cur_step);

// One canvas position of a step, from its raw logits at temperature t: z = l / t, p = softmax(z), in double from
// f32 logits (R3).
struct EbPosition {
  int32_t sample = 0;   // drawn from p: the first v whose cumulative probability reaches u = rng.uniform(0)
  int32_t argmax = 0;   // argmax z, lowest id on ties (R2): what the block outputs
  double entropy = 0;   // -sum_v p_v ln p_v
  bool finite = true;   // false: the row has no finite softmax (NaN or infinite logits); nothing else is set
};
EbPosition eb_position(const float* logits, int64_t n_vocab, double temperature, const RowRandom& rng);

// Acceptance (HF accept_canvas): positions ordered by entropy ascending (ties: lower position first, NaN last);
// the k-th of the order is accepted iff the entropies ranked before it sum to at most `bound`. The accepted set is
// a prefix of that order and always holds the lowest-entropy position. One flag per position (1 = accepted).
std::vector<uint8_t> eb_accept(std::span<const double> entropy, double bound);

// A uniform random token in [0, n_vocab) for a position: the initial canvas of block `block` (purpose EbInit,
// counter = the block) or the re-noise of step `step` (EbNoise, counter = the sequence's global step).
int32_t eb_random_token(uint64_t seed, RandomPurpose purpose, uint64_t counter, int64_t position, int64_t n_vocab);

// The adaptive stop (HF StableAndConfidentStoppingCriteria), fed once per step: stable = the argmax canvas equals
// that of each of the previous `stability` steps (0: always; never on a block's first step otherwise), confident =
// the mean entropy of the step < `confidence`. update() says whether the block stops after this step.
class EntropyBoundStop {
 public:
  EntropyBoundStop(int64_t stability, double confidence) : stability_(stability), confidence_(confidence) {}
  bool update(std::span<const int32_t> argmax, double mean_entropy);
  void reset() { prev_.clear(), held_ = 0; }  // a new block
  int64_t held() const { return held_; }      // previous steps with this argmax canvas, in a row

 private:
  int64_t stability_;
  double confidence_;
  std::vector<int32_t> prev_;
  int64_t held_ = 0;
};

}  // namespace dllm::model
