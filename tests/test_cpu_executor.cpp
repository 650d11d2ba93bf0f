// Whole-model logits through the JIT CPU executor, with every kernel family this CPU has, against llama.cpp's
// logits (which also quantise activations) and against the reference executor, on every quantized tiny model
// and case: relative L2 error per row within 6e-2 (Q8_0) / 8e-2 (Q4_K_M), argmax agreement >= 85%.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "jit/cpu_executor.h"
#include "model/model.h"
#include "model/reference_executor.h"
#include "support.h"
#include "test_jit_util.h"

using namespace dllm;
namespace fs = std::filesystem;

namespace {

struct Stats {
  double worst_rel_l2 = 0;
  int64_t rows = 0, argmax_agree = 0;
};

void compare(const float* got, const float* want, int64_t rows, int64_t vocab, Stats& st) {
  for (int64_t r = 0; r < rows; ++r) {
    double e = 0, n = 0;
    int64_t ag = 0, aw = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double a = got[r * vocab + j], b = want[r * vocab + j];
      e += (a - b) * (a - b), n += b * b;
      if (a > got[r * vocab + ag]) ag = j;
      if (b > want[r * vocab + aw]) aw = j;
    }
    st.worst_rel_l2 = std::max(st.worst_rel_l2, std::sqrt(e / n));
    st.rows++;
    st.argmax_agree += ag == aw;
  }
}

std::unique_ptr<model::Model> load(const std::string& path, jit::Isa isa, bool reference) {
  model::LoadOptions o;
  o.threads = 2;
  if (!reference) o.make_executor = [isa](ThreadPool& pool) { return std::make_unique<jit::CpuExecutor>(pool, isa); };
  return model::Model::load(path, o);
}

}  // namespace

TEST(CpuExecutor, LogitsMatchLlamaCppWithEveryFamily) {
  const fs::path dir = test::data_path("logits");
  int cases = 0;
  for (jit::Isa isa : jit::cpu_features().supported()) {
    for (std::string model : {"tiny-llada-Q8_0", "tiny-llada-Q4_K_M", "tiny-dream-Q8_0", "tiny-dream-Q4_K_M"}) {
      const double tol = model.find("Q8_0") != std::string::npos ? 6e-2 : 8e-2;
      auto jm = load(test::data_path("models/" + model + ".gguf"), isa, false);
      auto rm = load(test::data_path("models/" + model + ".gguf"), isa, true);
      Stats vs_llama, vs_ref;
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (e.path().extension() != ".json" || name.rfind(model + "__", 0) != 0) continue;
        const auto j = nlohmann::json::parse(test::read_file(e.path().string()));
        auto ids = j.at("ids").get<std::vector<int32_t>>();
        auto rows = j.at("rows").get<std::vector<int64_t>>();
        const std::string raw = test::read_file((dir / j.at("logits_file").get<std::string>()).string());
        std::vector<float> llama(raw.size() / 4);
        std::memcpy(llama.data(), raw.data(), raw.size());
        auto got = jm->forward(ids, rows);
        auto ref = rm->forward(ids, rows);
        ASSERT_EQ(got.size(), llama.size());
        compare(got.data(), llama.data(), static_cast<int64_t>(rows.size()), jm->n_vocab(), vs_llama);
        compare(got.data(), ref.data(), static_cast<int64_t>(rows.size()), jm->n_vocab(), vs_ref);
        ++cases;
      }
      ASSERT_GT(vs_llama.rows, 0) << model;
      EXPECT_LT(vs_llama.worst_rel_l2, tol) << model << " " << jit::isa_name(isa);
      EXPECT_LT(vs_ref.worst_rel_l2, tol) << model << " " << jit::isa_name(isa);
      EXPECT_GE(vs_llama.argmax_agree, 0.85 * vs_llama.rows) << model << " " << jit::isa_name(isa);
      EXPECT_GE(vs_ref.argmax_agree, 0.85 * vs_ref.rows) << model << " " << jit::isa_name(isa);
      RecordProperty(model + "_" + jit::isa_short_name(isa) + "_rel_l2_vs_llama", std::to_string(vs_llama.worst_rel_l2));
      std::printf("%-20s %-12s worst rel L2 vs llama.cpp %.4f, vs reference %.4f, argmax %lld/%lld\n",
                  model.c_str(), jit::isa_name(isa), vs_llama.worst_rel_l2, vs_ref.worst_rel_l2,
                  static_cast<long long>(vs_llama.argmax_agree), static_cast<long long>(vs_llama.rows));
    }
  }
  EXPECT_GT(cases, 0);
}

TEST(CpuExecutor, FloatModelsFallBackToTheReferencePath) {
  auto m = load(test::data_path("models/tiny-llada-F32.gguf"), jit::cpu_features().best(), false);
  auto& ex = dynamic_cast<jit::CpuExecutor&>(m->executor());
  EXPECT_EQ(ex.fallback_matrices(), 2 * 7 + 1);  // every matrix of the F32 file
  auto r = load(test::data_path("models/tiny-llada-F32.gguf"), jit::cpu_features().best(), true);
  std::vector<int32_t> ids = {5, 6, 7, 1014, 9};
  std::vector<int64_t> rows = {0, 3, 4};
  // Same matrices (reference path); only the attention differs (f32 flash kernel vs double scores).
  auto got = m->forward(ids, rows), want = r->forward(ids, rows);
  Stats st;
  compare(got.data(), want.data(), static_cast<int64_t>(rows.size()), m->n_vocab(), st);
  EXPECT_LT(st.worst_rel_l2, 1e-5);
  EXPECT_EQ(st.argmax_agree, st.rows);
}

// A Q5_0 matrix (no fixture model has one; DiffusionGemma's Q4_K_M files do, on the down projections) runs on
// the JIT kernels of every family this CPU has, with no fallback, and the reference-int8 executor takes it as
// ggml does (Q8_0 activations, exact block products): both within f32 rounding of the exact value.
TEST(CpuExecutor, Q5_0MatricesRunOnTheJitAndEqualTheInt8Reference) {
  const int64_t n = 40, k = 2112, rows = 5;
  std::mt19937 rng(2112);
  const std::vector<uint8_t> w = jit::test::random_weights(GgmlType::Q5_0, n, k, rng);
  const std::vector<float> x = jit::test::random_acts(rows, k, rng);
  gguf::TensorInfo t;
  t.name = "blk.0.ffn_down.weight";
  t.type_id = static_cast<uint32_t>(GgmlType::Q5_0);
  t.type_info = *ggml_type_info(t.type_id);
  t.n_dims = 2;
  t.ne[0] = k;
  t.ne[1] = n;
  t.nbytes = w.size();
  ThreadPool pool(2);
  jit::QuantizedActs a;
  jit::quantize_acts(jit::ActFormat::Q8_0, x.data(), rows, k, a, pool);
  const jit::test::RefResult ref = jit::test::reference_gemm(GgmlType::Q5_0, w.data(), n, a);
  // Each executor gets its own copy of the weights: after repacking, the JIT executor releases the source
  // pages (madvise), which zeroes anonymous memory.
  std::vector<std::vector<uint8_t>> copies;
  auto check = [&](model::Executor& ex, const std::string& what) {
    t.data = copies.emplace_back(w).data();
    const model::WeightHandle h = ex.prepare_weight(t);
    std::vector<float> y(rows * n, std::nanf(""));
    ex.matmul(h, x.data(), rows, y.data());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], ref.exact[i], 1e-6 * ref.scale[i] + 1e-30) << what << " row " << i / n << " col " << i % n;
  };
  model::ReferenceExecutor int8(pool, model::ReferenceExecutor::Activations::Quantized);
  check(int8, "reference-int8");
  for (jit::Isa isa : {jit::Isa::Portable, jit::Isa::Avx2, jit::Isa::AvxVnni, jit::Isa::Avx512Vnni, jit::Isa::Amx}) {
    if (!jit::cpu_features().supports(isa)) continue;
    jit::CpuExecutor ex(pool, isa);
    check(ex, jit::isa_name(isa));
    EXPECT_EQ(ex.fallback_matrices(), 0) << jit::isa_name(isa);
    EXPECT_EQ(ex.load_warning(), "") << jit::isa_name(isa);
  }
}

// Under amx each matrix is packed for the family matrix_family names (the tiles for the types with an AMX
// body). Packing runs no kernel, so this holds on any CPU.
TEST(CpuExecutor, AmxPacksEachMatrixForItsFamily) {
  auto file = gguf::File::open(test::data_path("models/tiny-llada-Q4_K_M.gguf"));
  ThreadPool pool(2);
  jit::CpuExecutor ex(pool, jit::Isa::Amx);
  int tiles = 0;
  for (const gguf::TensorInfo& t : file->tensors()) {
    if (t.n_dims != 2 || !jit::jit_supports(t.type())) continue;
    const jit::QuantMatrix* m = ex.matrix(ex.prepare_weight(t));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->isa, jit::matrix_family(jit::Isa::Amx, t.type())) << t.name;
    tiles += m->isa == jit::Isa::Amx;
  }
  EXPECT_GT(tiles, 0) << "no matrix of the fixture runs the tiles";
}
