// The JIT GEMM against ggml's own Q4_K x Q8_K and Q6_K x Q8_K results (tests/data/quants/dot.gguf and
// dot.json, see that folder's README), for every kernel family this CPU has:
//  - the activation quantisation of act.f32 equals ggml's act.q8_k byte for byte;
//  - every super-block's integer parts (sum_scaled_q, Q4_K's sum_mins) exactly: with the block's fp16
//    scales replaced by 1 (and 0) and the activation scale by 1, y is that integer;
//  - the float results within 1e-6 * abs_sum of the exact value and of ggml_mul_mat.
// DLLM_QUANTS_DIR=<dir> runs them on another set of the same files (e.g. the holdout set).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jit/gemm.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "common/thread_pool.h"
#include "support.h"

using namespace dllm;
using namespace dllm::jit;

namespace {

std::string quants_dir() {
  const char* env = std::getenv("DLLM_QUANTS_DIR");
  return env && *env ? std::string(env) : dllm::test::data_path("quants");
}

struct Fixture {
  std::unique_ptr<gguf::File> file;
  nlohmann::json json;
  int64_t k = 0, n_w = 0, n_a = 0;

  Fixture() {
    file = gguf::File::open(quants_dir() + "/dot.gguf");
    json = nlohmann::json::parse(dllm::test::read_file(quants_dir() + "/dot.json"));
    k = json["ncols"].get<int64_t>();
    n_w = json["n_weight_rows"].get<int64_t>();
    n_a = json["n_act_rows"].get<int64_t>();
  }
  const gguf::TensorInfo& tensor(const char* name) const {
    const gguf::TensorInfo* t = file->find_tensor(name);
    if (!t) throw std::runtime_error(std::string("dot.gguf lacks ") + name);
    return *t;
  }
};

std::vector<Isa> families() { return cpu_features().supported(); }

}  // namespace

TEST(JitFixtures, ActivationQuantisationEqualsGgml) {
  Fixture f;
  const gguf::TensorInfo& act = f.tensor("act.f32");
  const gguf::TensorInfo& q8k = f.tensor("act.q8_k");
  ThreadPool pool(2);
  QuantizedActs a;
  quantize_acts(ActFormat::Q8_K, reinterpret_cast<const float*>(act.data), f.n_a, f.k, a, pool);
  ASSERT_EQ(a.blocks.size(), q8k.nbytes);
  EXPECT_EQ(std::memcmp(a.blocks.data(), q8k.data, q8k.nbytes), 0);
  // The kernels' arrays agree with the blocks.
  const auto* blocks = reinterpret_cast<const quant::BlockQ8_K*>(q8k.data);
  for (int64_t r = 0; r < f.n_a; ++r) {
    for (int64_t b = 0; b < f.k / 256; ++b) {
      const quant::BlockQ8_K& blk = blocks[r * (f.k / 256) + b];
      EXPECT_EQ(a.d[r * (f.k / 256) + b], blk.d);
      EXPECT_EQ(std::memcmp(a.qs.data() + r * f.k + b * 256, blk.qs, 256), 0);
      for (int j = 0; j < 16; ++j) EXPECT_EQ(a.corr[r * (f.k / 16) + b * 16 + j], -32 * blk.bsums[j]);
      for (int j = 0; j < 8; ++j)
        EXPECT_EQ(a.s32[r * (f.k / 32) + b * 8 + j], blk.bsums[2 * j] + blk.bsums[2 * j + 1]);
    }
  }
}

TEST(JitFixtures, FloatResultsMatchGgml) {
  Fixture f;
  const gguf::TensorInfo& q8k = f.tensor("act.q8_k");
  QuantizedActs a;
  acts_from_blocks(ActFormat::Q8_K, q8k.data, f.n_a, f.k, a);
  ThreadPool pool(2);
  for (const char* tname : {"q4_k", "q6_k"}) {
    const gguf::TensorInfo& w = f.tensor((std::string("w.") + tname).c_str());
    for (Isa isa : families()) {
      SCOPED_TRACE(std::string(tname) + " " + isa_name(isa));
      const QuantMatrix m = prepare_matrix(w.type(), f.k, f.n_w, w.data, isa, pool);
      std::vector<float> y(f.n_a * f.n_w);
      gemm(m, a, y.data(), pool);
      for (const auto& res : f.json["results"][tname]) {
        const int64_t ar = res["act_row"].get<int64_t>(), wr = res["weight_row"].get<int64_t>();
        const double tol = 1e-6 * res["abs_sum"].get<double>();
        const float got = y[ar * f.n_w + wr];
        EXPECT_NEAR(got, res["exact_f64_from_ints"].get<double>(), tol) << "act " << ar << " weight " << wr;
        EXPECT_NEAR(got, res["ggml_mul_mat"].get<double>(), 2 * tol) << "act " << ar << " weight " << wr;
      }
    }
  }
}

// Super-block b of every weight row times super-block b of every activation row, scales replaced by units.
TEST(JitFixtures, IntegerPartsExact) {
  Fixture f;
  const gguf::TensorInfo& q8k = f.tensor("act.q8_k");
  const int64_t nb = f.k / 256;
  ThreadPool pool(2);
  for (const char* tname : {"q4_k", "q6_k"}) {
    const gguf::TensorInfo& w = f.tensor((std::string("w.") + tname).c_str());
    const bool q4 = w.type() == GgmlType::Q4_K;
    const size_t bs = q4 ? sizeof(quant::BlockQ4_K) : sizeof(quant::BlockQ6_K);
    for (int64_t b = 0; b < nb; ++b) {
      // Activation blocks b, d = 1.
      std::vector<quant::BlockQ8_K> ab(f.n_a);
      for (int64_t r = 0; r < f.n_a; ++r) {
        std::memcpy(&ab[r], q8k.data + (r * nb + b) * sizeof(quant::BlockQ8_K), sizeof(quant::BlockQ8_K));
        ab[r].d = 1.f;
      }
      QuantizedActs a;
      acts_from_blocks(ActFormat::Q8_K, ab.data(), f.n_a, 256, a);
      for (int part = 0; part < (q4 ? 2 : 1); ++part) {  // 0: sum_scaled_q, 1: sum_mins
        std::vector<uint8_t> wb(f.n_w * bs);
        for (int64_t r = 0; r < f.n_w; ++r) std::memcpy(wb.data() + r * bs, w.data + (r * nb + b) * bs, bs);
        for (int64_t r = 0; r < f.n_w; ++r) {
          uint8_t* blk = wb.data() + r * bs;
          if (q4) {
            reinterpret_cast<quant::BlockQ4_K*>(blk)->d = quant::f32_to_fp16(part == 0 ? 1.f : 0.f);
            reinterpret_cast<quant::BlockQ4_K*>(blk)->dmin = quant::f32_to_fp16(part == 0 ? 0.f : 1.f);
          } else {
            reinterpret_cast<quant::BlockQ6_K*>(blk)->d = quant::f32_to_fp16(1.f);
          }
        }
        for (Isa isa : families()) {
          SCOPED_TRACE(std::string(tname) + " " + isa_name(isa) + " super-block " + std::to_string(b) +
                       (part ? " sum_mins" : " sum_scaled_q"));
          const QuantMatrix m = prepare_matrix(w.type(), 256, f.n_w, wb.data(), isa, pool);
          std::vector<float> y(f.n_a * f.n_w);
          gemm(m, a, y.data(), pool);
          for (const auto& res : f.json["results"][tname]) {
            const int64_t ar = res["act_row"].get<int64_t>(), wr = res["weight_row"].get<int64_t>();
            const auto& sb = res["superblocks"][b];
            const int64_t expect = part == 0 ? sb["sum_scaled_q"].get<int64_t>() : -sb["sum_mins"].get<int64_t>();
            ASSERT_LT(std::llabs(expect), int64_t{1} << 24);
            EXPECT_EQ(y[ar * f.n_w + wr], static_cast<float>(expect)) << "act " << ar << " weight " << wr;
          }
        }
      }
    }
  }
}
