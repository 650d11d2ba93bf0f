// `dllm bench` and `dllm kernels` end to end through the binary: JSON fields, every flag reaching the
// run (rows list, --isa, --rows), the kernel dump of a tiny model (every matrix covered, .bin sizes,
// listings, manifest), and the usage errors (exit 2) and runtime errors (exit 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "jit/cpu_features.h"
#include "jit/gemm_desc.h"
#include "jit/repack.h"
#include "model/gguf.h"
#include "q5k_model.h"
#include "support.h"

using dllm::test::run_dllm;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("dllm_jit_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p.string();
}

// The tests that depend on the kernel family run once per family this CPU allows (DLLM_ISA set for the
// dllm processes they start); portable has no kernels, so the kernel tests skip it.
class JitCliFamily : public ::testing::TestWithParam<dllm::jit::Isa> {
 protected:
  void SetUp() override {
    if (!dllm::jit::cpu_features().supports(GetParam()))
      GTEST_SKIP() << "this CPU lacks " << dllm::jit::isa_name(GetParam());
    isa_.emplace(GetParam());
  }
  void TearDown() override { isa_.reset(); }
  bool jit() const { return GetParam() != dllm::jit::Isa::Portable; }

 private:
  std::optional<dllm::test::ScopedIsa> isa_;
};

}  // namespace

TEST_P(JitCliFamily, BenchGemmJsonReportsEveryRowCount) {
  const auto r = run_dllm({"bench", "gemm", "--type", "Q4_K", "--n", "40", "--k", "512", "--rows", "1,9", "--threads",
                           "2", "--warm", "--min-seconds", "0", "--no-peak", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_TRUE(j["peak"].is_null());
  ASSERT_EQ(j["results"].size(), 2u);
  const dllm::jit::Isa best = GetParam();
  for (size_t i = 0; i < 2; ++i) {
    const json& res = j["results"][i];
    EXPECT_EQ(res["type"], "Q4_K");
    EXPECT_EQ(res["n"], 40);
    EXPECT_EQ(res["k"], 512);
    EXPECT_EQ(res["rows"], i == 0 ? 1 : 9);
    EXPECT_EQ(res["threads"], 2);
    EXPECT_EQ(res["isa"], dllm::jit::isa_name(best));
    EXPECT_EQ(res["weight_copies"], 1);
    EXPECT_GE(res["reps"].get<int>(), 5);
    EXPECT_GT(res["gops"].get<double>(), 0);
    EXPECT_GT(res["median_s"].get<double>(), 0);
    EXPECT_EQ(res["gguf_bytes"], 40 * 2 * 144);
    if (best == dllm::jit::Isa::Amx) {
      // An AMX tile holds 16 rows: the amx family runs the 1-row GEMM on an avx512-vnni kernel (a remainder of up
      // to 8 rows, the same panels) and the 9-row one as a partial AMX tile.
      EXPECT_EQ(res["kernel"], i == 0 ? "q4k_q8k_gemm_1x16__avx512vnni_k512_n40" : "q4k_q8k_gemm_9x16__amx_k512_n40");
    } else if (best != dllm::jit::Isa::Portable) {
      const int mmax = dllm::jit::max_row_tile(best, dllm::GgmlType::Q4_K, 512);
      const std::string tile = std::to_string(i == 0 ? 1 : std::min(9, mmax)) + "x" +
                               std::to_string(dllm::jit::panel_rows(best, dllm::GgmlType::Q4_K, 512));
      // The first tile's kernel: on avx2 (tiles of at most 3 rows) the prefetching one (first_tile_prefetches).
      const int m = i == 0 ? 1 : std::min(9, mmax);
      const std::string pf = dllm::jit::first_tile_prefetches(best, m) ? "_pf" : "";
      EXPECT_EQ(res["kernel"], "q4k_q8k_gemm_" + tile + "__" + dllm::jit::isa_short_name(best) + "_k512_n40" + pf);
    }
  }
}

TEST(JitCli, BenchGemmHonoursIsa) {
  for (dllm::jit::Isa isa : dllm::jit::cpu_features().supported()) {
    const auto r = run_dllm({"bench", "gemm", "--type", "Q8_0", "--n", "24", "--k", "96", "--rows", "2", "--isa",
                             dllm::jit::isa_name(isa), "--warm", "--min-seconds", "0", "--no-peak", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json res = json::parse(r.out)["results"][0];
    EXPECT_EQ(res["isa"], dllm::jit::isa_name(isa));
    if (isa == dllm::jit::Isa::Portable) {
      EXPECT_EQ(res["kernel"], "");
    } else {
      EXPECT_NE(res["kernel"].get<std::string>().find(std::string("__") + dllm::jit::isa_short_name(isa)),
                std::string::npos);
    }
  }
}

TEST_P(JitCliFamily, BenchKernelReportsItsShareOfThePeak) {
  if (!jit()) GTEST_SKIP() << "the portable family has no kernels";
  const auto r = run_dllm({"bench", "kernel", "--type", "Q6_K", "--n", "64", "--k", "512", "--rows", "16", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["rows"], 16);
  EXPECT_GT(j[0]["gops_per_cpu_second"].get<double>(), 0);
  EXPECT_GT(j[0]["peak_gops_per_cpu_second"].get<double>(), 0);
  EXPECT_NEAR(j[0]["fraction_of_peak"].get<double>(),
              j[0]["gops_per_cpu_second"].get<double>() / j[0]["peak_gops_per_cpu_second"].get<double>(), 1e-9);
  EXPECT_EQ(j[0]["kernel"].get<std::string>().rfind("q6k_q8k_gemm_", 0), 0u);
}

TEST_P(JitCliFamily, BenchKernelResidentTimesOneTileOverCachedPanels) {
  const dllm::jit::Isa isa = GetParam();
  if (!jit()) GTEST_SKIP() << "the portable family has no kernels";
  // Q4_K, k = 1024: a panel of 16 columns is 16 * 4 * 144 bytes plus padding, so several fit in 32 KB;
  // n = 48 caps them at 3 panels.
  const auto r = run_dllm({"bench", "kernel", "--type", "Q4_K", "--n", "48", "--k", "1024", "--resident", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_TRUE(j[0]["resident"].get<bool>());
  // As many panels as fit in 32 KB, at most all of them (3 of 16 rows on avx512-vnni, 6 of 8 on the ymm
  // families): asked of the family's own layout.
  const dllm::jit::PackedLayout L = dllm::jit::packed_layout(isa, dllm::GgmlType::Q4_K, 48, 1024);
  EXPECT_EQ(j[0]["panels"], std::clamp<int64_t>(32 * 1024 / L.panel_bytes, 1, L.n_panels));
  EXPECT_EQ(L.n_panels, 48 / dllm::jit::panel_rows(isa, dllm::GgmlType::Q4_K, 1024));
  EXPECT_EQ(j[0]["rows_timed"], dllm::jit::max_row_tile(isa, dllm::GgmlType::Q4_K, 1024));
  EXPECT_GT(j[0]["gops_per_cpu_second"].get<double>(), 0);
  const auto streamed = run_dllm({"bench", "kernel", "--type", "Q4_K", "--n", "48", "--k", "1024", "--json"});
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_FALSE(json::parse(streamed.out)[0]["resident"].get<bool>());
}

TEST(JitCli, BenchUsageErrors) {
  const std::vector<std::vector<std::string>> bad = {
      {"bench"},
      {"bench", "fast"},
      {"bench", "gemm", "--type", "Q4_K", "--k", "256", "--rows", "1"},
      {"bench", "gemm", "--type", "Q3_K", "--n", "4", "--k", "256", "--rows", "1"},  // a type without kernels
      {"bench", "gemm", "--type", "Q4_K", "--n", "4", "--k", "100", "--rows", "1"},
      {"bench", "gemm", "--type", "Q4_K", "--n", "4", "--k", "256", "--rows", "1,x"},
      {"bench", "gemm", "--type", "Q4_K", "--n", "4", "--k", "256", "--rows", "1", "--isa", "sse2"},
      {"bench", "gemm", "--type", "Q4_K", "--n", "4", "--k", "256", "--rows", "1", "--threads", "0"},
      {"bench", "gemm", "--type", "Q4_K", "--n", "4", "--k", "256", "--rows", "1", "--frobnicate"},
      {"bench", "peak", "--threads", "0"},
      {"bench", "peak", "--isa", "portable"},
      {"bench", "kernel", "--type", "Q4_K", "--n", "16"},
      {"bench", "kernel", "--type", "Q4_K", "--n", "16", "--k", "256", "--isa", "portable"},
  };
  const auto q3 = run_dllm(bad[3]);
  EXPECT_NE(q3.err.find("--type must be one of Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0, got 'Q3_K'"), std::string::npos) << q3.err;
  for (const auto& args : bad) {
    const auto r = run_dllm(args);
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_EQ(r.exit_code, 2) << line << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("ERROR: ", 0), 0u) << line << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << line;
  }
}

TEST_P(JitCliFamily, KernelsDumpCoversEveryMatrix) {
  const dllm::jit::Isa isa = GetParam();
  if (!jit()) GTEST_SKIP() << "the portable family has no kernels";
  const std::string model = dllm::test::data_path("models/tiny-llada-Q8_0.gguf");
  const std::string out = temp_dir("kernels");
  const auto r = run_dllm({"kernels", "--model", model, "--out", out, "--rows", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote "), std::string::npos);
  const json m = json::parse(dllm::test::read_file(out + "/manifest.json"));
  EXPECT_EQ(m["isa"], dllm::jit::isa_name(isa));
  // Every 2-D matrix the forward pass multiplies by, of a type with kernels, is listed.
  const auto file = dllm::gguf::File::open(model);
  std::set<std::string> want, listed;
  for (const auto& t : file->tensors())
    if (t.n_dims == 2 && t.name != "token_embd.weight" && dllm::jit::jit_supports_type(t.type()))
      want.insert(std::string(t.name));
  ASSERT_FALSE(want.empty());
  const int mmax = dllm::jit::max_row_tile(isa, dllm::GgmlType::Q8_0, 256);
  std::set<int> tiles;
  for (const json& k : m["kernels"]) {
    for (const auto& t : k["tensors"]) listed.insert(t.get<std::string>());
    tiles.insert(k["row_tile"].get<int>());
    EXPECT_EQ(k["family"], dllm::jit::isa_name(isa));
    const fs::path bin = fs::path(out) / k["bin"].get<std::string>();
    ASSERT_TRUE(fs::exists(bin)) << bin;
    EXPECT_EQ(fs::file_size(bin), k["code_bytes"].get<size_t>());
    const std::string listing = dllm::test::read_file((fs::path(out) / k["listing"].get<std::string>()).string());
    EXPECT_GT(listing.size(), 100u);
    if (k["listing_kind"] == "objdump") {
      // The family's int8 dot product: vpdpbusd (VNNI), or vpmaddubsw + vpmaddwd (AVX2, which has none).
      if (isa == dllm::jit::Isa::Avx2) {
        EXPECT_NE(listing.find("vpmaddubsw"), std::string::npos) << k["name"];
        EXPECT_EQ(listing.find("vpdpbusd"), std::string::npos) << k["name"];
      } else if (k["name"].get<std::string>().find("__amx_") != std::string::npos) {
        EXPECT_NE(listing.find("tdpb"), std::string::npos) << k["name"];  // AMX: a tile dot product (tdpbusd, tdpbssd)
      } else {
        EXPECT_NE(listing.find("vpdpbusd"), std::string::npos) << k["name"];
      }
    }
    const std::string name = k["name"];
    EXPECT_NE(name.find("_k" + std::to_string(k["k"].get<int64_t>()) + "_n" + std::to_string(k["n"].get<int64_t>())),
              std::string::npos);
  }
  EXPECT_EQ(listed, want);
  // 10 rows: full tiles of the family's largest row tile and the remainder, if any (one tile when 10 fits).
  std::set<int> expect_tiles = {std::min(mmax, 10)};
  if (mmax < 10 && 10 % mmax != 0) expect_tiles.insert(10 % mmax);
  EXPECT_EQ(tiles, expect_tiles);
  fs::remove_all(out);
}

TEST(JitCli, KernelsHonoursIsaAndReportsErrors) {
  const std::string model = dllm::test::data_path("models/tiny-dream-Q4_K_M.gguf");
  if (dllm::jit::cpu_features().supports(dllm::jit::Isa::Avx2)) {
    const std::string out = temp_dir("kernels_avx2");
    const auto r = run_dllm({"kernels", "--model", model, "--out", out, "--isa", "avx2", "--rows", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json m = json::parse(dllm::test::read_file(out + "/manifest.json"));
    ASSERT_FALSE(m["kernels"].empty());
    for (const json& k : m["kernels"]) {
      EXPECT_NE(k["name"].get<std::string>().find("1x8__avx2_"), std::string::npos) << k["name"];
      EXPECT_EQ(k["panel_rows"], 8);
    }
    fs::remove_all(out);
  }
  auto r = run_dllm({"kernels", "--out", temp_dir("x")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // The families it accepts, named from the code's list (kAllIsas) in the error and in --help.
  std::string generated;
  for (dllm::jit::Isa isa : dllm::jit::kAllIsas) {
    if (isa == dllm::jit::Isa::Portable) continue;
    generated += generated.empty() ? "" : isa == dllm::jit::Isa::Amx ? " or " : ", ";
    generated += dllm::jit::isa_name(isa);
  }
  EXPECT_EQ(generated, "avx2, avx-vnni, avx512-vnni or amx");
  r = run_dllm({"kernels", "--model", model, "--out", temp_dir("y"), "--isa", "neon"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "ERROR: --isa must be " + generated + ", got 'neon'\nsee: dllm kernels --help\n");
  r = run_dllm({"kernels", "--model", model, "--out", temp_dir("z"), "--isa", "portable"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err, "ERROR: --isa must be " + generated +
                       ", got 'portable' (the portable family has no generated kernels)\nsee: dllm kernels --help\n");
  r = run_dllm({"kernels", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--isa F    kernel family: " + generated + ", also one this CPU lacks"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("portable, the\n             plain C++ family, has no generated kernels"), std::string::npos)
      << r.out;
  // bench takes every family, portable included (where its command runs it).
  r = run_dllm({"bench", "gemm", "--type", "Q4_K", "--n", "4", "--k", "256", "--rows", "1", "--isa", "sse2"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("ERROR: --isa must be portable, " + generated + ", got 'sse2'\n", 0), 0u) << r.err;
  // A missing file is a runtime error (exit 1) once the family is a JIT one (--isa: DLLM_ISA may say
  // portable, which is refused first, as a usage error).
  const dllm::jit::Isa best = dllm::jit::cpu_features().best();
  if (best == dllm::jit::Isa::Portable) return;
  r = run_dllm({"kernels", "--model", "/nonexistent/model.gguf", "--out", temp_dir("w"), "--isa",
                dllm::jit::isa_name(best)});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

// Every family's kernels can be dumped on any CPU, also one it lacks (written, never run): the listings
// carry the family's instructions (objdump), and the manifest names the family the tiles use.
TEST(JitCli, KernelsDumpsEveryFamilyOnAnyCpu) {
  const std::string model = dllm::test::data_path("moe/gguf/tiny-llada-moe-Q4_K_M.gguf");
  const bool objdump = std::system("objdump --version > /dev/null 2>&1") == 0;
  const struct {
    const char* isa;
    const char* tag;      // in every kernel name of the family (amx: its remainder tiles are avx512vnni)
    const char* listing;  // an instruction of the family (objdump)
  } families[] = {{"avx2", "__avx2_", "vpmaddubsw"},
                  {"avx-vnni", "__avxvnni_", "{vex} vpdpbusd"},
                  {"avx512-vnni", "__avx512vnni_", "zmm"},
                  {"amx", "__amx_", "tdpb"}};
  for (const auto& f : families) {
    SCOPED_TRACE(f.isa);
    const std::string out = temp_dir(std::string("kernels_any_") + f.isa);
    const auto r = run_dllm({"kernels", "--model", model, "--out", out, "--isa", f.isa, "--rows", "19"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json m = json::parse(dllm::test::read_file(out + "/manifest.json"));
    EXPECT_EQ(m["isa"], f.isa);
    ASSERT_FALSE(m["kernels"].empty());
    bool tagged = false, listed = false;
    for (const json& k : m["kernels"]) {
      tagged = tagged || k["name"].get<std::string>().find(f.tag) != std::string::npos;
      if (objdump)
        listed = listed || dllm::test::read_file(out + "/" + k["listing"].get<std::string>()).find(f.listing) != std::string::npos;
    }
    EXPECT_TRUE(tagged) << "no kernel named " << f.tag;
    if (objdump) EXPECT_TRUE(listed) << "no listing has " << f.listing;
    fs::remove_all(out);
  }
}

// A Q5_K model's kernels: the dump lists Q5_K kernels for its Q5_K matrices (every matrix covered).
TEST(JitCli, KernelsDumpOfAQ5KModel) {
  if (!dllm::jit::cpu_features().supports(dllm::jit::Isa::Avx2)) GTEST_SKIP() << "this CPU lacks avx2";
  const std::string model = temp_dir("q5k") + ".gguf";
  ASSERT_GT(dllm::test::write_q4k_as_q5k(dllm::test::data_path("models/tiny-dream-Q4_K_M.gguf"), model,
                                         dllm::test::Q5kMode::HighBits),
            5);
  const std::string out = temp_dir("kernels_q5k");
  const auto r = run_dllm({"kernels", "--model", model, "--out", out, "--isa", "avx2", "--rows", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json m = json::parse(dllm::test::read_file(out + "/manifest.json"));
  int q5 = 0;
  for (const json& k : m["kernels"]) {
    if (k["weight_type"] != "Q5_K") continue;
    ++q5;
    EXPECT_EQ(k["name"].get<std::string>().rfind("q5k_q8k_gemm_", 0), 0u) << k["name"];
    EXPECT_EQ(k["activation_type"], "Q8_K");
    if (k["listing_kind"] == "objdump") {
      const std::string listing = dllm::test::read_file((fs::path(out) / k["listing"].get<std::string>()).string());
      EXPECT_NE(listing.find("vpmaddubsw"), std::string::npos) << k["name"];
      EXPECT_NE(listing.find("vpor"), std::string::npos) << k["name"] << ": no high bits merged";
    }
  }
  EXPECT_GT(q5, 0);
  fs::remove_all(out);
  fs::remove(model);
}

// A matrix whose type has no JIT kernel (F16 here) runs on the reference path, and run, run
// --prompts-file and logits say so once on stderr; the logits stay llama.cpp's. A Q5_K model says nothing.
TEST(JitCli, MatricesWithoutKernelsAreReportedOnceAndStillRight) {
  if (dllm::jit::cpu_features().best() == dllm::jit::Isa::Portable) GTEST_SKIP() << "no JIT family";
  unsetenv("DLLM_EXECUTOR");
  const std::string f16 = dllm::test::data_path("models/tiny-llada-F16.gguf");
  const std::string marker = "have no JIT kernel and run on the slow reference path";
  auto count = [&](const std::string& err) {
    int n = 0;
    for (size_t p = err.find(marker); p != std::string::npos; p = err.find(marker, p + 1)) ++n;
    return n;
  };
  const json c = json::parse(dllm::test::read_file(dllm::test::data_path("logits/tiny-llada-F16__c1_short_len8.json")));
  std::string ids, rows;
  for (const auto& v : c["ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(v.get<int>());
  for (const auto& v : c["rows"]) rows += (rows.empty() ? "" : ",") + std::to_string(v.get<int>());
  const std::string out = temp_dir("f16_logits") + ".f32";
  auto r = run_dllm({"logits", "--model", f16, "--tokens", ids, "--rows", rows, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("15 weight matrices of type F16 (output.weight (F16) and 14 more)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("kernels exist for Q4_K, Q5_K, Q6_K, Q8_0 and Q5_0"), std::string::npos) << r.err;
  // The same logits as the reference executor's (only attention differs: f32 flash vs double), and as
  // llama.cpp's within test_logits' F16 bound (llama.cpp rounds activations to F16 for F16 products).
  auto rel_l2 = [](const std::string& got, const std::string& want) {
    EXPECT_EQ(got.size(), want.size());
    double e = 0, n = 0;
    for (size_t i = 0; i < std::min(got.size(), want.size()) / 4; ++i) {
      float a, b;
      std::memcpy(&a, got.data() + 4 * i, 4);
      std::memcpy(&b, want.data() + 4 * i, 4);
      e += (double(a) - b) * (double(a) - b), n += double(b) * b;
    }
    return std::sqrt(e / n);
  };
  const std::string got = dllm::test::read_file(out);
  setenv("DLLM_EXECUTOR", "reference", 1);
  const auto rr = run_dllm({"logits", "--model", f16, "--tokens", ids, "--rows", rows, "--out", out});
  unsetenv("DLLM_EXECUTOR");
  ASSERT_EQ(rr.exit_code, 0) << rr.err;
  EXPECT_EQ(count(rr.err), 0) << "the reference executor chose the reference path: " << rr.err;
  EXPECT_LT(rel_l2(got, dllm::test::read_file(out)), 1e-5) << "vs the reference executor";
  EXPECT_LT(rel_l2(got, dllm::test::read_file(dllm::test::data_path("logits/" + c["logits_file"].get<std::string>()))),
            3e-3)
      << "vs llama.cpp";
  fs::remove(out);

  r = run_dllm({"run", "--model", f16, "--prompt", "hi", "--max-tokens", "8", "--steps", "2", "--block-length", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.err), 1) << r.err;
  r = run_dllm({"run", "--model", f16, "--prompts-file", "-", "--max-tokens", "8", "--steps", "2", "--block-length", "8"},
               "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.err), 1) << r.err;

  const std::string q5 = temp_dir("q5k_model") + ".gguf";
  ASSERT_GT(dllm::test::write_q4k_as_q5k(dllm::test::data_path("models/tiny-llada-Q4_K_M.gguf"), q5,
                                         dllm::test::Q5kMode::HighBits),
            5);
  r = run_dllm({"logits", "--model", q5, "--tokens", ids, "--rows", rows, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  fs::remove(out);
  fs::remove(q5);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, JitCliFamily, ::testing::ValuesIn(dllm::jit::kAllIsas),
                         [](const ::testing::TestParamInfo<dllm::jit::Isa>& info) {
                           return dllm::test::family_label(info.param);
                         });
