// The JIT GEMM of every kernel family (the portable twin included; the families this CPU lacks run in the x86
// interpreter of x86_emu.h where libzydis-dev is installed, and skip otherwise) against the reference
// integer dot products of model/quant_ref_dot.h, on shapes with tails: 1 row, odd row counts, N not a
// multiple of the panel, K from one block to 4096, for every type of the weight table (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0). Also: the integer parts
// exactly (unit scales make y equal the integer sums), and against dequantise + f32 dot.
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "jit/gemm.h"
#include "common/error.h"
#include "common/thread_pool.h"
#include "jit/kernel_cache.h"
#include "test_jit_util.h"
#ifdef DLLM_HAVE_X86_EMU
#include "x86_emu.h"
#endif

using namespace dllm;
using namespace dllm::jit;
using namespace dllm::jit::test;

namespace {

struct Shape {
  GgmlType type;
  int64_t rows, n, k;
};

std::string label(Isa isa, const Shape& s) {
  return std::string(isa_name(isa)) + " " + ggml_type_name(s.type) + " rows=" + std::to_string(s.rows) +
         " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
}

const Shape kShapes[] = {
    {GgmlType::Q4_K, 1, 16, 256},   {GgmlType::Q4_K, 3, 33, 512},  {GgmlType::Q4_K, 7, 8, 256},
    {GgmlType::Q4_K, 13, 100, 768}, {GgmlType::Q4_K, 17, 5, 256},  {GgmlType::Q4_K, 2, 24, 4096},
    {GgmlType::Q4_K, 9, 1, 256},    {GgmlType::Q4_K, 20, 40, 1024}, {GgmlType::Q4_K, 6, 16, 512},
    {GgmlType::Q5_K, 1, 16, 256},   {GgmlType::Q5_K, 3, 33, 512},  {GgmlType::Q5_K, 7, 8, 256},
    {GgmlType::Q5_K, 13, 100, 768}, {GgmlType::Q5_K, 17, 5, 256},  {GgmlType::Q5_K, 2, 24, 4096},
    {GgmlType::Q5_K, 9, 1, 256},    {GgmlType::Q5_K, 20, 40, 1024}, {GgmlType::Q5_K, 6, 16, 512},
    {GgmlType::Q6_K, 1, 16, 256},   {GgmlType::Q6_K, 3, 33, 512},  {GgmlType::Q6_K, 7, 8, 256},
    {GgmlType::Q6_K, 13, 100, 768}, {GgmlType::Q6_K, 17, 5, 256},  {GgmlType::Q6_K, 2, 24, 4096},
    {GgmlType::Q6_K, 9, 1, 256},    {GgmlType::Q6_K, 20, 40, 1024}, {GgmlType::Q6_K, 6, 16, 512},
    {GgmlType::Q6_K, 9, 37, 8448},  // past kTwoVectorMaxK: one-vector panels on avx512-vnni too
    {GgmlType::Q8_0, 1, 16, 32},    {GgmlType::Q8_0, 3, 33, 96},   {GgmlType::Q8_0, 7, 8, 288},
    {GgmlType::Q8_0, 13, 100, 768}, {GgmlType::Q8_0, 17, 5, 32},   {GgmlType::Q8_0, 2, 24, 4096},
    {GgmlType::Q8_0, 25, 1, 64},    {GgmlType::Q8_0, 30, 40, 1024}, {GgmlType::Q8_0, 6, 16, 64},
    // Q5_0 (Q8_0's layout and bodies): one and odd block counts, and DiffusionGemma's down-projection widths
    {GgmlType::Q5_0, 1, 16, 32},    {GgmlType::Q5_0, 3, 33, 96},   {GgmlType::Q5_0, 7, 8, 704},
    {GgmlType::Q5_0, 13, 100, 768}, {GgmlType::Q5_0, 17, 5, 32},   {GgmlType::Q5_0, 2, 24, 2112},
    {GgmlType::Q5_0, 25, 1, 64},    {GgmlType::Q5_0, 30, 40, 1024}, {GgmlType::Q5_0, 6, 16, 64},
};

class GemmFamily : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (cpu_features().supports(GetParam())) return;
#ifdef DLLM_HAVE_X86_EMU
    set_kernel_interpreter(dllm::test::interpret_kernel);  // every GEMM kernel call of the test goes through it
#else
    GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << " (and the x86 interpreter needs libzydis-dev)";
#endif
  }
  void TearDown() override { set_kernel_interpreter(nullptr); }
};

}  // namespace

TEST_P(GemmFamily, MatchesReferenceDotProducts) {
  const Isa isa = GetParam();
  ThreadPool pool(2);
  std::mt19937 rng(1234);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(label(isa, s));
    const std::vector<uint8_t> w = random_weights(s.type, s.n, s.k, rng);
    const std::vector<float> x = random_acts(s.rows, s.k, rng);
    const QuantMatrix m = prepare_matrix(s.type, s.k, s.n, w.data(), isa, pool);
    QuantizedActs a;
    quantize_acts(act_format_for(s.type), x.data(), s.rows, s.k, a, pool);
    std::vector<float> y(s.rows * s.n, std::nanf(""));
    gemm(m, a, y.data(), pool);
    const RefResult ref = reference_gemm(s.type, w.data(), s.n, a);
    int bad = 0;
    for (size_t i = 0; i < y.size() && bad < 5; ++i) {
      const double tol = 1e-6 * ref.scale[i] + 1e-30;
      if (!(std::fabs(y[i] - ref.exact[i]) <= tol) || !(std::fabs(y[i] - ref.ref[i]) <= 2 * tol)) {
        ++bad;
        ADD_FAILURE() << "row " << i / s.n << " col " << i % s.n << ": got " << y[i] << ", reference "
                      << ref.ref[i] << ", exact " << ref.exact[i] << ", scale " << ref.scale[i];
      }
    }
  }
}

// With unit scales the float result is the integer sum itself (exact below 2^24): sum_scaled_q with
// d = 1, dmin = 0, and -sum_mins with d = 0, dmin = 1 (Q4_K, Q5_K); sum of q_w*q_a for Q8_0 and Q5_0.
TEST_P(GemmFamily, IntegerPartsExact) {
  const Isa isa = GetParam();
  ThreadPool pool(2);
  std::mt19937 rng(99);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0}) {
    const bool mins = t == GgmlType::Q4_K || t == GgmlType::Q5_K;
    for (int variant = 0; variant < (mins ? 2 : 1); ++variant) {
      const int64_t rows = 5, n = 19, k = 1024;
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + ggml_type_name(t) + (variant ? " mins" : " scales"));
      std::vector<uint8_t> w = random_weights(t, n, k, rng);
      const size_t bs = ggml_type_info(static_cast<uint32_t>(t))->type_size;
      for (size_t i = 0; i < w.size() / bs; ++i) {
        uint8_t* b = w.data() + i * bs;
        if (mins) {  // Q4_K and Q5_K blocks both start with d, dmin
          reinterpret_cast<quant::BlockQ4_K*>(b)->d = fp16(variant ? 0.f : 1.f);
          reinterpret_cast<quant::BlockQ4_K*>(b)->dmin = fp16(variant ? 1.f : 0.f);
        } else if (t == GgmlType::Q6_K) {
          reinterpret_cast<quant::BlockQ6_K*>(b)->d = fp16(1.f);
        } else if (t == GgmlType::Q5_0) {
          reinterpret_cast<quant::BlockQ5_0*>(b)->d = fp16(1.f);
        } else {
          reinterpret_cast<quant::BlockQ8_0*>(b)->d = fp16(1.f);
        }
      }
      // Activation blocks with unit scales and random quants in -127..127.
      const ActFormat fmt = act_format_for(t);
      std::uniform_int_distribution<int> q(-127, 127);
      std::vector<uint8_t> blocks;
      if (fmt == ActFormat::Q8_K) {
        std::vector<quant::BlockQ8_K> b(rows * k / 256);
        for (auto& blk : b) {
          blk.d = 1.f;
          for (int j = 0; j < 256; ++j) blk.qs[j] = static_cast<int8_t>(q(rng));
          for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int l = 0; l < 16; ++l) sum += blk.qs[16 * j + l];
            blk.bsums[j] = static_cast<int16_t>(sum);
          }
        }
        blocks.assign(reinterpret_cast<uint8_t*>(b.data()), reinterpret_cast<uint8_t*>(b.data() + b.size()));
      } else {
        std::vector<quant::BlockQ8_0> b(rows * k / 32);
        for (auto& blk : b) {
          blk.d = fp16(1.f);
          for (int j = 0; j < 32; ++j) blk.qs[j] = static_cast<int8_t>(q(rng));
        }
        blocks.assign(reinterpret_cast<uint8_t*>(b.data()), reinterpret_cast<uint8_t*>(b.data() + b.size()));
      }
      QuantizedActs a;
      acts_from_blocks(fmt, blocks.data(), rows, k, a);
      const QuantMatrix m = prepare_matrix(t, k, n, w.data(), isa, pool);
      std::vector<float> y(rows * n);
      gemm(m, a, y.data(), pool);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          const uint8_t* wr = w.data() + j * row_bytes(t, k);
          int64_t expect = 0;
          if (mins) {
            std::vector<quant::DotPartsQ4K> parts;
            if (t == GgmlType::Q4_K) quant::vec_dot_q4_K_q8_K(k, wr, a.row_blocks(r), &parts);
            else quant::vec_dot_q5_K_q8_K(k, wr, a.row_blocks(r), &parts);
            for (const auto& p : parts) expect += variant ? -p.sum_mins : p.sum_scaled_q;
          } else if (t == GgmlType::Q6_K) {
            std::vector<quant::DotPartsQ6K> parts;
            quant::vec_dot_q6_K_q8_K(k, wr, a.row_blocks(r), &parts);
            for (const auto& p : parts) expect += p.sum_scaled_q;
          } else if (t == GgmlType::Q5_0) {
            const auto* ab = static_cast<const quant::BlockQ8_0*>(a.row_blocks(r));
            for (int64_t e = 0; e < k; ++e) {
              quant::BlockQ5_0 wb;
              std::memcpy(&wb, wr + (e / 32) * 22, 22);
              expect += (quant::q5_0_quant(wb, static_cast<int>(e % 32)) - 16) * ab[e / 32].qs[e % 32];
            }
          } else {
            const auto* wb = reinterpret_cast<const quant::BlockQ8_0*>(wr);
            const auto* ab = static_cast<const quant::BlockQ8_0*>(a.row_blocks(r));
            for (int64_t e = 0; e < k; ++e) expect += wb[e / 32].qs[e % 32] * ab[e / 32].qs[e % 32];
          }
          ASSERT_LT(std::llabs(expect), 1 << 24);
          ASSERT_EQ(static_cast<int64_t>(y[r * n + j]), expect) << "row " << r << " col " << j;
          ASSERT_EQ(y[r * n + j], static_cast<float>(expect)) << "row " << r << " col " << j;
        }
      }
    }
  }
}

// Against the plain float product of the dequantised weights and the unquantised activations: the only
// difference is the int8 rounding of the activations.
TEST_P(GemmFamily, CloseToDequantisedFloatProduct) {
  const Isa isa = GetParam();
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0}) {
    const int64_t rows = 6, n = 21, k = 512;
    SCOPED_TRACE(std::string(isa_name(isa)) + " " + ggml_type_name(t));
    const std::vector<uint8_t> w = random_weights(t, n, k, rng);
    std::vector<float> x(rows * k);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(rng);
    const QuantMatrix m = prepare_matrix(t, k, n, w.data(), isa, pool);
    std::vector<float> y(rows * n);
    gemm(m, x.data(), rows, y.data(), pool);
    std::vector<float> wf(k);
    for (int64_t j = 0; j < n; ++j) {
      quant::dequantize_row(t, w.data() + j * row_bytes(t, k), wf.data(), k);
      for (int64_t r = 0; r < rows; ++r) {
        double dot = 0, mag = 0;
        for (int64_t e = 0; e < k; ++e) {
          dot += static_cast<double>(wf[e]) * x[r * k + e];
          mag += std::fabs(static_cast<double>(wf[e]) * x[r * k + e]);
        }
        EXPECT_NEAR(y[r * n + j], dot, 0.02 * mag + 1e-6) << "row " << r << " col " << j;
      }
    }
  }
}

TEST_P(GemmFamily, RowsAreIndependentOfTheBatch) {
  const Isa isa = GetParam();
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0}) {
    const int64_t rows = 23, n = 40, k = 512;
    const std::vector<uint8_t> w = random_weights(t, n, k, rng);
    const std::vector<float> x = random_acts(rows, k, rng);
    const QuantMatrix m = prepare_matrix(t, k, n, w.data(), isa, pool);
    std::vector<float> all(rows * n), one(n);
    gemm(m, x.data(), rows, all.data(), pool);
    for (int64_t r = 0; r < rows; ++r) {
      gemm(m, x.data() + r * k, 1, one.data(), pool);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(one[j], all[r * n + j]) << isa_name(isa) << " " << ggml_type_name(t) << " row " << r;
    }
  }
}

// Every family performs the same f32 operations per output (jit/kernel_order.h): the results equal the
// portable family's bit for bit, on every shape (tails, one row, two-vector panels, long K).
TEST_P(GemmFamily, BitIdenticalToPortable) {
  const Isa isa = GetParam();
  ThreadPool pool(2);
  std::mt19937 rng(777);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(label(isa, s));
    const std::vector<uint8_t> w = random_weights(s.type, s.n, s.k, rng);
    const std::vector<float> x = random_acts(s.rows, s.k, rng);
    const QuantMatrix m = prepare_matrix(s.type, s.k, s.n, w.data(), isa, pool);
    const QuantMatrix p = prepare_matrix(s.type, s.k, s.n, w.data(), Isa::Portable, pool);
    QuantizedActs a;
    quantize_acts(act_format_for(s.type), x.data(), s.rows, s.k, a, pool);
    std::vector<float> y(s.rows * s.n, std::nanf("")), yp(s.rows * s.n, std::nanf(""));
    gemm(m, a, y.data(), pool);
    gemm(p, a, yp.data(), pool);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_EQ(std::memcmp(&y[i], &yp[i], sizeof(float)), 0)
          << "row " << i / s.n << " col " << i % s.n << ": " << y[i] << " vs portable " << yp[i];
  }
}

TEST_P(GemmFamily, MismatchedActivationsAreRefused) {
  ThreadPool pool(1);
  std::mt19937 rng(3);
  const std::vector<uint8_t> w = random_weights(GgmlType::Q4_K, 16, 512, rng);
  const QuantMatrix m = prepare_matrix(GgmlType::Q4_K, 512, 16, w.data(), GetParam(), pool);
  const std::vector<float> x = random_acts(2, 512, rng);
  QuantizedActs a;
  quantize_acts(ActFormat::Q8_0, x.data(), 2, 512, a, pool);
  std::vector<float> y(2 * 16);
  EXPECT_THROW(gemm(m, a, y.data(), pool), Error);
  quantize_acts(ActFormat::Q8_K, x.data(), 2, 256, a, pool);
  EXPECT_THROW(gemm(m, a, y.data(), pool), Error);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, GemmFamily, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           std::string s = isa_short_name(info.param);
                           return s;
                         });

// DLLM_PERF_MAP=1 names each generated kernel in /tmp/perf-PID.map (address, size, name) for `perf report`;
// without it nothing is written.
TEST(PerfMap, NamesGeneratedKernelsOnlyWhenAsked) {
  const std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  std::remove(path.c_str());
  GemmDesc desc;
  desc.isa = Isa::Avx2;
  if (!cpu_features().supports(desc.isa)) GTEST_SKIP() << "this CPU lacks avx2";
  desc.wtype = GgmlType::Q8_0;
  desc.n = 16;
  desc.k = 64;
  desc.m = 1;
  unsetenv("DLLM_PERF_MAP");
  generate_kernel(desc);
  EXPECT_FALSE(std::ifstream(path).good()) << path << " was written without DLLM_PERF_MAP";

  setenv("DLLM_PERF_MAP", "1", 1);
  const auto k = generate_kernel(desc);
  unsetenv("DLLM_PERF_MAP");
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::string addr, size, name;
  in >> std::hex >> addr >> size >> name;
  std::remove(path.c_str());
  EXPECT_EQ(std::stoull(addr, nullptr, 16), reinterpret_cast<uintptr_t>(k->code()));
  EXPECT_EQ(std::stoull(size, nullptr, 16), k->code_size());
  EXPECT_EQ(name, k->name());
}
