// The CPU flash attention equals the reference executor's attention (double precision scores) within f32
// rounding, for many canvas lengths and head layouts, with every kernel family the CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

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
