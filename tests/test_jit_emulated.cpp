// Every kernel family on every CPU: the generated GEMM kernels of avx2, avx-vnni, avx512-vnni and amx run in
// the x86 interpreter of x86_emu.h, at every row tile the GEMM driver plans, on shapes with tails, for every
// type of the weight table, and must give exactly the portable family's bits (the float contract of
// kernel_order.h that every family keeps). Where this CPU has the family the kernel also runs natively
// and the interpreter must agree with the silicon bit for bit, which checks the interpreter itself.
// Also the weights of the tiny mixture-of-experts fixtures (Q4_K_M: Q4_K, Q5_K, Q6_K and Q8_0 matrices,
// experts included), so the families this CPU cannot run are checked on real model files too.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/thread_pool.h"
#include "jit/cpu_executor.h"
#include "jit/gemm.h"
#include "jit/kernel_cache.h"
#include "jit/x64/amx_gemm.h"
#include "jit/x64/gemm_gen.h"
#include "model/arch.h"
#include "model/generate.h"
#include "model/gguf.h"
#include "model/model.h"
#include "support.h"
#include "test_jit_util.h"
#include "x86_emu.h"

using namespace dllm;
using namespace dllm::jit;
using namespace dllm::jit::test;

namespace {

const Isa kFamilies[] = {Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Amx};

// The code of one kernel, generated without asking the CPU (generate_kernel refuses a family it lacks).
std::unique_ptr<JitGenerator> generate_any(const GemmDesc& d) {
  std::unique_ptr<JitGenerator> gen;
  if (d.isa == Isa::Amx) gen = std::make_unique<AmxGemmGenerator>(d);
  else if (d.isa == Isa::Avx512Vnni) gen = std::make_unique<GemmGenerator<Xbyak::Zmm>>(d);
  else gen = std::make_unique<GemmGenerator<Xbyak::Ymm>>(d);
  gen->create();
  return gen;
}

struct Outcome {
  std::vector<float> emulated, native;  // native is empty where the CPU lacks the family
  int64_t instructions = 0;
};

// The GEMM of rows activation rows by the matrix m (family m.isa): per planned row tile, the kernel over two
// runs of panels, with and without the software prefetch.
Outcome run_family(const QuantMatrix& m, const QuantizedActs& a, bool prefetch) {
  Outcome out;
  const bool native = cpu_features().supports(m.isa);
  out.emulated.assign(a.rows * m.n, std::nanf(""));
  if (native) out.native.assign(a.rows * m.n, std::nanf(""));
  dllm::test::X86Emulator emu;
  for (RowTile tile : plan_row_tiles(m.isa, m.type, m.n, m.k, a.rows)) {
    tile.desc.prefetch = tile.desc.prefetch || prefetch;
    const std::unique_ptr<JitGenerator> gen = generate_any(tile.desc);
    // Two calls as the driver makes them (gemm.cpp's run_item): the first half of the panels, then the rest
    // from a panel offset, ending on the partial panel (one call when there is one panel).
    const int64_t P = m.layout.n_panels, half = P / 2;
    const std::vector<std::pair<int64_t, int64_t>> runs =
        half > 0 ? std::vector<std::pair<int64_t, int64_t>>{{0, half}, {half, P - half}}
                 : std::vector<std::pair<int64_t, int64_t>>{{0, P}};
    for (const auto& [p0, np] : runs) {
      GemmKernelArgs args{};
      args.w = m.packed.data() + p0 * m.layout.panel_bytes;
      args.n_panels = np;
      args.tail_cols = p0 + np == P ? m.n - (P - 1) * m.layout.p : m.layout.p;
      point_at_rows(args, a, tile.desc.isa, tile.r0);
      args.y = out.emulated.data() + tile.r0 * m.n + p0 * m.layout.p;
      emu.call(gen->code(), &args);
      out.instructions += emu.instructions();
      if (native && cpu_features().supports(tile.desc.isa)) {
        args.y = out.native.data() + tile.r0 * m.n + p0 * m.layout.p;
        reinterpret_cast<GemmKernelFn>(const_cast<uint8_t*>(gen->code()))(&args);
      }
    }
  }
  return out;
}

// The first difference of two results bit for bit, or "".
std::string first_difference(const std::vector<float>& got, const std::vector<float>& want, int64_t n) {
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return "row " + std::to_string(i / n) + " col " + std::to_string(i % n) + ": " + std::to_string(got[i]) +
             " vs " + std::to_string(want[i]);
  return "";
}

// One matrix (ggml rows w) by random activation rows on every family: emulated == portable (== native).
void check_matrix(GgmlType t, int64_t n, int64_t k, const uint8_t* w, int64_t rows, std::mt19937& rng,
                  ThreadPool& pool, const std::string& what) {
  const std::vector<float> x = random_acts(rows, k, rng);
  QuantizedActs a;
  quantize_acts(act_format_for(t), x.data(), rows, k, a, pool);
  const QuantMatrix ref = prepare_matrix(t, k, n, w, Isa::Portable, pool);
  std::vector<float> want(rows * n, std::nanf(""));
  gemm(ref, a, want.data(), pool);
  for (Isa isa : kFamilies) {
    const WeightTypeTraits* traits = weight_traits(t);
    ASSERT_NE(traits, nullptr);
    const QuantMatrix m = prepare_matrix(t, k, n, w, isa, pool);
    if (isa == Isa::Amx) build_amx_tiles(a, pool);
    for (bool prefetch : {false, true}) {
      SCOPED_TRACE(what + " on " + isa_name(isa) + (prefetch ? " (prefetching)" : "") + ", " + std::to_string(rows) +
                   " rows");
      const Outcome o = run_family(m, a, prefetch);
      EXPECT_GT(o.instructions, 0);
      EXPECT_EQ(first_difference(o.emulated, want, n), "") << "emulated kernel vs the portable family";
      if (!o.native.empty()) {
        EXPECT_EQ(first_difference(o.emulated, o.native, n), "") << "emulator vs this CPU";
      }
    }
  }
}

}  // namespace

// The interpreter models what the kernels rely on: a scalar loop with flags, and VEX/EVEX vector semantics
// with write masks and embedded broadcasts, checked here on hand-assembled code against known answers; an
// instruction outside the subset is an error naming it.
TEST(X86Emulator, RunsHandWrittenCode) {
  struct Gen : Xbyak::CodeGenerator {
    Gen() {
      // out[0..15] = 10 x 3 (a counted loop of vpaddd), then on lanes 0-3 only (k1) a vpdpbusd of the
      // unsigned bytes {2, 255, 1, 0} with the broadcast signed bytes {1, 2, 3, -4}: 2 + 510 + 3 = 515;
      // y[4..11] = fma(y[0], y[1], y[2]) (vfmadd213ps).
      mov(rax, ptr[rdi]);
      mov(rcx, 10);
      vpxord(zmm0, zmm0, zmm0);
      mov(edx, 3);
      vpbroadcastd(zmm1, edx);
      L("loop");
      vpaddd(zmm0, zmm0, zmm1);
      dec(rcx);
      jnz("loop");
      mov(edx, 0x000f);
      kmovw(k1, edx);
      vpbroadcastd(zmm2, ptr[rdi + 8]);
      vpdpbusd(zmm0 | k1, zmm2, ptr_b[rdi + 12]);
      vmovdqu32(ptr[rax], zmm0);
      mov(rdx, ptr[rdi + 16]);
      vbroadcastss(ymm3, ptr[rdx]);
      vbroadcastss(ymm4, ptr[rdx + 4]);
      vbroadcastss(ymm5, ptr[rdx + 8]);
      vfmadd213ps(ymm3, ymm4, ymm5);
      vmovups(ptr[rdx + 16], ymm3);
      ret();
    }
  } gen;
  struct Args {
    int32_t* out;
    uint8_t u[4];
    int8_t s[4];
    float* y;
  };
  int32_t out[16] = {};
  float y[12] = {1.5f, 3.0f, 0.25f};
  Args args{out, {2, 255, 1, 0}, {1, 2, 3, -4}, y};
  dllm::test::X86Emulator emu;
  emu.call(gen.getCode(), &args);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], i < 4 ? 30 + 515 : 30) << i;
  for (int i = 4; i < 12; ++i) EXPECT_EQ(y[i], 4.75f) << i;
  EXPECT_EQ(emu.instructions(), 5 + 3 * 10 + 12);

  struct Unknown : Xbyak::CodeGenerator {
    Unknown() {
      vpermd(ymm0, ymm1, ymm2);
      ret();
    }
  } unknown;
  try {
    emu.call(unknown.getCode(), &args);
    ADD_FAILURE() << "vpermd ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vpermd"), std::string::npos) << e.what();
  }
}

TEST(JitEmulated, EveryFamilyMatchesThePortableBits) {
  const struct {
    GgmlType type;
    int64_t rows, n, k;
  } shapes[] = {
      {GgmlType::Q4_K, 1, 16, 256},   {GgmlType::Q4_K, 7, 33, 512},  {GgmlType::Q4_K, 17, 40, 256},
      {GgmlType::Q4_K, 35, 5, 512},   {GgmlType::Q4_K, 17, 40, 1024},  // amx: first, middle and last super-blocks
      {GgmlType::Q4_K, 12, 40, 512},  {GgmlType::Q4_K, 29, 33, 1024},  // amx: partial tiles (remainders over 8 rows)
      {GgmlType::Q5_K, 1, 16, 256},  {GgmlType::Q5_K, 7, 33, 512},
      {GgmlType::Q5_K, 12, 40, 1024}, {GgmlType::Q5_K, 29, 33, 768},  // amx: a partial tile, 16 + 13 rows
      {GgmlType::Q5_K, 17, 40, 256},  {GgmlType::Q5_K, 35, 5, 512},  {GgmlType::Q6_K, 1, 16, 256},
      {GgmlType::Q6_K, 7, 33, 512},   {GgmlType::Q6_K, 17, 40, 256}, {GgmlType::Q6_K, 35, 5, 512},
      {GgmlType::Q6_K, 5, 37, 8448},  // past kTwoVectorMaxK: one-vector panels on avx512-vnni
      {GgmlType::Q8_0, 1, 16, 32},    {GgmlType::Q8_0, 7, 33, 96},   {GgmlType::Q8_0, 17, 40, 288},
      {GgmlType::Q8_0, 35, 5, 64},    {GgmlType::Q5_0, 1, 16, 32},   {GgmlType::Q5_0, 7, 33, 96},
      {GgmlType::Q5_0, 17, 40, 704},  {GgmlType::Q5_0, 35, 5, 64},
  };
  ThreadPool pool(2);
  std::mt19937 rng(4321);
  for (const auto& s : shapes) {
    const std::vector<uint8_t> w = random_weights(s.type, s.n, s.k, rng);
    check_matrix(s.type, s.n, s.k, w.data(), s.rows, rng, pool,
                 std::string(ggml_type_name(s.type)) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
  }
}

// The matrices of the tiny mixture-of-experts fixtures as llama-quantize wrote them (Q4_K_M: Q4_K, Q5_K on the
// attention output, Q6_K, Q8_0 on attention k/v; and the Q8_0 files), on every family: each 2-D matrix,
// and the first and last expert of each 3-D expert tensor, at a few-rows tile (an expert's share of a
// canvas) and at 19 rows (a full 16-row tile and a remainder).
TEST(JitEmulated, MixtureOfExpertsFixtureMatricesOnEveryFamily) {
  ThreadPool pool(2);
  std::mt19937 rng(77);
  int checked = 0;
  for (const char* file : {"tiny-llada-moe-Q4_K_M", "tiny-rnd1-Q4_K_M", "tiny-llada-moe-Q8_0", "tiny-rnd1-Q8_0"}) {
    const std::unique_ptr<gguf::File> f = gguf::File::open(dllm::test::data_path(std::string("moe/gguf/") + file + ".gguf"));
    for (const gguf::TensorInfo& t : f->tensors()) {
      if (!weight_traits(t.type()) || t.n_dims < 2 || t.name == "token_embd.weight") continue;
      const int64_t k = t.ne[0], n = t.ne[1], experts = t.ne[2];
      for (int64_t e : {int64_t{0}, experts - 1}) {
        const uint8_t* w = t.data + static_cast<size_t>(e * n) * t.row_bytes();
        const int64_t rows = std::string_view(t.name).starts_with("output") ? 19 : 5;
        check_matrix(t.type(), n, k, w, rows, rng, pool,
                     std::string(file) + " " + std::string(t.name) + (experts > 1 ? " expert " + std::to_string(e) : ""));
        ++checked;
        if (experts == 1) break;
      }
    }
  }
  EXPECT_GE(checked, 40);
}

namespace {

// The kernel interpreter for the GEMM driver (interpret_kernel), counting its calls.
std::atomic<int64_t> g_interpreted{0};
void interpret(const uint8_t* code, const GemmKernelArgs* args) {
  dllm::test::interpret_kernel(code, args);
  ++g_interpreted;
}

// Sets it for a scope (kernels of every family then generate and run through it).
struct Interpreted {
  Interpreted() { set_kernel_interpreter(interpret); }
  ~Interpreted() { set_kernel_interpreter(nullptr); }
};

std::unique_ptr<model::Model> load_family(const std::string& file, Isa isa) {
  model::LoadOptions o;
  o.threads = 2;
  o.make_executor = [isa](ThreadPool& pool) { return std::make_unique<CpuExecutor>(pool, isa); };
  return model::Model::load(dllm::test::data_path("moe/gguf/" + file + ".gguf"), o);
}

struct LogitsCase {
  std::vector<int32_t> ids;
  std::vector<int64_t> rows;
};

LogitsCase logits_case(const std::string& file, const std::string& name) {
  const nlohmann::json j =
      nlohmann::json::parse(dllm::test::read_file(dllm::test::data_path("moe/logits/" + file + "__" + name + ".json")));
  return {j.at("ids").get<std::vector<int32_t>>(), j.at("rows").get<std::vector<int64_t>>()};
}

}  // namespace

// Whole models on every family, whatever the CPU: the tiny mixture-of-experts files (Q4_K_M: Q4_K, Q5_K,
// Q6_K and Q8_0 matrices; Q8_0), every kernel call interpreted. The logits of a llama.cpp fixture canvas
// (77 positions, a partial block at the end) are bit-identical to the portable family's, and greedy
// generations (16 tokens in 8 steps; the Q4_K_M files) give the same canvas.
TEST(JitEmulated, MixtureOfExpertsModelsBitIdenticalOnEveryFamily) {
  const Interpreted interpreted;
  for (const char* file : {"tiny-llada-moe-Q4_K_M", "tiny-rnd1-Q4_K_M", "tiny-llada-moe-Q8_0", "tiny-rnd1-Q8_0"}) {
    const std::unique_ptr<model::Model> base = load_family(file, Isa::Portable);
    model::GenerateConfig cfg;
    cfg.arch = base->arch();
    cfg.mask_id = base->mask_token_id();
    cfg.context_length = base->hparams().n_ctx;
    cfg.max_tokens = 16, cfg.steps = 8, cfg.block_length = 8, cfg.early_stop = false;
    cfg.remasking = model::arch_spec(base->arch()).sampler == model::SamplerKind::Blocks
                        ? model::Remasking::LowConfidence
                        : model::Remasking::MaskgitPlus;
    std::vector<LogitsCase> cases;
    for (const char* name : {"m2_prompt_partial_tail_len77"}) cases.push_back(logits_case(file, name));
    const bool generate = std::string_view(file).ends_with("Q4_K_M");
    const std::vector<int32_t> prompt(cases[0].ids.begin(), cases[0].ids.begin() + 12);
    std::vector<std::vector<float>> want;
    for (const LogitsCase& c : cases) want.push_back(base->forward(c.ids, c.rows));
    auto src = model::make_model_logit_source(*base);
    const model::GenerateResult want_gen = generate ? model::generate(*src, cfg, prompt) : model::GenerateResult{};
    for (Isa isa : kFamilies) {
      SCOPED_TRACE(std::string(file) + " on " + isa_name(isa));
      const std::unique_ptr<model::Model> m = load_family(file, isa);
      const int64_t calls = g_interpreted.load();
      for (size_t i = 0; i < cases.size(); ++i) {
        const std::vector<float> got = m->forward(cases[i].ids, cases[i].rows);
        EXPECT_EQ(first_difference(got, want[i], m->n_vocab()), "") << "case " << i;
      }
      EXPECT_GT(g_interpreted.load(), calls + 8) << "the kernels ran natively, not interpreted";
      if (!generate) continue;
      auto msrc = model::make_model_logit_source(*m);
      EXPECT_EQ(model::generate(*msrc, cfg, prompt).canvas, want_gen.canvas);
    }
  }
}
