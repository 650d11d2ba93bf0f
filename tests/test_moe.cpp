// The mixture-of-experts architectures (llada-moe, rnd1) against llama.cpp's logits on the tiny models of
// tests/data/moe (F32, Q8_0, Q4_K_M; two canvases each; README there), on the reference executor and every
// JIT family this CPU runs:
// - F32 files: every case within 1e-5 relative L2 on every executor.
// - quantised files: within 2e-2 on the JIT families (llama.cpp's arithmetic: int8 activations); a case
//   above it must be explained: each row off by more than 2e-2 has a router decision whose two experts'
//   probabilities differ by less than what activation quantisation moves them (measured: the same row's
//   router probabilities with f32 activations, the reference executor, against int8 ones, the JIT), and
//   forcing that decision the other way brings the row and the case within 2e-2.
// - greedy generation: the same tokens, pass by pass, on every JIT family as on the reference executor with
//   int8 activations (llama.cpp's arithmetic; the dense tiny models too: the same final tokens); against
//   the f32-activation reference the same tokens, or where they
//   part (quantised files: int8 against f32 activations), the first differing step is a near tie of the
//   sampler's decision that the activations' rounding moves across.
// Plus the tensor and metadata checks of the two architectures, and the routing itself (softmax, top-k,
// renormalisation) against a direct computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "jit/cpu_executor.h"
#include "model/arch.h"
#include "model/forward.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/reference_executor.h"
#include "model/sequence.h"
#include "router_probe.h"
#include "support.h"

using namespace dllm;

namespace {

constexpr double kF32Tolerance = 1e-5;
constexpr double kQuantTolerance = 2e-2;

std::string moe_path(const std::string& rel) { return test::data_path("moe/" + rel); }

struct Case {
  std::string model;  // "tiny-llada-moe-Q4_K_M"
  std::string name;
  std::vector<int32_t> ids;
  std::vector<int64_t> rows;
  std::vector<float> logits;  // llama.cpp's [rows, n_vocab]
};

Case load_case(const std::string& model, const std::string& name) {
  Case c{model, name, {}, {}, {}};
  const std::string base = moe_path("logits/" + model + "__" + name);
  const nlohmann::json j = nlohmann::json::parse(test::read_file(base + ".json"));
  c.ids = j.at("ids").get<std::vector<int32_t>>();
  c.rows = j.at("rows").get<std::vector<int64_t>>();
  const std::string bytes = test::read_file(base + ".f32");
  c.logits.resize(bytes.size() / sizeof(float));
  std::memcpy(c.logits.data(), bytes.data(), c.logits.size() * sizeof(float));
  return c;
}

const char* const kCases[] = {"m1_prompt_then_masks_len64", "m2_prompt_partial_tail_len77"};

double rel_l2(const float* a, const float* b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
  return std::sqrt(d / r);
}

// An executor by label: "reference" or a JIT family's.
struct Choice {
  std::string label;
  bool reference = false;
  jit::Isa isa = jit::Isa::Portable;
  model::ReferenceExecutor::Activations acts = model::ReferenceExecutor::Activations::F32;
};

// The reference executor with llama.cpp's (and the JIT's) int8 activations.
const Choice kInt8Reference{"reference-int8", true, jit::Isa::Portable, model::ReferenceExecutor::Activations::Quantized};

std::vector<Choice> executors() {
  std::vector<Choice> out{{"reference", true}};
  for (jit::Isa isa : jit::cpu_features().supported()) out.push_back({test::family_label(isa), false, isa});
  return out;
}

// A loaded model with its probe executor.
struct Loaded {
  std::unique_ptr<model::Model> model;
  test::RouterProbe<model::ReferenceExecutor>* ref = nullptr;
  test::RouterProbe<jit::CpuExecutor>* jit = nullptr;
  std::vector<std::vector<float>>& probs() { return ref ? ref->probs : jit->probs; }
  std::vector<std::vector<int32_t>>& ids() { return ref ? ref->ids : jit->ids; }
  std::vector<test::Flip>& flips() { return ref ? ref->flips : jit->flips; }
  std::vector<std::vector<int32_t>>& forced() { return ref ? ref->forced : jit->forced; }
  std::vector<std::vector<int32_t>>& own() { return ref ? ref->own : jit->own; }
  void reset() { ref ? ref->reset() : jit->reset(); }
};

Loaded& load(const std::string& file, const Choice& ex) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& slot = cache[file + "/" + ex.label];
  if (slot) return *slot;
  slot = std::make_unique<Loaded>();
  Loaded* l = slot.get();
  model::LoadOptions o;
  o.threads = 2;
  if (ex.reference) {
    const auto acts = ex.acts;
    o.make_executor = [l, acts](ThreadPool& pool) {
      auto e = std::make_unique<test::RouterProbe<model::ReferenceExecutor>>(pool, acts);
      l->ref = e.get();
      return e;
    };
  } else {
    const jit::Isa isa = ex.isa;
    o.make_executor = [l, isa](ThreadPool& pool) {
      auto e = std::make_unique<test::RouterProbe<jit::CpuExecutor>>(pool, isa);
      l->jit = e.get();
      return e;
    };
  }
  // The dense tiny models (tests/data/models) run through the same checks where a test names them.
  const bool moe = file.rfind("tiny-llada-moe", 0) == 0 || file.rfind("tiny-rnd1", 0) == 0;
  l->model = model::Model::load(moe ? moe_path("gguf/" + file + ".gguf") : test::data_path("models/" + file + ".gguf"), o);
  return *l;
}

std::vector<float> run(Loaded& l, const Case& c) {
  l.reset();
  return l.model->forward(c.ids, c.rows);
}

const std::vector<std::string>& models() {
  static const std::vector<std::string> m{"tiny-llada-moe", "tiny-rnd1"};
  return m;
}

}  // namespace

// ---------------------------------------------------------------- architecture and routing

TEST(MoeArch, HyperparametersAndTensorsOfBothArchitectures) {
  for (const std::string& m : models()) {
    const model::ModelFile f = model::ModelFile::open(moe_path("gguf/" + m + "-Q4_K_M.gguf"));
    const model::HParams& hp = f.hparams();
    EXPECT_EQ(hp.n_expert, 8) << m;
    EXPECT_EQ(hp.n_expert_used, 2) << m;
    EXPECT_EQ(hp.n_ff_exp, 256) << m;
    EXPECT_TRUE(hp.qk_norm) << m;
    EXPECT_EQ(hp.rope_style, model::RopeStyle::Neox) << m;
    const bool rnd1 = m == "tiny-rnd1";
    EXPECT_EQ(hp.expert_weights_norm, rnd1) << m;
    EXPECT_EQ(hp.shift_logits, rnd1) << m;  // llada-moe says false; rnd1 files carry no key: shifted
    EXPECT_EQ(model::arch_spec(hp.arch).sampler, rnd1 ? model::SamplerKind::Timesteps : model::SamplerKind::Blocks);
    const model::ModelTensors& t = f.tensors();
    ASSERT_EQ(t.layers.size(), 2u);
    EXPECT_EQ(t.layers[0].ffn_gate, nullptr);
    ASSERT_NE(t.layers[0].ffn_down_exps, nullptr);
    EXPECT_EQ(t.layers[0].ffn_down_exps->ne[2], 8);
    // Both files carry output.weight (rnd1 would tie its LM head to token_embd without one: MoeArch.TiedOutput).
    EXPECT_NE(t.output, t.token_embd) << m;
  }
}

TEST(MoeArch, ExpertSliceIsTheExpertsBytes) {
  const model::ModelFile f = model::ModelFile::open(moe_path("gguf/tiny-llada-moe-Q8_0.gguf"));
  const gguf::TensorInfo& t = *f.tensors().layers[1].ffn_up_exps;
  std::string name;
  const gguf::TensorInfo s = model::expert_slice(t, 5, name);
  EXPECT_EQ(name, "blk.1.ffn_up_exps.weight[5]");
  EXPECT_EQ(s.n_dims, 2u);
  EXPECT_EQ(s.ne[0], t.ne[0]);
  EXPECT_EQ(s.ne[1], t.ne[1]);
  EXPECT_EQ(s.nbytes * 8, t.nbytes);
  EXPECT_EQ(s.data, t.data + 5 * s.nbytes);
  EXPECT_THROW(model::expert_slice(t, 8, name), Error);
}

namespace {

// The grouped-product tests' groups: rows per expert with empty groups, one-row groups and groups of several row
// tiles, each group's rows after the previous group's.
struct ExpertGroups {
  static constexpr int64_t E = 8;
  std::vector<int64_t> n{3, 0, 1, 9, 0, 4, 2, 13}, row0 = std::vector<int64_t>(E, 0);
  int64_t R = 0;
  ExpertGroups() {
    for (size_t e = 1; e < static_cast<size_t>(E); ++e) row0[e] = row0[e - 1] + n[e - 1];
    R = row0[E - 1] + n[E - 1];
  }
};

// count values of an LCG in [-1000 / div, 1000 / div].
std::vector<float> lcg_values(int64_t count, uint32_t s, float div) {
  std::vector<float> x(static_cast<size_t>(count));
  for (float& v : x)
    s = s * 1664525u + 1013904223u, v = static_cast<float>(static_cast<int32_t>(s >> 9) % 2001 - 1000) / div;
  return x;
}

// On every family but the reference, for layer 1's gate/up pair (m = 2) and down matrices (m = 1) of `file`, one
// per expert of g: run(cpu, ws, m, k, got, want) computes the products twice, into the outputs got[g*m + j] and
// want[g*m + j] ([n[g], cols] each); the two must be equal bit for bit.
template <class Run>
void expect_equal_expert_products(const char* file, const ExpertGroups& g, Run run) {
  const model::ModelFile f = model::ModelFile::open(moe_path(file));
  const auto& layer = f.tensors().layers[1];
  for (const Choice& ex : executors()) {
    if (ex.reference) continue;
    ThreadPool pool(2);
    jit::CpuExecutor cpu(pool, ex.isa);
    for (const auto& [m, tensors] : {std::pair{2, std::vector{layer.ffn_gate_exps, layer.ffn_up_exps}},
                                     std::pair{1, std::vector{layer.ffn_down_exps}}}) {
      const int64_t k = tensors[0]->ne[0], cols = tensors[0]->ne[1], E = ExpertGroups::E;
      std::vector<model::WeightHandle> ws;
      std::vector<std::string> names(static_cast<size_t>(E * m));
      for (int64_t e = 0; e < E; ++e)
        for (int j = 0; j < m; ++j)
          ws.push_back(cpu.prepare_weight(model::expert_slice(*tensors[static_cast<size_t>(j)], e, names[ws.size()])));
      std::vector<float> got(static_cast<size_t>(g.R * cols * m), 1e30f), want(got.size(), -1e30f);
      std::vector<float*> y1, y2;
      for (int64_t e = 0; e < E; ++e) {
        for (int j = 0; j < m; ++j) {
          y1.push_back(got.data() + (j * g.R + g.row0[static_cast<size_t>(e)]) * cols);
          y2.push_back(want.data() + (j * g.R + g.row0[static_cast<size_t>(e)]) * cols);
        }
      }
      run(cpu, ws, m, k, y1, y2);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << file << " " << ex.label << " " << ggml_type_name(tensors[0]->type_id) << " matrices per group " << m;
    }
  }
}

}  // namespace

// The expert GEMMs in one pass (CpuExecutor::matmul_grouped: one quantisation of every expert's rows, one
// gemm_ranges over all groups) give bit for bit what the group-by-group path gives (the executor
// interface's default: matmul_shared per group), for the gate/up pair (Q4_K) and the down matrices (Q6_K in layer 1).
TEST(MoeArch, GroupedExpertGemmsEqualGroupByGroup) {
  const ExpertGroups g;
  const int E = static_cast<int>(ExpertGroups::E);
  const char* file = "gguf/tiny-llada-moe-Q4_K_M.gguf";
  expect_equal_expert_products(file, g, [&](jit::CpuExecutor& cpu, auto& ws, int m, int64_t k, auto& y1, auto& y2) {
    const std::vector<float> x = lcg_values(g.R * k, 7, 400.f);
    cpu.matmul_grouped(ws.data(), y1.data(), m, g.row0.data(), g.n.data(), E, x.data(), k);
    cpu.model::Executor::matmul_grouped(ws.data(), y2.data(), m, g.row0.data(), g.n.data(), E, x.data(), k);
  });
}

// The products over gathered rows (CpuExecutor::matmul_grouped_gather: the source rows quantised once, the
// quantised rows gathered) equal the default's (the rows gathered in f32, then matmul_grouped) bit for bit, with
// rows read by several pairs and a row read by none, in both activation formats (Q8_K, Q8_0).
TEST(MoeArch, GatheredExpertGemmsEqualGatheringTheRowsFirst) {
  const ExpertGroups g;
  const int E = static_cast<int>(ExpertGroups::E);
  const int64_t x_rows = 7;
  std::vector<int64_t> src(static_cast<size_t>(g.R));
  for (int64_t i = 0; i < g.R; ++i) src[static_cast<size_t>(i)] = (i * 5 + i / 3) % (x_rows - 1);  // row 6 unread
  for (const char* file : {"gguf/tiny-llada-moe-Q4_K_M.gguf", "gguf/tiny-llada-moe-Q8_0.gguf"}) {
    expect_equal_expert_products(file, g, [&](jit::CpuExecutor& cpu, auto& ws, int m, int64_t k, auto& y1, auto& y2) {
      const std::vector<float> x = lcg_values(x_rows * k, 11, 300.f);
      cpu.matmul_grouped_gather(ws.data(), y1.data(), m, g.row0.data(), g.n.data(), E, x.data(), x_rows, src.data(), k);
      cpu.model::Executor::matmul_grouped_gather(ws.data(), y2.data(), m, g.row0.data(), g.n.data(), E, x.data(),
                                                 x_rows, src.data(), k);
    });
  }
}

TEST(MoeRoute, SoftmaxTopKAndRenormalisation) {
  // Three rows over four experts of D = 2, against a direct computation.
  const std::vector<float> router = {1, 0, 0, 1, -1, 0, 0.5f, 0.5f};
  const std::vector<float> h = {2, 1, -1, 3, 0, 0};
  for (bool norm : {false, true}) {
    std::vector<int32_t> ids(6);
    std::vector<float> w(6), p(12);
    model::moe_route(router, h.data(), 3, 2, 4, 2, norm, ids.data(), w.data(), p.data());
    for (int r = 0; r < 3; ++r) {
      double l[4], sum = 0;
      for (int e = 0; e < 4; ++e) l[e] = router[e * 2] * h[r * 2] + router[e * 2 + 1] * h[r * 2 + 1];
      for (double& v : l) sum += std::exp(v);
      std::vector<int> order(4);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
      const double pa = std::exp(l[order[0]]) / sum, pb = std::exp(l[order[1]]) / sum;
      EXPECT_EQ(ids[r * 2], order[0]) << r;
      EXPECT_EQ(ids[r * 2 + 1], order[1]) << r;
      EXPECT_NEAR(w[r * 2], norm ? pa / (pa + pb) : pa, 1e-6) << r;
      EXPECT_NEAR(w[r * 2 + 1], norm ? pb / (pa + pb) : pb, 1e-6) << r;
      for (int e = 0; e < 4; ++e) EXPECT_NEAR(p[r * 4 + e], std::exp(l[e]) / sum, 1e-6);
    }
    // Row 2 is all zeros: a four-way tie, broken towards the lower index.
    EXPECT_EQ(ids[4], 0);
    EXPECT_EQ(ids[5], 1);
  }
}

// The router's logits are dot_f64 of each expert's row, bit for bit, whether it takes rows and experts four at a
// time or one (an expert count that is not a multiple of 4, a width that is not one of 8): the probabilities it writes
// equal the softmax of the dot_f64 logits as moe_route defines it.
TEST(MoeRoute, LogitsAreDotF64BitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t len : {1, 7, 8, 9, 37, 2816}) {  // dot4_f64 against dot_f64 in double
    std::vector<float> a(static_cast<size_t>(len)), b(static_cast<size_t>(4 * (len + 3)));
    for (float& v : a) v = n(rng);
    for (float& v : b) v = n(rng) * 1e3f;
    double d[4];
    model::dot4_f64(a.data(), b.data(), len + 3, len, d);
    for (int j = 0; j < 4; ++j) {
      const double want = model::dot_f64(a.data(), b.data() + j * (len + 3), len);
      ASSERT_EQ(std::memcmp(&d[j], &want, sizeof want), 0) << "n " << len << " row " << j << ": " << d[j] << " " << want;
    }
    // dot4x4_f64: four rows of a (stride len + 5) against the same four rows of b.
    std::vector<float> a4(static_cast<size_t>(4 * (len + 5)));
    for (float& v : a4) v = n(rng);
    const std::vector<double> a4d(a4.begin(), a4.end()), bd(b.begin(), b.end());
    double d16[16];
    model::dot4x4_f64(a4d.data(), len + 5, bd.data(), len + 3, len, d16);
    for (int r = 0; r < 4; ++r) {
      for (int j = 0; j < 4; ++j) {
        const double want = model::dot_f64(a4.data() + r * (len + 5), b.data() + j * (len + 3), len);
        ASSERT_EQ(std::memcmp(&d16[r * 4 + j], &want, sizeof want), 0) << "n " << len << " rows " << r << ", " << j;
      }
    }
  }
  for (auto [E, D] : {std::pair<int64_t, int64_t>{7, 37}, {128, 2816}, {4, 8}}) {
    const int64_t rows = 9;  // two groups of four (dot4x4_f64) and a last row alone
    std::vector<float> router(static_cast<size_t>(E * D)), h(static_cast<size_t>(rows * D));
    for (float& v : router) v = n(rng);
    for (float& v : h) v = n(rng);
    std::vector<int32_t> ids(static_cast<size_t>(rows * 2));
    std::vector<float> w(ids.size()), p(static_cast<size_t>(rows * E));
    model::moe_route(router, h.data(), rows, D, E, 2, false, ids.data(), w.data(), p.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> l(static_cast<size_t>(E));
      float mx = -INFINITY;
      for (int64_t e = 0; e < E; ++e) {
        l[e] = static_cast<float>(model::dot_f64(h.data() + r * D, router.data() + e * D, D));
        mx = std::max(mx, l[e]);
      }
      double sum = 0;
      for (float& v : l) sum += (v = std::exp(v - mx));
      for (int64_t e = 0; e < E; ++e)
        ASSERT_EQ(p[r * E + e], static_cast<float>(l[e] / sum)) << "E " << E << " D " << D << " row " << r << " expert " << e;
    }
  }
}

TEST(MoeArch, MissingExpertTensorIsNamed) {
  // A file whose tensor table lacks one expert tensor: the error names it (check_tensors' messages).
  const model::ModelFile f = model::ModelFile::open(moe_path("gguf/tiny-rnd1-Q8_0.gguf"));
  model::HParams hp = f.hparams();
  hp.n_ff_exp = 128;  // the experts' width the file does not have
  try {
    model::check_tensors(f.file(), hp);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "tensor shape mismatch for blk.0.ffn_gate_exps.weight: [256, 256, 8], expected [256, 128, 8]");
  }
  hp = f.hparams();
  hp.n_expert = 16;
  try {
    model::check_tensors(f.file(), hp);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor shape mismatch for blk.0.ffn_gate_inp.weight: [256, 8], expected [256, 16]");
  }
}

// A copy of a model file whose output.weight is renamed (same length, so the layout stays): the file then has
// no LM head of its own.
std::string without_output_weight(const std::string& file) {
  std::string bytes = test::read_file(moe_path("gguf/" + file + ".gguf"));
  const std::string name = "output.weight";
  std::string key(8, '\0');
  key[0] = static_cast<char>(name.size());  // the GGUF string: u64 length, then the bytes
  key += name;
  const size_t at = bytes.find(key);
  EXPECT_NE(at, std::string::npos);
  bytes[at + 8 + 5] = 'X';  // "outpuX.weight"
  const std::string path = testing::TempDir() + file + "-untied.gguf";
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// rnd1 without output.weight ties its LM head to token_embd: the logits are the final hidden states (the
// same as with the file's own head) times token_embd's rows. llada-moe requires output.weight (as llama.cpp).
TEST(MoeArch, TiedOutputUsesTheEmbedding) {
  const Choice ref{"reference", true};
  Loaded& own = load("tiny-rnd1-F32", ref);
  const Case c = load_case("tiny-rnd1-F32", kCases[0]);
  const int64_t D = own.model->hparams().n_embd, V = own.model->n_vocab();
  own.ref->width = D;
  run(own, c);
  const std::vector<float> hidden = own.ref->hidden;
  own.ref->width = 0;
  ASSERT_EQ(hidden.size(), c.rows.size() * static_cast<size_t>(D));

  model::LoadOptions o;
  o.threads = 2;
  const auto tied = model::Model::load(without_output_weight("tiny-rnd1-F32"), o);
  ASSERT_EQ(tied->tensors().output, tied->tensors().token_embd);
  const std::vector<float> got = tied->forward(c.ids, c.rows);
  const gguf::TensorInfo& emb = *tied->tensors().token_embd;
  const float* e = reinterpret_cast<const float*>(emb.data);  // F32 [D, V]
  std::vector<float> want(got.size());
  for (size_t r = 0; r < c.rows.size(); ++r)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += double(hidden[r * D + d]) * e[v * D + d];
      want[r * V + v] = static_cast<float>(acc);
    }
  EXPECT_LE(rel_l2(got.data(), want.data(), got.size()), 1e-6);

  try {
    model::Model::load(without_output_weight("tiny-llada-moe-F32"), o);
    FAIL() << "llada-moe loaded without output.weight";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "required tensor missing: output.weight");
  }
}

// ---------------------------------------------------------------- logits against llama.cpp

TEST(MoeLogits, F32WithinOneInTenThousandthOfAPercentOnEveryExecutor) {
  for (const Choice& ex : executors()) {
    for (const std::string& m : models()) {
      Loaded& l = load(m + "-F32", ex);
      for (const char* name : kCases) {
        const Case c = load_case(m + "-F32", name);
        const std::vector<float> got = run(l, c);
        ASSERT_EQ(got.size(), c.logits.size());
        const double rel = rel_l2(got.data(), c.logits.data(), got.size());
        std::printf("%-10s %-22s %-30s rel L2 %.3g\n", ex.label.c_str(), (m + "-F32").c_str(), name, rel);
        EXPECT_LE(rel, kF32Tolerance) << ex.label << " " << m << " " << name;
      }
    }
  }
}

// Quantised files on the JIT families: within 2e-2, or every row above it explained by a near-tie router
// decision that activation quantisation can flip, and fixed by flipping it.
TEST(MoeLogits, QuantisedWithinTwoPercentOrExplainedByARouterFlip) {
  const std::vector<Choice> all = executors();
  for (const Choice& ex : all) {
    if (ex.reference) continue;
    for (const std::string& m : models()) {
      for (const char* quant : {"Q8_0", "Q4_K_M"}) {
        const std::string file = m + "-" + quant;
        Loaded& l = load(file, ex);
        Loaded& ref = load(file, all[0]);  // f32 activations: the router without activation quantisation
        const int64_t E = l.model->hparams().n_expert, k = l.model->hparams().n_expert_used;
        const int64_t V = l.model->n_vocab();
        for (const char* name : kCases) {
          const Case c = load_case(file, name);
          l.flips().clear();
          const std::vector<float> got = run(l, c);
          const double rel = rel_l2(got.data(), c.logits.data(), got.size());
          std::printf("%-10s %-22s %-30s rel L2 %.3g\n", ex.label.c_str(), file.c_str(), name, rel);
          if (rel <= kQuantTolerance) continue;
          // Above the tolerance: explain every row that is.
          run(ref, c);
          const auto probs = l.probs();
          const auto ids = l.ids();
          std::vector<test::Flip> fixes;
          for (size_t i = 0; i < c.rows.size(); ++i) {
            const double row_rel = rel_l2(got.data() + i * V, c.logits.data() + i * V, static_cast<size_t>(V));
            if (row_rel <= kQuantTolerance) continue;
            const int64_t r = c.rows[i];
            l.probs() = probs, l.ids() = ids;
            const std::vector<test::Decision> near = test::decisions_by_margin(l.probs(), l.ids(), r, E, k);
            bool fixed = false;
            for (size_t j = 0; j < std::min<size_t>(3, near.size()) && !fixed; ++j) {
              const test::Decision& d = near[j];
              // What activation quantisation moves this row's router probabilities by at this layer.
              double moved = 0;
              for (int64_t e = 0; e < E; ++e) {
                moved = std::max<double>(moved, std::fabs(probs[static_cast<size_t>(d.call)][r * E + e] -
                                                          ref.probs()[static_cast<size_t>(d.call)][r * E + e]));
              }
              l.flips() = {test::Flip{d.call, r, d.selected, d.unselected}};
              const std::vector<float> flipped = run(l, c);
              const double after = rel_l2(flipped.data() + i * V, c.logits.data() + i * V, static_cast<size_t>(V));
              std::printf("  row %3lld: rel %.3g; layer %d experts %d / %d, probabilities differ by %.3g "
                          "(activation quantisation moves them by up to %.3g); flipped: rel %.3g\n",
                          static_cast<long long>(r), row_rel, d.call, d.selected, d.unselected, d.margin, moved,
                          after);
              if (after <= kQuantTolerance && d.margin < moved) {
                fixed = true;
                fixes.push_back(l.flips()[0]);
              }
            }
            EXPECT_TRUE(fixed) << ex.label << " " << file << " " << name << " row " << r
                               << ": off by more than 2e-2 without a near-tie router decision that explains it";
          }
          l.flips() = fixes;
          const std::vector<float> all_fixed = run(l, c);
          const double rel_fixed = rel_l2(all_fixed.data(), c.logits.data(), all_fixed.size());
          std::printf("  with the %zu flip(s): rel L2 %.3g\n", fixes.size(), rel_fixed);
          EXPECT_LE(rel_fixed, kQuantTolerance) << ex.label << " " << file << " " << name;
          l.flips().clear();
        }
      }
    }
  }
}

// ---------------------------------------------------------------- greedy generation

namespace {

model::GenerateConfig greedy_config(const model::Model& m) {
  model::GenerateConfig c;
  c.arch = m.arch();
  c.mask_id = m.mask_token_id();
  c.context_length = m.hparams().n_ctx;
  c.max_tokens = 32, c.steps = 16, c.block_length = 16, c.early_stop = false;
  // Both confidences are the top-1 probability (LLaDA's low_confidence, Dream's maskgit_plus).
  c.remasking = model::arch_spec(m.arch()).sampler == model::SamplerKind::Blocks ? model::Remasking::LowConfidence
                                                                                  : model::Remasking::MaskgitPlus;
  return c;
}

// The prompt of a file's first case (a dense model: the llada-moe one's; the tiny vocabularies are alike).
std::vector<int32_t> prompt_of(const std::string& file) {
  const bool moe = file.rfind("tiny-llada-moe", 0) == 0 || file.rfind("tiny-rnd1", 0) == 0;
  const Case c = load_case(moe ? file : "tiny-llada-moe-Q8_0", kCases[0]);
  return std::vector<int32_t>(c.ids.begin(), c.ids.begin() + 12);  // the case's prompt tokens
}

}  // namespace


namespace {

// A LogitSource that records every pass: the canvas, the rows and the logits.
class Recorder : public model::LogitSource {
 public:
  explicit Recorder(model::Model& m) : m_(m) {}
  int64_t n_vocab() const override { return m_.n_vocab(); }
  void forward(std::span<const int32_t> canvas, std::span<const int64_t> rows, float* out) override {
    m_.forward(canvas, rows, out);
    passes.push_back({std::vector<int32_t>(canvas.begin(), canvas.end()), std::vector<int64_t>(rows.begin(), rows.end()),
                      std::vector<float>(out, out + rows.size() * static_cast<size_t>(n_vocab()))});
  }
  struct Pass {
    std::vector<int32_t> canvas;
    std::vector<int64_t> rows;
    std::vector<float> logits;
  };
  std::vector<Pass> passes;

 private:
  model::Model& m_;
};

// Top-1 token, its softmax probability and its logit margin over the top-2 of one row.
struct Top {
  int32_t token = 0;
  double prob = 0, margin = 0;
};
Top top_of(const float* l, int64_t V) {
  int32_t a = 0, b = -1;
  for (int32_t i = 1; i < V; ++i) {
    if (l[i] > l[a]) b = a, a = i;
    else if (b < 0 || l[i] > l[b]) b = i;
  }
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(l[i]) - l[a]);
  return {a, 1.0 / sum, double(l[a]) - l[b]};
}

}  // namespace

// Greedy generation of `file` on `reference` and on every JIT family this CPU runs, each pass recorded;
// check(family, reference model, reference passes, reference result, family passes, family result).
template <class Check>
void for_each_greedy_pair(const std::string& file, const Choice& reference, Check check) {
  Loaded& ref = load(file, reference);
  const model::GenerateConfig cfg = greedy_config(*ref.model);
  const std::vector<int32_t> prompt = prompt_of(file);
  Recorder want_src(*ref.model);
  const model::GenerateResult want = model::generate(want_src, cfg, prompt);
  for (const Choice& ex : executors()) {
    if (ex.reference) continue;
    Loaded& l = load(file, ex);
    Recorder got_src(*l.model);
    const model::GenerateResult got = model::generate(got_src, cfg, prompt);
    check(ex, ref, want_src, want, got_src, got);
  }
}

// Greedy generation on the tiny models equals the reference executor's token for token on every JIT
// family: the reference with the JIT's arithmetic (int8 activations, as llama.cpp), which differs from the
// JIT's only in the float rounding of sums (and so, rarely, in an activation's int8 rounding). Every pass's
// logits are compared too. The dense tiny models as well.
TEST(MoeGenerate, GreedyTokensEqualTheInt8ReferenceTokenForToken) {
  for (const std::string m : {"tiny-llada-moe", "tiny-rnd1", "tiny-llada", "tiny-dream"}) {
    for (const char* quant : {"F32", "Q8_0", "Q4_K_M"}) {
      const std::string file = m + "-" + quant;
      for_each_greedy_pair(file, kInt8Reference, [&](const Choice& ex, Loaded&, const Recorder& want_src,
                                                     const model::GenerateResult& want, const Recorder& got_src,
                                                     const model::GenerateResult& got) {
        EXPECT_EQ(got.canvas, want.canvas) << ex.label << " " << file;
        ASSERT_EQ(got_src.passes.size(), want_src.passes.size()) << ex.label << " " << file;
        double worst = 0;
        int parted = 0;  // passes that saw different canvases (an order of commits that parted and met again)
        for (size_t i = 0; i < want_src.passes.size(); ++i) {
          const auto& a = want_src.passes[i];
          const auto& b = got_src.passes[i];
          if (a.canvas != b.canvas || a.rows != b.rows) {
            ++parted;
            continue;
          }
          worst = std::max(worst, rel_l2(b.logits.data(), a.logits.data(), a.logits.size()));
        }
        // Same arithmetic: the order and precision of float sums differ, and where that moves an activation
        // across an int8 rounding boundary, the logits move by up to about 1e-2 on these tiny random models
        // (a relative 1e-7 nudge of the reference's own activations moves them as much: docs/correctness.md).
        EXPECT_LE(worst, kQuantTolerance) << ex.label << " " << file;
        // The mixtures of experts: the same canvas at every pass, not only at the end.
        if (m == "tiny-llada-moe" || m == "tiny-rnd1") {
          EXPECT_EQ(parted, 0) << ex.label << " " << file;
        }
        std::printf("%-10s %-22s greedy tokens %s the int8 reference's; %d of %zu passes parted; worst pass logits %.2e\n",
                    ex.label.c_str(), file.c_str(), got.canvas == want.canvas ? "equal" : "DIFFER from", parted,
                    want_src.passes.size(), worst);
      });
    }
  }
}

// Against the f32-activation reference: the same tokens on every JIT family (F32 files: always). Where a
// quantised file's tokens part (the JIT quantises activations to int8, the reference keeps f32: the dense tiny models part the same way), the first step that decides differently
// got identical canvases and logits within 2e-2, and decided differently for a near tie: at a position
// both commit, the reference's top-1/top-2 logit margin is below that row's largest logit difference
// between the executors; for positions only one commits, their confidences (top-1 probabilities) differ
// by less than the confidences moved between the executors.
TEST(MoeGenerate, GreedyTokensEqualTheReferenceOrPartAtANearTie) {
  const std::vector<Choice> all = executors();
  for (const std::string& m : models()) {
    for (const char* quant : {"F32", "Q8_0", "Q4_K_M"}) {
      const std::string file = m + "-" + quant;
      for_each_greedy_pair(file, all[0], [&](const Choice& ex, Loaded& ref, const Recorder& want_src,
                                             const model::GenerateResult& want, const Recorder& got_src,
                                             const model::GenerateResult& got) {
        const int64_t V = ref.model->n_vocab(), shift = ref.model->shift_logits() ? 1 : 0;
        if (got.canvas == want.canvas) {
          std::printf("%-10s %-22s greedy tokens equal the reference's\n", ex.label.c_str(), file.c_str());
          return;
        }
        EXPECT_NE(std::string(quant), "F32") << ex.label << " " << file << ": F32 tokens differ";
        // The first pass after which the canvases part: both saw the same canvas.
        const auto& A = want_src.passes;
        const auto& B = got_src.passes;
        size_t i = 0;
        auto next_canvas = [&](const std::vector<Recorder::Pass>& p, const model::GenerateResult& r, size_t k) {
          return k + 1 < p.size() ? p[k + 1].canvas : r.canvas;
        };
        while (i < std::min(A.size(), B.size()) && next_canvas(A, want, i) == next_canvas(B, got, i)) ++i;
        ASSERT_LT(i, std::min(A.size(), B.size())) << ex.label << " " << file;
        ASSERT_EQ(A[i].canvas, B[i].canvas);
        ASSERT_EQ(A[i].rows, B[i].rows);
        const double rel = rel_l2(B[i].logits.data(), A[i].logits.data(), A[i].logits.size());
        EXPECT_LE(rel, kQuantTolerance) << ex.label << " " << file << " pass " << i;
        const std::vector<int32_t> ca = next_canvas(A, want, i), cb = next_canvas(B, got, i);
        auto row_of = [&](int64_t pos) -> int64_t {
          const auto it = std::find(A[i].rows.begin(), A[i].rows.end(), pos - shift);
          return it == A[i].rows.end() ? -1 : it - A[i].rows.begin();
        };
        // How far the two executors' logits and confidences of this pass are apart.
        double conf_moved = 0;
        for (size_t r = 0; r < A[i].rows.size(); ++r) {
          conf_moved = std::max(conf_moved, std::fabs(top_of(A[i].logits.data() + r * V, V).prob -
                                                       top_of(B[i].logits.data() + r * V, V).prob));
        }
        std::vector<int64_t> only_a, only_b;
        int explained = 0;
        for (size_t p = 0; p < ca.size(); ++p) {
          const bool a_new = ca[p] != A[i].canvas[p], b_new = cb[p] != A[i].canvas[p];
          if (a_new && b_new && ca[p] != cb[p]) {  // both commit the position, different tokens
            const int64_t r = row_of(static_cast<int64_t>(p));
            ASSERT_GE(r, 0);
            const float* la = A[i].logits.data() + r * V;
            const float* lb = B[i].logits.data() + r * V;
            double moved = 0;
            for (int64_t t = 0; t < V; ++t) moved = std::max<double>(moved, std::fabs(la[t] - lb[t]));
            const double margin = top_of(la, V).margin;
            std::printf("%-10s %-22s pass %zu position %zu: tokens %d / %d, logit margin %.3g, logits moved %.3g\n",
                        ex.label.c_str(), file.c_str(), i, p, ca[p], cb[p], margin, moved);
            EXPECT_LT(margin, moved) << ex.label << " " << file << " position " << p;
            ++explained;
          } else if (a_new != b_new) {
            (a_new ? only_a : only_b).push_back(static_cast<int64_t>(p));
          }
        }
        for (int64_t pa : only_a) {
          for (int64_t pb : only_b) {
            const double gap = std::fabs(top_of(A[i].logits.data() + row_of(pa) * V, V).prob -
                                         top_of(A[i].logits.data() + row_of(pb) * V, V).prob);
            std::printf("%-10s %-22s pass %zu: positions %lld (reference) / %lld (JIT), confidences differ by %.3g, "
                        "confidences moved %.3g\n", ex.label.c_str(), file.c_str(), i, static_cast<long long>(pa),
                        static_cast<long long>(pb), gap, conf_moved);
            EXPECT_LT(gap, conf_moved) << ex.label << " " << file;
            ++explained;
          }
        }
        EXPECT_GT(explained, 0) << ex.label << " " << file << ": the canvases part without a differing decision";
      });
    }
  }
}

// ---------------------------------------------------------------- the command line on the MoE files

TEST(MoeCli, InspectTokenizeLogitsRunKernels) {
  const std::string llada = moe_path("gguf/tiny-llada-moe-F32.gguf"), rnd1 = moe_path("gguf/tiny-rnd1-Q4_K_M.gguf");
  test::RunResult r = test::run_dllm({"inspect", rnd1});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rnd1.expert_used_count: u32 = 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blk.0.ffn_gate_exps.weight"), std::string::npos) << r.out;

  // Chat templates: llada-moe as LLaDA's (BOS, Llama-3 headers), rnd1 as ChatML; --no-chat as llama.cpp.
  r = test::run_dllm({"tokenize", "--model", llada, "--prompt", "hello"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("1012 ", 0), 0u) << r.out;  // BOS first
  r = test::run_dllm({"tokenize", "--model", rnd1, "--prompt", "hello", "--no-chat"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("1017"), std::string::npos) << r.out;  // no <|im_start|>

  // logits: the F32 file's first case, within 1e-5 of llama.cpp's.
  const Case c = load_case("tiny-llada-moe-F32", kCases[0]);
  std::string ids, rows;
  for (int32_t t : c.ids) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  for (int64_t p : c.rows) rows += (rows.empty() ? "" : ",") + std::to_string(p);
  const std::string out = testing::TempDir() + "moe_logits.f32";
  r = test::run_dllm({"logits", "--model", llada, "--tokens", ids, "--rows", rows, "--out", out, "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string bytes = test::read_file(out);
  ASSERT_EQ(bytes.size(), c.logits.size() * sizeof(float));
  EXPECT_LE(rel_l2(reinterpret_cast<const float*>(bytes.data()), c.logits.data(), c.logits.size()), kF32Tolerance);

  // run: both samplers.
  r = test::run_dllm({"run", "--model", llada, "--prompt", "hi", "--max-tokens", "8", "--block-length", "8",
                      "--steps", "4", "--threads", "2", "--verbose"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("sampler: low_confidence"), std::string::npos) << r.err;
  r = test::run_dllm({"run", "--model", rnd1, "--prompt", "hi", "--max-tokens", "8", "--steps", "4", "--threads", "2",
                      "--verbose"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("sampler: entropy"), std::string::npos) << r.err;

  // DLLM_EXECUTOR=reference-int8: the reference executor with int8 activations; its logits of a quantised file
  // are the JIT's up to float rounding, while the f32-activation reference's are 1e-2 away. An unknown
  // DLLM_EXECUTOR is a usage error naming the variable.
  {
    const std::string q8 = moe_path("gguf/tiny-llada-moe-Q8_0.gguf");
    const Case cq = load_case("tiny-llada-moe-Q8_0", kCases[0]);
    std::string qids, qrows;
    for (int32_t t : cq.ids) qids += (qids.empty() ? "" : ",") + std::to_string(t);
    for (int64_t p : cq.rows) qrows += (qrows.empty() ? "" : ",") + std::to_string(p);
    auto logits_with = [&](const char* executor) {
      if (executor) setenv("DLLM_EXECUTOR", executor, 1);
      const std::string o = testing::TempDir() + "moe_q8_logits.f32";
      const test::RunResult rr = test::run_dllm({"logits", "--model", q8, "--tokens", qids, "--rows", qrows, "--out", o});
      unsetenv("DLLM_EXECUTOR");
      EXPECT_EQ(rr.exit_code, 0) << rr.err;
      const std::string raw = test::read_file(o);
      std::vector<float> v(raw.size() / sizeof(float));
      std::memcpy(v.data(), raw.data(), v.size() * sizeof(float));
      return v;
    };
    const std::vector<float> jit = logits_with(nullptr), int8 = logits_with("reference-int8"), f32 = logits_with("reference");
    ASSERT_EQ(jit.size(), cq.logits.size());
    ASSERT_EQ(int8.size(), jit.size());
    ASSERT_EQ(f32.size(), jit.size());
    EXPECT_LT(rel_l2(jit.data(), int8.data(), jit.size()), 1e-5);
    EXPECT_GT(rel_l2(jit.data(), f32.data(), jit.size()), 1e-3);
    setenv("DLLM_EXECUTOR", "reference-nonsense", 1);
    const test::RunResult bad =
        test::run_dllm({"logits", "--model", q8, "--tokens", qids, "--rows", qrows, "--out", testing::TempDir() + "x.f32"});
    unsetenv("DLLM_EXECUTOR");
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.err.find("DLLM_EXECUTOR must be jit, reference or reference-int8, got 'reference-nonsense'"),
              std::string::npos) << bad.err;
  }

  // kernels: the expert tensors' GEMMs are generated (one shape for all experts); routers are not matrices.
  const std::string dir = testing::TempDir() + "moe_kernels";
  r = test::run_dllm({"kernels", "--model", rnd1, "--out", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string manifest = test::read_file(dir + "/manifest.json");
  EXPECT_NE(manifest.find("blk.0.ffn_down_exps.weight"), std::string::npos);
  EXPECT_EQ(manifest.find("ffn_gate_inp"), std::string::npos);
}

// Hostile numbers. A logit source whose rows hold no number (NaN, or one NaN entry among numbers): the
// samplers skip NaN, so a row without any number would commit token 0 silently. The sequence ends at that
// step instead, its result naming the position and the step, and generate() throws it; a single NaN entry
// among numbers is skipped and the run goes on.
namespace {
struct PoisonedSource : model::LogitSource {
  int64_t V = 16;
  bool all_nan = true;
  int64_t n_vocab() const override { return V; }
  void forward(std::span<const int32_t>, std::span<const int64_t> rows, float* out) override {
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t v = 0; v < V; ++v)
        out[r * V + v] = all_nan || v == 3 ? std::nanf("") : static_cast<float>((v * 7 + rows[r]) % 11);
  }
};
}  // namespace

TEST(HostileNumbers, RowsWithoutAnyNumberEndTheRunNamingThePosition) {
  model::GenerateConfig c;
  c.arch = model::Arch::LLaDA;
  c.mask_id = 15;
  c.max_tokens = 8, c.steps = 4, c.block_length = 8, c.early_stop = false;
  const std::vector<int32_t> prompt = {1, 2, 3};
  PoisonedSource src;
  model::Sequence seq(c, prompt, src.n_vocab());
  std::vector<float> logits;
  const model::StepNeed* need = seq.next();
  ASSERT_NE(need, nullptr);
  logits.resize(need->rows.size() * 16);
  src.forward(seq.canvas(), need->rows, logits.data());
  seq.commit(logits.data());
  EXPECT_TRUE(seq.finished());
  EXPECT_EQ(seq.next(), nullptr);
  EXPECT_NE(seq.result().error.find("no finite logit at step 1"), std::string::npos) << seq.result().error;
  EXPECT_NE(seq.result().error.find("canvas position 3"), std::string::npos) << seq.result().error;
  EXPECT_EQ(seq.result().committed, 0);
  for (int64_t j = 3; j < 11; ++j) EXPECT_EQ(seq.canvas()[static_cast<size_t>(j)], 15);  // nothing committed
  try {
    model::generate(src, c, prompt);
    ADD_FAILURE() << "generate() returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no finite logit"), std::string::npos) << e.what();
  }
  src.all_nan = false;  // one NaN column among numbers: skipped, never chosen
  const model::GenerateResult r = model::generate(src, c, prompt);
  EXPECT_TRUE(r.error.empty()) << r.error;
  for (int32_t t : r.generated()) EXPECT_NE(t, 3);
}

// Through the CLI: files whose router (mixtures of experts) or a norm (dense models) holds NaN or infinity,
// so that no logit is a number: exit 1 with the error, nothing on standard output, alone, with --json and
// through --prompts-file.
TEST(HostileNumbers, NonFiniteWeightsEndTheRunWithAnError) {
  const float nan = std::nanf(""), inf = INFINITY;
  const struct {
    const char* model;
    const char* tensor;
    float value;
    bool blocks;  // LLaDA's block sampler (--block-length)
  } cases[] = {{"moe/gguf/tiny-llada-moe-F32.gguf", "blk.0.ffn_gate_inp.weight", nan, true},
               {"moe/gguf/tiny-rnd1-F32.gguf", "blk.1.ffn_gate_inp.weight", inf, false},
               {"models/tiny-llada-F32.gguf", "blk.0.attn_norm.weight", nan, true},
               {"models/tiny-dream-F32.gguf", "output_norm.weight", inf, false}};
  for (const auto& k : cases) {
    SCOPED_TRACE(std::string(k.model) + " " + k.tensor);
    const std::string path = test::poisoned_model_copy(k.model, k.tensor, k.value);
    std::vector<std::string> flags = {"--max-tokens", "8", "--steps", "4"};
    if (k.blocks) flags.insert(flags.end(), {"--block-length", "8"});
    std::vector<std::string> run = {"run", "--model", path, "--prompt", "Hello"};
    run.insert(run.end(), flags.begin(), flags.end());
    for (bool json : {false, true}) {
      std::vector<std::string> a = run;
      if (json) a.push_back("--json");
      const test::RunResult r = test::run_dllm(a);
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find("no finite logit at step 1"), std::string::npos) << r.err;
      EXPECT_EQ(r.out, "");
    }
    const std::string prompts = path + ".jsonl";
    std::ofstream(prompts) << "{\"prompt\": \"Hello\"}\n{\"prompt\": \"Hi\"}\n";
    std::vector<std::string> a = {"run", "--model", path, "--prompts-file", prompts};
    a.insert(a.end(), flags.begin(), flags.end());
    const test::RunResult r = test::run_dllm(a);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("request 0: the model gave canvas position"), std::string::npos) << r.err;
    std::remove(prompts.c_str());
    std::remove(path.c_str());
  }
}
