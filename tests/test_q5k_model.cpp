// Q5_K end to end on whole models (q5k_model.h makes them from the tiny Q4_K_M fixtures):
//  - the same-values copy (every Q4_K tensor as Q5_K with its high bits 0) gives the Q4_K_M file's logits
//    bit for bit, on the reference executor and on every JIT family this CPU has, and so matches
//    llama.cpp's logits of that file as closely;
//  - the high-bits model (q5 = 2*q4 + a random bit, d/2) runs on the JIT kernels (no matrix left on the
//    reference path), within the usual activation-quantisation distance of the reference executor, and
//    bit-identical on every family to the portable one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "jit/cpu_executor.h"
#include "model/model.h"
#include "q5k_model.h"
#include "support.h"

using namespace dllm;
namespace fs = std::filesystem;

namespace {

double worst_rel_l2(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  double worst = 0;
  for (size_t r = 0; r < got.size() / static_cast<size_t>(vocab); ++r) {
    double e = 0, n = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double a = got[r * vocab + j], b = want[r * vocab + j];
      e += (a - b) * (a - b), n += b * b;
    }
    worst = std::max(worst, std::sqrt(e / n));
  }
  return worst;
}

std::unique_ptr<model::Model> load(const std::string& path, std::optional<jit::Isa> isa) {
  model::LoadOptions o;
  o.threads = 2;
  if (isa) o.make_executor = [i = *isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, i); };
  return model::Model::load(path, o);
}

struct Case {
  std::vector<int32_t> ids;
  std::vector<int64_t> rows;
  std::vector<float> llama;  // llama.cpp's logits of the Q4_K_M file
};

// The llama.cpp logits cases of a tiny model (tests/data/logits).
std::vector<Case> cases_of(const std::string& model) {
  std::vector<Case> out;
  const fs::path dir = test::data_path("logits");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".json" || name.rfind(model + "__", 0) != 0) continue;
    const auto j = nlohmann::json::parse(test::read_file(e.path().string()));
    Case c;
    c.ids = j.at("ids").get<std::vector<int32_t>>();
    c.rows = j.at("rows").get<std::vector<int64_t>>();
    const std::string raw = test::read_file((dir / j.at("logits_file").get<std::string>()).string());
    c.llama.resize(raw.size() / 4);
    std::memcpy(c.llama.data(), raw.data(), raw.size());
    out.push_back(std::move(c));
  }
  return out;
}

std::string q5k_file(const std::string& model, test::Q5kMode mode) {
  const std::string out = ::testing::TempDir() + "/" + model + (mode == test::Q5kMode::SameValues ? "-Q5_K-same.gguf" : "-Q5_K-bits.gguf");
  EXPECT_GT(test::write_q4k_as_q5k(test::data_path("models/" + model + ".gguf"), out, mode), 5) << model;
  return out;
}

}  // namespace

TEST(Q5kModel, SameValuesGiveTheQ4KLogitsOnEveryExecutor) {
  for (const std::string model : {"tiny-llada-Q4_K_M", "tiny-dream-Q4_K_M"}) {
    const std::string q5 = q5k_file(model, test::Q5kMode::SameValues);
    const std::string q4 = test::data_path("models/" + model + ".gguf");
    const std::vector<Case> cases = cases_of(model);
    ASSERT_FALSE(cases.empty()) << model;
    std::vector<std::optional<jit::Isa>> executors = {std::nullopt};
    for (jit::Isa isa : jit::kAllIsas)
      if (jit::cpu_features().supports(isa)) executors.push_back(isa);
    for (const auto& isa : executors) {
      SCOPED_TRACE(model + " " + (isa ? jit::isa_name(*isa) : "reference"));
      auto m4 = load(q4, isa), m5 = load(q5, isa);
      if (isa) {
        EXPECT_EQ(dynamic_cast<jit::CpuExecutor&>(m5->executor()).fallback_matrices(), 0);
        EXPECT_EQ(m5->executor().load_warning(), "");
      }
      for (const Case& c : cases) {
        const auto a = m4->forward(c.ids, c.rows), b = m5->forward(c.ids, c.rows);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "Q5_K copy differs from the Q4_K file";
        EXPECT_LT(worst_rel_l2(b, c.llama, m5->n_vocab()), 8e-2) << "vs llama.cpp";
      }
    }
  }
}

TEST(Q5kModel, HighBitsRunOnTheKernelsCloseToTheReferenceAndEqualOnEveryFamily) {
  for (const std::string model : {"tiny-llada-Q4_K_M", "tiny-dream-Q4_K_M"}) {
    const std::string q5 = q5k_file(model, test::Q5kMode::HighBits);
    const std::vector<Case> cases = cases_of(model);
    auto ref = load(q5, std::nullopt);
    auto portable = load(q5, jit::Isa::Portable);
    for (jit::Isa isa : jit::kAllIsas) {
      if (!jit::cpu_features().supports(isa)) continue;
      SCOPED_TRACE(model + " " + jit::isa_name(isa));
      auto m = load(q5, isa);
      EXPECT_EQ(dynamic_cast<jit::CpuExecutor&>(m->executor()).fallback_matrices(), 0);
      double worst = 0;
      for (const Case& c : cases) {
        const auto got = m->forward(c.ids, c.rows), want = ref->forward(c.ids, c.rows);
        worst = std::max(worst, worst_rel_l2(got, want, m->n_vocab()));
        const auto p = portable->forward(c.ids, c.rows);
        EXPECT_EQ(std::memcmp(got.data(), p.data(), got.size() * 4), 0) << "differs from the portable family";
      }
      EXPECT_LT(worst, 8e-2);
      std::printf("%-20s %-12s Q5_K high bits: worst rel L2 vs the reference executor %.4f\n", model.c_str(),
                  jit::isa_name(isa), worst);
    }
  }
}
