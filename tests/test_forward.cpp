// Properties of the forward pass and the reference executor on the tiny fixture models: a subset of
// logit rows (any order, repeats) equals those rows of the all-rows result bit for bit; the thread count
// does not change a bit; attention is bidirectional (a later token changes earlier rows); and the
// executor's matmul/attention rows are independent of the other rows in the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "model/fast_math.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/model.h"
#include "model/reference_executor.h"
#include "support.h"

namespace dllm::test {
namespace {

using model::Model;

std::unique_ptr<Model> load(const std::string& name, int threads = 2) {
  model::LoadOptions opt;
  opt.threads = threads;
  return Model::load(data_path("models/" + name + ".gguf"), opt);
}

// 20 ids from the whole vocabulary with a few mask tokens, fixed seed.
std::vector<int32_t> canvas(const Model& m, int n = 20) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(m.n_vocab() - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = id(rng);
  for (int i = n / 2; i < n; i += 3) t[static_cast<size_t>(i)] = m.mask_token_id();
  return t;
}

std::vector<int64_t> all_rows(size_t n) {
  std::vector<int64_t> r(n);
  std::iota(r.begin(), r.end(), int64_t{0});
  return r;
}

std::vector<float> row_of(const std::vector<float>& logits, int64_t r, int64_t vocab) {
  return std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * double(a[i] - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / n);
}

class ForwardProperties : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardProperties, SubsetOfRowsEqualsThoseRowsOfAllRows) {
  auto m = load(GetParam());
  const auto tokens = canvas(*m);
  const int64_t V = m->n_vocab();
  const std::vector<float> all = m->forward(tokens, all_rows(tokens.size()));
  const std::vector<int64_t> subset{17, 3, 0, 17, 19};
  const std::vector<float> some = m->forward(tokens, subset);
  ASSERT_EQ(some.size(), subset.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < subset.size(); ++i) {
    EXPECT_EQ(row_of(some, static_cast<int64_t>(i), V), row_of(all, subset[i], V)) << "row " << subset[i];
  }
  EXPECT_TRUE(m->forward(tokens, std::vector<int64_t>{}).empty());
}

TEST_P(ForwardProperties, ThreadCountDoesNotChangeABit) {
  auto one = load(GetParam(), 1), two = load(GetParam(), 2);
  const auto tokens = canvas(*one, 13);
  const auto rows = all_rows(tokens.size());
  EXPECT_EQ(one->forward(tokens, rows), two->forward(tokens, rows));
}

TEST_P(ForwardProperties, AttentionIsBidirectional) {
  auto m = load(GetParam());
  auto tokens = canvas(*m);
  const int64_t V = m->n_vocab(), j = 15;
  const auto rows = all_rows(tokens.size());
  const std::vector<float> before = m->forward(tokens, rows);
  tokens[j] = tokens[j] == 5 ? 6 : 5;
  const std::vector<float> after = m->forward(tokens, rows);
  for (int64_t i = 0; i < j; ++i) {
    // Every earlier row sees the change (a causal model would leave them bit-identical).
    EXPECT_GT(rel_l2(row_of(after, i, V), row_of(before, i, V)), 1e-4) << "row " << i;
  }
}

TEST_P(ForwardProperties, RejectsIdsAndRowsOutOfRange) {
  auto m = load(GetParam());
  const std::vector<int32_t> tokens{1, static_cast<int32_t>(m->n_vocab()), 2};
  try {
    m->forward(tokens, std::vector<int64_t>{0});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "token id 1024 at position 1 is out of range: the vocabulary has 1024 tokens "
                                     "(ids 0..1023)");
  }
  try {
    m->forward(std::vector<int32_t>{1, 2}, std::vector<int64_t>{2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "row 2 is out of range: the canvas has 2 tokens (rows 0..1)");
  }
  EXPECT_THROW(m->forward(std::vector<int32_t>{}, std::vector<int64_t>{}), Error);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ForwardProperties,
                         ::testing::Values("tiny-llada-F32", "tiny-llada-Q4_K_M", "tiny-dream-F16", "tiny-dream-Q4_K_M"));

TEST(ForwardDream, ShiftIsTheSamplersBusiness) {
  // The model returns raw rows for both architectures; only the flag differs.
  auto dream = load("tiny-dream-Q8_0"), llada = load("tiny-llada-Q8_0");
  EXPECT_TRUE(dream->shift_logits());
  EXPECT_FALSE(llada->shift_logits());
}

TEST(ReferenceExecutor, RowsAreIndependentOfTheCall) {
  auto m = load("tiny-dream-Q4_K_M");
  model::Executor& ex = m->executor();
  const auto& layer = m->tensors().layers[1];
  // A fresh handle on the mixed-type tensors: blk.1.ffn_down is Q6_K, blk.1.ffn_gate Q4_K.
  for (const gguf::TensorInfo* t : {layer.ffn_down, layer.ffn_gate}) {
    const model::WeightHandle w = ex.prepare_weight(*t);
    const int64_t k = t->ne[0], n = t->ne[1], rows = 5;
    std::mt19937 rng(9);
    std::normal_distribution<float> dist;
    std::vector<float> x(static_cast<size_t>(rows * k)), y(static_cast<size_t>(rows * n)), y1(static_cast<size_t>(n));
    for (float& v : x) v = dist(rng);
    ex.matmul(w, x.data(), rows, y.data());
    for (int64_t r = 0; r < rows; ++r) {
      ex.matmul(w, x.data() + r * k, 1, y1.data());
      EXPECT_TRUE(std::equal(y1.begin(), y1.end(), y.begin() + r * n)) << t->name << " row " << r;
    }
  }
  // Attention: one query row against the same keys equals that row of the full call.
  const model::AttentionShape sh{4, 2, 64, 0.125f};
  const int64_t n_q = 6, n_kv = 9;
  std::mt19937 rng(10);
  std::normal_distribution<float> dist;
  std::vector<float> q(n_q * 256), k(n_kv * 128), v(n_kv * 128), out(n_q * 256), one(256);
  for (auto* vec : {&q, &k, &v})
    for (float& x : *vec) x = dist(rng);
  ex.attention(sh, q.data(), n_q, k.data(), v.data(), n_kv, out.data());
  ex.attention(sh, q.data() + 4 * 256, 1, k.data(), v.data(), n_kv, one.data());
  EXPECT_TRUE(std::equal(one.begin(), one.end(), out.begin() + 4 * 256));
  // Head 3 reads kv head 1: with all keys equal the weights are uniform, so it is the mean of v's head 1.
  std::fill(k.begin(), k.end(), 0.5f);
  ex.attention(sh, q.data(), 1, k.data(), v.data(), n_kv, one.data());
  for (int64_t c = 0; c < 64; ++c) {
    double mean = 0;
    for (int64_t j = 0; j < n_kv; ++j) mean += v[j * 128 + 64 + c];
    EXPECT_NEAR(one[3 * 64 + c], mean / n_kv, 1e-6);
  }
}

TEST(ReferenceExecutor, KeyValueStoreTakesEachLayersOwnWidth) {
  // Layers of different geometry (diffusion-gemma's sliding and global layers) get their own room: a layer
  // stores rows of its width, a wider row is refused, and growing the store keeps what it holds.
  auto m = load("tiny-dream-Q4_K_M");
  model::Executor& ex = m->executor();
  const int64_t widths[2] = {128, 64};
  const model::KvHandle kv = ex.kv_open(widths, 4);
  const model::Act k = ex.activation(40, 8, 128), v = ex.activation(41, 8, 128);
  const model::AttentionShape wide{2, 2, 64, 1.0f}, narrow{2, 1, 64, 1.0f};
  const model::RopeSpec rope{model::RopeStyle::Neox, 64, 10000.0f};
  EXPECT_NO_THROW(ex.kv_store(kv, 0, k, v, 0, 4, 0, {}, {}, rope, wide));
  EXPECT_NO_THROW(ex.kv_store(kv, 1, k, v, 0, 4, 0, {}, {}, rope, narrow));
  EXPECT_THROW(ex.kv_store(kv, 1, k, v, 0, 4, 0, {}, {}, rope, wide), Error);
  EXPECT_THROW(ex.kv_store(kv, 1, k, v, 0, 1, 4, {}, {}, rope, narrow), Error) << "past the positions";
  ex.kv_grow(kv, 8);
  EXPECT_NO_THROW(ex.kv_store(kv, 1, k, v, 0, 4, 4, {}, {}, rope, narrow));
  ex.kv_close(kv);
}

// The reference executor with its host buffers open to the test.
struct OpenExecutor : model::ReferenceExecutor {
  using ReferenceExecutor::ReferenceExecutor;
  using Executor::host_data;
};

// The reference soft embedding of one row (F16 probabilities of softmax(l / t), F16 table values, every term
// summed in F32 in token order) over the tokens `take` admits given the row's F16 probabilities.
std::vector<float> soft_embed_reference(const float* l, int64_t V, int64_t D, const std::vector<float>& e, float t,
                                        float scale, const std::function<std::vector<bool>(const std::vector<double>&)>& take,
                                        int* zeros = nullptr) {
  auto f16 = [](double x) { return static_cast<double>(quant::fp16_to_f32(quant::f32_to_fp16(static_cast<float>(x)))); };
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[v]) * (1.0 / double(t)));
  std::vector<double> p(static_cast<size_t>(V));
  double lane[16] = {};  // the sum in 16 lanes (element v into lane v % 16), halved pairwise
  for (int64_t v = 0; v < V; ++v) lane[v % 16] += p[v] = model::exp_f64(double(l[v]) * (1.0 / double(t)) - mx);
  for (int w = 8; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
  sum = lane[0];
  for (int64_t v = 0; v < V; ++v) {
    p[v] = f16(static_cast<float>(p[v] / sum));
    if (zeros) *zeros += p[v] == 0;
  }
  const std::vector<bool> in = take(p);
  std::vector<float> acc(static_cast<size_t>(D), 0.0f);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t c = 0; c < D; ++c)
      acc[c] += in[v] ? static_cast<float>(p[v]) * static_cast<float>(f16(e[v * D + c])) : 0.0f;
  for (float& a : acc) a *= scale;
  return acc;
}

struct SoftEmbedCase {
  std::unique_ptr<gguf::File> file = gguf::File::open(data_path("diffusion-gemma/gguf/tiny-diffusion-gemma-A-Q4_K_M.gguf"));
  const gguf::TensorInfo& table = *file->find_tensor("token_embd.weight");
  const int64_t D = table.ne[0], V = table.ne[1], rows = 64;  // 1536 tokens: two of soft_embed's blocks
  std::vector<float> logits, e;
  SoftEmbedCase() {
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.0f, 4.0f);
    logits.resize(static_cast<size_t>(rows * V));
    for (float& l : logits) l = n(rng);
    e.resize(static_cast<size_t>(V * D));
    for (int64_t v = 0; v < V; ++v)
      quant::dequantize_row(table.type(), table.data + static_cast<uint64_t>(v) * table.row_bytes(), e.data() + v * D, D);
  }
};

// soft_embed (Gemma-4's self-conditioning) decodes only the tokens some row gives a nonzero F16 probability:
// the same sums, term for term and in the same order, as over the whole vocabulary (computed densely here),
// at a sharp temperature (most probabilities round to 0) and a soft one.
TEST(ReferenceExecutor, SoftEmbedEqualsTheDenseSumOverTheVocabularyBitForBit) {
  SoftEmbedCase k;
  ThreadPool pool(2);
  OpenExecutor ex(pool);
  for (float t : {0.05f, 0.8f}) {
    const model::Act x = ex.activation(50, k.rows, k.D);
    ex.soft_embed(k.table, k.logits.data(), k.rows, t, 0, 2.5f, x);
    int zeros = 0;
    for (int64_t r = 0; r < k.rows; ++r) {
      // Every token's term, the zero ones included.
      const std::vector<float> want = soft_embed_reference(
          k.logits.data() + r * k.V, k.V, k.D, k.e, t, 2.5f,
          [](const std::vector<double>& p) { return std::vector<bool>(p.size(), true); }, &zeros);
      for (int64_t c = 0; c < k.D; ++c)
        ASSERT_EQ(ex.host_data(x)[r * k.D + c], want[c]) << "t " << t << " row " << r << " col " << c;
    }
    if (t < 0.1f) {
      EXPECT_GT(zeros, k.rows * k.V / 2) << "the sharp temperature leaves most of the vocabulary at 0";
    }
  }
}

// soft_embed's opt-in top_k: each row's sum over its top_k largest F16 probabilities only (ties: the lower id),
// in token order, bit for bit; a top_k at least the row's nonzero count is the exact sum's bits; and the
// approximation's distance to the exact row is at most the dropped mass times the largest table row's norm.
TEST(ReferenceExecutor, SoftEmbedTopKSumsEachRowsMostProbableTokens) {
  SoftEmbedCase k;
  for (int64_t v = 0; v < k.V; ++v) k.logits[2 * k.V + v] = std::round(k.logits[2 * k.V + v]);  // ties in row 2
  ThreadPool pool(2);
  OpenExecutor ex(pool);
  const float t = 0.8f, scale = 2.5f;
  const model::Act exact = ex.activation(50, k.rows, k.D);
  ex.soft_embed(k.table, k.logits.data(), k.rows, t, 0, scale, exact);
  std::vector<float> ex0(ex.host_data(exact), ex.host_data(exact) + k.rows * k.D);
  double max_norm = 0;
  for (int64_t v = 0; v < k.V; ++v) {
    double n2 = 0;
    for (int64_t c = 0; c < k.D; ++c) n2 += double(k.e[v * k.D + c]) * k.e[v * k.D + c];
    max_norm = std::max(max_norm, std::sqrt(n2));
  }
  for (int64_t top_k : {int64_t{1}, int64_t{7}, int64_t{60}, k.V}) {
    SCOPED_TRACE("top_k " + std::to_string(top_k));
    const model::Act x = ex.activation(51, k.rows, k.D);
    ex.soft_embed(k.table, k.logits.data(), k.rows, t, top_k, scale, x);
    for (int64_t r = 0; r < k.rows; ++r) {
      double dropped = 0;
      const std::vector<float> want = soft_embed_reference(
          k.logits.data() + r * k.V, k.V, k.D, k.e, t, scale, [&](const std::vector<double>& p) {
            std::vector<int64_t> order;  // nonzero ids by probability, ties to the lower id
            for (int64_t v = 0; v < k.V; ++v)
              if (p[v] != 0) order.push_back(v);
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
            std::vector<bool> in(p.size(), false);
            for (size_t i = 0; i < order.size(); ++i) {
              if (static_cast<int64_t>(i) < top_k) in[order[i]] = true;
              else dropped += p[order[i]];
            }
            return in;
          });
      double dist = 0;
      for (int64_t c = 0; c < k.D; ++c) {
        ASSERT_EQ(ex.host_data(x)[r * k.D + c], want[c]) << "row " << r << " col " << c;
        const double d = double(want[c]) - ex0[r * k.D + c];
        dist += d * d;
      }
      EXPECT_LE(std::sqrt(dist), dropped * max_norm * scale * 1.001 + 1e-5) << "row " << r;
      if (top_k == k.V) {
        EXPECT_EQ(dropped, 0.0);
      } else if (top_k == 1) {
        EXPECT_GT(dropped, 0.0) << "t 0.8 leaves more than one token";
      }
    }
  }
}

}  // namespace
}  // namespace dllm::test

// The softcap's tangent: tanh_f64 rounded to f32 is the correctly rounded tanh (std::tanh in double, rounded)
// everywhere a logit over the cap can fall, signs and limits included; glibc 2.36's tanhf (what llama.cpp
// calls) is not: it is up to 2 ulp away from it on about 2% of these inputs.
TEST(FastMath, TanhRoundsToTheCorrectlyRoundedValue) {
  int64_t differ_from_tanhf = 0, n = 0;
  for (double x = -25.0; x <= 25.0; x += 0.0000917) {
    const float y = static_cast<float>(x);
    const float got = static_cast<float>(dllm::model::tanh_f64(static_cast<double>(y)));
    ASSERT_EQ(got, static_cast<float>(std::tanh(static_cast<double>(y)))) << "x " << y;
    const float libm = std::tanh(y);
    ASSERT_LE(std::fabs(got - libm), 2 * (std::nextafter(std::fabs(libm), 2.0f) - std::fabs(libm))) << "x " << y;
    differ_from_tanhf += got != libm, ++n;
  }
  for (float y : {0.0f, 1e-30f, 1e-8f, 0.0625f, 0.06249999f, 19.99f, 20.0f, 1e6f}) {
    EXPECT_EQ(static_cast<float>(dllm::model::tanh_f64(y)), static_cast<float>(std::tanh(static_cast<double>(y)))) << y;
    EXPECT_EQ(static_cast<float>(dllm::model::tanh_f64(-y)), -static_cast<float>(std::tanh(static_cast<double>(y)))) << y;
  }
  EXPECT_TRUE(std::signbit(dllm::model::tanh_f64(-0.0)));
  EXPECT_TRUE(std::isnan(dllm::model::tanh_f64(NAN)));
  EXPECT_EQ(dllm::model::tanh_f64(INFINITY), 1.0);
  EXPECT_LT(differ_from_tanhf, n / 20);
}

// The f32 exponential behind SwiGLU: within 2 ulp of the exact value over the whole range it serves,
// clamped (finite, no overflow to inf) beyond it.
TEST(FastMath, ExpWithinTwoUlpAndClamped) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.000731) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    const double got = dllm::model::exp_f32(xf);
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst = std::max(worst, std::fabs(got - want) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(dllm::model::exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(dllm::model::exp_f32(1000.0f)));
  EXPECT_GT(dllm::model::exp_f32(1000.0f), 1e38f);
  EXPECT_GE(dllm::model::exp_f32(-1000.0f), 0.0f);
  EXPECT_LT(dllm::model::exp_f32(-1000.0f), 1e-37f);
  EXPECT_EQ(dllm::model::exp_f32(std::nanf("")), 1.0f);
}

// The double exponential behind the samplers' softmax: within 1 ulp of libm over the range it serves.
TEST(FastMath, ExpDoubleWithinOneUlp) {
  double worst = 0;
  for (double x = -700.0; x <= 700.0; x += 0.0123457) {
    const double want = std::exp(x), got = dllm::model::exp_f64(x);
    worst = std::max(worst, std::fabs(got - want) / std::ldexp(1.0, std::ilogb(want) - 52));
  }
  EXPECT_LE(worst, 1.0);
  EXPECT_EQ(dllm::model::exp_f64(0.0), 1.0);
  EXPECT_TRUE(std::isnan(dllm::model::exp_f64(std::nan(""))));
  EXPECT_GT(dllm::model::exp_f64(-1e9), 0.0);
  EXPECT_LT(dllm::model::exp_f64(-1e9), 1e-300);
}

// (F64x8 values stay in always-inlined helpers: the vector ABI note does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
// The eight-lane exponential the samplers' and self-conditioning's sums run (F64x8) is exp_f64 in every lane, bit
// for bit: over the range, at the clamps, for infinities, NaN and signed zeros, whatever lane a value sits in.
TEST(FastMath, ExpDoubleOnEightLanesIsTheScalarExpInEveryLane) {
  std::vector<double> xs = {0.0, -0.0, 1.0, -1.0, 709.0, 709.5, -708.0, -708.5, -745.2, 1e9, -1e9,
                            std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                            std::nan(""), 1e-300, -1e-300, 0.6931471805599453, -0.34657359027997264};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-720.0, 720.0);
  while (xs.size() % 8 != 0 || xs.size() < 4096) xs.push_back(u(rng));
  for (int shift = 0; shift < 8; ++shift) {  // every value in every lane
    std::rotate(xs.begin(), xs.begin() + 1, xs.end());
    for (size_t i = 0; i < xs.size(); i += 8) {
      dllm::model::F64x8 x, e;
      std::memcpy(&x, &xs[i], sizeof x);
      dllm::model::exp_f64_into(e, x);
      for (int l = 0; l < 8; ++l) {
        const double want = dllm::model::exp_f64(xs[i + static_cast<size_t>(l)]);
        ASSERT_EQ(std::memcmp(&e[l], &want, sizeof want), 0) << "x " << xs[i + static_cast<size_t>(l)] << " lane " << l;
      }
    }
  }
}
