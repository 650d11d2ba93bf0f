// Reference integer dot products against ggml (tests/data/quants/dot.gguf + dot.json, see its README):
// every super-block's integer parts (scales, mins, sum_scaled_q, sum_mins) equal ggml's exactly, and the
// float results lie within 1e-6*abs_sum of the exact value; Q5_K x Q8_K against ggml's own dequantization
// of the fixture's Q5_K tensors; Q8_0 x Q8_0 against an exact computation; Q5_0 x Q8_0 against ggml's own
// dequantization of the fixture's Q5_0 tensors.
// DLLM_QUANTS_DIR=<dir> runs the fixture tests on another set of the same files (e.g. a holdout set).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/quant_ref_dot.h"
#include "support.h"

namespace q = dllm::quant;
using dllm::GgmlType;
using dllm::gguf::File;
using dllm::gguf::TensorInfo;
using nlohmann::json;

namespace {

std::string quants_dir() {
  const char* env = std::getenv("DLLM_QUANTS_DIR");
  return env && *env ? std::string(env) : dllm::test::data_path("quants");
}

struct DotFixture {
  std::unique_ptr<File> file;
  json doc;
  int64_t ncols = 0;

  DotFixture() {
    file = File::open(quants_dir() + "/dot.gguf");
    doc = json::parse(dllm::test::read_file(quants_dir() + "/dot.json"));
    ncols = doc.at("ncols").get<int64_t>();
  }
  const TensorInfo& tensor(const char* name) const {
    const TensorInfo* t = file->find_tensor(name);
    if (!t) throw std::runtime_error(std::string("dot.gguf has no tensor ") + name);
    return *t;
  }
  const uint8_t* row(const char* name, int64_t r) const {
    const TensorInfo& t = tensor(name);
    EXPECT_LT(r, t.n_rows()) << name;
    return t.data + r * t.row_bytes();
  }
};

// Dot products as double of two float vectors (for checks that link decoders and dot products).
double dot_f64(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

std::vector<float> decode_row(GgmlType t, const uint8_t* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  q::dequantize_row(t, src, out.data(), n);
  return out;
}

}  // namespace

TEST(QuantDot, FixtureShapesAgree) {
  DotFixture f;
  ASSERT_EQ(f.ncols % 256, 0);
  const int64_t nw = f.doc.at("n_weight_rows"), na = f.doc.at("n_act_rows");
  for (const char* name : {"w.f32", "w.q4_k", "w.q6_k"}) {
    EXPECT_EQ(f.tensor(name).ne[0], f.ncols) << name;
    EXPECT_EQ(f.tensor(name).n_rows(), nw) << name;
  }
  for (const char* name : {"act.f32", "act.q8_k"}) {
    EXPECT_EQ(f.tensor(name).ne[0], f.ncols) << name;
    EXPECT_EQ(f.tensor(name).n_rows(), na) << name;
  }
  EXPECT_EQ(f.tensor("w.q4_k").type(), GgmlType::Q4_K);
  EXPECT_EQ(f.tensor("w.q6_k").type(), GgmlType::Q6_K);
  EXPECT_EQ(f.tensor("act.q8_k").type(), GgmlType::Q8_K);
  for (const char* kind : {"q4_k", "q6_k"}) {
    EXPECT_EQ(static_cast<int64_t>(f.doc.at("results").at(kind).size()), nw * na) << kind;
  }
}

TEST(QuantDot, Q4_KIntegerPartsAndResultMatchGgml) {
  DotFixture f;
  const auto& results = f.doc.at("results").at("q4_k");
  ASSERT_FALSE(results.empty());
  const int64_t nw = f.doc.at("n_weight_rows");
  for (const auto& r : results) {
    const int64_t a = r.at("act_row"), w = r.at("weight_row");
    SCOPED_TRACE("act row " + std::to_string(a) + ", weight row " + std::to_string(w));
    std::vector<q::DotPartsQ4K> parts;
    const float got = q::vec_dot_q4_K_q8_K(f.ncols, f.row("w.q4_k", w), f.row("act.q8_k", a), &parts);
    const auto& sbs = r.at("superblocks");
    ASSERT_EQ(parts.size(), sbs.size());
    double exact = 0, abs_sum = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& p = parts[i];
      const auto& sb = sbs[i];
      SCOPED_TRACE("super-block " + std::to_string(i));
      EXPECT_EQ(p.d_w, sb.at("d_w").get<float>());
      EXPECT_EQ(p.dmin_w, sb.at("dmin_w").get<float>());
      EXPECT_EQ(p.d_a, sb.at("d_a").get<float>());
      for (int j = 0; j < 8; ++j) {
        EXPECT_EQ(p.scales[j], sb.at("scales")[j].get<int>()) << "scale " << j;
        EXPECT_EQ(p.mins[j], sb.at("mins")[j].get<int>()) << "min " << j;
      }
      EXPECT_EQ(p.sum_scaled_q, sb.at("sum_scaled_q").get<int64_t>());
      EXPECT_EQ(p.sum_mins, sb.at("sum_mins").get<int64_t>());
      exact += p.exact_f64();
      abs_sum += p.abs_f64();
    }
    const double want_exact = r.at("exact_f64_from_ints"), want_abs = r.at("abs_sum");
    EXPECT_NEAR(exact, want_exact, 1e-12 * want_abs);
    EXPECT_NEAR(abs_sum, want_abs, 1e-12 * want_abs);
    EXPECT_NEAR(got, want_exact, 1e-6 * want_abs);
    EXPECT_NEAR(got, r.at("ggml_mul_mat").get<double>(), 1e-6 * want_abs);
    // out.q4_k holds ggml_mul_mat's results: element w + nw*a.
    float out;
    std::memcpy(&out, f.tensor("out.q4_k").data + 4 * (w + nw * a), 4);
    EXPECT_EQ(out, r.at("ggml_mul_mat").get<float>());
  }
}

TEST(QuantDot, Q6_KIntegerPartsAndResultMatchGgml) {
  DotFixture f;
  const auto& results = f.doc.at("results").at("q6_k");
  ASSERT_FALSE(results.empty());
  const int64_t nw = f.doc.at("n_weight_rows");
  for (const auto& r : results) {
    const int64_t a = r.at("act_row"), w = r.at("weight_row");
    SCOPED_TRACE("act row " + std::to_string(a) + ", weight row " + std::to_string(w));
    std::vector<q::DotPartsQ6K> parts;
    const float got = q::vec_dot_q6_K_q8_K(f.ncols, f.row("w.q6_k", w), f.row("act.q8_k", a), &parts);
    const auto& sbs = r.at("superblocks");
    ASSERT_EQ(parts.size(), sbs.size());
    double exact = 0, abs_sum = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& p = parts[i];
      const auto& sb = sbs[i];
      SCOPED_TRACE("super-block " + std::to_string(i));
      EXPECT_EQ(p.d_w, sb.at("d_w").get<float>());
      EXPECT_EQ(p.d_a, sb.at("d_a").get<float>());
      for (int j = 0; j < 16; ++j) EXPECT_EQ(p.scales[j], sb.at("scales")[j].get<int>()) << "scale " << j;
      EXPECT_EQ(p.sum_scaled_q, sb.at("sum_scaled_q").get<int64_t>());
      exact += p.exact_f64();
      abs_sum += p.abs_f64();
    }
    const double want_exact = r.at("exact_f64_from_ints"), want_abs = r.at("abs_sum");
    EXPECT_NEAR(exact, want_exact, 1e-12 * want_abs);
    EXPECT_NEAR(abs_sum, want_abs, 1e-12 * want_abs);
    EXPECT_NEAR(got, want_exact, 1e-6 * want_abs);
    EXPECT_NEAR(got, r.at("ggml_mul_mat").get<double>(), 1e-6 * want_abs);
    float out;
    std::memcpy(&out, f.tensor("out.q6_k").data + 4 * (w + nw * a), 4);
    EXPECT_EQ(out, r.at("ggml_mul_mat").get<float>());
  }
}

TEST(QuantDot, OwnQ8_KActivationsGiveTheSameParts) {
  // The whole chain from float activations: quantize_row_q8_K then the integer dot product.
  DotFixture f;
  const TensorInfo& act = f.tensor("act.f32");
  const auto& results = f.doc.at("results").at("q4_k");
  for (const auto& r : results) {
    const int64_t a = r.at("act_row"), w = r.at("weight_row");
    std::vector<float> x(static_cast<size_t>(f.ncols));
    std::memcpy(x.data(), act.data + a * act.row_bytes(), x.size() * 4);
    std::vector<q::BlockQ8_K> qa(x.size() / 256);
    q::quantize_row_q8_K(x.data(), qa.data(), f.ncols);
    std::vector<q::DotPartsQ4K> parts;
    q::vec_dot_q4_K_q8_K(f.ncols, f.row("w.q4_k", w), qa.data(), &parts);
    ASSERT_EQ(parts.size(), r.at("superblocks").size());
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_EQ(parts[i].sum_scaled_q, r.at("superblocks")[i].at("sum_scaled_q").get<int64_t>());
      EXPECT_EQ(parts[i].sum_mins, r.at("superblocks")[i].at("sum_mins").get<int64_t>());
    }
  }
}

TEST(QuantDot, KQuantDotEqualsDotOfDecodedRows) {
  // Links the dot products to the decoders: the exact integer dot equals (to float rounding of the
  // decoded values) the float64 dot of the dequantized weight and activation rows.
  DotFixture f;
  for (int64_t a = 0; a < f.tensor("act.q8_k").n_rows(); ++a) {
    const std::vector<float> x = decode_row(GgmlType::Q8_K, f.row("act.q8_k", a), f.ncols);
    for (int64_t w = 0; w < f.tensor("w.q4_k").n_rows(); ++w) {
      std::vector<q::DotPartsQ4K> p4;
      std::vector<q::DotPartsQ6K> p6;
      q::vec_dot_q4_K_q8_K(f.ncols, f.row("w.q4_k", w), f.row("act.q8_k", a), &p4);
      q::vec_dot_q6_K_q8_K(f.ncols, f.row("w.q6_k", w), f.row("act.q8_k", a), &p6);
      double e4 = 0, s4 = 0, e6 = 0, s6 = 0;
      for (const auto& p : p4) e4 += p.exact_f64(), s4 += p.abs_f64();
      for (const auto& p : p6) e6 += p.exact_f64(), s6 += p.abs_f64();
      const double d4 = dot_f64(decode_row(GgmlType::Q4_K, f.row("w.q4_k", w), f.ncols), x);
      const double d6 = dot_f64(decode_row(GgmlType::Q6_K, f.row("w.q6_k", w), f.ncols), x);
      EXPECT_NEAR(d4, e4, 1e-6 * s4) << "q4_k a=" << a << " w=" << w;
      EXPECT_NEAR(d6, e6, 1e-6 * s6) << "q6_k a=" << a << " w=" << w;
    }
  }
}

// Calls f(t, r, w, wf) for every row r of every tensor t of type `type` in quants.gguf: w the ggml row, wf
// ggml's own dequantization of it (quants-expected-f32.gguf, checked bit for bit against ggml's C decoder).
// Returns the number of rows.
template <class F>
int for_each_decoded_row(GgmlType type, F f) {
  const auto quants = File::open(quants_dir() + "/quants.gguf");
  const auto expected = File::open(quants_dir() + "/quants-expected-f32.gguf");
  int rows = 0;
  for (const TensorInfo& t : quants->tensors()) {
    if (t.type() != type) continue;
    const TensorInfo* e = expected->find_tensor(std::string(t.name));
    if (!e) throw std::runtime_error("quants-expected-f32.gguf has no tensor " + std::string(t.name));
    for (int64_t r = 0; r < t.n_rows(); ++r, ++rows) {
      std::vector<float> wf(static_cast<size_t>(t.ne[0]));
      std::memcpy(wf.data(), e->data + r * e->row_bytes(), wf.size() * 4);
      f(t, r, t.data + r * t.row_bytes(), wf);
    }
  }
  return rows;
}

// Q5_K x Q8_K: ggml's fixture has no Q5_K dot products, but it has ggml's own dequantization of its Q5_K
// tensors (quants-expected-f32.gguf, checked bit for bit against ggml's C decoder). The reference dot's
// exact value (its integer parts scaled in float64) must equal the float64 dot of those decoded weights
// with the decoded Q8_K activations, on every row (normal, outliers, constant, tiny, zero, positive,
// uniform, LLM-like, log-magnitudes, sparse), and its float result must lie within 1e-6 of the scale.
TEST(QuantDot, Q5_KExactValueEqualsGgmlDecodedDot) {
  std::mt19937 rng(505);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int rows_checked = for_each_decoded_row(GgmlType::Q5_K, [&](const TensorInfo& t, int64_t r, const uint8_t* w,
                                                                    const std::vector<float>& wf) {
    const int64_t k = t.ne[0];
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = nd(rng);
    std::vector<q::BlockQ8_K> qa(static_cast<size_t>(k / 256));
    q::quantize_row_q8_K(x.data(), qa.data(), k);
    const std::vector<float> xa = decode_row(GgmlType::Q8_K, reinterpret_cast<const uint8_t*>(qa.data()), k);
    std::vector<q::DotPartsQ4K> parts;
    const float got = q::vec_dot_q5_K_q8_K(k, w, qa.data(), &parts);
    ASSERT_EQ(parts.size(), static_cast<size_t>(k / 256));
    double exact = 0, scale = 0;
    for (const auto& p : parts) exact += p.exact_f64(), scale += p.abs_f64();
    // The decoded values are d*sc*q - dmin*m rounded to f32: within f32 rounding of each term.
    EXPECT_NEAR(dot_f64(wf, xa), exact, 1e-6 * scale + 1e-30) << t.name << " row " << r;
    EXPECT_NEAR(got, exact, 1e-6 * scale + 1e-30) << t.name << " row " << r;
    // The integer parts, recomputed from the decoded weights: per sub-block q = (w + dmin*m) / (d*sc).
    for (size_t b = 0; b < parts.size(); ++b) {
      int64_t sum_scaled_q = 0;
      bool recoverable = true;  // a zero step (d underflowed to 0, or a zero scale) hides the quants
      for (int s = 0; s < 8; ++s) {
        const double step = double(parts[b].d_w) * parts[b].scales[s];
        if (step == 0) {
          recoverable = recoverable && parts[b].scales[s] == 0;
          continue;
        }
        int64_t dot = 0;
        for (int l = 0; l < 32; ++l) {
          const size_t i = b * 256 + 32 * s + l;
          const double qw = (double(wf[i]) + double(parts[b].dmin_w) * parts[b].mins[s]) / step;
          ASSERT_NEAR(qw, std::round(qw), 0.05) << t.name << " row " << r << " element " << i;
          ASSERT_GE(std::lround(qw), 0);
          ASSERT_LE(std::lround(qw), 31);
          dot += std::lround(qw) * qa[b].qs[32 * s + l];
        }
        sum_scaled_q += dot * parts[b].scales[s];
      }
      // Sub-blocks with a zero scale add nothing either way.
      if (recoverable) {
        EXPECT_EQ(sum_scaled_q, parts[b].sum_scaled_q) << t.name << " row " << r << " block " << b;
      }
      int64_t sum_mins = 0;
      for (int j = 0; j < 16; ++j) sum_mins += int64_t{qa[b].bsums[j]} * parts[b].mins[j / 2];
      EXPECT_EQ(sum_mins, parts[b].sum_mins);
    }
  });
  EXPECT_EQ(rows_checked, 7 + 3);
}

// Q5_0 x Q8_0 (ggml's vec_dot_q5_0_q8_0): the fixture has ggml's own dequantization of its Q5_0 tensors
// (quants-expected-f32.gguf). Each block's integer sum, recovered from the decoded weights (q - 16 =
// w / d: exact, d * (q - 16) is exact in f32), must equal the reference's sumi exactly; the exact value
// must equal the float64 dot of the decoded weights and decoded Q8_0 activations, and the float result lie
// within 1e-6 of the scale; on every row of every Q5_0 tensor, with all-zero and huge activation blocks.
TEST(QuantDot, Q5_0ExactIntegersEqualGgmlDecodedDot) {
  std::mt19937 rng(500);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int rows_checked = for_each_decoded_row(GgmlType::Q5_0, [&](const TensorInfo& t, int64_t r, const uint8_t* w,
                                                                    const std::vector<float>& wf) {
    const int64_t k = t.ne[0];
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = nd(rng);
    std::fill(x.begin(), x.begin() + 32, 0.f);        // an all-zero block: d_a = 0
    if (k >= 64) x[40] = 1e4f;                        // an outlier: the rest of its block rounds to 0
    std::vector<q::BlockQ8_0> qa(static_cast<size_t>(k / 32));
    q::quantize_row_q8_0(x.data(), qa.data(), k);
    const std::vector<float> xa = decode_row(GgmlType::Q8_0, reinterpret_cast<const uint8_t*>(qa.data()), k);
    std::vector<int32_t> sumi;
    const float got = q::vec_dot_q5_0_q8_0(k, w, qa.data(), &sumi);
    ASSERT_EQ(sumi.size(), static_cast<size_t>(k / 32));
    double exact = 0, scale = 0;
    for (int64_t b = 0; b < k / 32; ++b) {
      q::BlockQ5_0 wb;
      std::memcpy(&wb, w + b * 22, 22);
      const double dw = q::fp16_to_f32(wb.d), da = q::fp16_to_f32(qa[b].d);
      const double term = dw * da * sumi[b];
      exact += term;
      scale += std::fabs(term);
      if (dw == 0) continue;  // a zero scale hides the quants
      int64_t dot = 0;
      for (int j = 0; j < 32; ++j) {
        const double qw = double(wf[32 * b + j]) / dw;
        ASSERT_EQ(qw, std::round(qw)) << t.name << " row " << r << " element " << 32 * b + j;
        ASSERT_GE(qw, -16);
        ASSERT_LE(qw, 15);
        dot += std::lround(qw) * qa[b].qs[j];
      }
      EXPECT_EQ(dot, sumi[b]) << t.name << " row " << r << " block " << b;
    }
    EXPECT_NEAR(dot_f64(wf, xa), exact, 1e-12 * scale + 1e-30) << t.name << " row " << r;
    EXPECT_NEAR(got, exact, 1e-6 * scale + 1e-30) << t.name << " row " << r;
  });
  EXPECT_EQ(rows_checked, 7 + 3 + 4);
}

TEST(QuantDot, Q8_0TimesQ8_0) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {0, 32, 96, 1024, 4096 + 32}) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (auto& v : x) v = normal(rng);
    for (auto& v : y) v = normal(rng) * 0.01f;
    if (n >= 64) std::fill(y.begin() + 32, y.begin() + 64, 0.0f);  // an all-zero block: d = 0
    std::vector<q::BlockQ8_0> qx(x.size() / 32), qy(y.size() / 32);
    q::quantize_row_q8_0(x.data(), qx.data(), n);
    q::quantize_row_q8_0(y.data(), qy.data(), n);
    // Exact value from the integers and the fp16 scales, and the float64 dot of the decoded rows.
    double exact = 0, abs_sum = 0;
    for (size_t b = 0; b < qx.size(); ++b) {
      int64_t s = 0;
      for (int j = 0; j < 32; ++j) s += qx[b].qs[j] * qy[b].qs[j];
      const double t = double(q::fp16_to_f32(qx[b].d)) * double(q::fp16_to_f32(qy[b].d)) * double(s);
      exact += t;
      abs_sum += std::fabs(t);
    }
    const double decoded = n ? dot_f64(decode_row(GgmlType::Q8_0, reinterpret_cast<const uint8_t*>(qx.data()), n),
                                       decode_row(GgmlType::Q8_0, reinterpret_cast<const uint8_t*>(qy.data()), n))
                             : 0.0;
    const float got = q::vec_dot_q8_0_q8_0(n, qx.data(), qy.data());
    EXPECT_NEAR(got, exact, 1e-6 * abs_sum + 1e-30) << "n=" << n;
    EXPECT_NEAR(decoded, exact, 1e-6 * abs_sum + 1e-30) << "n=" << n;
    // And the quantized dot approximates the float one.
    if (n > 0) {
      EXPECT_NEAR(got, dot_f64(x, y), 0.02 * std::sqrt(double(n)) * 0.01) << "n=" << n;
    }
  }
  // Weight rows from quants.gguf (made by ggml's quantize_row_q8_0_ref) against themselves: sum of squares.
  const auto src = File::open(quants_dir() + "/quants.gguf");
  int checked = 0;
  for (const TensorInfo& t : src->tensors()) {
    if (t.type() != GgmlType::Q8_0) continue;
    const std::vector<float> v = decode_row(GgmlType::Q8_0, t.data, t.ne[0]);
    const double want = dot_f64(v, v);
    EXPECT_NEAR(q::vec_dot_q8_0_q8_0(t.ne[0], t.data, t.data), want, 1e-6 * want + 1e-30) << t.name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(QuantDot, RejectsBadLengths) {
  q::BlockQ8_K a[2]{};
  q::BlockQ4_K w4[2]{};
  q::BlockQ6_K w6[2]{};
  q::BlockQ8_0 b[2]{};
  EXPECT_THROW(q::vec_dot_q4_K_q8_K(300, w4, a), dllm::Error);
  EXPECT_THROW(q::vec_dot_q6_K_q8_K(-256, w6, a), dllm::Error);
  q::BlockQ5_K w5[2]{};
  EXPECT_THROW(q::vec_dot_q5_K_q8_K(128, w5, a), dllm::Error);
  EXPECT_THROW(q::vec_dot_q8_0_q8_0(40, b, b), dllm::Error);
  q::BlockQ5_0 w50[2]{};
  EXPECT_THROW(q::vec_dot_q5_0_q8_0(48, w50, b), dllm::Error);
  std::vector<q::DotPartsQ4K> parts(5);
  EXPECT_EQ(q::vec_dot_q4_K_q8_K(0, w4, a, &parts), 0.0f);
  EXPECT_TRUE(parts.empty());
  EXPECT_EQ(q::vec_dot_q4_K_q8_K(512, w4, a, &parts), 0.0f);
  EXPECT_EQ(parts.size(), 2u);
}
