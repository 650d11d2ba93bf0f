// What both samplers share (sampler.h): --remasking names, the counter-based random stream, argmax and
// Gumbel-max proposals, softmax probabilities in double, and the choice of positions (R1, R5).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "model/fast_math.h"
#include "model/sampler.h"

// GCC vector types (fast_math.h) pass through always-inlined helpers only: no call crosses a vector ABI.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dllm::model {

namespace {

struct RemaskingName {
  Remasking value;
  const char* name;
};
constexpr RemaskingName kRemaskingNames[] = {
    {Remasking::LowConfidence, "low_confidence"}, {Remasking::Random, "random"},
    {Remasking::Entropy, "entropy"},              {Remasking::MaskgitPlus, "maskgit_plus"},
    {Remasking::TopkMargin, "topk_margin"},
};

// SplitMix64's output function: a bijective 64-bit mixer.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

const char* remasking_name(Remasking r) {
  for (const auto& n : kRemaskingNames)
    if (n.value == r) return n.name;
  return "?";
}

std::optional<Remasking> parse_remasking(const std::string& name) {
  for (const auto& n : kRemaskingNames)
    if (name == n.name) return n.value;
  return std::nullopt;
}

namespace {
bool block_sampler(Arch arch) { return arch_spec(arch).sampler == SamplerKind::Blocks; }
}  // namespace

Remasking default_remasking(Arch arch) { return block_sampler(arch) ? Remasking::LowConfidence : Remasking::Entropy; }

bool remasking_valid_for(Arch arch, Remasking r) {
  const bool llada = r == Remasking::LowConfidence || r == Remasking::Random;
  return block_sampler(arch) ? llada : !llada;
}

const char* remasking_choices(Arch arch) {
  return block_sampler(arch) ? "low_confidence or random" : "entropy, maskgit_plus or topk_margin";
}

// --- random stream ---

RowRandom::RowRandom(uint64_t seed, RandomPurpose purpose, uint64_t step, uint64_t position) {
  uint64_t k = mix64(seed ^ (static_cast<uint64_t>(purpose) * 0xD6E8FEB86659FD93ull));
  k = mix64(k ^ step);
  key_ = mix64(k ^ (position * 0x9E3779B97F4A7C15ull));
}

double RowRandom::uniform(uint64_t index) const {
  // One SplitMix64 stream per row: element `index` is the index-th output after key_.
  const uint64_t bits = mix64(key_ + index * 0x9E3779B97F4A7C15ull);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// --- proposals ---

namespace {

// max over v of logits[v] (NaN ignored; -inf when there is no number; exact in any order), and sum over v
// of e^(logits[v] * inv_t - mx) in double, both vectorised, compiled for AVX-512, AVX2 and baseline x86-64.
__attribute__((target_clones("avx512f", "avx2", "default"))) float max_logit(const float* logits, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < n; ++v) mx = logits[v] > mx ? logits[v] : mx;
  return mx;
}

// The sum goes into 8 lanes (element v into lane v % 8) reduced in one fixed order, whichever clone runs,
// so that the machine's vector width never changes a probability (the kernel families' contract).
__attribute__((target_clones("avx512f", "avx2", "default"))) double sum_exp(const float* logits, int64_t n,
                                                                           double inv_t, double mx) {
  constexpr int L = 8;
  F64x8 s = {};
  int64_t v0 = 0;
  for (; v0 + L <= n; v0 += L) {
    F64x8 z, ev;
    load8_f64(z, logits + v0);
    exp_f64_into(ev, z * inv_t - mx);
    s += ev;
  }
  double lane[L];
  std::memcpy(lane, &s, sizeof s);
  for (int l = 0; v0 + l < n; ++l) lane[l] += exp_f64(static_cast<double>(logits[v0 + l]) * inv_t - mx);
  return sum_lanes8(lane);
}

// The first i with x[i] == v (n when there is none): 64 elements at a time, each chunk tested vectorised.
__attribute__((target_clones("avx512f", "avx2", "default"))) int64_t first_equal(const float* x, int64_t n,
                                                                                float v) {
  for (int64_t i0 = 0; i0 < n; i0 += 64) {
    const int64_t i1 = std::min<int64_t>(n, i0 + 64);
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (int64_t i = i0; i < i1; ++i) hit |= x[i] == v;
    if (!hit) continue;
    for (int64_t i = i0; i < i1; ++i)
      if (x[i] == v) return i;
  }
  return n;
}

// One logit's term of exp_sums: its exponential (0 for -inf) into *e, added to the lane's sums.
inline void exp_term(float logit, double inv_t, double mx, double* e, double& s, double& sz, int& nan) {
  const double z = static_cast<double>(logit) * inv_t - mx;
  nan |= z != z;
  const double ev = z == -std::numeric_limits<double>::infinity() ? 0.0 : exp_f64(z);
  *e = ev;
  s += ev;
  sz += ev > 0 ? ev * z : 0.0;
}

// e[v] = exp(z_v), z_v = logits[v] * inv_t - mx (0 for a -inf logit), with sum = sum e_v and ez = sum e_v z_v
// over the e_v > 0, each in 8 lanes (element v into lane v % 8) reduced in one fixed order, whichever clone
// runs. False when a logit is NaN.
__attribute__((target_clones("avx512f", "avx2", "default"))) bool exp_sums(const float* logits, int64_t n, double inv_t,
                                                                          double mx, double* e, double& sum,
                                                                          double& ez) {
  constexpr int L = 8;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  F64x8 vs = {}, vz = {};
  I64x8 vnan = {};
  int64_t v0 = 0;
  for (; v0 + L <= n; v0 += L) {  // exp_term on eight lanes
    F64x8 z, ev;
    load8_f64(z, logits + v0);
    z = z * inv_t - mx;
    vnan |= z != z;
    exp_f64_into(ev, z);
    ev = select(z == kNegInf, splat<F64x8>(0.0), ev);
    std::memcpy(e + v0, &ev, sizeof ev);
    vs += ev;
    vz += select(ev > 0.0, ev * z, splat<F64x8>(0.0));
  }
  double ls[L], lz[L];
  std::memcpy(ls, &vs, sizeof vs);
  std::memcpy(lz, &vz, sizeof vz);
  int nan = 0;
  for (int l = 0; l < L; ++l) nan |= vnan[l] != 0;
  for (int l = 0; v0 + l < n; ++l) exp_term(logits[v0 + l], inv_t, mx, e + v0 + l, ls[l], lz[l], nan);
  sum = sum_lanes8(ls);
  ez = sum_lanes8(lz);
  return nan == 0;
}

}  // namespace

int32_t argmax_token(const float* logits, int64_t n_vocab) {
  // The first index of the largest number (NaN skipped; 0 when there is none): the vectorised maximum, then
  // the first element equal to it. The same as one left-to-right scan keeping the first of equal maxima
  // (-0.0 == +0.0, so a zero maximum finds the first zero of either sign, as the scan does).
  const int64_t v = first_equal(logits, n_vocab, max_logit(logits, n_vocab));
  return v < n_vocab ? static_cast<int32_t>(v) : 0;
}

int32_t gumbel_argmax_token(const float* logits, int64_t n_vocab, double temperature, const RowRandom& rng) {
  int32_t best = 0;
  double best_v = -std::numeric_limits<double>::infinity();
  bool found = false;
  for (int64_t v = 0; v < n_vocab; ++v) {
    const double u = rng.uniform(static_cast<uint64_t>(v));
    const double g = -std::log(-std::log(u));  // u == 0 gives -inf: never chosen
    const double x = static_cast<double>(logits[v]) + temperature * g;
    if (x != x) continue;
    if (!found || x > best_v) best = static_cast<int32_t>(v), best_v = x, found = true;
  }
  return best;
}


namespace {

// softmax(logits * inv_t) as its largest scaled logit and the sum of e^(l * inv_t - mx); mx is not finite
// for a row without a finite maximum (sum then 0).
struct Softmax {
  double inv_t = 1, mx = 0, sum = 0;
  Softmax(const float* logits, int64_t n_vocab, double temperature)
      : inv_t(temperature > 0 ? 1.0 / temperature : 1.0),
        mx(static_cast<double>(max_logit(logits, n_vocab)) * inv_t) {  // inv_t > 0 keeps the order
    if (std::isfinite(mx)) sum = sum_exp(logits, n_vocab, inv_t, mx);
  }
  double scaled(float l) const { return static_cast<double>(l) * inv_t - mx; }
};

// The k largest logits (NaN skipped), largest first, lowest id first among equals: one pass keeping a
// sorted list of at most k.
std::vector<std::pair<float, int32_t>> top_logits(const float* logits, int64_t n_vocab, int k) {
  std::vector<std::pair<float, int32_t>> top;
  if (k <= 0) return top;
  top.reserve(static_cast<size_t>(k) + 1);
  auto higher = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) { return a.first > b.first; };
  for (int64_t v = 0; v < n_vocab; ++v) {
    const float x = logits[v];
    if (x != x || (static_cast<int>(top.size()) == k && !(x > top.back().first))) continue;
    const std::pair<float, int32_t> e{x, static_cast<int32_t>(v)};
    top.insert(std::upper_bound(top.begin(), top.end(), e, higher), e);  // after its equals: lower ids first
    if (static_cast<int>(top.size()) > k) top.pop_back();
  }
  return top;
}

}  // namespace

double softmax_prob(const float* logits, int64_t n_vocab, int32_t token, double temperature) {
  const Softmax s(logits, n_vocab, temperature);
  if (!std::isfinite(s.mx)) return 0.0;
  return exp_f64(s.scaled(logits[token])) / s.sum;
}

PositionLogprobs position_logprobs(const float* logits, int64_t n_vocab, int32_t token, double temperature, int k) {
  const Softmax s(logits, n_vocab, temperature);
  PositionLogprobs out;
  out.chosen.token = token;
  if (!std::isfinite(s.mx)) {
    out.chosen.logprob = -std::numeric_limits<double>::infinity();
    return out;
  }
  const double log_sum = std::log(s.sum);
  out.chosen.logprob = s.scaled(logits[token]) - log_sum;
  for (const auto& [l, v] : top_logits(logits, n_vocab, std::min(k, kMaxTopLogprobs)))
    out.top.push_back(TokenLogprob{v, s.scaled(l) - log_sum});
  return out;
}

EbPosition eb_position(const float* logits, int64_t n_vocab, double temperature, const RowRandom& rng) {
  EbPosition out;
  const double inv_t = temperature > 0 ? 1.0 / temperature : 1.0;
  const double mx = static_cast<double>(max_logit(logits, n_vocab)) * inv_t;
  if (!std::isfinite(mx)) {
    out.finite = false;
    return out;
  }
  // One exponential per logit, e_v = exp(z_v) with z_v = l_v / t - max (-inf logits: 0), kept for the sample:
  // S = sum e_v, the entropy H = ln S - sum e_v z_v / S, and the sample the first v whose running sum of e
  // reaches u * S (rounding: else the last v with e > 0).
  thread_local std::vector<double> e;
  e.resize(static_cast<size_t>(n_vocab));
  double sum = 0, ez = 0;
  if (!exp_sums(logits, n_vocab, inv_t, mx, e.data(), sum, ez)) {  // a NaN logit: no distribution to sample
    out.finite = false;
    return out;
  }
  if (!(sum > 0) || !std::isfinite(sum)) {
    out.finite = false;
    return out;
  }
  const double target = rng.uniform(0) * sum;
  double run = 0;
  int64_t pick = -1, last = 0;
  for (int64_t v = 0; v < n_vocab && pick < 0; ++v) {
    const double ev = e[static_cast<size_t>(v)];
    if (!(ev > 0)) continue;
    run += ev;
    last = v;
    if (run >= target) pick = v;
  }
  out.sample = static_cast<int32_t>(pick >= 0 ? pick : last);
  out.argmax = argmax_token(logits, n_vocab);
  out.entropy = std::max(0.0, std::log(sum) - ez / sum);
  return out;
}

// --- selection ---

std::vector<size_t> select_candidates(std::span<const Candidate> c, int64_t k, double threshold) {
  std::vector<size_t> order(c.size());
  for (size_t i = 0; i < c.size(); ++i) order[i] = i;
  auto better = [&](size_t a, size_t b) {
    const double ca = c[a].proposal.confidence, cb = c[b].proposal.confidence;
    const bool na = ca != ca, nb = cb != cb;  // NaN ranks last
    if (na != nb) return nb;
    if (!na && ca != cb) return ca > cb;
    return c[a].position < c[b].position;
  };
  std::sort(order.begin(), order.end(), better);
  const size_t take = static_cast<size_t>(std::clamp<int64_t>(k, 0, static_cast<int64_t>(c.size())));
  std::vector<size_t> chosen(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take));
  if (threshold > 0) {
    for (size_t i = take; i < order.size(); ++i)
      if (c[order[i]].proposal.confidence >= threshold) chosen.push_back(order[i]);
  }
  std::sort(chosen.begin(), chosen.end(), [&](size_t a, size_t b) { return c[a].position < c[b].position; });
  return chosen;
}

}  // namespace dllm::model
