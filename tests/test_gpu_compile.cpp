// Compile-level tests of the GPU backend, run on every CI machine (no GPU needed, NVRTC needed): every
// kernel generated for the tiny fixture models and for the real LLaDA-8B and Dream-7B shapes compiles
// with NVRTC for sm_80, sm_86, sm_89 and sm_90 (one translation unit per architecture, compiled in
// parallel), and the PTX holds the int8 and f16 tensor-core instructions the design promises; the
// embedded kernel text equals the .cuh files; NVRTC errors name the unit and carry the log; and the
// on-disk kernel cache keys, stores atomically and finds its entries.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <unistd.h>
#include <string>
#include <vector>

#include "cli/commands_gpu.h"
#include "jit/cuda/disk_cache.h"
#include "jit/cuda/kernel_set.h"
#include "jit/cuda/kernel_text.h"
#include "jit/cuda/nvrtc.h"
#include "model/arch.h"
#include "common/error.h"
#include "model/gguf.h"
#include "support.h"

namespace dllm::test {
namespace {

namespace fs = std::filesystem;
namespace jc = dllm::jit::cuda;

model::HParams llada_8b() {
  model::HParams hp;
  hp.arch = model::Arch::LLaDA;
  hp.n_layer = 32;
  hp.n_embd = 4096;
  hp.n_head = 32;
  hp.n_head_kv = 32;
  hp.head_dim = 128;
  hp.n_ff = 12288;
  hp.n_vocab = 126464;
  hp.n_rot = 128;
  hp.n_ctx = 4096;
  hp.rope_style = model::RopeStyle::Norm;
  return hp;
}

model::HParams dream_7b() {
  model::HParams hp;
  hp.arch = model::Arch::Dream;
  hp.n_layer = 28;
  hp.n_embd = 3584;
  hp.n_head = 28;
  hp.n_head_kv = 4;
  hp.head_dim = 128;
  hp.n_ff = 18944;
  hp.n_vocab = 152064;
  hp.n_rot = 128;
  hp.n_ctx = 131072;
  hp.rope_style = model::RopeStyle::Neox;
  hp.qkv_bias = true;
  return hp;
}

// Every kernel of the six quantised tiny fixtures (from their files; diffusion-gemma's with key ranges) in every weight
// format (Q5_K and Q5_0 included), and of the two real shapes in Q4_K, Q6_K and Q8_0 (Q5_K and Q5_0 run the same code as
// Q4_K and Q8_0 with other constants: their tiny shapes cover them, and the unit compiles in a few minutes).
jc::KernelSet all_kernels() {
  jc::KernelSet set;
  for (const char* name : {"tiny-llada-Q8_0", "tiny-llada-Q4_K_M", "tiny-dream-Q8_0", "tiny-dream-Q4_K_M"}) {
    const auto file = gguf::File::open(data_path(std::string("models/") + name + ".gguf"));
    const model::HParams hp = model::read_hparams(*file);
    set.add(jc::kernels_for_model(hp, model::check_tensors(*file, hp)));
    set.add(jc::kernels_for_hparams(hp, {jc::WeightFormat::Q8_0, jc::WeightFormat::Q4_K, jc::WeightFormat::Q5_K, jc::WeightFormat::Q6_K, jc::WeightFormat::Q5_0}));
  }
  for (const char* name : {"tiny-diffusion-gemma-A-Q8_0", "tiny-diffusion-gemma-A-Q4_K_M"}) {  // both head geometries
    const auto file = gguf::File::open(data_path(std::string("diffusion-gemma/gguf/") + name + ".gguf"));
    const model::HParams hp = model::read_hparams(*file);
    set.add(jc::kernels_for_model(hp, model::check_tensors(*file, hp)));
  }
  {  // the real DiffusionGemma's attention: 16 query heads over 8 KV heads of 256 (sliding), 2 of 512 (global)
    model::HParams hp;
    hp.n_layer = 2, hp.n_head = 16, hp.rope_style = model::RopeStyle::Neox;
    hp.layer_attn = {model::LayerAttention{8, 256, 256, 1e4f, true, false}, model::LayerAttention{2, 512, 512, 1e6f, false, true}};
    jc::add_attention_kernels(set, hp, {jc::ActFormat::Q8_K, jc::ActFormat::Q8_0});
  }
  for (const model::HParams& hp : {llada_8b(), dream_7b()}) {
    set.add(jc::kernels_for_hparams(hp, {jc::WeightFormat::Q8_0, jc::WeightFormat::Q4_K, jc::WeightFormat::Q6_K}));
  }
  return set;
}

jc::Nvrtc* nvrtc_or_null() { return jc::Nvrtc::get(); }

#define REQUIRE_NVRTC()                                                                                    \
  jc::Nvrtc* nv = nvrtc_or_null();                                                                         \
  if (!nv) GTEST_SKIP() << "NVRTC not found, GPU kernels cannot be compiled here: " << jc::Nvrtc::load_error()

TEST(GpuKernelText, EmbeddedTextMatchesTheCuhFiles) {
  const fs::path dir = fs::path(DLLM_TEST_DATA).parent_path().parent_path() / "src/jit/cuda/kernels";
  ASSERT_TRUE(fs::exists(dir)) << dir;
  size_t cuh = 0;
  for (const auto& e : fs::directory_iterator(dir)) cuh += e.path().extension() == ".cuh";
  ASSERT_EQ(jc::kernel_files().size(), cuh) << "every .cuh file is embedded (CMakeLists.txt: DLLM_CUDA_KERNEL_FILES)";
  for (const jc::KernelFile& f : jc::kernel_files()) {
    EXPECT_EQ(read_file((dir / std::string(f.name)).string()), std::string(f.text))
        << f.name << " differs from the embedded text: the build did not re-embed it (cmake/embed_kernels.cmake)";
  }
}

TEST(GpuKernelSet, NamesSourceAndShapesOfTheRealModels) {
  const jc::KernelSet set = jc::kernels_for_hparams(llada_8b(), {jc::WeightFormat::Q4_K});
  const std::vector<std::string> names = set.names();
  for (const char* n : {"dllm_gemm_q4_k_n4096_k4096", "dllm_gemm_q4_k_n12288_k4096", "dllm_gemm_q4_k_n4096_k12288",
                        "dllm_gemm_q4_k_n126464_k4096", "dllm_quant_rmsnorm_q8_k_k4096", "dllm_quant_swiglu_q8_k_k12288",
                        "dllm_pack_h32_d128_r128_norm", "dllm_pack_h32_d128_r128_none_t", "dllm_attn_h32_kv32_d128",
                        "dllm_packqkv_h32_kv32_d128_r128_norm"}) {
    EXPECT_TRUE(set.contains(n)) << n;
    EXPECT_NE(set.source().find(std::string("void __launch_bounds__(")), std::string::npos);
    EXPECT_NE(set.source().find(std::string(n) + "("), std::string::npos) << n;
  }
  EXPECT_TRUE(jc::kernels_for_hparams(dream_7b(), {jc::WeightFormat::Q6_K}).contains("dllm_attn_h28_kv4_d128"));
  EXPECT_TRUE(jc::kernels_for_hparams(dream_7b(), {jc::WeightFormat::Q6_K}).contains("dllm_pack_h4_d128_r128_neox"));
  // Deterministic text and unit name; a different set gives a different name.
  EXPECT_EQ(set.source(), jc::kernels_for_hparams(llada_8b(), {jc::WeightFormat::Q4_K}).source());
  EXPECT_NE(set.unit_name(), jc::kernels_for_hparams(dream_7b(), {jc::WeightFormat::Q4_K}).unit_name());
  // The tiled GEMMs of every format: the wide tiling covers 128 columns and 64 rows per block of 256 threads, with a
  // pipeline of three stages of 256 values of k in dynamic shared memory (two on sm_86 / sm_89, whose blocks get at most
  // 99 KiB). A stage: 16 KiB of activations, 128 weight records (Q4_K 144 bytes, Q5_K 176, Q6_K 208 and its d, Q8_0 272,
  // Q5_0 176), 2 KiB of activation sums or scales; then the decoded table. When that grid has fewer blocks than the GPU
  // has SMs, or its stages do not fit (Q8_0 on sm_86 / sm_89), the split tiling (32 x 64, plus 24 KiB to exchange the
  // warps' sums) takes over.
  for (auto [f, bytes] : {std::pair{jc::WeightFormat::Q4_K, 3u * (16384 + 128 * 144 + 2048) + 128 * 48},
                          std::pair{jc::WeightFormat::Q5_K, 3u * (16384 + 128 * 176 + 2048) + 128 * 48},
                          std::pair{jc::WeightFormat::Q6_K, 3u * (16384 + 128 * 208 + 2048 + 512) + 128 * 64},
                          std::pair{jc::WeightFormat::Q8_0, 3u * (16384 + 128 * 272 + 2048) + 128 * 32},
                          std::pair{jc::WeightFormat::Q5_0, 3u * (16384 + 128 * 176 + 2048) + 128 * 32}}) {
    SCOPED_TRACE(jc::weight_format_name(f));
    const jc::GemmDesc big{f, 126464, 4096}, small{f, 4096, 4096};
    const jc::Launch t = jc::gemm_launch(big, 65, 90, 132);
    EXPECT_EQ(t.grid_x, 988u);
    EXPECT_EQ(t.grid_y, 2u);
    EXPECT_EQ(t.block_x, 256u);
    EXPECT_EQ(t.shared_bytes, bytes);
    EXPECT_EQ(jc::gemm_kernel_name(big, 65, 90, 132), big.name());
    EXPECT_LE(t.shared_bytes, 227u * 1024) << "an H100/H200 block";
    // 4096 columns at 65 rows: 32 x 2 wide blocks on 132 SMs, so 64 x 4 split blocks.
    const jc::Launch sp = jc::gemm_launch(small, 65, 90, 132);
    EXPECT_EQ(jc::gemm_kernel_name(small, 65, 90, 132), small.name() + "_split");
    EXPECT_EQ(sp.grid_x, 64u);
    EXPECT_EQ(sp.grid_y, 4u);
    EXPECT_EQ(sp.block_x, 256u);
    EXPECT_EQ(jc::gemm_kernel_name(small, 65, 90, 0), small.name()) << "no SM count: the wide tiling";
    EXPECT_EQ(jc::gemm_kernel_name(big, 5, 90, 132), big.name() + "_small");
    for (int arch : {80, 86, 89, 90}) {
      const unsigned limit = arch == 90 ? 227u * 1024 : arch == 80 ? 163u * 1024 : 99u * 1024;
      for (int64_t rows : {5, 65}) {
        for (const jc::GemmDesc& d : {big, small}) {
          SCOPED_TRACE("sm_" + std::to_string(arch) + " " + std::to_string(rows) + " rows, " + d.name());
          EXPECT_LE(jc::gemm_launch(d, rows, arch, 132).shared_bytes, limit);
        }
      }
      const bool wide = jc::gemm_kernel_name(big, 65, arch, 132) == big.name();
      EXPECT_EQ(wide, !(f == jc::WeightFormat::Q8_0 && (arch == 86 || arch == 89))) << "sm_" << arch;
    }
  }
  EXPECT_EQ(jc::attn_launch(jc::AttnDesc{28, 4, 128}, 65).grid_x, 2u);
}

TEST(GpuKernelSet, ModelsWithoutGpuKernelsAreNamed) {
  const auto file = gguf::File::open(data_path("models/tiny-llada-F32.gguf"));
  const model::HParams hp = model::read_hparams(*file);
  const model::ModelTensors t = model::check_tensors(*file, hp);
  const std::string err = jc::gpu_support_error(t);
  EXPECT_EQ(err.rfind("tensor blk.0.attn_q.weight is F32: the GPU backend has matrix kernels for Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0", 0),
            0u)
      << err;
  EXPECT_THROW(jc::kernels_for_model(hp, t), Error);
}

TEST(GpuCompile, NvrtcTargetsTheRequiredArchitectures) {
  REQUIRE_NVRTC();
  for (int arch : {80, 86, 89, 90}) EXPECT_TRUE(nv->supports(arch)) << "NVRTC " << nv->version_string() << " lacks sm_" << arch;
}

TEST(GpuCompile, EveryKernelCompilesForSm80Sm86Sm89Sm90WithTensorCoreInstructions) {
  REQUIRE_NVRTC();
  const jc::KernelSet set = all_kernels();
  const std::string source = set.source();
  const std::vector<std::string> names = set.names();
  ASSERT_GE(names.size(), 60u);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::future<jc::CompiledUnit>> jobs;
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"}) {
    jobs.push_back(std::async(std::launch::async, [&, arch] { return nv->compile(source, set.unit_name(), arch); }));
  }
  for (auto& job : jobs) {
    const jc::CompiledUnit u = job.get();
    SCOPED_TRACE(u.target);
    EXPECT_NE(u.ptx.find(".target " + u.target), std::string::npos);
    for (const std::string& n : names) EXPECT_NE(u.ptx.find(".entry " + n + "("), std::string::npos) << n;
    // The instructions the design promises: int8 tensor cores for every projection (k32 blocks, and
    // k16 halves for Q6_K's 16-value sub-blocks) and f16 tensor cores with f32 accumulation for attention.
    EXPECT_NE(u.ptx.find("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"), std::string::npos);
    EXPECT_NE(u.ptx.find("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32"), std::string::npos);
    EXPECT_NE(u.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), std::string::npos);
    EXPECT_NE(u.ptx.find("cvt.rn.f16x2.f32"), std::string::npos);
    ASSERT_GT(u.cubin.size(), 4u);
    EXPECT_EQ(u.cubin.substr(0, 4), std::string("\x7f" "ELF"));
    EXPECT_EQ(u.log.find("error"), std::string::npos) << u.log;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("compile_seconds", std::to_string(s));
}

// ---------------------------------------------------------------- the machine code of the tiled GEMM

// cuobjdump from the CUDA toolkit, DLLM_CUOBJDUMP, or the nvidia-cuda-cuobjdump wheel that ./dllm test installs
// into build/venv; "" when none is found.
std::string find_cuobjdump() {
  if (const char* e = std::getenv("DLLM_CUOBJDUMP"); e && *e) return e;
  std::vector<fs::path> candidates = {"/usr/local/cuda/bin/cuobjdump"};
  const fs::path lib = fs::path(DLLM_BUILD_DIR) / "venv" / "lib";
  std::error_code ec;
  if (fs::is_directory(lib, ec)) {
    for (const auto& py : fs::directory_iterator(lib, ec)) {
      const fs::path nv = py.path() / "site-packages" / "nvidia";
      if (!fs::is_directory(nv, ec)) continue;
      for (const auto& cu : fs::directory_iterator(nv, ec)) candidates.push_back(cu.path() / "bin" / "cuobjdump");
    }
  }
  // `cuobjdump -sass` runs nvdisasm: beside it (the wheels' layout, the toolkit's), or where NVDISASM_PATH says.
  const char* nvd = std::getenv("NVDISASM_PATH");
  for (const fs::path& c : candidates) {
    if (fs::exists(c, ec) && ((nvd && *nvd) || fs::exists(c.parent_path() / "nvdisasm", ec))) return c.string();
  }
  return "";
}

std::string run_output(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

struct SassInstr {
  long addr = 0;
  std::string op;     // opcode with modifiers, predicate dropped: "IMMA.16832.S8.U8"
  long target = -1;   // branch target
};

// The instructions of each function in `cuobjdump -sass` output.
std::map<std::string, std::vector<SassInstr>> parse_sass(const std::string& text) {
  std::map<std::string, std::vector<SassInstr>> fns;
  std::vector<SassInstr>* cur = nullptr;
  std::istringstream in(text);
  std::string line;
  const std::regex fn_re(R"(Function : (\S+))");
  const std::regex ins_re(R"(^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);)");
  const std::regex bra_re(R"(0x([0-9a-f]+))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, fn_re)) {
      cur = &fns[m[1]];
      continue;
    }
    if (!cur || !std::regex_search(line, m, ins_re)) continue;
    SassInstr i;
    i.addr = std::stol(m[1], nullptr, 16);
    i.op = m[2];
    const std::string rest = m[3];
    std::smatch b;
    if (i.op.rfind("BRA", 0) == 0 && std::regex_search(rest, b, bra_re)) i.target = std::stol(b[1], nullptr, 16);
    cur->push_back(i);
  }
  return fns;
}

// The tiled GEMMs (every format) as NVRTC compiles them for sm_90, sm_80, sm_86 and sm_89 (two stages), disassembled: the
// innermost loop (the one that multiplies) issues at least one IMMA per 10 instructions (the per-32 types, which
// scale every block of 32 in float: per_imma below) with no branch but its back edge (no ladder); the
// k-loop around it fills the pipeline with LDGSTS (cp.async) and the multiply loop reads the nibbles with LDSM;
// no indirect branch; at most 128 registers (255 for a grouped launch, one block per SM) and no local memory (no spills).
TEST(GpuSass, TiledGemmMainLoop) {
  REQUIRE_NVRTC();
  const std::string cuobjdump = find_cuobjdump();
  if (cuobjdump.empty()) {
    GTEST_SKIP() << "no cuobjdump with nvdisasm beside it (CUDA toolkit, DLLM_CUOBJDUMP, or build/venv's "
                    "nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm)";
  }
  jc::KernelSet set;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 4096}, {12288, 4096}, {4096, 12288}}) {
    set.add(jc::GemmDesc{jc::WeightFormat::Q4_K, n, k});
    set.add(jc::GemmDesc{jc::WeightFormat::Q5_K, n, k});
    set.add(jc::GemmDesc{jc::WeightFormat::Q6_K, n, k});
  }
  // The per-32 types at LLaDA-8B's square shape, and Q5_0 at DiffusionGemma's down projection (a short last step).
  set.add(jc::GemmDesc{jc::WeightFormat::Q8_0, 4096, 4096});
  set.add(jc::GemmDesc{jc::WeightFormat::Q5_0, 4096, 4096});
  set.add(jc::GemmDesc{jc::WeightFormat::Q5_0, 2816, 704});
  // A grouped launch (LLaDA-8B's Q, K, V at their GQA widths, mixed formats): three tiles' code in one kernel, held to
  // the same spills and multiply loop.
  set.add(jc::GemmGroupDesc{{jc::GemmDesc{jc::WeightFormat::Q4_K, 4096, 4096}, jc::GemmDesc{jc::WeightFormat::Q4_K, 1024, 4096},
                             jc::GemmDesc{jc::WeightFormat::Q6_K, 1024, 4096}}});
  // LLaDA-8B's gate and up, quantising SwiGLU for the down projection in the same launch.
  set.add(jc::GemmGroupDesc{{jc::GemmDesc{jc::WeightFormat::Q4_K, 12288, 4096}, jc::GemmDesc{jc::WeightFormat::Q4_K, 12288, 4096}}, true});
  // A K-quant query beside Q8_0 keys and values, and a Q8_0 feed-forward quantising Q8_0 for its down projection.
  set.add(jc::GemmGroupDesc{{jc::GemmDesc{jc::WeightFormat::Q4_K, 4096, 4096}, jc::GemmDesc{jc::WeightFormat::Q8_0, 1024, 4096},
                             jc::GemmDesc{jc::WeightFormat::Q8_0, 1024, 4096}}});
  set.add(jc::GemmGroupDesc{{jc::GemmDesc{jc::WeightFormat::Q8_0, 12288, 4096}, jc::GemmDesc{jc::WeightFormat::Q8_0, 12288, 4096}},
                            true, jc::ActFormat::Q8_0});
  const fs::path dir = fs::temp_directory_path() / ("dllm-sass-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct RemoveDir {
    fs::path p;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } remove_dir{dir};
  for (const char* arch : {"sm_90", "sm_80", "sm_86", "sm_89"}) {
    SCOPED_TRACE(arch);
    const jc::CompiledUnit u = nv->compile(set.source(), set.unit_name(), arch);
    const fs::path cubin = dir / (std::string(arch) + ".cubin");
    {
      std::ofstream f(cubin, std::ios::binary);
      f.write(u.cubin.data(), static_cast<std::streamsize>(u.cubin.size()));
    }
    const std::string usage = run_output(cuobjdump + " --dump-resource-usage " + cubin.string() + " 2>&1");
    const std::string sass = run_output(cuobjdump + " -sass " + cubin.string() + " 2>&1");
    const auto fns = parse_sass(sass);
    // wide, split and small-row per shape
    ASSERT_EQ(fns.size(), 48u) << cuobjdump << " -sass printed:\n" << sass.substr(0, 2000);
    for (const auto& [name, code] : fns) {
      SCOPED_TRACE(name);
      // Resources: "Function NAME:\n REG:128 STACK:0 SHARED:... LOCAL:0 ..."
      const size_t at = usage.find("Function " + name + ":");
      ASSERT_NE(at, std::string::npos) << usage;
      const std::string res = usage.substr(at, usage.find('\n', usage.find('\n', at) + 1) - at);
      std::smatch m;
      ASSERT_TRUE(std::regex_search(res, m, std::regex(R"(REG:(\d+) STACK:(\d+) .*LOCAL:(\d+))"))) << res;
      // A group, the wide tiling and the small-row kernel run one block per SM (kernel_set.cpp): up to 255 registers;
      // the split tiling two: 128.
      const bool group = name.rfind("dllm_gemmgrp_", 0) == 0;
      const bool two_blocks = !group && name.find("_split") != std::string::npos;
      EXPECT_LE(std::stoi(m[1]), two_blocks ? 128 : 255) << res;
      EXPECT_EQ(std::stoi(m[2]), 0) << "stack frame: spills? " << res;
      EXPECT_EQ(std::stoi(m[3]), 0) << "local memory: spills " << res;

      // Loops: back edges (a branch to an earlier address); the innermost one with IMMAs is the multiply loop.
      size_t best_lo = 0, best_hi = 0, imma_total = 0;
      bool found = false;
      for (size_t i = 0; i < code.size(); ++i) {
        imma_total += code[i].op.rfind("IMMA", 0) == 0;
        if (code[i].target < 0 || code[i].target > code[i].addr) continue;
        size_t lo = i;
        while (lo > 0 && code[lo].addr > code[i].target) --lo;
        size_t immas = 0;
        for (size_t j = lo; j <= i; ++j) immas += code[j].op.rfind("IMMA", 0) == 0;
        if (immas > 0 && (!found || i - lo < best_hi - best_lo)) best_lo = lo, best_hi = i, found = true;
      }
      ASSERT_TRUE(found) << "no loop with IMMA";
      size_t immas = 0, ldsm = 0, branches = 0;
      for (size_t j = best_lo; j <= best_hi; ++j) {
        immas += code[j].op.rfind("IMMA", 0) == 0;
        ldsm += code[j].op.rfind("LDSM", 0) == 0;
        branches += code[j].op.rfind("BRA", 0) == 0 || code[j].op.rfind("BRX", 0) == 0;
      }
      const size_t len = best_hi - best_lo + 1;
      std::printf("[ sass ] %s %s: multiply loop %zu instructions, %zu IMMA (%.1f per IMMA), %zu LDSM; %zu IMMA in all, "
                  "%zu instructions, %s registers\n",
                  arch, name.c_str(), len, immas, double(len) / double(immas), ldsm, imma_total, code.size(),
                  m[1].str().c_str());
      // Q5_K assembles each quant from a nibble and a fifth bit (four more instructions per pair of IMMAs): at most
      // 13 instructions per IMMA there, 10 for the others. The split tiling's warps multiply a quarter of each
      // super-block, so their innermost IMMA loop is the k-loop itself, exchange and epilogue included: only the
      // wide tiling's multiply loop is held to the density.
      const auto ends = [&](const std::string& tail) {
        return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
      };
      const bool split = ends("_split") || ends("_small");  // the small-row kernel runs the split tiling's loop
      // Q8_0 and Q5_0 scale every block of 32 by its own activation and weight scales: per output and block a
      // conversion, the scales' product and an accumulation, 12 instructions per IMMA before any load; Q5_0 assembles
      // its quants from nibbles and fifth bits on top. Their bounds are those floors with the loads.
      const bool q80 = name.find("_q8_0_") != std::string::npos, q50 = name.find("_q5_0_") != std::string::npos;
      const size_t per = q80 ? 20 : q50 ? 26 : name.find("_q5_k_") != std::string::npos ? 13 : 10;
      if (!split) {
        EXPECT_LE(len, per * immas) << "fewer than one IMMA per " << per << " instructions in the multiply loop";
        EXPECT_EQ(branches, 1u) << "branches inside the multiply loop (a ladder?)";
      }
      EXPECT_GE(ldsm, 1u) << "the multiply loop reads shared memory without ldmatrix";
      size_t ldgsts = 0, brx = 0;
      for (const SassInstr& i : code) ldgsts += i.op.rfind("LDGSTS", 0) == 0, brx += i.op.rfind("BRX", 0) == 0;
      EXPECT_GE(ldgsts, 1u) << "no cp.async (LDGSTS)";
      EXPECT_EQ(brx, 0u) << "an indirect branch";
    }
  }
  fs::remove_all(dir);
}

TEST(GpuCompile, ErrorsNameTheUnitAndCarryTheLog) {
  REQUIRE_NVRTC();
  try {
    nv->compile("extern \"C\" __global__ void broken() { undeclared_thing(); }", "dllm_broken_unit", "sm_80");
    FAIL() << "compiled";
  } catch (const jc::CompileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dllm_broken_unit"), std::string::npos) << what;
    EXPECT_NE(what.find("sm_80"), std::string::npos) << what;
    EXPECT_NE(e.log().find("undeclared_thing"), std::string::npos) << e.log();
    EXPECT_NE(e.source().find("broken()"), std::string::npos);
  }
  EXPECT_THROW(nv->compile("", "x", "sm80"), Error);
}

// A fresh cache directory per test.
struct TempDir {
  fs::path path;
  TempDir() {
    char tpl[] = "/tmp/dllm-kcache-XXXXXX";
    path = mkdtemp(tpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(GpuDiskCache, DirectoryFollowsTheEnvironment) {
  const char* old_c = std::getenv("DLLM_CACHE");
  const std::string saved_c = old_c ? old_c : "";
  const char* old_x = std::getenv("XDG_CACHE_HOME");
  const std::string saved_x = old_x ? old_x : "";
  setenv("DLLM_CACHE", "/some/where", 1);
  EXPECT_EQ(jc::kernel_cache_dir(), "/some/where/cuda-kernels");
  unsetenv("DLLM_CACHE");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(jc::kernel_cache_dir(), "/xdg/dllm/cuda-kernels");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_NE(jc::kernel_cache_dir().find("/.cache/dllm/cuda-kernels"), std::string::npos);
  if (old_c) setenv("DLLM_CACHE", saved_c.c_str(), 1);
  if (old_x) setenv("XDG_CACHE_HOME", saved_x.c_str(), 1);
}

TEST(GpuDiskCache, StoreLoadAndKeyMismatch) {
  TempDir tmp;
  const jc::KernelDiskCache cache((tmp.path / "a/b").string());  // created on first store
  const std::string entry = jc::KernelDiskCache::entry_name("unit", "source", "sm_90", 13000, 13000);
  EXPECT_EQ(entry.find("unit-sm_90-nvrtc13000-drv13000-"), 0u);
  EXPECT_NE(entry, jc::KernelDiskCache::entry_name("unit", "source", "sm_90", 13000, 12080));
  EXPECT_NE(entry, jc::KernelDiskCache::entry_name("unit", "source2", "sm_90", 13000, 13000));
  EXPECT_FALSE(cache.load(entry, "header").has_value());
  const std::string blob("\x7f" "ELF\0binary\xff", 12);
  EXPECT_EQ(cache.store(entry, "header", blob), "");
  ASSERT_TRUE(cache.load(entry, "header").has_value());
  EXPECT_EQ(*cache.load(entry, "header"), blob);
  EXPECT_FALSE(cache.load(entry, "other header").has_value());  // a foreign entry is a miss
  // No temporary files are left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path / "a/b")) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  // An unwritable directory is reported, not thrown.
  const jc::KernelDiskCache bad("/proc/dllm-no-such-dir");
  EXPECT_NE(bad.store(entry, "header", blob), "");
}

TEST(GpuDiskCache, SecondCompileComesFromTheCache) {
  REQUIRE_NVRTC();
  TempDir tmp;
  const jc::KernelDiskCache cache(tmp.path.string());
  jc::KernelSet set;
  set.add(jc::QuantDesc{jc::QuantMode::Plain, jc::ActFormat::Q8_0, 256});
  const jc::CompileOutcome first = cache.compile_cached(*nv, set.source(), set.unit_name(), "sm_86", 13000);
  EXPECT_FALSE(first.from_cache);
  EXPECT_EQ(first.cache_note, "");
  const jc::CompileOutcome second = cache.compile_cached(*nv, set.source(), set.unit_name(), "sm_86", 13000);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.binary, first.binary);
  // Another driver version or target is another entry.
  EXPECT_FALSE(cache.compile_cached(*nv, set.source(), set.unit_name(), "sm_86", 12080).from_cache);
  const jc::CompileOutcome ptx = cache.compile_cached(*nv, set.source(), set.unit_name(), "compute_80", 13000);
  EXPECT_FALSE(ptx.from_cache);
  EXPECT_NE(ptx.binary.find(".entry dllm_quant_plain_q8_0_k256"), std::string::npos);
  EXPECT_EQ(ptx.binary.back(), '\0');
}

TEST(GpuKernelsCommand, WritesSourcePtxCubinAndManifestWithoutAGpu) {
  REQUIRE_NVRTC();
  TempDir tmp;
  const std::string out = (tmp.path / "kernels").string();
  ASSERT_EQ(cli::cmd_kernels_gpu(data_path("models/tiny-dream-Q4_K_M.gguf"), "sm_89", out), 0);
  const auto manifest = nlohmann::json::parse(read_file(out + "/gpu-manifest.json"));
  const std::string unit = manifest.at("unit").get<std::string>();
  EXPECT_EQ(manifest.at("target"), "sm_89");
  const std::string cu = read_file(out + "/" + unit + ".cu");
  const std::string ptx = read_file(out + "/" + unit + ".sm_89.ptx");
  const std::string cubin = read_file(out + "/" + unit + ".sm_89.cubin");
  EXPECT_NE(cu.find("gemm_tc_body<12, "), std::string::npos);  // Q4_K, tiled: the high nibbles as u8
  EXPECT_NE(cu.find("gemm_tc_body<14, "), std::string::npos);  // Q6_K, tiled
  EXPECT_NE(ptx.find("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32"), std::string::npos);
  EXPECT_NE(ptx.find("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32"), std::string::npos);
  EXPECT_NE(ptx.find("cp.async.cg.shared.global.L2::cache_hint"), std::string::npos);
  EXPECT_NE(ptx.find("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), std::string::npos);
  EXPECT_NE(ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), std::string::npos);
  EXPECT_EQ(cubin.substr(0, 4), std::string("\x7f" "ELF"));
  // Q4_K_M: Q6_K for output.weight, blk.1.attn_v.weight and blk.1.ffn_down.weight, Q4_K elsewhere.
  bool found = false;
  for (const auto& k : manifest.at("kernels")) {
    if (k.at("name") == "dllm_gemm_q6_k_n1024_k256") {
      found = true;
      EXPECT_EQ(k.at("tensors"), nlohmann::json::array({"output.weight"}));
    }
  }
  EXPECT_TRUE(found) << manifest.dump(1);
  int files = 0;
  for (const auto& e : fs::directory_iterator(out)) files += e.is_regular_file();
  EXPECT_EQ(files, 4) << "no temporary files left";
}

TEST(GpuKernelsCommand, Errors) {
  try {
    cli::cmd_kernels_gpu(data_path("models/tiny-dream-Q4_K_M.gguf"), "90", "/tmp/x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_STREQ(e.what(), "flag --gpu-arch needs an architecture such as sm_80, sm_86, sm_89 or sm_90, got '90'");
  }
  try {
    cli::cmd_kernels_gpu(data_path("models/tiny-dream-F16.gguf"), "sm_90", "/tmp/dllm-never-written");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_NE(std::string(e.what()).find("is F16: the GPU backend has matrix kernels"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists("/tmp/dllm-never-written"));
}

}  // namespace
}  // namespace dllm::test
