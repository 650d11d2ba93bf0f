// The samplers without a model (algorithms.md sections 3, 4 and 7): LLaDA's and Dream's schedules, the
// tie rules R1/R2, the confidence of every --remasking strategy on designed distributions, Gumbel-max
// sampling frequencies, the counter-based random stream, and position selection with a threshold; DiffusionGemma's
// entropy-bound sampler (diffusion-gemma-sampler.md) on constructed logits and entropies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "model/fast_math.h"
#include "model/sampler.h"

namespace dllm::model {
namespace {

std::vector<int64_t> repeat(int64_t v, int64_t n) { return std::vector<int64_t>(static_cast<size_t>(n), v); }
std::vector<int64_t> cat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// --- LLaDA schedule (3.2) ---

TEST(LladaSchedule, ExamplesOfTheSpec) {
  EXPECT_EQ(llada_block_schedule(32, 32), repeat(1, 32));
  EXPECT_EQ(llada_block_schedule(32, 16), repeat(2, 16));
  EXPECT_EQ(llada_block_schedule(32, 10), (std::vector<int64_t>{4, 4, 3, 3, 3, 3, 3, 3, 3, 3}));
  EXPECT_EQ(llada_block_schedule(128, 48), cat({repeat(3, 32), repeat(2, 16)}));
  EXPECT_EQ(llada_block_schedule(32, 64), cat({repeat(1, 32), repeat(0, 32)}));
}

TEST(LladaSchedule, SumsToTheMaskedCount) {
  for (int64_t m = 0; m <= 70; ++m) {
    for (int64_t s = 1; s <= 70; ++s) {
      const auto k = llada_block_schedule(m, s);
      ASSERT_EQ(static_cast<int64_t>(k.size()), s);
      EXPECT_EQ(std::accumulate(k.begin(), k.end(), int64_t{0}), m);
      EXPECT_TRUE(std::is_sorted(k.rbegin(), k.rend()));  // the remainder goes to the first steps
      EXPECT_LE(k.front() - k.back(), 1);
      for (int64_t i = 0; i < s; ++i) ASSERT_EQ(llada_step_count(m, s, i), k[static_cast<size_t>(i)]);
    }
  }
}

// --- Dream schedule (4.2, R6) ---

TEST(LladaBlocks, DividingSettingsGiveTheAuthorsLayout) {
  for (int64_t B : {1, 4, 8, 32}) {
    for (int64_t nb : {1, 2, 3, 4, 7}) {
      for (int64_t S : {1, 2, 5, 32, 40}) {
        SCOPED_TRACE(testing::Message() << "B " << B << " nb " << nb << " S " << S);
        ASSERT_EQ(llada_block_count(nb * B, B), nb);
        for (int64_t b = 0; b < nb; ++b) {
          const LladaBlock k = llada_block(nb * B, B, nb * S, b);
          EXPECT_EQ(k.begin, b * B);
          EXPECT_EQ(k.end, (b + 1) * B);
          EXPECT_EQ(k.first_step, b * S);
          EXPECT_EQ(k.steps, S);
        }
      }
    }
  }
}

TEST(LladaBlocks, ShortLastBlockAndStepsInProportion) {
  auto steps_of = [](int64_t L, int64_t B, int64_t N) {
    std::vector<int64_t> out;
    for (int64_t b = 0; b < llada_block_count(L, B); ++b) out.push_back(llada_block(L, B, N, b).steps);
    return out;
  };
  EXPECT_EQ(steps_of(100, 32, 100), (std::vector<int64_t>{32, 32, 32, 4}));
  EXPECT_EQ(steps_of(100, 32, 10), (std::vector<int64_t>{3, 3, 3, 1}));  // 3.2 x3, 0.4 rounded up
  EXPECT_EQ(steps_of(100, 32, 4), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(steps_of(128, 32, 10), (std::vector<int64_t>{2, 3, 2, 3}));  // 2.5 each
  EXPECT_EQ(steps_of(16, 32, 16), (std::vector<int64_t>{16}));            // one block of max_tokens
  EXPECT_EQ(steps_of(16, 32, 5), (std::vector<int64_t>{5}));
  EXPECT_EQ(steps_of(1, 32, 1), (std::vector<int64_t>{1}));
  const LladaBlock last = llada_block(100, 32, 100, 3);
  EXPECT_EQ(last.begin, 96);
  EXPECT_EQ(last.end, 100);
  EXPECT_EQ(last.first_step, 96);
}

TEST(LladaBlocks, TilesTheCanvasAndTheStepsWithAtLeastOneStepEach) {
  for (int64_t L = 1; L <= 70; ++L) {
    for (int64_t B : {1, 3, 8, 32, 100}) {
      const int64_t nb = llada_block_count(L, B);
      for (int64_t N = nb; N <= 2 * L + 3; N += 1 + N / 7) {
        SCOPED_TRACE(testing::Message() << "L " << L << " B " << B << " N " << N);
        int64_t pos = 0, step = 0;
        for (int64_t b = 0; b < nb; ++b) {
          const LladaBlock k = llada_block(L, B, N, b);
          ASSERT_EQ(k.begin, pos);
          ASSERT_EQ(k.end - k.begin, std::min(B, L - pos));
          ASSERT_EQ(k.first_step, step);
          ASSERT_GE(k.steps, 1);
          // Its share N (e - s) / L, rounded down or up.
          const int64_t share = N * (k.end - k.begin);
          ASSERT_LE(k.steps * L, share + L - 1);
          ASSERT_GE(k.steps * L, share - L + 1);
          pos = k.end, step += k.steps;
        }
        ASSERT_EQ(pos, L);
        ASSERT_EQ(step, N);
      }
    }
  }
  // Steps far beyond max_tokens (allowed by the library: the extra steps commit nothing) do not overflow.
  const LladaBlock k = llada_block(100, 32, int64_t{1} << 60, 3);
  EXPECT_EQ(k.first_step + k.steps, int64_t{1} << 60);
}

TEST(DreamSchedule, TableOfTheSpec) {
  EXPECT_EQ(dream_schedule(128, 128), cat({{0}, repeat(1, 126), {2}}));
  EXPECT_EQ(dream_schedule(256, 256), cat({{0}, repeat(1, 254), {2}}));
  EXPECT_EQ(dream_schedule(512, 512), cat({{0}, repeat(1, 510), {2}}));
  EXPECT_EQ(dream_schedule(64, 128), cat({{1}, repeat(2, 62), {3}}));
  EXPECT_EQ(dream_schedule(32, 128), cat({{3}, repeat(4, 30), {5}}));
  EXPECT_EQ(dream_schedule(16, 128), cat({{7}, repeat(8, 14), {9}}));
  EXPECT_EQ(dream_schedule(8, 128), cat({{15}, repeat(16, 6), {17}}));
  EXPECT_EQ(dream_schedule(4, 10), (std::vector<int64_t>{2, 2, 2, 4}));
  EXPECT_EQ(dream_schedule(10, 4), cat({repeat(0, 7), {1, 1, 2}}));
}

TEST(DreamSchedule, StepsEqualToLengthGiveZeroOnesTwoUpTo933) {
  for (int64_t n = 2; n <= 933; ++n) {
    ASSERT_EQ(dream_schedule(n, n), cat({{0}, repeat(1, n - 2), {2}})) << "N = L = " << n;
  }
}

TEST(DreamSchedule, Float32RecipeAt934) {
  // The spec: at N = L = 934 float32 gives zeros at steps 0 and 2 and a final 3 (float64 would not).
  const auto k = dream_schedule(934, 934);
  EXPECT_EQ(k[0], 0);
  EXPECT_EQ(k[2], 0);
  EXPECT_EQ(k.back(), 3);
  EXPECT_EQ(std::accumulate(k.begin(), k.end(), int64_t{0}), 934);
}

// An independent float64 computation agrees for N <= 512, L <= 516 (spec 4.2); spot-checked here.
TEST(DreamSchedule, AgreesWithFloat64InTheSafeRange) {
  for (int64_t n : {1, 2, 3, 7, 10, 33, 64, 100, 255, 333, 512}) {
    for (int64_t len : {1, 2, 5, 16, 31, 128, 200, 333, 516}) {
      std::vector<int64_t> want;
      int64_t masked = len;
      for (int64_t i = 0; i < n; ++i) {
        const double t = 1.0 - static_cast<double>(i) / n * (1 - 1e-3);
        const double s = 1.0 - static_cast<double>(i + 1) / n * (1 - 1e-3);
        const int64_t k = i == n - 1 ? masked : static_cast<int64_t>(masked * (1 - s / t));
        want.push_back(k);
        masked -= k;
      }
      ASSERT_EQ(dream_schedule(n, len), want) << "N " << n << " L " << len;
    }
  }
}

TEST(DreamSchedule, AnyNumberOfStepsWithoutAllocating) {
  const DreamSchedule s(1'000'000'000'000);  // computed per step, nothing stored
  EXPECT_EQ(s.timestep(0), 1.0f);
  EXPECT_EQ(s.timestep(1'000'000'000'000), 1e-3f);
  EXPECT_EQ(s.count(0, 128), 0);
  EXPECT_EQ(s.count(999'999'999'999, 128), 128);
  EXPECT_EQ(llada_step_count(32, 1'000'000'000'000, 31), 1);
  EXPECT_EQ(llada_step_count(32, 1'000'000'000'000, 32), 0);
}

TEST(DreamSchedule, CountUsesTheActualMaskedCount) {
  const DreamSchedule s(4);
  EXPECT_EQ(s.steps(), 4);
  EXPECT_EQ(s.count(3, 7), 7);  // the last step takes everything left
  EXPECT_EQ(s.count(0, 10), 2);
  EXPECT_EQ(s.count(0, 0), 0);
}

// --- proposals and ties ---

TEST(Proposal, ArgmaxLowestIdWinsTies) {  // R2
  std::vector<float> l(16, 0.0f);
  l[7] = 3.0f;
  l[3] = 3.0f;
  EXPECT_EQ(argmax_token(l.data(), 16), 3);
  l[2] = NAN;
  EXPECT_EQ(argmax_token(l.data(), 16), 3);
}

// argmax_token against a plain left-to-right scan: ties, NaN, infinities, zeros of both signs, lengths
// around its 64-element chunks.
TEST(Proposal, ArgmaxEqualsAScanKeepingTheFirstMaximum) {
  auto scan = [](const std::vector<float>& l) {
    int32_t best = 0;
    bool found = false;
    for (size_t v = 0; v < l.size(); ++v) {
      if (l[v] != l[v]) continue;
      if (!found || l[v] > l[static_cast<size_t>(best)]) best = static_cast<int32_t>(v), found = true;
    }
    return best;
  };
  std::mt19937 rng(7);
  const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 5.0f};
  for (int64_t n : {1, 2, 63, 64, 65, 130, 1000}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> l(static_cast<size_t>(n));
      const int range = 1 + trial % 4;  // small ranges make ties common
      for (float& x : l) {
        const unsigned r = rng();
        x = r % 5 == 0 ? specials[(r / 5) % 6] : static_cast<float>(static_cast<int>(r >> 8) % range) - 2.0f;
      }
      if (trial % 17 == 0) std::fill(l.begin(), l.end(), NAN);
      ASSERT_EQ(argmax_token(l.data(), n), scan(l)) << "n=" << n << " trial=" << trial;
    }
  }
}

TEST(Proposal, LladaLowConfidenceIsTheUntemperedProbability) {
  std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(0.5) + std::exp(-1.0);
  const Proposal p = llada_propose(l.data(), 4, 0.0, Remasking::LowConfidence, 42, 0, 0);
  EXPECT_EQ(p.token, 1);
  EXPECT_NEAR(p.confidence, std::exp(2.0) / z, 1e-15);
  // At T > 0 the confidence is still the untempered probability of the sampled token.
  for (uint64_t step = 0; step < 20; ++step) {
    const Proposal q = llada_propose(l.data(), 4, 2.0, Remasking::LowConfidence, 7, step, 3);
    EXPECT_NEAR(q.confidence, std::exp(static_cast<double>(l[static_cast<size_t>(q.token)])) / z, 1e-15);
  }
}

TEST(Proposal, LladaRandomRemaskingScoresAUniformDrawPerPositionAndStep) {
  std::vector<float> l = {1.0f, 2.0f};
  std::set<double> seen;
  for (int64_t pos = 0; pos < 50; ++pos) {
    const Proposal p = llada_propose(l.data(), 2, 0.0, Remasking::Random, 42, 3, pos);
    EXPECT_EQ(p.token, 1);  // the proposal is still the argmax
    EXPECT_GE(p.confidence, 0.0);
    EXPECT_LT(p.confidence, 1.0);
    seen.insert(p.confidence);
    EXPECT_EQ(p.confidence, llada_propose(l.data(), 2, 0.0, Remasking::Random, 42, 3, pos).confidence);
  }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_NE(llada_propose(l.data(), 2, 0.0, Remasking::Random, 42, 4, 0).confidence,
            llada_propose(l.data(), 2, 0.0, Remasking::Random, 42, 3, 0).confidence);
}

// Designed rows where the three Dream strategies disagree (spec 7): a two-way tie [0.5, 0.5] against a
// spread [0.4, 0.1 x 6].
std::vector<float> logits_of(std::vector<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return l;
}

TEST(Proposal, DreamStrategiesOnDesignedDistributions) {
  const auto tie = logits_of({0.5, 0.5, 0, 0, 0, 0, 0});
  const auto spread = logits_of({0.4, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1});
  auto conf = [](const std::vector<float>& l, Remasking r) {
    return dream_propose(l.data(), static_cast<int64_t>(l.size()), 0.0, r, 42, 0, 1).confidence;
  };
  // maskgit_plus: max probability; the tie (0.5) beats the spread (0.4).
  EXPECT_NEAR(conf(tie, Remasking::MaskgitPlus), 0.5, 1e-7);
  EXPECT_NEAR(conf(spread, Remasking::MaskgitPlus), 0.4, 1e-7);
  // topk_margin: p1 - p2; the tie has margin 0, the spread 0.3.
  EXPECT_NEAR(conf(tie, Remasking::TopkMargin), 0.0, 1e-7);
  EXPECT_NEAR(conf(spread, Remasking::TopkMargin), 0.3, 1e-7);
  // entropy: minus the entropy; the tie (ln 2 = 0.693) is more certain than the spread (1.60).
  EXPECT_NEAR(conf(tie, Remasking::Entropy), -std::log(2.0), 1e-7);
  EXPECT_NEAR(conf(spread, Remasking::Entropy), 0.4 * std::log(0.4) + 0.6 * std::log(0.1), 1e-7);
  EXPECT_GT(conf(tie, Remasking::Entropy), conf(spread, Remasking::Entropy));  // the sign llama.cpp inverts
  // Every strategy proposes the argmax at T = 0 (lowest id on the tie).
  EXPECT_EQ(dream_propose(tie.data(), 7, 0.0, Remasking::Entropy, 1, 0, 1).token, 0);
}

TEST(Proposal, DreamConfidenceUsesTheTemperedDistribution) {
  const std::vector<float> l = {2.0f, 1.0f, 0.0f};
  const double T = 0.5;
  double z = 0;
  for (float x : l) z += std::exp(x / T);
  for (uint64_t step = 0; step < 10; ++step) {
    const Proposal p = dream_propose(l.data(), 3, T, Remasking::MaskgitPlus, 3, step, 5);
    EXPECT_NEAR(p.confidence, std::exp(l[static_cast<size_t>(p.token)] / T) / z, 1e-12);
  }
}

// --- Gumbel-max (R4) ---

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double x2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

TEST(Gumbel, FrequenciesMatchTheTemperedSoftmax) {
  const std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  for (double T : {0.5, 1.0, 2.0}) {
    std::vector<double> p(l.size());
    double z = 0;
    for (size_t v = 0; v < l.size(); ++v) z += p[v] = std::exp(l[v] / T);
    for (double& x : p) x /= z;
    std::vector<int> counts(l.size(), 0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) {
      // Draws over (step, position) pairs, as the generation loop makes them.
      RowRandom rng(123, RandomPurpose::Gumbel, static_cast<uint64_t>(i / 100), static_cast<uint64_t>(i % 100));
      ++counts[static_cast<size_t>(gumbel_argmax_token(l.data(), 5, T, rng))];
    }
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
    EXPECT_LT(chi_square(counts, p, n), 18.47) << "T " << T;
  }
}

TEST(Gumbel, TemperatureZeroIgnoresTheSeed) {
  const std::vector<float> l = {0.3f, 0.2f, 0.1f};
  for (uint64_t seed : {0ull, 1ull, 99ull}) {
    EXPECT_EQ(llada_propose(l.data(), 3, 0.0, Remasking::LowConfidence, seed, 5, 5).token, 0);
    EXPECT_EQ(dream_propose(l.data(), 3, 0.0, Remasking::Entropy, seed, 5, 5).token, 0);
  }
}

TEST(RandomStream, UniformInTheHalfOpenUnitIntervalAndUniformlySpread) {
  RowRandom r(42, RandomPurpose::Gumbel, 0, 0);
  std::vector<int> bins(10, 0);
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = r.uniform(i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[static_cast<size_t>(u * 10)];
  }
  // 9 degrees of freedom: P(chi2 > 27.88) = 0.001.
  EXPECT_LT(chi_square(bins, std::vector<double>(10, 0.1), 100000), 27.88);
  // Keyed by seed, purpose, step and position; a pure function of them.
  EXPECT_EQ(r.uniform(5), RowRandom(42, RandomPurpose::Gumbel, 0, 0).uniform(5));
  EXPECT_NE(r.uniform(5), RowRandom(43, RandomPurpose::Gumbel, 0, 0).uniform(5));
  EXPECT_NE(r.uniform(5), RowRandom(42, RandomPurpose::RemaskRandom, 0, 0).uniform(5));
  EXPECT_NE(r.uniform(5), RowRandom(42, RandomPurpose::Gumbel, 1, 0).uniform(5));
  EXPECT_NE(r.uniform(5), RowRandom(42, RandomPurpose::Gumbel, 0, 1).uniform(5));
}

// --- selection (R1, R5) ---

std::vector<Candidate> cands(std::vector<std::pair<int64_t, double>> pc) {
  std::vector<Candidate> c;
  for (auto [pos, conf] : pc) c.push_back(Candidate{pos, Proposal{0, conf}});
  return c;
}

TEST(Selection, HighestConfidenceFirstLowestPositionOnTies) {
  auto c = cands({{9, 0.5}, {5, 0.5}, {7, 0.2}});
  EXPECT_EQ(select_candidates(c, 1), (std::vector<size_t>{1}));  // position 5 wins the tie with 9
  EXPECT_EQ(select_candidates(c, 2), (std::vector<size_t>{1, 0}));
  EXPECT_EQ(select_candidates(c, 5), (std::vector<size_t>{1, 2, 0}));  // all, in position order
  EXPECT_TRUE(select_candidates(c, 0).empty());
  auto n = cands({{1, NAN}, {2, 0.1}});
  EXPECT_EQ(select_candidates(n, 1), (std::vector<size_t>{1}));  // NaN ranks last
}

TEST(Selection, ThresholdAddsEveryConfidentCandidateToTheScheduledOnes) {
  auto c = cands({{10, 0.95}, {11, 0.3}, {12, 0.91}, {13, 0.5}, {14, 0.89}});
  EXPECT_EQ(select_candidates(c, 1, 0.9), (std::vector<size_t>{0, 2}));
  EXPECT_EQ(select_candidates(c, 3, 0.9), (std::vector<size_t>{0, 2, 4}));  // never fewer than scheduled
  EXPECT_EQ(select_candidates(c, 0, 0.9), (std::vector<size_t>{0, 2}));     // a zero step can still commit
  EXPECT_EQ(select_candidates(c, 1, 1.0), (std::vector<size_t>{0}));        // nothing reaches 1.0
  EXPECT_EQ(select_candidates(c, 2, 0.0), select_candidates(c, 2));           // 0 = off
}

TEST(Remasking, NamesDefaultsAndValidity) {
  for (auto r : {Remasking::LowConfidence, Remasking::Random, Remasking::Entropy, Remasking::MaskgitPlus,
                 Remasking::TopkMargin}) {
    EXPECT_EQ(parse_remasking(remasking_name(r)), r);
    EXPECT_NE(remasking_valid_for(Arch::LLaDA, r), remasking_valid_for(Arch::Dream, r));
  }
  EXPECT_FALSE(parse_remasking("origin").has_value());
  EXPECT_EQ(default_remasking(Arch::LLaDA), Remasking::LowConfidence);
  EXPECT_EQ(default_remasking(Arch::Dream), Remasking::Entropy);
  EXPECT_TRUE(remasking_valid_for(Arch::LLaDA, Remasking::Random));
  EXPECT_FALSE(remasking_valid_for(Arch::Dream, Remasking::Random));
  EXPECT_FALSE(remasking_valid_for(Arch::LLaDA, Remasking::Entropy));
}

// --- DiffusionGemma's entropy-bound sampler ---

TEST(EntropyBound, TemperatureGoesLinearlyFromTMaxAndNeverReachesTMin) {
  EntropyBoundDefaults p;  // 48 steps, 0.4 .. 0.8
  EXPECT_DOUBLE_EQ(eb_temperature(p, 48), 0.8);
  EXPECT_DOUBLE_EQ(eb_temperature(p, 24), 0.6);
  EXPECT_DOUBLE_EQ(eb_temperature(p, 1), 0.4 + 0.4 / 48);
  p.max_steps = 4, p.t_min = 0.25, p.t_max = 1.25;
  EXPECT_EQ((std::vector<double>{eb_temperature(p, 4), eb_temperature(p, 3), eb_temperature(p, 2), eb_temperature(p, 1)}),
            (std::vector<double>{1.25, 1.0, 0.75, 0.5}));
}

// The rule as stated: position i is accepted iff the entropies ranked strictly before it (ascending entropy, lower
// position first on ties, NaN last) sum to at most the bound.
std::vector<uint8_t> accept_by_definition(const std::vector<double>& h, double bound) {
  std::vector<uint8_t> out(h.size());
  auto before = [&](size_t j, size_t i) {
    const bool nj = h[j] != h[j], ni = h[i] != h[i];
    if (nj != ni) return ni;
    if (nj) return j < i;
    return h[j] < h[i] || (h[j] == h[i] && j < i);
  };
  for (size_t i = 0; i < h.size(); ++i) {
    double sum = 0;
    for (size_t j = 0; j < h.size(); ++j)
      if (j != i && before(j, i)) sum += h[j];
    out[i] = sum <= bound;
  }
  return out;
}

TEST(EntropyBound, AcceptanceIsTheLowestEntropyPrefixUnderTheBound) {
  // Dyadic entropies, exact sums: ranked 1 (0.0625), 3 (0.125), 0 (0.25), 4 (0.25), 2 (1.0); before each: 0,
  // 0.0625, 0.1875, 0.4375, 0.6875.
  const std::vector<double> h{0.25, 0.0625, 1.0, 0.125, 0.25};
  EXPECT_EQ(eb_accept(h, 0.1875), (std::vector<uint8_t>{1, 1, 0, 1, 0})) << "the bound itself is allowed";
  EXPECT_EQ(eb_accept(h, 0.1), (std::vector<uint8_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(eb_accept(h, 0.0), (std::vector<uint8_t>{0, 1, 0, 0, 0})) << "the lowest entropy is always accepted";
  EXPECT_EQ(eb_accept(h, 0.4375), (std::vector<uint8_t>{1, 1, 0, 1, 1})) << "ties: the lower position first";
  EXPECT_EQ(eb_accept(h, 10.0), (std::vector<uint8_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(eb_accept(std::vector<double>{}, 0.1), std::vector<uint8_t>{});
  const double nan = std::nan("");
  EXPECT_EQ(eb_accept(std::vector<double>{nan, 0.5, 0.25}, 0.25), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(eb_accept(std::vector<double>{nan, 0.5, 0.25}, 0.2), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(eb_accept(std::vector<double>{nan, 0.5, 0.25}, 1.0), (std::vector<uint8_t>{1, 1, 1}));
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.0, 0.05);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> e(static_cast<size_t>(1 + trial % 40));
    for (double& x : e) x = trial % 3 == 0 ? std::round(u(rng) * 100) / 100 : u(rng);  // ties every third trial
    const double bound = u(rng) * 4;
    ASSERT_EQ(eb_accept(e, bound), accept_by_definition(e, bound)) << "trial " << trial;
  }
}

TEST(EntropyBound, PositionTakesArgmaxEntropyAndSampleOfTheTemperedSoftmax) {
  const std::vector<float> flat(16, 0.5f);
  const EbPosition f = eb_position(flat.data(), 16, 0.7, RowRandom(1, RandomPurpose::EbSample, 0, 0));
  ASSERT_TRUE(f.finite);
  EXPECT_NEAR(f.entropy, std::log(16.0), 1e-12);
  EXPECT_EQ(f.argmax, 0);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> l{2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -inf, 2.0f};
  const double t = 0.7;
  std::vector<double> p(l.size());
  double sum = 0, h = 0;
  for (size_t v = 0; v < l.size(); ++v) sum += p[v] = std::exp((double(l[v]) - 2.0) / t);
  for (double& x : p) x /= sum, h -= x > 0 ? x * std::log(x) : 0;
  const int64_t V = static_cast<int64_t>(l.size()), draws = 60000;
  std::vector<int64_t> count(l.size());
  for (int64_t i = 0; i < draws; ++i) {
    const EbPosition e = eb_position(l.data(), V, t, RowRandom(7, RandomPurpose::EbSample, static_cast<uint64_t>(i / 256), static_cast<uint64_t>(i % 256)));
    ASSERT_TRUE(e.finite);
    ASSERT_EQ(e.argmax, 0) << "ties go to the lowest id";
    ASSERT_NEAR(e.entropy, h, 1e-12);
    ++count[static_cast<size_t>(e.sample)];
  }
  EXPECT_EQ(count[5], 0) << "a -inf logit is never sampled";
  for (size_t v = 0; v < l.size(); ++v) {
    const double want = p[v] * draws, sd = std::sqrt(draws * p[v] * (1 - p[v]));
    EXPECT_NEAR(static_cast<double>(count[v]), want, 4.5 * sd + 1) << "token " << v;
  }
  // The same draw is the same token; a lower temperature concentrates the distribution (lower entropy).
  const RowRandom r(3, RandomPurpose::EbSample, 2, 9);
  EXPECT_EQ(eb_position(l.data(), V, t, r).sample, eb_position(l.data(), V, t, r).sample);
  EXPECT_LT(eb_position(l.data(), V, 0.4, r).entropy, eb_position(l.data(), V, 0.8, r).entropy);
  const std::vector<float> bad{1.0f, std::nanf(""), 0.0f};
  EXPECT_FALSE(eb_position(bad.data(), 3, t, r).finite);
  const std::vector<float> none{-inf, -inf};
  EXPECT_FALSE(eb_position(none.data(), 2, t, r).finite);
}

// On rows long enough for eight-lane vectors, eb_position's entropy and sample are the scalar definition's, bit for
// bit: e_v = exp_f64(l_v / t - max) (0 for -inf), S and sum e_v z_v in eight partial sums (element v into sum v % 8)
// combined in sum_lanes8's order, the sample the first v whose running sum of e reaches u * S.
TEST(EntropyBound, VectorisedSumsEqualTheScalarDefinition) {
  std::mt19937 gen(21);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int64_t V : {8, 9, 1003, 262147}) {
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = nd(gen);
    l[static_cast<size_t>(V / 3)] = -std::numeric_limits<float>::infinity();
    for (double t : {0.4, 1.0, 2.5}) {
      const RowRandom r(5, RandomPurpose::EbSample, 1, static_cast<uint64_t>(V));
      const EbPosition got = eb_position(l.data(), V, t, r);
      const double inv_t = 1.0 / t;
      const double mx = static_cast<double>(*std::max_element(l.begin(), l.end())) * inv_t;
      double ls[8] = {}, lz[8] = {};
      std::vector<double> e(l.size());
      for (int64_t v = 0; v < V; ++v) {
        const double z = static_cast<double>(l[static_cast<size_t>(v)]) * inv_t - mx;
        const double ev = z == -std::numeric_limits<double>::infinity() ? 0.0 : model::exp_f64(z);
        e[static_cast<size_t>(v)] = ev;
        ls[v % 8] += ev;
        lz[v % 8] += ev > 0 ? ev * z : 0.0;
      }
      const double sum = model::sum_lanes8(ls), ez = model::sum_lanes8(lz);
      const double entropy = std::max(0.0, std::log(sum) - ez / sum);
      const double target = r.uniform(0) * sum;
      double run = 0;
      int64_t pick = -1, last = 0;
      for (int64_t v = 0; v < V && pick < 0; ++v) {
        if (!(e[static_cast<size_t>(v)] > 0)) continue;
        run += e[static_cast<size_t>(v)];
        last = v;
        if (run >= target) pick = v;
      }
      ASSERT_TRUE(got.finite);
      EXPECT_EQ(std::memcmp(&got.entropy, &entropy, sizeof entropy), 0) << "V " << V << " t " << t << ": "
                                                                        << got.entropy << " " << entropy;
      EXPECT_EQ(got.sample, pick >= 0 ? pick : last) << "V " << V << " t " << t;
    }
  }
}

TEST(EntropyBound, RandomTokensAreUniformReproducibleAndIndependentPerPurpose) {
  const int64_t V = 10, n = 50000;
  std::vector<int64_t> count(V);
  int same_as_init = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t tok = eb_random_token(11, RandomPurpose::EbNoise, 3, i, V);
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, V);
    ASSERT_EQ(tok, eb_random_token(11, RandomPurpose::EbNoise, 3, i, V));
    ++count[static_cast<size_t>(tok)];
    same_as_init += tok == eb_random_token(11, RandomPurpose::EbInit, 3, i, V);
  }
  for (int64_t c : count) EXPECT_NEAR(static_cast<double>(c), n / 10.0, 4.5 * std::sqrt(n * 0.09));
  EXPECT_NEAR(same_as_init, n / 10.0, 4.5 * std::sqrt(n * 0.09)) << "the purposes are independent streams";
}

TEST(EntropyBound, StopNeedsAStableArgmaxCanvasAndAConfidentStep) {
  const std::vector<int32_t> a{1, 2, 3}, b{1, 2, 4};
  EntropyBoundStop one(1, 0.005);
  EXPECT_FALSE(one.update(a, 0.0)) << "the first step is never stable";
  EXPECT_FALSE(one.update(b, 0.0)) << "the canvas changed";
  EXPECT_FALSE(one.update(b, 0.005)) << "stable, not confident (strictly below)";
  EXPECT_TRUE(one.update(b, 0.004));
  one.reset();
  EXPECT_FALSE(one.update(b, 0.0)) << "a new block starts without history";
  EntropyBoundStop two(2, 0.01);
  EXPECT_FALSE(two.update(a, 0.0));
  EXPECT_FALSE(two.update(a, 0.0));
  EXPECT_TRUE(two.update(a, 0.0)) << "equal to each of the two previous canvases";
  EXPECT_EQ(two.held(), 2);
  EntropyBoundStop zero(0, 0.01);
  EXPECT_TRUE(zero.update(a, 0.001)) << "stability 0: confidence alone";
  EXPECT_FALSE(zero.update(b, 0.02));
}

}  // namespace
}  // namespace dllm::model
