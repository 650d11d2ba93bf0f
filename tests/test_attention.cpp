// The CPU flash attention equals the reference executor's attention (double precision scores) within f32
// rounding, for many canvas lengths and head layouts, with every kernel family the CPU has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "jit/attention/attention.h"
#include "jit/cpu_features.h"
#include "model/reference_executor.h"

using namespace dllm;

namespace {

struct Case {
  int64_t n_q, n_kv, H, Hkv, d;
};

void check(const Case& c, jit::Isa isa, ThreadPool& pool, std::mt19937& rng, float q_scale) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(c.n_q * c.H * c.d), k(c.n_kv * c.Hkv * c.d), v(c.n_kv * c.Hkv * c.d);
  for (auto& x : q) x = nd(rng) * q_scale;
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  model::AttentionShape sh{c.H, c.Hkv, c.d, 1.0f / std::sqrt(static_cast<float>(c.d))};
  std::vector<float> want(q.size()), got(q.size(), NAN);
  model::ReferenceExecutor ref(pool);
  ref.attention(sh, q.data(), c.n_q, k.data(), v.data(), c.n_kv, want.data());
  jit::flash_attention(sh, q.data(), c.n_q, k.data(), v.data(), c.n_kv, got.data(), pool, isa);
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    norm = std::max(norm, std::fabs(double(want[i])));
  }
  EXPECT_LT(err, 2e-6 * std::max(1.0, norm) * std::sqrt(double(c.n_kv)))
      << jit::isa_name(isa) << " n_q=" << c.n_q << " n_kv=" << c.n_kv << " H=" << c.H << " Hkv=" << c.Hkv
      << " d=" << c.d << " q_scale=" << q_scale;
}

}  // namespace

TEST(FlashAttention, MatchesReferenceOnManyShapes) {
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 16},     {1, 7, 2, 1, 64},    {5, 5, 4, 4, 64},      {13, 13, 4, 2, 64},
      {37, 37, 4, 4, 64},   {64, 64, 4, 2, 128}, {65, 65, 7, 1, 128},   {100, 100, 28, 4, 128},
      {8, 200, 4, 4, 128},  {130, 130, 2, 2, 48}, {3, 129, 6, 3, 24},   {288, 288, 4, 1, 128},
      // the longest canvases run generates (prompt + up to 1024): a whole canvas, and a block against it
      {1056, 1056, 2, 1, 64}, {32, 1100, 4, 2, 128},
  };
  std::mt19937 rng(1234);
  ThreadPool pool(2);
  for (jit::Isa isa : jit::cpu_features().supported()) {
    for (const Case& c : cases) {
      check(c, isa, pool, rng, 1.0f);
      check(c, isa, pool, rng, 8.0f);  // peaked softmax: large score ranges exercise the online rescaling
    }
  }
}

TEST(FlashAttention, RowsAreIndependentOfTheirNeighbours) {
  // A query row's output must not depend on which other query rows are in the call (dual cache relies on it).
  // 160 rows also take the path that gathers values per head first (from 128 query rows), 10 rows do not.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 160, H = 4, Hkv = 2, d = 64;
  std::vector<float> q(n * H * d), k(n * Hkv * d), v(n * Hkv * d);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  model::AttentionShape sh{H, Hkv, d, 0.125f};
  ThreadPool pool(2);
  std::vector<float> all(q.size()), part(10 * H * d);
  jit::flash_attention(sh, q.data(), n, k.data(), v.data(), n, all.data(), pool, jit::cpu_features().best());
  jit::flash_attention(sh, q.data() + 20 * H * d, 10, k.data(), v.data(), n, part.data(), pool,
                       jit::cpu_features().best());
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], all[20 * H * d + i]) << i;
}

TEST(FlashAttention, KeyRangesEqualUnmaskedCallsOverEachRowsKeys) {
  // One masked call (keys transposed once) against an unmasked call per row over that row's keys alone:
  // bit-identical, on every family the CPU has and the portable one, for the masks diffusion-gemma makes
  // (causal prompt rows, sliding windows, canvas rows sharing one range) and ranges starting at any key, past
  // several tiles, with values gathered per head (from 128 query rows) and without.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  for (const int64_t n : {29, 150}) {
    for (const int64_t d : {64, 24}) {  // 24: not a multiple of the vector width (the plain path)
      const int64_t H = 4, Hkv = 2, window = 8;
      std::vector<float> q(n * H * d), k(n * Hkv * d), v(n * Hkv * d);
      for (auto* vec : {&q, &k, &v})
        for (auto& x : *vec) x = nd(rng) * 2.0f;
      model::AttentionShape sh{H, Hkv, d, 1.0f};
      const int64_t prompt = n - 16;
      std::vector<model::KeyRange> ranges;
      for (int64_t i = 0; i < n; ++i) {
        const bool sliding = i % 3 == 0 && i < prompt;
        if (i < prompt) ranges.push_back({sliding ? std::max<int64_t>(0, i - window + 1) : 0, i + 1});
        else ranges.push_back({std::max<int64_t>(0, prompt - 70), n});  // the canvas: one range, 70+ keys
      }
      std::vector<jit::Isa> families = jit::cpu_features().supported();
      families.push_back(jit::Isa::Portable);
      for (jit::Isa isa : families) {
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        jit::flash_attention(sh, q.data(), n, k.data(), v.data(), n, got.data(), pool, isa, ranges.data());
        for (int64_t i = 0; i < n; ++i) {
          const model::KeyRange r = ranges[static_cast<size_t>(i)];
          jit::flash_attention(sh, q.data() + i * H * d, 1, k.data() + r.lo * Hkv * d, v.data() + r.lo * Hkv * d,
                               r.hi - r.lo, want.data() + i * H * d, pool, isa);
        }
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << jit::isa_name(isa) << " n=" << n << " d=" << d << " element " << i;
      }
      // A bad range is refused.
      ranges[3] = {5, 4};
      EXPECT_THROW(jit::flash_attention(sh, q.data(), n, k.data(), v.data(), n, q.data(), pool,
                                        jit::Isa::Portable, ranges.data()),
                   Error);
    }
  }
}
